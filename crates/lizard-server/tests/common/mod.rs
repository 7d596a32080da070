//! Test helpers, shared by every integration test:
//! - [`Api`]: the full control plane (every route, the node in process, optionally the
//!   sandbox-URL proxy, the timeout reaper and metering) on 127.0.0.1:0 with its own data
//!   directory, built with [`Api::builder`];
//! - [`start`]: the tenancy API alone on a real SQLite file;
//! - [`in_process`]: the tenancy router on an in-memory store, for fast property tests.
//!
//! All of them check on every answer that an error body is exactly `{code, message}`.

// Helpers of these tests unwrap as the tests do (clippy.toml's allow-unwrap-in-tests
// covers only the #[test] functions themselves).
#![allow(clippy::unwrap_used)]
#![allow(dead_code)]

use axum::Router;
use lizard_node_client::Nodes;
use lizard_server::billing::BillingConfig;
use lizard_server::{AppState, ServerConfig, ServerState};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

/// The data directory of the machine's one image store (outside the checkout: a fresh
/// clone reuses its images).
pub use lizard_node::shared_image_root as image_root;

/// How to start an [`Api`]: which background parts run beside the routes.
pub struct ApiBuilder {
    prefix: &'static str,
    proxy: bool,
    reaper: bool,
    metering: bool,
    billing: BillingConfig,
}

impl ApiBuilder {
    /// Also serve sandbox URLs (the proxy) on a loopback port of its own.
    pub fn proxy(mut self) -> Self {
        self.proxy = true;
        self
    }

    /// Also run the timeout reaper.
    pub fn reaper(mut self) -> Self {
        self.reaper = true;
        self
    }

    /// Bill with `config` and run the metering task.
    pub fn metering(mut self, config: BillingConfig) -> Self {
        self.billing = config;
        self.metering = true;
        self
    }

    pub async fn start(self) -> Api {
        let dir = tempfile::Builder::new().prefix(self.prefix).tempdir().unwrap();
        let mut config = ServerConfig::new(dir.path());
        config.listen = "127.0.0.1:0".parse().unwrap();
        config.billing = self.billing;
        let server = lizard_server::open(config).await.unwrap();
        let owner = server.initial_key().expect("first start").to_string();
        let mut node_config = lizard_node::NodeConfig::new(dir.path().join("node"));
        node_config.image_root = image_root();
        let node = lizard_node::Node::start(node_config).await.unwrap();
        let state = server.app_state(Nodes::local(node.clone()));
        let listener = server.bind().await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        if self.reaper {
            tokio::spawn(lizard_server::ops::timeouts::reap_expired(state.clone()));
        }
        if self.metering {
            tokio::spawn(lizard_server::billing::run_metering(
                state.server.store.clone(),
                state.server.config.billing.clone(),
                Arc::new(lizard_server::ops::hooks::BillingPauser(state.clone())),
            ));
        }
        let router = lizard_server::build_router(state.clone(), lizard_server::api::all_routes());
        tokio::spawn(lizard_server::serve(listener, router, std::future::pending()));
        let proxy = if self.proxy {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            tokio::spawn(lizard_server::serve(l, lizard_server::proxy::router(state.clone()), std::future::pending()));
            Some(addr)
        } else {
            None
        };
        // Never through a proxy from the environment: loopback only.
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let mut api = Api { base, proxy, client, state, node, owner, account: String::new(), dir };
        let owner = api.owner.clone();
        api.account = api.ok("GET", "/v1/whoami", &owner, None).await["accountId"].as_str().unwrap().into();
        api
    }
}

/// The full control plane with the node in process, over HTTP on loopback.
pub struct Api {
    pub base: String,
    /// The sandbox-URL proxy, when the builder asked for it.
    pub proxy: Option<SocketAddr>,
    pub client: reqwest::Client,
    pub state: AppState,
    /// The node itself, for what only the host can see (its VMs, their processes).
    pub node: Arc<lizard_node::Node>,
    /// The owner's unscoped key and account.
    pub owner: String,
    pub account: String,
    pub dir: tempfile::TempDir,
}

impl Api {
    /// Routes, node and nothing else running; `prefix` names the data directory.
    pub fn builder(prefix: &'static str) -> ApiBuilder {
        ApiBuilder { prefix, proxy: false, reaper: false, metering: false, billing: BillingConfig::default() }
    }

    /// The proxy's address (the builder must have asked for it).
    pub fn proxy_addr(&self) -> SocketAddr {
        self.proxy.expect("started with .proxy()")
    }

    /// One request; returns (status, JSON body, or the body as a string, or Null when
    /// empty), checking error shapes.
    pub async fn call(&self, method: &str, path: &str, key: &str, body: Option<Value>) -> (u16, Value) {
        http_call(&self.client, &self.base, method, path, Some(key), body).await
    }

    /// A request that must succeed.
    pub async fn ok(&self, method: &str, path: &str, key: &str, body: Option<Value>) -> Value {
        let (status, v) = self.call(method, path, key, body).await;
        assert!((200..300).contains(&status), "{method} {path}: {status} {v}");
        v
    }

    /// A request that must fail with `code`; returns its message.
    pub async fn fails(&self, method: &str, path: &str, key: &str, body: Option<Value>, code: &str) -> String {
        let (status, v) = self.call(method, path, key, body).await;
        assert_eq!(v["code"], code, "{method} {path}: {status} {v}");
        v["message"].as_str().unwrap_or_default().to_string()
    }

    /// Run a shell command in a sandbox; (exit code, stdout, stderr).
    pub async fn sh(&self, key: &str, id: &str, cmd: &str) -> (i64, String, String) {
        let r = self.ok("POST", &format!("/v1/sandboxes/{id}/exec"), key, Some(json!({"cmd": cmd}))).await;
        (r["exitCode"].as_i64().unwrap(), r["stdout"].as_str().unwrap().into(), r["stderr"].as_str().unwrap().into())
    }
}

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
/// One request to `base`, with `key` if given; returns (status, JSON body, or the body as
/// a string, or Null when empty), checking error shapes.
async fn http_call(
    client: &reqwest::Client,
    base: &str,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = client.request(method.parse().unwrap(), format!("{base}{path}"));
    if let Some(k) = key {
        req = req.header("x-api-key", k);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    answer(method, path, status, &resp.bytes().await.unwrap())
}

/// An answer as (status, body value), its error shape checked.
fn answer(method: &str, path: &str, status: u16, bytes: &[u8]) -> (u16, Value) {
    let v = body_value(bytes);
    if status >= 400 {
        assert_error_shape(&format!("{method} {path}"), status, &v);
    }
    (status, v)
}

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
        http_call(&self.client, &self.base, method, path, key, body).await
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
    let store = lizard_server::SqlStore::memory().await.unwrap();
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
        answer(method, path, status, &axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap())
    }
}
