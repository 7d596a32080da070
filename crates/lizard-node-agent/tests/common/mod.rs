//! What the agent's tests share: the real control plane (`lizard_server::run` with no
//! node of its own, SQLite in a temp directory) on a loopback port, and calls to it with
//! the owner's key (an operator key: unscoped, of the account made at first start).

// Each test target is its own crate and uses only part of this.
#![allow(dead_code)]

use lizard_api::cluster::NodeInfo;
use lizard_server::run::{run, RunOptions};
use lizard_server::{ServerConfig, ServerError};
use reqwest::Method;
use serde_json::{json, Value};
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The region the server places in and the agents join.
pub const REGION: &str = "eu-1";
/// The heartbeat period the server gives nodes: short, so tests see reports fast.
pub const HEARTBEAT_MS: u64 = 200;

/// `lizard server --no-local-node` in this process, until stopped or dropped.
pub struct ControlPlane {
    pub url: String,
    pub key: String,
    pub http: reqwest::Client,
    config: ServerConfig,
    running: Option<Running>,
    _dir: tempfile::TempDir,
}

struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    /// `run`'s future is not provably `Send` (sqlx's executors), so it runs on a thread
    /// and runtime of its own, as `lizard server`'s main does.
    thread: std::thread::JoinHandle<Result<(), ServerError>>,
}

impl ControlPlane {
    /// A new server on a free port, nodes leased for `lease_ms`.
    pub async fn start(lease_ms: u64) -> ControlPlane {
        Self::start_on(free_port(), lease_ms).await
    }

    /// A new server on `port`.
    pub async fn start_on(port: u16, lease_ms: u64) -> ControlPlane {
        let dir = tempfile::Builder::new().prefix("lizard-cp-").tempdir().unwrap();
        let mut config = ServerConfig::new(dir.path());
        config.listen = ([127, 0, 0, 1], port).into();
        config.region = REGION.into();
        config.cluster.heartbeat_ms = HEARTBEAT_MS;
        config.cluster.lease_ms = lease_ms;
        // The first open makes the owner and hands out its key (`run` would print it).
        let key = lizard_server::open(config.clone()).await.unwrap().initial_key().expect("first start").to_owned();
        let mut cp = ControlPlane {
            url: format!("http://127.0.0.1:{port}"),
            key,
            http: reqwest::Client::new(),
            config,
            running: None,
            _dir: dir,
        };
        cp.resume().await;
        cp
    }

    /// Serve again (same store, same port) after [`ControlPlane::stop`].
    pub async fn resume(&mut self) {
        assert!(self.running.is_none(), "already serving");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let opts = RunOptions {
            server: self.config.clone(),
            node: lizard_node::NodeConfig::new(self.data_dir().join("unused-node")),
            proxy_listen: None,
            proxy_tls: None,
            proxy_limits: Default::default(),
            local_node: false,
            node_connector: None,
            faces: Default::default(),
        };
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            rt.block_on(run(opts, async move {
                let _ = stopped.await;
            }))
        });
        let health = format!("{}/health", self.url);
        let start = Instant::now();
        while !self.http.get(&health).send().await.is_ok_and(|r| r.status() == 200) {
            assert!(!thread.is_finished(), "the server stopped: {:?}", thread.join());
            assert!(start.elapsed() < Duration::from_secs(30), "the server did not come up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.running = Some(Running { stop, thread });
    }

    /// Stop serving (a clean shutdown); the store stays for [`ControlPlane::resume`].
    pub async fn stop(&mut self) {
        let Running { stop, thread } = self.running.take().expect("serving");
        let _ = stop.send(());
        tokio::task::spawn_blocking(move || thread.join()).await.unwrap().unwrap().unwrap();
    }

    pub fn data_dir(&self) -> PathBuf {
        self.config.data_dir.clone()
    }

    /// A JSON call with the owner's key: status and body (`null` when empty or not JSON).
    pub async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let req = self.http.request(method, format!("{}{path}", self.url)).header("x-api-key", &self.key);
        let req = match body {
            Some(b) => req.json(&b),
            None => req,
        };
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// A single-use join token from `POST /v1/node-tokens`: (its id, the token).
    pub async fn mint_token(&self) -> (String, String) {
        self.mint_token_for(1).await
    }

    /// A join token for `uses` nodes.
    pub async fn mint_token_for(&self, uses: u32) -> (String, String) {
        let (status, t) = self.call(Method::POST, "/v1/node-tokens", Some(json!({"uses": uses}))).await;
        assert_eq!(status, 201, "{t}");
        (t["id"].as_str().unwrap().to_owned(), t["token"].as_str().unwrap().to_owned())
    }

    /// `GET /v1/nodes`.
    pub async fn nodes(&self) -> Vec<NodeInfo> {
        let (status, nodes) = self.call(Method::GET, "/v1/nodes", None).await;
        assert_eq!(status, 200, "{nodes}");
        serde_json::from_value(nodes).unwrap()
    }

    /// `GET /v1/nodes/{id}`.
    pub async fn node(&self, id: &str) -> NodeInfo {
        let (status, node) = self.call(Method::GET, &format!("/v1/nodes/{id}"), None).await;
        assert_eq!(status, 200, "{node}");
        serde_json::from_value(node).unwrap()
    }

    /// The node whose API is at `address`, once it shows `up`.
    pub async fn wait_up(&self, address: &str, secs: u64) -> NodeInfo {
        let start = Instant::now();
        loop {
            let nodes = self.nodes().await;
            if let Some(n) = nodes.iter().find(|n| n.address.as_deref() == Some(address)) {
                if n.state == lizard_api::cluster::NodeState::Up && n.last_heartbeat.is_some() {
                    return n.clone();
                }
            }
            assert!(start.elapsed() < Duration::from_secs(secs), "{address} did not come up: {nodes:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A workspace and a project in it: the project's id.
    pub async fn project(&self) -> String {
        let (status, ws) = self.call(Method::POST, "/v1/workspaces", Some(json!({"name": "w"}))).await;
        assert_eq!(status, 201, "{ws}");
        let body = json!({"workspaceId": ws["id"], "name": "p"});
        let (status, p) = self.call(Method::POST, "/v1/projects", Some(body)).await;
        assert_eq!(status, 201, "{p}");
        p["id"].as_str().unwrap().to_owned()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            let _ = r.stop.send(());
        }
    }
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Wait until `done` answers true, at most `secs`.
pub async fn until<F: Future<Output = bool>>(what: &str, secs: u64, mut done: impl FnMut() -> F) {
    let start = Instant::now();
    while !done().await {
        assert!(start.elapsed() < Duration::from_secs(secs), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `node.json` of the agent whose data directory is `dir`: (node id, credential). The
/// server records a join before the agent has its answer and writes it down, so a node
/// seen up may still be a moment from its file: waited for, at most 10 s.
pub fn kept(dir: &std::path::Path) -> (String, String) {
    let path = dir.join("node.json");
    let start = Instant::now();
    while !path.exists() {
        assert!(start.elapsed() < Duration::from_secs(10), "no {} after 10 s", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    let kept: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    (kept["nodeId"].as_str().unwrap().to_owned(), kept["credential"].as_str().unwrap().to_owned())
}

/// A TCP forwarder from a loopback port to a node's API, which a test can cut (every
/// connection closed, new ones closed at once) and heal: a network partition between the
/// control plane and a node (the node's own calls to the server still go through).
pub struct Partition {
    pub addr: std::net::SocketAddr,
    open: tokio::sync::watch::Sender<bool>,
}

impl Partition {
    pub async fn start(to: std::net::SocketAddr) -> Partition {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (open, watch) = tokio::sync::watch::channel(true);
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else { continue };
                if !*watch.borrow() {
                    continue;
                }
                let mut cut = watch.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.wait_for(|open| !*open) => {}
                    }
                });
            }
        });
        Partition { addr, open }
    }

    pub fn cut(&self) {
        self.open.send_replace(false);
    }

    pub fn heal(&self) {
        self.open.send_replace(true);
    }
}
