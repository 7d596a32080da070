//! The content of pushed files, kept in the store so that every server replica can serve
//! any call of a push (see the server's `shared_blobs`): a push's upload may reach one replica
//! and its build run on another, which copies the content to its own disk first.
//!
//! Part of [`super::Store`] (a supertrait). A blob is written as chunks of at most
//! [`BLOB_CHUNK_BYTES`], then marked complete with its size; only a complete blob is
//! ever read, so a half-written upload (a replica that died midway) is never used, and
//! a re-upload of the same content rewrites the same rows.

use super::Result;
use async_trait::async_trait;
use std::collections::HashSet;

/// The most bytes one chunk holds: small enough that a replica never holds more than a
/// few in memory, large enough that a 512 MiB file is 128 rows.
pub const BLOB_CHUNK_BYTES: usize = 4 << 20;

/// A complete blob's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobContent {
    /// Its length in bytes (the sum of its chunks').
    pub size: u64,
    /// How many chunks it has (`seq` 0 to `chunks - 1`).
    pub chunks: u32,
}

#[async_trait]
pub trait BlobContentStore: Send + Sync {
    /// Write chunk `seq` of a blob's content, replacing one already there (a re-upload
    /// writes the same bytes).
    async fn put_blob_chunk(&self, sha256: &str, seq: u32, data: &[u8]) -> Result<()>;

    /// Mark a blob complete: chunks `0..content.chunks` are all there and their lengths
    /// add up to `content.size`, else [`super::StoreError::Conflict`] (nothing marked).
    /// Idempotent: a blob already complete stays as it was.
    async fn complete_blob_content(&self, sha256: &str, content: BlobContent, at: i64) -> Result<()>;

    /// A complete blob's shape; `None` while it is absent or half-written.
    async fn blob_content(&self, sha256: &str) -> Result<Option<BlobContent>>;

    /// Of `sha256`, those whose content is complete.
    async fn complete_blobs(&self, sha256: &[String]) -> Result<HashSet<String>>;

    /// Chunk `seq` of a blob's content; `None` when there is none.
    async fn blob_chunk(&self, sha256: &str, seq: u32) -> Result<Option<Vec<u8>>>;

    /// Forget a blob's content (its completion first, then its chunks), so that a content
    /// found corrupt is asked for again instead of being used.
    async fn forget_blob_content(&self, sha256: &str) -> Result<()>;
}
