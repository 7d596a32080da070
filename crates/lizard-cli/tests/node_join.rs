//! `lizard node join` as a real process against a stand-in control plane: it joins once,
//! serves the node API behind its credential, and after a SIGKILL its next start (no
//! token: node.json) takes its running VM back and reports it; SIGTERM kills what runs,
//! posts it, and leaves no VMM behind.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

mod common;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use common::{agent_bin, copy_accel_verdict, free_port, link_images, lizard_command};
use lizard_api::cluster::{HeartbeatResponse, JoinRequest, JoinResponse, NodeReport, NodeState, SandboxEnded};
use lizard_api::{routes, ProcessResult, SandboxInfo};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Cluster {
    joins: Vec<JoinRequest>,
    reports: Vec<NodeReport>,
    ended: Vec<SandboxEnded>,
}

type Shared = Arc<Mutex<Cluster>>;

fn authorized(h: &HeaderMap, want: &str) -> bool {
    h.get("authorization").is_some_and(|v| v == format!("Bearer {want}").as_str())
}

async fn stand_in_server() -> (String, Shared) {
    let cluster = Shared::default();
    let app = Router::new()
        .route(
            routes::CLUSTER_JOIN.path,
            post(|State(c): State<Shared>, h: HeaderMap, Json(req): Json<JoinRequest>| async move {
                assert!(authorized(&h, "lzn_cli"));
                c.lock().unwrap().joins.push(req);
                Json(JoinResponse {
                    node_id: "node_cli".into(),
                    credential: "cred-cli".into(),
                    heartbeat_ms: 200,
                    lease_ms: 5000,
                })
            }),
        )
        .route(
            routes::CLUSTER_HEARTBEAT.path,
            post(|State(c): State<Shared>, h: HeaderMap, Json(r): Json<NodeReport>| async move {
                assert!(authorized(&h, "cred-cli"));
                c.lock().unwrap().reports.push(r);
                Json(HeartbeatResponse { state: NodeState::Up, stop: vec![] })
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

fn start_agent(data: &Path, server: &str, port: u16, token: Option<&str>, prefix: &str) -> Child {
    let mut cmd = lizard_command();
    cmd.env("LIZARD_AGENT_BIN", agent_bin()).arg("--data-dir").arg(data).args([
        "node",
        "join",
        "--server",
        server,
        "--region",
        "eu-1",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--net-prefix",
        prefix,
    ]);
    if let Some(t) = token {
        cmd.args(["--token", t]);
    }
    cmd.stdout(Stdio::null()).stderr(Stdio::inherit()).spawn().unwrap()
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

fn signal(child: &Child, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()), sig).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_joined_node_survives_sigkill_and_stops_clean_on_sigterm() {
    let (server, cluster) = stand_in_server().await;
    let data = tempfile::Builder::new().prefix("lizard-join-").tempdir().unwrap();
    link_images(data.path());
    copy_accel_verdict(data.path());
    let prefix = format!("lzj{:03}", std::process::id() % 1000);
    let port = free_port();
    let api = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();

    let mut agent = start_agent(data.path(), &server, port, Some("lzn_cli"), &prefix);
    until("the first heartbeat", 120, || !cluster.lock().unwrap().reports.is_empty()).await;
    assert_eq!(cluster.lock().unwrap().joins[0].address, api);
    let kept = std::fs::metadata(data.path().join("node.json")).unwrap();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&kept.permissions()) & 0o777, 0o600);

    let created: SandboxInfo = http
        .post(format!("{api}{}", routes::node::CREATE_SANDBOX.path))
        .bearer_auth("cred-cli")
        .json(&serde_json::json!({"template": "base"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created.sandbox_id;
    let vmm = vmms(&id);
    assert_eq!(vmm.len(), 1);

    // SIGKILL: the VM outlives the agent; the next start takes it back, without a join.
    signal(&agent, nix::sys::signal::Signal::SIGKILL);
    agent.wait().unwrap();
    assert_eq!(vmms(&id), vmm, "the VM outlives its agent");
    let beats = cluster.lock().unwrap().reports.len();
    let mut agent = start_agent(data.path(), &server, port, None, &prefix);
    until("a heartbeat from the restarted agent holding the sandbox", 120, || {
        let c = cluster.lock().unwrap();
        c.reports.len() > beats && c.reports.last().unwrap().sandboxes.iter().any(|s| s.sandbox_id == id)
    })
    .await;
    assert_eq!(cluster.lock().unwrap().joins.len(), 1, "a restart does not join again");
    assert_eq!(vmms(&id), vmm, "the same VM, taken back");
    let r: ProcessResult = http
        .post(format!("{api}{}", routes::node::EXEC.uri(&[&id])))
        .bearer_auth("cred-cli")
        .json(&serde_json::json!({"cmd": "echo still here"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r.stdout, "still here\n");

    // SIGTERM: the running sandbox is killed and posted; nothing is left.
    signal(&agent, nix::sys::signal::Signal::SIGTERM);
    let status = agent.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let c = cluster.lock().unwrap();
    assert!(c.ended.iter().any(|e| e.sandbox_id == id && e.reason == "its node shut down"), "{:?}", c.ended);
    assert!(vmms(&data.path().to_string_lossy()).is_empty(), "VMMs left behind");
}
