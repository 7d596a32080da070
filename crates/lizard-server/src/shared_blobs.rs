//! Pushed files shared by every server replica through the store.
//!
//! Behind a load balancer the calls of one push reach different replicas: the upload
//! lands on one replica's disk ([`crate::blobs`]) while the push, and so its build, may
//! run on another. A server that shares pushed files ([`crate::ServerConfig::shares_blobs`])
//! therefore also writes each upload's content into the store ([`share`], after its hash
//! checked out, in chunks of [`BLOB_CHUNK_BYTES`], never the whole file in memory), and
//! before a build the replica running it copies what it lacks from the store to its disk
//! ([`fetch`], through the same hashed temp-file-and-rename path as an upload, so a
//! corrupt or incomplete stored content never reaches a build).

use crate::blobs::{BlobError, BlobStore};
use lizard_store::{BlobContent, Store, StoreError, BLOB_CHUNK_BYTES};
use std::sync::Arc;
use tokio::io::AsyncReadExt;

/// Why a blob could not be shared or fetched.
#[derive(Debug, thiserror::Error)]
pub enum SharedBlobError {
    /// The store failed (or cannot be reached: worth a retry).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// This replica's own copy could not be read, or the fetched one written.
    #[error("{context}: {cause}")]
    Io { context: &'static str, cause: std::io::Error },
    /// No complete content of this blob is in the store.
    #[error("the store holds no complete content of {0}")]
    NotStored(String),
    /// The stored content is cut short, too long, or hashes to something else. It was
    /// forgotten, so the next push uploads it again.
    #[error("the stored content of {sha256} is corrupt or incomplete ({reason})")]
    Corrupt { sha256: String, reason: String },
}

impl SharedBlobError {
    /// Whether a retry may succeed (the store was unreachable) rather than the content
    /// being bad or absent.
    pub fn is_transient(&self) -> bool {
        matches!(self, SharedBlobError::Store(StoreError::Unavailable(_)))
    }
}

/// Put this replica's copy of `sha256` (already hash-checked on its disk) into the store,
/// unless the store has it complete already. Chunks first, completion last.
pub async fn share(store: &dyn Store, local: &BlobStore, sha256: &str) -> Result<(), SharedBlobError> {
    if store.blob_content(sha256).await?.is_some() {
        return Ok(());
    }
    let io = |context| move |cause| SharedBlobError::Io { context, cause };
    let mut file = tokio::fs::File::open(local.dir().join(sha256)).await.map_err(io("open a pushed file"))?;
    let mut buf = vec![0u8; BLOB_CHUNK_BYTES];
    let (mut seq, mut size) = (0u32, 0u64);
    loop {
        let filled = fill(&mut file, &mut buf).await.map_err(io("read a pushed file"))?;
        if filled == 0 {
            break;
        }
        store.put_blob_chunk(sha256, seq, &buf[..filled]).await?;
        seq = seq.checked_add(1).ok_or_else(|| SharedBlobError::Io {
            context: "count a pushed file's chunks",
            cause: std::io::Error::other("too many chunks"),
        })?;
        size += filled as u64;
        if filled < buf.len() {
            break;
        }
    }
    store.complete_blob_content(sha256, BlobContent { size, chunks: seq }, lizard_api::ids::now_ms()).await?;
    Ok(())
}

/// Read into `buf` until it is full or the file ends; how much was read.
async fn fill(file: &mut tokio::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        let n = file.read(&mut buf[filled..]).await?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(filled)
}

/// Copy `sha256` from the store to this replica's disk unless it is there already. The
/// content streams chunk by chunk through [`BlobStore::put`] (temp file, hash check,
/// rename); one found corrupt or incomplete is forgotten in the store
/// ([`SharedBlobError::Corrupt`]), so that a new push asks for it again.
pub async fn fetch(store: Arc<dyn Store>, local: &BlobStore, sha256: &str) -> Result<(), SharedBlobError> {
    if local.has(sha256).await {
        return Ok(());
    }
    let content = store.blob_content(sha256).await?.ok_or_else(|| SharedBlobError::NotStored(sha256.to_owned()))?;
    // Why reading a chunk failed, kept typed (the upload path sees only its text).
    let failed: Arc<std::sync::Mutex<Option<ChunkError>>> = Arc::default();
    let chunks = {
        let (store, sha256, failed) = (store.clone(), sha256.to_owned(), failed.clone());
        futures_util::stream::try_unfold(0u32, move |seq| {
            let (store, sha256, failed) = (store.clone(), sha256.clone(), failed.clone());
            async move {
                if seq >= content.chunks {
                    return Ok(None);
                }
                let error = match store.blob_chunk(&sha256, seq).await {
                    Ok(Some(data)) => return Ok(Some((bytes::Bytes::from(data), seq + 1))),
                    Ok(None) => ChunkError::Missing { seq, of: content.chunks },
                    Err(e) => ChunkError::Store(e),
                };
                let text = error.to_string();
                *failed.lock().expect("the slot's lock is never poisoned") = Some(error);
                Err(text)
            }
        })
    };
    let written = local.put(sha256, std::pin::pin!(chunks), content.size).await;
    let corrupt = |reason: String| SharedBlobError::Corrupt { sha256: sha256.to_owned(), reason };
    let error = match written {
        Ok(size) if size == content.size => return Ok(()),
        Ok(size) => corrupt(format!("{size} bytes where its record says {}", content.size)),
        Err(BlobError::Mismatch { actual, .. }) => corrupt(format!("its bytes hash to {actual}")),
        Err(BlobError::TooLarge { limit }) => corrupt(format!("longer than its recorded {limit} bytes")),
        Err(BlobError::Body(reason)) => match failed.lock().expect("the slot's lock is never poisoned").take() {
            Some(ChunkError::Store(e)) => SharedBlobError::Store(e),
            Some(missing @ ChunkError::Missing { .. }) => corrupt(missing.to_string()),
            None => corrupt(reason),
        },
        Err(BlobError::Io { context, cause: source }) => {
            tracing::error!(%context, "cannot write a fetched pushed file: {source}");
            SharedBlobError::Io { context: "write a fetched pushed file", cause: source }
        }
        Err(e @ BlobError::BadHash(_)) => corrupt(e.to_string()),
    };
    if let SharedBlobError::Corrupt { reason, .. } = &error {
        tracing::warn!(sha256, %reason, "stored content of a pushed file is unusable; forgetting it");
        if let Err(e) = store.forget_blob_content(sha256).await {
            tracing::warn!(sha256, "cannot forget a corrupt stored content: {e}");
        }
    }
    Err(error)
}

/// Why one chunk of a fetch could not be read (becomes the upload path's body error).
#[derive(Debug, thiserror::Error)]
enum ChunkError {
    #[error("chunk {seq} of {of} is missing")]
    Missing { seq: u32, of: u32 },
    #[error("{0}")]
    Store(StoreError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    #[tokio::test]
    async fn a_file_of_several_chunks_goes_through_the_store_to_another_disk() {
        let store: Arc<dyn Store> = Arc::new(lizard_store::fixture::seeded_store("acc", &[]).await);
        let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (a, b) = (BlobStore::new(dir_a.path()), BlobStore::new(dir_b.path()));
        let content: Vec<u8> = (0..BLOB_CHUNK_BYTES * 2 + 3).map(|i| u8::try_from(i % 251).unwrap()).collect();
        let hash = hex::encode(Sha256::digest(&content));
        let body = futures_util::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from(content.clone()))]);
        a.put(&hash, body, u64::MAX).await.unwrap();
        assert!(matches!(fetch(store.clone(), &b, &hash).await, Err(SharedBlobError::NotStored(_))));
        share(store.as_ref(), &a, &hash).await.unwrap();
        let size = content.len() as u64;
        assert_eq!(store.blob_content(&hash).await.unwrap(), Some(BlobContent { size, chunks: 3 }));
        share(store.as_ref(), &a, &hash).await.unwrap();
        fetch(store.clone(), &b, &hash).await.unwrap();
        assert_eq!(std::fs::read(b.dir().join(&hash)).unwrap(), content);
    }
}
