//! A fleet on one host: a PostgreSQL database of its own, `lizard server` replicas with no
//! node of their own behind a [`Balancer`], and `lizard node join` agents (each with its
//! own data directory, API port and network prefix) that reach the replicas through it.

use crate::balancer::Balancer;
use crate::database::Database;
use crate::process::Process;
use lizard_attacks::leftovers;
use lizard_attacks::system::{free_port, image_root};
use reqwest::Method;
use serde_json::{json, Value};
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long a process may take to listen, and the nodes to join.
const START_DEADLINE: Duration = Duration::from_secs(90);
/// Heartbeat period and lease the replicas give nodes: short, so a lost node shows fast.
pub const HEARTBEAT_MS: u64 = 1000;
pub const LEASE_MS: u64 = 4000;

/// One `lizard server --no-local-node`.
pub struct Replica {
    pub process: Process,
    pub api_addr: SocketAddr,
    /// Base URL of its API.
    pub api: String,
    /// Its sandbox-URL proxy.
    pub proxy: SocketAddr,
    _dir: tempfile::TempDir,
}

/// One `lizard node join`.
pub struct NodeAgent {
    pub process: Process,
    pub dir: tempfile::TempDir,
    /// Where its API listens.
    pub listen: SocketAddr,
    /// Prefix of its network namespaces and host links.
    pub net_prefix: String,
    /// Its id, once joined.
    pub id: String,
}

/// What a node left on the host, from the kernel's view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostCounts {
    pub vmms: usize,
    pub netns: usize,
    pub links: usize,
    /// Volume disks (`<id>.img`).
    pub volumes: usize,
}

pub struct Fleet {
    pub db: Database,
    pub replicas: Vec<Replica>,
    pub balancer: Balancer,
    pub nodes: Vec<NodeAgent>,
    /// The owner key (an operator key: unscoped, of the owner account).
    pub key: String,
    pub project: String,
    pub http: reqwest::Client,
}

impl Fleet {
    /// `replicas` servers on one new database and `nodes` joined agents, all up.
    pub async fn start(replicas: usize, nodes: usize) -> Fleet {
        let db = Database::create();
        let (first, key) = start_replica(&db.url, true).await;
        let mut all = vec![first];
        for _ in 1..replicas {
            all.push(start_replica(&db.url, false).await.0);
        }
        let balancer = Balancer::start(all.iter().map(|r| r.api_addr).collect()).await;
        let mut fleet = Fleet {
            db,
            replicas: all,
            balancer,
            nodes: Vec::new(),
            key: key.expect("the first replica prints the owner key"),
            project: String::new(),
            http: reqwest::Client::new(),
        };
        let (status, ws) = fleet.call(0, Method::POST, "/v1/workspaces", Some(json!({"name": "fleet"}))).await;
        assert_eq!(status, 201, "{ws}");
        let body = json!({"workspaceId": ws["id"], "name": "p"});
        let (status, p) = fleet.call(0, Method::POST, "/v1/projects", Some(body)).await;
        assert_eq!(status, 201, "{p}");
        fleet.project = p["id"].as_str().expect("project id").to_string();
        let (status, token) = fleet.call(0, Method::POST, "/v1/node-tokens", Some(json!({"uses": nodes}))).await;
        assert_eq!(status, 201, "{token}");
        let token = token["token"].as_str().expect("the join token, shown once").to_string();
        for _ in 0..nodes {
            let node = fleet.join_node(&token);
            fleet.nodes.push(node);
        }
        fleet.wait_nodes_up().await;
        fleet
    }

    fn join_node(&self, token: &str) -> NodeAgent {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = tempfile::Builder::new().prefix("lizard-fleet-node-").tempdir().expect("temp dir");
        link_images(dir.path());
        let net_prefix = format!("lzf{}-{}", std::process::id() % 10_000, NEXT.fetch_add(1, Ordering::SeqCst) % 100);
        let listen: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let mut args: Vec<OsString> = vec!["--data-dir".into(), dir.path().into(), "node".into(), "join".into()];
        for a in [
            "--server",
            &format!("http://{}", self.balancer.addr),
            "--token",
            token,
            "--region",
            "local",
            "--listen",
            &listen.to_string(),
            "--net-prefix",
            &net_prefix,
            "--prespawn",
            "0",
        ] {
            args.push(a.into());
        }
        if let Some(agent) = std::env::var_os("LIZARD_AGENT_BIN") {
            args.push("--agent".into());
            args.push(agent);
        }
        let process = Process::start("node", dir.path(), args);
        NodeAgent { process, dir, listen, net_prefix, id: String::new() }
    }

    /// Wait until every node agent shows `up` in `GET /v1/nodes`; learn their ids.
    pub async fn wait_nodes_up(&mut self) {
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            let nodes = self.node_infos(0).await;
            let mut all_up = true;
            for agent in &mut self.nodes {
                let address = format!("http://{}", agent.listen);
                match nodes.iter().find(|n| n["address"] == address.as_str()) {
                    Some(n) if n["state"] == "up" => agent.id = n["id"].as_str().unwrap_or_default().to_string(),
                    _ => all_up = false,
                }
            }
            if all_up {
                return;
            }
            for agent in &mut self.nodes {
                assert!(agent.process.running(), "a node agent exited:\n{}", agent.process.log());
            }
            assert!(Instant::now() < deadline, "nodes did not come up: {nodes:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `GET /v1/nodes` through replica `r`.
    pub async fn node_infos(&self, r: usize) -> Vec<Value> {
        let (status, nodes) = self.call(r, Method::GET, "/v1/nodes", None).await;
        assert_eq!(status, 200, "{nodes}");
        nodes.as_array().cloned().unwrap_or_default()
    }

    /// The node `GET /v1/nodes/{id}` shows for node agent `n`.
    pub async fn node_info(&self, r: usize, n: usize) -> Value {
        let (status, node) = self.call(r, Method::GET, &format!("/v1/nodes/{}", self.nodes[n].id), None).await;
        assert_eq!(status, 200, "{node}");
        node
    }

    /// A JSON call with the owner key through replica `r`: status and body (`null` when
    /// empty or not JSON).
    pub async fn call(&self, r: usize, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_as(&self.key, r, method, path, body).await
    }

    /// A JSON call with `key` through replica `r`.
    pub async fn call_as(&self, key: &str, r: usize, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let req = self.http.request(method, format!("{}{path}", self.replicas[r].api)).header("x-api-key", key);
        let req = match body {
            Some(b) => req.json(&b),
            None => req,
        };
        let resp = req.send().await.expect("the replica answers");
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.expect("a whole body");
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// Create a sandbox of `base` through replica `r`, with `fields` merged in: its id.
    pub async fn create(&self, r: usize, fields: Value) -> String {
        let (status, info) = self.try_create(r, fields).await;
        assert_eq!(status, 201, "create through replica {r}: {info}");
        info["sandboxId"].as_str().expect("sandboxId").to_string()
    }

    /// As [`Fleet::create`], answering what the replica answered.
    pub async fn try_create(&self, r: usize, fields: Value) -> (u16, Value) {
        let mut body = json!({"template": "base", "projectId": self.project});
        if let (Some(body), Some(fields)) = (body.as_object_mut(), fields.as_object()) {
            body.extend(fields.clone());
        }
        self.call(r, Method::POST, "/v1/sandboxes", Some(body)).await
    }

    /// Run a shell line in sandbox `id` through replica `r`: exit code and stdout.
    pub async fn exec(&self, r: usize, id: &str, cmd: &str) -> (i64, String) {
        let (status, out) =
            self.call(r, Method::POST, &format!("/v1/sandboxes/{id}/exec"), Some(json!({"cmd": cmd}))).await;
        assert_eq!(status, 200, "exec {cmd:?} in {id} through replica {r}: {out}");
        (out["exitCode"].as_i64().expect("exitCode"), out["stdout"].as_str().unwrap_or_default().to_string())
    }

    /// The node agent (index) whose data directory holds sandbox `id`.
    pub fn node_of(&self, id: &str) -> Option<usize> {
        self.nodes.iter().position(|n| files_named(n.dir.path(), "sandboxes").iter().any(|s| s == id))
    }

    /// Run the `lizard` CLI against replica `r` with the owner key: exit status, stdout
    /// and stderr.
    pub async fn cli(&self, r: usize, args: &[&str]) -> (bool, String, String) {
        let out = tokio::process::Command::from(crate::process::command())
            .args(args)
            .env("LIZARD_API_URL", &self.replicas[r].api)
            .env("LIZARD_API_KEY", &self.key)
            .output()
            .await
            .expect("run lizard-in-cluster");
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    }

    /// The node agent (index) that keeps volume `id`'s disk.
    pub fn node_of_volume(&self, id: &str) -> Option<usize> {
        let disk = format!("{id}.img");
        self.nodes.iter().position(|n| files_named(n.dir.path(), "volumes").contains(&disk))
    }

    /// What node agent `n` has on the host now.
    pub fn host_counts(&self, n: usize) -> HostCounts {
        let node = &self.nodes[n];
        HostCounts {
            vmms: leftovers::vmm_pids(node.dir.path()).len(),
            netns: leftovers::netns(&node.net_prefix).len(),
            links: leftovers::links(&node.net_prefix).len(),
            volumes: files_named(node.dir.path(), "volumes").iter().filter(|f| f.ends_with(".img")).count(),
        }
    }

    /// Wait (at most `within`) until `check` holds; panics with `what` otherwise.
    pub async fn wait_for<F, Fut>(&self, within: Duration, what: &str, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + within;
        while !check().await {
            assert!(Instant::now() < deadline, "{what} did not happen within {within:?}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for Fleet {
    /// Nodes first (SIGTERM stops their sandboxes), then whatever VMM, namespace or link
    /// is left (a node a failed test SIGKILLed never swept). After a failed test, the end
    /// of every process's log goes to stderr first.
    fn drop(&mut self) {
        if std::thread::panicking() {
            let processes = self.replicas.iter_mut().map(|r| ("replica", &mut r.process));
            let all = processes.chain(self.nodes.iter_mut().map(|n| ("node", &mut n.process)));
            for (i, (what, process)) in all.enumerate() {
                let log = process.log();
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                eprintln!("--- {what} (#{i}), exited: {:?}; log, last {} lines ---", process.exit_status(), tail.len());
                tail.iter().rev().for_each(|l| eprintln!("{l}"));
            }
        }
        for node in &mut self.nodes {
            node.process.stop();
            for pid in leftovers::vmm_pids(node.dir.path()) {
                if let Ok(pid) = i32::try_from(pid) {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
                }
            }
            // A node SIGKILLed by a test that then failed never swept its networks.
            for ns in leftovers::netns(&node.net_prefix) {
                let _ = std::process::Command::new("ip").args(["netns", "delete", &ns]).status();
            }
            for link in leftovers::links(&node.net_prefix) {
                let _ = std::process::Command::new("ip").args(["link", "delete", &link]).status();
            }
        }
    }
}

/// Names in the `kind` directory (`sandboxes`, `volumes`) of a node, wherever under its
/// data directory the node keeps it (the directory itself or one level down).
fn files_named(data_dir: &Path, kind: &str) -> Vec<String> {
    let names = |dir: &Path| -> Vec<String> {
        std::fs::read_dir(dir.join(kind))
            .map(|e| e.flatten().filter_map(|e| e.file_name().to_str().map(str::to_string)).collect())
            .unwrap_or_default()
    };
    let mut out = names(data_dir);
    if let Ok(entries) = std::fs::read_dir(data_dir) {
        for sub in entries.flatten().filter(|e| e.path().is_dir() && !e.path().is_symlink()) {
            out.extend(names(&sub.path()));
        }
    }
    out
}

/// The suite's cached guest images, linked into a new data directory.
fn link_images(dir: &Path) {
    let images: PathBuf = image_root().canonicalize().expect("the image store exists").join("images");
    std::os::unix::fs::symlink(images, dir.join("images")).expect("link images");
    let verdict = image_root().join("accel.json");
    if verdict.exists() {
        std::fs::copy(verdict, dir.join("accel.json")).expect("copy accel verdict");
    }
}

/// Start a replica on `database`; the first prints the owner key.
async fn start_replica(database: &str, first: bool) -> (Replica, Option<String>) {
    let dir = tempfile::Builder::new().prefix("lizard-fleet-replica-").tempdir().expect("temp dir");
    let api_addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let proxy: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let mut args: Vec<OsString> = vec!["--data-dir".into(), dir.path().into(), "server".into()];
    for a in [
        "--listen",
        &api_addr.to_string(),
        "--proxy-listen",
        &proxy.to_string(),
        "--database",
        database,
        "--no-local-node",
        "--node-heartbeat-ms",
        &HEARTBEAT_MS.to_string(),
        "--node-lease-ms",
        &LEASE_MS.to_string(),
    ] {
        args.push(a.into());
    }
    let mut process = Process::start("server", dir.path(), args);
    let key = if first {
        let stdout = process.take_stdout().expect("piped stdout");
        let line = tokio::task::spawn_blocking(move || {
            use std::io::BufRead;
            let mut line = String::new();
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
            line.trim().strip_prefix("LIZARD_API_KEY=").map(str::to_string)
        });
        tokio::time::timeout(START_DEADLINE, line).await.expect("the first start prints the owner key").expect("reader")
    } else {
        None
    };
    let deadline = Instant::now() + START_DEADLINE;
    while tokio::net::TcpStream::connect(api_addr).await.is_err() {
        assert!(process.running(), "a replica exited:\n{}", process.log());
        assert!(Instant::now() < deadline, "a replica did not listen:\n{}", process.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let api = format!("http://{api_addr}");
    (Replica { process, api_addr, api, proxy, _dir: dir }, key)
}
