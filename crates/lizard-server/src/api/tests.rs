//! Handler tests through the router (`tower::ServiceExt::oneshot`) on an in-memory store.

use crate::{open_with_store, ServerConfig, SqlStore};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use serde_json::{json, Value};
use std::sync::Arc;
use tower::ServiceExt;

struct T {
    app: Router,
    key: String,
}

async fn setup() -> T {
    let store = SqlStore::memory().await.unwrap();
    let server = open_with_store(ServerConfig::new("/nonexistent"), Arc::new(store)).await.unwrap();
    let key = server.initial_key().expect("first start").to_string();
    T { app: server.router(), key }
}

impl T {
    async fn call(&self, method: &str, uri: &str, key: Option<&str>, body: Option<Value>) -> (StatusCode, Value) {
        let mut req = Request::builder().method(method).uri(uri);
        if let Some(k) = key {
            req = req.header("x-api-key", k);
        }
        let body = match body {
            Some(v) => {
                req = req.header("content-type", "application/json");
                Body::from(v.to_string())
            }
            None => Body::empty(),
        };
        let resp = self.app.clone().oneshot(req.body(body).unwrap()).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
        let v = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
        };
        if !status.is_success() {
            let obj = v.as_object().unwrap_or_else(|| panic!("{method} {uri}: error body is not an object: {v}"));
            assert_eq!(obj.len(), 2, "{method} {uri}: error body has exactly code and message: {v}");
            assert!(obj["code"].is_string() && obj["message"].is_string(), "{v}");
        }
        (status, v)
    }

    async fn ok(&self, method: &str, uri: &str, key: &str, body: Option<Value>) -> Value {
        let (s, v) = self.call(method, uri, Some(key), body).await;
        assert!(s.is_success(), "{method} {uri}: {s} {v}");
        v
    }
}

#[tokio::test]
async fn health_and_openapi_need_no_key_everything_else_does() {
    let t = setup().await;
    let (s, v) = t.call("GET", "/health", None, None).await;
    assert_eq!((s, v), (StatusCode::OK, json!("ok")));
    let (s, doc) = t.call("GET", "/openapi.json", None, None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(doc["paths"]["/v1/workspaces"].is_object());
    for uri in ["/v1/workspaces", "/v1/projects", "/v1/api-keys", "/v1/whoami", "/v1/account", "/v1/regions"] {
        let (s, v) = t.call("GET", uri, None, None).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{uri}");
        assert_eq!(v["code"], "UNAUTHENTICATED");
        let (s, _) = t.call("GET", uri, Some("lz_nope"), None).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{uri}");
        let forged = format!("lz_{}", "A".repeat(43));
        let (s, _) = t.call("GET", uri, Some(&forged), None).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{uri}");
    }
    // Same-prefix forgery: right lookup prefix, wrong rest.
    let forged = format!("{}{}", &t.key[..11], "0".repeat(t.key.len() - 11));
    assert_eq!(t.call("GET", "/v1/whoami", Some(&forged), None).await.0, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn unknown_routes_and_bad_bodies_answer_code_and_message() {
    let t = setup().await;
    let (s, v) = t.call("GET", "/v1/nothing", Some(&t.key), None).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::NOT_FOUND, Some("NOT_FOUND")));
    let (s, _) = t.call("PUT", "/v1/regions", Some(&t.key), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    for body in [json!({"name": "a", "color": "red"}), json!({}), json!({"name": 5}), json!("x")] {
        let (s, v) = t.call("POST", "/v1/workspaces", Some(&t.key), Some(body.clone())).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(v["code"], "INVALID_ARGUMENT");
    }
    let (s, _) = t.call("POST", "/v1/workspaces", Some(&t.key), Some(json!({"name": "!!!"}))).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "a name without a slug");
    let (s, _) = t.call("DELETE", "/v1/workspaces/ws_x?force=maybe", Some(&t.key), None).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let (s, _) = t.call("GET", "/v1/projects?workspace=x", Some(&t.key), None).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "unknown query parameter");
}

#[tokio::test]
async fn workspaces_and_projects_by_id_slug_or_name() {
    let t = setup().await;
    let ws = t.ok("POST", "/v1/workspaces", &t.key, Some(json!({"name": "User 42"}))).await;
    assert_eq!(ws["slug"], "user-42");
    let id = ws["id"].as_str().unwrap();
    for k in [id, "user-42", "User 42"] {
        let found = t.ok("GET", &format!("/v1/workspaces/{}", k.replace(' ', "%20")), &t.key, None).await;
        assert_eq!(found["id"], id);
    }
    let (s, v) = t.call("POST", "/v1/workspaces", Some(&t.key), Some(json!({"name": "user 42"}))).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::CONFLICT, Some("CONFLICT")), "same slug");

    let p = t.ok("POST", "/v1/projects", &t.key, Some(json!({"workspaceId": id, "name": "My Project"}))).await;
    assert_eq!((p["slug"].as_str(), p["workspaceId"].as_str()), (Some("my-project"), Some(id)));
    let pid = p["id"].as_str().unwrap();
    assert_eq!(t.ok("GET", "/v1/projects/my-project", &t.key, None).await["id"], pid);
    let renamed = t.ok("PATCH", &format!("/v1/projects/{pid}"), &t.key, Some(json!({"name": "Renamed"}))).await;
    assert_eq!((renamed["name"].as_str(), renamed["slug"].as_str()), (Some("Renamed"), Some("my-project")));
    assert_eq!(t.ok("GET", "/v1/projects/Renamed", &t.key, None).await["id"], pid);
    let (s, _) = t.call("PATCH", &format!("/v1/projects/{pid}"), Some(&t.key), Some(json!({"slug": "x"}))).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);

    // The same slug in a second workspace makes the slug ambiguous, not the id.
    let ws2 = t.ok("POST", "/v1/workspaces", &t.key, Some(json!({"name": "other"}))).await;
    t.ok("POST", "/v1/projects", &t.key, Some(json!({"workspaceId": ws2["id"], "name": "my project"}))).await;
    let (s, _) = t.call("GET", "/v1/projects/my-project", Some(&t.key), None).await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert_eq!(t.ok("GET", &format!("/v1/projects/{pid}"), &t.key, None).await["id"], pid);
    let listed = t.ok("GET", &format!("/v1/projects?workspaceId={id}"), &t.key, None).await;
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(t.ok("GET", "/v1/projects", &t.key, None).await.as_array().unwrap().len(), 2);
    let (s, _) = t.call("GET", "/v1/projects?workspaceId=ws_nope", Some(&t.key), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) =
        t.call("POST", "/v1/projects", Some(&t.key), Some(json!({"workspaceId": "ws_nope", "name": "x"}))).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn whoami_account_and_regions() {
    let t = setup().await;
    let me = t.ok("GET", "/v1/whoami", &t.key, None).await;
    assert_eq!(me["scoped"], false);
    assert_eq!(me["email"], "owner@lizard.localhost");
    assert_eq!(me["plan"], "free");
    assert_eq!(me["keyName"], "owner");
    assert!(me.get("workspaces").is_none());
    let acc = t.ok("GET", "/v1/account", &t.key, None).await;
    assert_eq!(acc["id"], me["accountId"]);

    let ws = t.ok("POST", "/v1/workspaces", &t.key, Some(json!({"name": "w"}))).await;
    let k = t.ok("POST", "/v1/api-keys", &t.key, Some(json!({"name": "s", "workspaces": [ws["id"]]}))).await;
    let scoped = k["key"].as_str().unwrap();
    let me = t.ok("GET", "/v1/whoami", scoped, None).await;
    let obj = me.as_object().unwrap();
    for absent in ["email", "plan", "balance"] {
        assert!(!obj.contains_key(absent), "{absent} in {me}");
    }
    assert_eq!(me["scoped"], true);
    assert_eq!(me["workspaces"], json!([ws["id"]]));
    assert_eq!(me["projects"], json!([]));
    let (s, v) = t.call("GET", "/v1/account", Some(scoped), None).await;
    assert_eq!((s, v["code"].as_str()), (StatusCode::FORBIDDEN, Some("ACCOUNT_SCOPE_REQUIRED")));

    let regions = t.ok("GET", "/v1/regions", scoped, None).await;
    assert_eq!(regions, json!([{"id": "local", "name": "local", "sandboxDomain": "sandbox.local.lizard.localhost"}]));
}

#[tokio::test]
async fn key_scope_input_rules() {
    let t = setup().await;
    let (s, _) = t.call("POST", "/v1/api-keys", Some(&t.key), Some(json!({"name": "e", "workspaces": []}))).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "an empty scope is refused, not read as unscoped");
    let (s, _) =
        t.call("POST", "/v1/api-keys", Some(&t.key), Some(json!({"name": "e", "workspaces": ["ws_nope"]}))).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) =
        t.call("POST", "/v1/api-keys", Some(&t.key), Some(json!({"name": "e", "projects": ["prj_nope"]}))).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let unscoped = t.ok("POST", "/v1/api-keys", &t.key, Some(json!({"name": "full"}))).await;
    assert_eq!((unscoped["workspaces"].clone(), unscoped["projects"].clone()), (Value::Null, Value::Null));
    assert!(unscoped["key"].as_str().unwrap().starts_with("lz_"));
    let listed = t.ok("GET", "/v1/api-keys", &t.key, None).await;
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|k| k.get("key").is_none()), "never the key itself");
    assert_eq!(listed[1]["prefix"], unscoped["key"].as_str().unwrap()[..11]);

    // The last unscoped key cannot go; a second one can.
    let owner_id = t.ok("GET", "/v1/whoami", &t.key, None).await["keyId"].as_str().unwrap().to_string();
    t.ok("DELETE", &format!("/v1/api-keys/{}", unscoped["id"].as_str().unwrap()), &t.key, None).await;
    let (s, _) = t.call("DELETE", &format!("/v1/api-keys/{owner_id}"), Some(&t.key), None).await;
    assert_eq!(s, StatusCode::CONFLICT);
    let (s, _) = t.call("GET", "/v1/whoami", Some(unscoped["key"].as_str().unwrap()), None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}
