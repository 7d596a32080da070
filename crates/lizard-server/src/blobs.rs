//! The content-addressed store of pushed files: `<data>/blobs/sha256/<hash>`, shared by
//! every workspace (which workspace uploaded what is the store's `template_blobs`).
//!
//! An upload streams to a temporary file in the same directory while it is hashed, and
//! is renamed into place only once its hash is the one it was uploaded as, so a file at
//! `<hash>` always has that content, and a builder reading it never sees half a file.
//! Replicas that share pushed files also keep them in the store ([`crate::shared_blobs`]),
//! and copy them back here through the same path.

use futures_util::{Stream, StreamExt};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use tokio::io::AsyncWriteExt;

/// Why an upload was refused.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    /// The path names no SHA-256.
    #[error("{0:?} is not a SHA-256 (64 lower-case hex digits)")]
    BadHash(String),
    /// The bytes hash to something else.
    #[error("the uploaded bytes have SHA-256 {actual}, not {expected}")]
    Mismatch { expected: String, actual: String },
    /// Over the size limit.
    #[error("the file is larger than {limit} bytes")]
    TooLarge { limit: u64 },
    /// The client's body failed midway.
    #[error("the upload was cut off: {0}")]
    Body(String),
    /// The disk failed (logged; never shown to clients).
    #[error("{context}: {cause}")]
    Io { context: String, cause: std::io::Error },
}

/// Whether `s` is a SHA-256 as the store names files: 64 lower-case hex digits.
pub fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The blob directory of a server.
#[derive(Debug, Clone)]
pub struct BlobStore {
    root: PathBuf,
}

impl BlobStore {
    /// `<data_dir>/blobs/sha256`.
    pub fn new(data_dir: &Path) -> BlobStore {
        BlobStore { root: data_dir.join("blobs").join("sha256") }
    }

    /// The directory holding each blob at `<dir>/<sha256>` (what a builder reads).
    pub fn dir(&self) -> &Path {
        &self.root
    }

    /// Whether the content is stored.
    pub async fn has(&self, sha256: &str) -> bool {
        is_sha256(sha256) && tokio::fs::metadata(self.root.join(sha256)).await.is_ok_and(|m| m.is_file())
    }

    /// Store `body` as `sha256` unless it is stored already; refuses a body over `limit`
    /// bytes or whose hash differs. Returns its size.
    pub async fn put<S, E>(&self, sha256: &str, body: S, limit: u64) -> Result<u64, BlobError>
    where
        S: Stream<Item = Result<bytes::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        if !is_sha256(sha256) {
            return Err(BlobError::BadHash(sha256.to_owned()));
        }
        let io = |context: &str| {
            let context = context.to_owned();
            move |cause| BlobError::Io { context, cause }
        };
        tokio::fs::create_dir_all(&self.root).await.map_err(io("create the blob directory"))?;
        let tmp = self.root.join(format!(".upload-{}", lizard_api::ids::new_id("tmp")));
        let written = self.write_hashed(&tmp, body, limit).await;
        let result = match written {
            Ok((size, actual)) if actual == sha256 => {
                tokio::fs::rename(&tmp, self.root.join(sha256)).await.map_err(io("store a blob")).map(|_| size)
            }
            Ok((_, actual)) => Err(BlobError::Mismatch { expected: sha256.to_owned(), actual }),
            Err(e) => Err(e),
        };
        if result.is_err() {
            let _ = tokio::fs::remove_file(&tmp).await;
        }
        result
    }

    async fn write_hashed<S, E>(&self, path: &Path, mut body: S, limit: u64) -> Result<(u64, String), BlobError>
    where
        S: Stream<Item = Result<bytes::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let io = |cause| BlobError::Io { context: "write a blob".into(), cause };
        let mut file = tokio::fs::File::create(path).await.map_err(io)?;
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| BlobError::Body(e.to_string()))?;
            size = size.saturating_add(chunk.len() as u64);
            if size > limit {
                return Err(BlobError::TooLarge { limit });
            }
            hasher.update(&chunk);
            file.write_all(&chunk).await.map_err(io)?;
        }
        file.sync_all().await.map_err(io)?;
        Ok((size, hex::encode(hasher.finalize())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(parts: &[&'static [u8]]) -> impl Stream<Item = Result<bytes::Bytes, std::io::Error>> + Unpin {
        futures_util::stream::iter(parts.iter().map(|p| Ok(bytes::Bytes::from_static(p))).collect::<Vec<_>>())
    }

    #[tokio::test]
    async fn stores_only_what_hashes_right_and_fits() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::new(dir.path());
        let hash = hex::encode(Sha256::digest(b"hello world"));
        assert!(!store.has(&hash).await);
        assert_eq!(store.put(&hash, body(&[b"hello ", b"world"]), 100).await.unwrap(), 11);
        assert!(store.has(&hash).await);
        assert_eq!(std::fs::read(store.dir().join(&hash)).unwrap(), b"hello world");

        let other = hex::encode(Sha256::digest(b"other"));
        assert!(matches!(store.put(&other, body(&[b"not it"]), 100).await, Err(BlobError::Mismatch { .. })));
        assert!(matches!(store.put(&other, body(&[b"other"]), 3).await, Err(BlobError::TooLarge { limit: 3 })));
        assert!(matches!(store.put("../x", body(&[b"x"]), 3).await, Err(BlobError::BadHash(_))));
        assert!(!store.has(&other).await);
        // Nothing half-written is left behind.
        let names: Vec<_> = std::fs::read_dir(store.dir()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, [std::ffi::OsString::from(&hash)]);
    }
}
