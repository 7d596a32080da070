//! Two servers on one database (SQLite and PostgreSQL, each test once per engine through
//! the store's harness): what one replica writes, the other acts on at once.

#![allow(clippy::unwrap_used)]

use lizard_server::{open_with_store, ServerConfig, Store};
use lizard_store::harness::{TestDb, TestStore};
use lizard_store::store_tests;

/// One request to a server's router: the status and the JSON body (`Null` when empty).
async fn call(
    app: &axum::Router,
    method: &str,
    uri: &str,
    key: &str,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    use tower::ServiceExt;
    let mut req = axum::http::Request::builder().method(method).uri(uri).header("x-api-key", key);
    let body = match body {
        Some(v) => {
            req = req.header("content-type", "application/json");
            axum::body::Body::from(v.to_string())
        }
        None => axum::body::Body::empty(),
    };
    let resp = app.clone().oneshot(req.body(body).unwrap()).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    (status, if bytes.is_empty() { serde_json::Value::Null } else { serde_json::from_slice(&bytes).unwrap() })
}

/// Two servers on one database: the first start bootstraps the owner once; a key made
/// through one works through the other, and a revoke through one is refused by the other
/// on its very next request (no per-replica key cache).
async fn servers_on_one_database_share_keys_and_revokes(db: TestDb) {
    let open = |store: TestStore| async move {
        let shared: std::sync::Arc<dyn Store> = std::sync::Arc::new(store.into_inner());
        open_with_store(ServerConfig::new("/nonexistent"), shared).await.unwrap()
    };
    let a = open(db.open().await).await;
    let b = open(db.open().await).await;
    let owner = a.initial_key().expect("the first start makes the owner's key").to_string();
    assert_eq!(b.initial_key(), None, "the second replica finds the owner made");
    let (a, b) = (a.router(), b.router());
    assert_eq!(call(&b, "GET", "/v1/whoami", &owner, None).await.0, 200);
    let (status, made) = call(&a, "POST", "/v1/api-keys", &owner, Some(serde_json::json!({"name": "ci"}))).await;
    assert_eq!(status, 201, "{made}");
    let key = made["key"].as_str().unwrap();
    assert_eq!(call(&b, "GET", "/v1/whoami", key, None).await.0, 200, "made on A, accepted by B");
    let (status, _) = call(&b, "DELETE", &format!("/v1/api-keys/{}", made["id"].as_str().unwrap()), &owner, None).await;
    assert!((200..300).contains(&status), "{status}");
    for replica in [&a, &b] {
        assert_eq!(call(replica, "GET", "/v1/whoami", key, None).await.0, 401, "revoked on B, refused everywhere");
    }
}

store_tests!(servers_on_one_database_share_keys_and_revokes);
