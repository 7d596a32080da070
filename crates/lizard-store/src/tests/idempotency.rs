//! Idempotency keys: claimed once, replayed, released, expired.

use crate::harness::TestDb;
use crate::idempotency::*;
use crate::store_tests;

async fn a_claim_is_answered_once_then_replayed_until_it_expires(db: TestDb) {
    let store = db.open().await;
    let id = IdempotencyId { key_id: "key_1".into(), route: "POST /v1/sandboxes".into(), idem_key: "k".into() };
    assert_eq!(store.claim_idempotent(&id, b"h", 100, 0).await.unwrap(), None, "first: claimed");
    let again = store.claim_idempotent(&id, b"h", 101, 0).await.unwrap();
    assert_eq!(again, Some(IdempotencyEntry::InProgress { request_hash: b"h".to_vec() }));
    let answer = StoredAnswer { status: 201, content_type: Some("application/json".into()), body: b"{}".to_vec() };
    store.finish_idempotent(&id, &answer).await.unwrap();
    let done = store.claim_idempotent(&id, b"other", 102, 0).await.unwrap();
    assert_eq!(done, Some(IdempotencyEntry::Done { request_hash: b"h".to_vec(), answer }));
    let other_key = IdempotencyId { key_id: "key_2".into(), ..id.clone() };
    assert_eq!(store.claim_idempotent(&other_key, b"h", 103, 0).await.unwrap(), None, "keys never share");
    store.release_idempotent(&other_key).await.unwrap();
    assert_eq!(store.claim_idempotent(&other_key, b"h", 104, 0).await.unwrap(), None, "released: claimable");
    assert_eq!(store.claim_idempotent(&id, b"h", 200, 150).await.unwrap(), None, "expired: claimable again");
}

store_tests!(a_claim_is_answered_once_then_replayed_until_it_expires);
