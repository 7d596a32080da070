//! The agent with real microVMs, against a stand-in control plane: sandboxes created
//! through its API show in its heartbeats; one the server lists in `stop` is killed; one
//! whose VMM is SIGKILLed is posted as ended; SIGTERM's path (the shutdown future) kills
//! what runs and says so.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use lizard_api::cluster::{HeartbeatResponse, JoinResponse, NodeReport, NodeState, SandboxEnded};
use lizard_api::{routes, SandboxInfo};
use lizard_node_agent::{run, AgentConfig};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Cluster {
    stop: Vec<String>,
    reports: Vec<NodeReport>,
    ended: Vec<SandboxEnded>,
}

type Shared = Arc<Mutex<Cluster>>;

async fn stand_in_server() -> (String, Shared) {
    let cluster = Shared::default();
    let app = Router::new()
        .route(
            routes::CLUSTER_JOIN.path,
            post(|| async {
                Json(JoinResponse {
                    node_id: "node_vm".into(),
                    credential: "cred-vm".into(),
                    heartbeat_ms: 200,
                    lease_ms: 5000,
                })
            }),
        )
        .route(
            routes::CLUSTER_HEARTBEAT.path,
            post(|State(c): State<Shared>, Json(r): Json<NodeReport>| async move {
                let mut c = c.lock().unwrap();
                c.reports.push(r);
                Json(HeartbeatResponse { state: NodeState::Up, stop: c.stop.clone() })
            }),
        )
        .route(
            routes::CLUSTER_EVENTS.path,
            post(|State(c): State<Shared>, Json(e): Json<Vec<SandboxEnded>>| async move {
                c.lock().unwrap().ended.extend(e);
                StatusCode::NO_CONTENT
            }),
        )
        .with_state(cluster.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, cluster)
}

async fn until(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(secs), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Pids of live QEMU processes whose command line mentions `needle`.
fn vmms(needle: &str) -> Vec<i32> {
    let mut pids = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let cmd =
            String::from_utf8_lossy(&std::fs::read(e.path().join("cmdline")).unwrap_or_default()).replace('\0', " ");
        let zombie = std::fs::read_to_string(e.path().join("stat"))
            .map(|s| s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
            .unwrap_or(true);
        if cmd.contains("qemu-system") && cmd.contains(needle) && !zombie {
            pids.push(pid);
        }
    }
    pids
}

fn image_root() -> PathBuf {
    std::env::var_os("LIZARD_TEST_DATA_DIR").map(PathBuf::from).unwrap_or_else(|| "/var/cache/lizard-test-data".into())
}

fn held(report: &NodeReport) -> Vec<String> {
    report.sandboxes.iter().map(|s| s.sandbox_id.clone()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn heartbeats_stop_lists_and_crashes_with_real_vms() {
    let (server, cluster) = stand_in_server().await;
    let dir = tempfile::Builder::new().prefix("lizard-agent-").tempdir().unwrap();
    let mut node = lizard_node::NodeConfig::new(dir.path());
    node.image_root = image_root();
    if let Some(net) = node.network.as_mut() {
        let tag = format!("{:03}", std::process::id() % 1000);
        net.netns_prefix = format!("lizard-g{tag}-");
        net.link_prefix = format!("lzg{tag}");
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = AgentConfig {
        node,
        server,
        token: Some("lzn_vm".into()),
        region: "eu-1".into(),
        listen: format!("127.0.0.1:{port}").parse().unwrap(),
        advertise: None,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let agent = tokio::spawn(run(config, async move {
        let _ = stopped.await;
    }));
    until("the first heartbeat", 60, || !cluster.lock().unwrap().reports.is_empty()).await;

    // Two sandboxes through the node API, with the credential.
    let http = reqwest::Client::new();
    let api = format!("http://127.0.0.1:{port}");
    let mut ids = vec![];
    for _ in 0..2 {
        let resp = http
            .post(format!("{api}{}", routes::node::CREATE_SANDBOX.path))
            .bearer_auth("cred-vm")
            .json(&serde_json::json!({"template": "base"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
        ids.push(resp.json::<SandboxInfo>().await.unwrap().sandbox_id);
    }
    let (stopped_id, crashed_id) = (ids[0].clone(), ids[1].clone());
    until("a heartbeat with both", 30, || {
        cluster.lock().unwrap().reports.last().is_some_and(|r| held(r).len() == 2 && r.usage.vcpus > 0)
    })
    .await;

    // The server says the first one's record ended: the node kills it.
    cluster.lock().unwrap().stop = vec![stopped_id.clone()];
    let gone = |id: &str| {
        let url = format!("{api}{}", routes::node::GET_SANDBOX.uri(&[id]));
        let http = http.clone();
        async move { http.get(url).bearer_auth("cred-vm").send().await.unwrap().status() == 404 }
    };
    let start = Instant::now();
    while !gone(&stopped_id).await {
        assert!(start.elapsed() < Duration::from_secs(30), "the stop list was not acted on");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(vmms(&stopped_id).is_empty());
    cluster.lock().unwrap().stop.clear();
    assert!(cluster.lock().unwrap().ended.is_empty(), "a stop is the server's own doing: no event");

    // The second one's VMM dies: the end is posted with why.
    let pids = vmms(&crashed_id);
    assert_eq!(pids.len(), 1, "one VMM for {crashed_id}");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pids[0]), nix::sys::signal::Signal::SIGKILL).unwrap();
    until("the crash posted", 30, || cluster.lock().unwrap().ended.iter().any(|e| e.sandbox_id == crashed_id)).await;
    let reason = cluster.lock().unwrap().ended[0].reason.clone();
    assert!(reason.contains("stopped unexpectedly"), "{reason}");
    until("a heartbeat without either", 30, || {
        cluster.lock().unwrap().reports.last().is_some_and(|r| held(r).is_empty())
    })
    .await;

    // A third, then the agent stops: it is killed and posted, nothing is left.
    let resp = http
        .post(format!("{api}{}", routes::node::CREATE_SANDBOX.path))
        .bearer_auth("cred-vm")
        .json(&serde_json::json!({"template": "base"}))
        .send()
        .await
        .unwrap();
    let last = resp.json::<SandboxInfo>().await.unwrap().sandbox_id;
    stop.send(()).unwrap();
    agent.await.unwrap().unwrap();
    let c = cluster.lock().unwrap();
    assert!(c.ended.iter().any(|e| e.sandbox_id == last && e.reason == "its node shut down"), "{:?}", c.ended);
    assert!(c.reports.last().is_some_and(|r| r.sandboxes.is_empty()), "the goodbye heartbeat holds nothing");
    assert!(vmms(&dir.path().to_string_lossy()).is_empty(), "VMMs left behind");
    let left: Vec<_> = std::fs::read_dir(Path::new(dir.path()).join("sandboxes")).unwrap().flatten().collect();
    assert!(left.is_empty(), "sandbox directories left: {left:?}");
}
