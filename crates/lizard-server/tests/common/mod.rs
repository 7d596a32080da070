//! Test helpers: a real server on 127.0.0.1:0 with a SQLite file in a temp dir, talked to
//! over HTTP, and an in-process router for fast property tests. Both check on every
//! answer that an error body is exactly `{code, message}`.

#![allow(dead_code)]

use axum::Router;
use lizard_server::{ServerConfig, ServerState};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

/// Panics unless `v` is an error body: an object with exactly a string `code` and a
/// string `message`.
pub fn assert_error_shape(what: &str, status: u16, v: &Value) {
    let obj = v.as_object().unwrap_or_else(|| panic!("{what}: {status} body is not an object: {v}"));
    assert_eq!(obj.len(), 2, "{what}: error body must be exactly {{code, message}}: {v}");
    assert!(obj["code"].is_string() && obj["message"].is_string(), "{what}: {v}");
    let code: lizard_api::ErrorCode = serde_json::from_value(obj["code"].clone()).expect("a known code");
    assert_eq!(code.status(), status, "{what}: status and code disagree: {v}");
}

/// JSON, or a plain-text body as a string (`/health`), or Null when empty.
fn body_value(bytes: &[u8]) -> Value {
    if bytes.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

/// A running server.
pub struct Running {
    pub base: String,
    pub addr: SocketAddr,
    pub initial_key: Option<String>,
    pub state: ServerState,
    client: reqwest::Client,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// Start on a free loopback port with the data directory `dir`; `with_state` may
/// install a reaper.
pub async fn start(dir: &Path, with_state: impl FnOnce(ServerState) -> ServerState) -> Running {
    let mut config = ServerConfig::new(dir);
    config.listen = "127.0.0.1:0".parse().unwrap();
    let server = lizard_server::open(config).await.expect("open");
    let initial_key = server.initial_key().map(str::to_string);
    let listener = server.bind().await.expect("bind");
    let addr = listener.local_addr().unwrap();
    let state = with_state(server.state().clone());
    let router = lizard_server::router(state.clone());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        lizard_server::serve(listener, router, async move {
            let _ = rx.await;
        })
        .await
        .expect("serve");
    });
    // Never through a proxy from the environment: loopback only.
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    Running { base: format!("http://{addr}"), addr, initial_key, state, client, stop: Some(tx), task: Some(task) }
}

impl Running {
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.unwrap();
        }
    }

    /// One request; returns (status, JSON body or Null), checking error shapes.
    pub async fn call(&self, method: &str, path: &str, key: Option<&str>, body: Option<Value>) -> (u16, Value) {
        let mut req = self.client.request(method.parse().unwrap(), format!("{}{path}", self.base));
        if let Some(k) = key {
            req = req.header("X-API-Key", k);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.unwrap();
        let v = body_value(&bytes);
        if status >= 400 {
            assert_error_shape(&format!("{method} {path}"), status, &v);
        }
        (status, v)
    }

    /// A request that must succeed.
    pub async fn ok(&self, method: &str, path: &str, key: &str, body: Option<Value>) -> Value {
        let (s, v) = self.call(method, path, Some(key), body).await;
        assert!((200..300).contains(&s), "{method} {path}: {s} {v}");
        v
    }

    /// A request that must fail with `status` and `code`.
    pub async fn fails(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
        status: u16,
        code: &str,
    ) {
        let (s, v) = self.call(method, path, key, body).await;
        assert_eq!((s, v["code"].as_str().unwrap_or("")), (status, code), "{method} {path}: {v}");
    }
}

/// An in-process router on an in-memory store (property tests).
pub struct InProcess {
    pub app: Router,
    pub state: ServerState,
    pub owner_key: String,
}

pub async fn in_process() -> InProcess {
    let store = lizard_server::SqliteStore::memory().await.unwrap();
    let server = lizard_server::open_with_store(ServerConfig::new("/nonexistent"), Arc::new(store)).await.unwrap();
    InProcess {
        app: server.router(),
        state: server.state().clone(),
        owner_key: server.initial_key().unwrap().to_string(),
    }
}

impl InProcess {
    pub async fn call(&self, method: &str, path: &str, key: &str, body: Option<Value>) -> (u16, Value) {
        use tower::ServiceExt;
        let mut req = axum::http::Request::builder().method(method).uri(path).header("x-api-key", key);
        let body = match body {
            Some(b) => {
                req = req.header("content-type", "application/json");
                axum::body::Body::from(b.to_string())
            }
            None => axum::body::Body::empty(),
        };
        let resp = self.app.clone().oneshot(req.body(body).unwrap()).await.unwrap();
        let status = resp.status().as_u16();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
        let v = body_value(&bytes);
        if status >= 400 {
            assert_error_shape(&format!("{method} {path}"), status, &v);
        }
        (status, v)
    }
}
