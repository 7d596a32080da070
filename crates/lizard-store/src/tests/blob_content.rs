//! Pushed files' content in the store: written in chunks, used only once complete,
//! re-uploaded idempotently, forgotten when found corrupt.

use crate::blob_content::*;
use crate::harness::TestDb;
use crate::store_tests;
use crate::StoreError;

const HASH: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const OTHER: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

async fn content_round_trips_in_chunks(db: TestDb) {
    let store = db.open().await;
    let big = vec![7u8; BLOB_CHUNK_BYTES];
    store.put_blob_chunk(HASH, 0, &big).await.unwrap();
    store.put_blob_chunk(HASH, 1, b"tail").await.unwrap();
    let size = u64::try_from(BLOB_CHUNK_BYTES).unwrap() + 4;
    let content = BlobContent { size, chunks: 2 };
    store.complete_blob_content(HASH, content, 10).await.unwrap();
    assert_eq!(store.blob_content(HASH).await.unwrap(), Some(content));
    assert_eq!(store.blob_chunk(HASH, 0).await.unwrap().unwrap(), big);
    assert_eq!(store.blob_chunk(HASH, 1).await.unwrap().unwrap(), b"tail");
    assert_eq!(store.blob_chunk(HASH, 2).await.unwrap(), None);
    let asked = [HASH.to_owned(), OTHER.to_owned()];
    assert_eq!(store.complete_blobs(&asked).await.unwrap(), [HASH.to_owned()].into_iter().collect());
    // A second handle (another replica) sees the same.
    let replica = db.open().await;
    assert_eq!(replica.blob_content(HASH).await.unwrap(), Some(content));
}

async fn a_partial_upload_is_never_complete(db: TestDb) {
    let store = db.open().await;
    store.put_blob_chunk(HASH, 0, b"first").await.unwrap();
    // Chunk 1 never came (the uploading replica died): nothing may mark it complete.
    let claimed = BlobContent { size: 10, chunks: 2 };
    let refused = store.complete_blob_content(HASH, claimed, 10).await.unwrap_err();
    assert!(matches!(refused, StoreError::Conflict(_)), "{refused:?}");
    assert_eq!(store.blob_content(HASH).await.unwrap(), None);
    assert!(store.complete_blobs(&[HASH.to_owned()]).await.unwrap().is_empty());
    // Every chunk there but a size that does not add up: refused too.
    store.put_blob_chunk(HASH, 1, b"second").await.unwrap();
    let wrong_size = BlobContent { size: 10, chunks: 2 };
    assert!(matches!(store.complete_blob_content(HASH, wrong_size, 10).await, Err(StoreError::Conflict(_))));
    assert_eq!(store.blob_content(HASH).await.unwrap(), None);
}

async fn a_reupload_is_idempotent_and_a_forget_asks_again(db: TestDb) {
    let store = db.open().await;
    let content = BlobContent { size: 5, chunks: 1 };
    for at in [10, 20] {
        store.put_blob_chunk(HASH, 0, b"hello").await.unwrap();
        store.complete_blob_content(HASH, content, at).await.unwrap();
        assert_eq!(store.blob_content(HASH).await.unwrap(), Some(content));
        assert_eq!(store.blob_chunk(HASH, 0).await.unwrap().unwrap(), b"hello");
    }
    // An empty file is one complete blob of no chunks.
    store.complete_blob_content(OTHER, BlobContent { size: 0, chunks: 0 }, 30).await.unwrap();
    assert_eq!(store.blob_content(OTHER).await.unwrap(), Some(BlobContent { size: 0, chunks: 0 }));
    store.forget_blob_content(HASH).await.unwrap();
    assert_eq!(store.blob_content(HASH).await.unwrap(), None);
    assert_eq!(store.blob_chunk(HASH, 0).await.unwrap(), None);
    store.forget_blob_content(HASH).await.unwrap();
    assert_eq!(store.blob_content(OTHER).await.unwrap().map(|c| c.size), Some(0), "others untouched");
}

store_tests!(
    content_round_trips_in_chunks,
    a_partial_upload_is_never_complete,
    a_reupload_is_idempotent_and_a_forget_asks_again
);
