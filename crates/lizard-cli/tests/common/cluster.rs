//! A cluster of real processes for the `lizard node …` tests (included by them with
//! `#[path]`, beside `mod common`): `lizard server --no-local-node` (SQLite in its data
//! directory) and `lizard node join` agents, each logging to a file of its own (printed
//! when the test fails), and calls to the server with the owner's key (an operator key:
//! unscoped, of the account made at first start).

// Helpers of these tests unwrap as the tests do (clippy.toml's allow-unwrap-in-tests
// covers only the #[test] functions themselves).
#![allow(clippy::unwrap_used)]
// Each test target uses only part of this.
#![allow(dead_code)]

use crate::common::{agent_bin, copy_accel_verdict, free_port, lizard_command};
use lizard_api::cluster::{NodeInfo, NodeState};
use reqwest::Method;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// The region the server places in and the nodes join.
pub const REGION: &str = "eu-1";
/// The heartbeat period the server gives nodes: short, so tests see reports fast.
pub const HEARTBEAT_MS: u64 = 200;

/// A child process, SIGTERMed and reaped when dropped; its log shown if the test fails.
pub struct Process {
    pub child: Child,
    log: PathBuf,
}

impl Process {
    fn spawn(mut cmd: std::process::Command, log: PathBuf) -> (Process, Option<std::process::ChildStdout>) {
        let file = std::fs::File::create(&log).unwrap();
        let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(file).spawn().unwrap();
        let stdout = child.stdout.take();
        (Process { child, log }, stdout)
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap()), sig).unwrap();
    }

    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- {}\n{}", self.log.display(), self.log());
        }
        if self.running() {
            self.signal(nix::sys::signal::Signal::SIGTERM);
            let _ = self.child.wait();
        }
    }
}

/// `lizard server --no-local-node` on a loopback port.
pub struct ControlPlane {
    pub url: String,
    pub key: String,
    pub http: reqwest::Client,
    pub process: Process,
    _dir: tempfile::TempDir,
}

impl ControlPlane {
    /// A new server whose nodes are leased for `lease_ms`; waits until it answers.
    pub async fn start(lease_ms: u64) -> ControlPlane {
        let dir = tempfile::Builder::new().prefix("lizard-cp-").tempdir().unwrap();
        let port = free_port();
        let mut cmd = lizard_command();
        cmd.arg("--data-dir").arg(dir.path()).args(["server", "--no-proxy", "--no-local-node", "--region", REGION]);
        cmd.args(["--listen", &format!("127.0.0.1:{port}")]);
        cmd.args(["--node-heartbeat-ms", &HEARTBEAT_MS.to_string(), "--node-lease-ms", &lease_ms.to_string()]);
        let (process, stdout) = Process::spawn(cmd, dir.path().join("server.log"));
        // The owner's key is the first line, printed once at the first start.
        let line = BufReader::new(stdout.unwrap()).lines().next().expect("a first line").unwrap();
        let key = line.strip_prefix("LIZARD_API_KEY=").unwrap_or_else(|| panic!("{line}")).to_owned();
        let cp = ControlPlane {
            url: format!("http://127.0.0.1:{port}"),
            key,
            http: reqwest::Client::new(),
            process,
            _dir: dir,
        };
        let start = Instant::now();
        while !cp.http.get(format!("{}/health", cp.url)).send().await.is_ok_and(|r| r.status() == 200) {
            assert!(start.elapsed() < Duration::from_secs(60), "the server did not come up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        cp
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

    /// A join token from `POST /v1/node-tokens`.
    pub async fn mint_token(&self) -> String {
        let (status, t) = self.call(Method::POST, "/v1/node-tokens", Some(json!({}))).await;
        assert_eq!(status, 201, "{t}");
        t["token"].as_str().unwrap().to_owned()
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

    /// The node whose API is at `address`, once it shows `state` (and has heartbeated).
    pub async fn wait_for(&self, address: &str, state: NodeState, secs: u64) -> NodeInfo {
        let start = Instant::now();
        loop {
            let nodes = self.nodes().await;
            if let Some(n) = nodes.iter().find(|n| n.address.as_deref() == Some(address)) {
                if n.state == state && n.last_heartbeat.is_some() {
                    return n.clone();
                }
            }
            assert!(start.elapsed() < Duration::from_secs(secs), "{address} did not show {state:?}: {nodes:?}");
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

/// `lizard node join` with its data in `data`, its API on `port`, sandbox networks named
/// from `net_prefix`; `extra` flags after the rest.
pub fn start_node(
    data: &Path,
    server: &str,
    port: u16,
    token: Option<&str>,
    net_prefix: &str,
    extra: &[&str],
) -> Process {
    copy_accel_verdict(data);
    let mut cmd = lizard_command();
    cmd.env("LIZARD_AGENT_BIN", agent_bin()).arg("--data-dir").arg(data).args(["node", "join", "--server", server]);
    cmd.args(["--region", REGION, "--listen", &format!("127.0.0.1:{port}"), "--net-prefix", net_prefix]);
    if let Some(t) = token {
        cmd.args(["--token", t]);
    }
    cmd.args(extra);
    static STARTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = STARTS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Process::spawn(cmd, data.join(format!("node-{n}.log"))).0
}

/// Wait until `done` answers true, at most `secs`.
pub async fn until<F: std::future::Future<Output = bool>>(what: &str, secs: u64, mut done: impl FnMut() -> F) {
    let start = Instant::now();
    while !done().await {
        assert!(start.elapsed() < Duration::from_secs(secs), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
