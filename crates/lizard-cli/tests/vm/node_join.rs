//! `lizard node join` as a real process against the real control plane (`lizard server
//! --no-local-node` as a process): it joins once with a minted token and shows `up`,
//! keeps node.json (0600), runs what the server's API creates; after a SIGKILL its next
//! start (no token: node.json) takes the running VM back and reports it, exec through the
//! server reaches it and the guest's API calls reach the server; killed again and silent past its lease, the server has it down
//! and the sandbox lost, and its next start kills that VM (the heartbeat's stop list);
//! SIGTERM kills what runs and the record says so, while a paused sandbox stays and
//! resumes through the server after a restart; nothing is left on the host.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

use crate::cluster;
use crate::common;

use cluster::{start_node, until, ControlPlane};
use common::{free_port, link_images};
use lizard_api::cluster::NodeState;
use lizard_api::ProcessResult;
use lizard_vmm::census::live_vmms;
use nix::sys::signal::Signal;
use reqwest::Method;
use serde_json::{json, Value};

/// How long the server waits for a silent node: long enough for a restart to come back
/// within it on a loaded machine, short enough to wait out.
const LEASE_MS: u64 = 8000;

/// Network namespaces and host links whose names start with `prefix`.
fn networks(prefix: &str) -> Vec<String> {
    let names = |dir: &str| -> Vec<String> {
        std::fs::read_dir(dir)
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default()
    };
    names("/run/netns").into_iter().chain(names("/sys/class/net")).filter(|n| n.starts_with(prefix)).collect()
}

/// `POST /v1/sandboxes` of `base` in `project`: the new sandbox's id.
async fn create(cp: &ControlPlane, project: &str) -> String {
    let (status, info) =
        cp.call(Method::POST, "/v1/sandboxes", Some(json!({"template": "base", "projectId": project}))).await;
    assert_eq!(status, 201, "{info}");
    info["sandboxId"].as_str().unwrap().to_owned()
}

/// `GET /v1/sandboxes/{id}`: status and body.
async fn sandbox(cp: &ControlPlane, id: &str) -> (u16, Value) {
    cp.call(Method::GET, &format!("/v1/sandboxes/{id}"), None).await
}

/// Whether the server answers that `id`'s record ended, with `reason`.
async fn ended_with(cp: &ControlPlane, id: &str, reason: &str) -> bool {
    let (status, body) = sandbox(cp, id).await;
    status == 404 && body["message"].as_str().is_some_and(|m| m.ends_with(&format!("not found: {reason}")))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_joined_node_survives_sigkill_reconciles_after_its_lease_and_stops_clean() {
    let cp = ControlPlane::start(LEASE_MS).await;
    let project = cp.project().await;
    let token = cp.mint_token().await;
    let data = tempfile::Builder::new().prefix("lizard-join-").tempdir().unwrap();
    link_images(data.path());
    let prefix = format!("lzj{:03}", std::process::id() % 1000);
    let port = free_port();
    let address = format!("http://127.0.0.1:{port}");

    let mut agent = start_node(data.path(), &cp.url, port, Some(&token), &prefix, &[]);
    let node = cp.wait_for(&address, NodeState::Up, 120).await;
    // The server records the join before the agent has its answer and writes the file.
    let file = data.path().join("node.json");
    let waited = std::time::Instant::now();
    while !file.exists() {
        assert!(waited.elapsed() < std::time::Duration::from_secs(10), "no node.json 10 s after the join");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let kept = std::fs::metadata(&file).unwrap();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&kept.permissions()) & 0o777, 0o600);
    let kept: Value = serde_json::from_slice(&std::fs::read(data.path().join("node.json")).unwrap()).unwrap();
    assert_eq!(kept["nodeId"].as_str(), Some(node.id.as_str()));

    // A sandbox through the server's API runs on the node.
    let id = create(&cp, &project).await;
    let vmm = live_vmms(&id);
    assert_eq!(vmm.len(), 1);

    // SIGKILL: the VM outlives the agent; the next start takes it back, without a join.
    agent.signal(Signal::SIGKILL);
    agent.child.wait().unwrap();
    assert_eq!(live_vmms(&id), vmm, "the VM outlives its agent");
    let beat = cp.node(&node.id).await.last_heartbeat;
    let mut agent = start_node(data.path(), &cp.url, port, None, &prefix, &[]);
    until("a heartbeat from the restarted agent holding the sandbox", 60, || async {
        let n = cp.node(&node.id).await;
        n.last_heartbeat > beat && n.usage.sandboxes == 1
    })
    .await;
    let nodes = cp.nodes().await;
    assert_eq!(nodes.len(), 1, "a restart does not join again: {nodes:?}");
    assert_eq!(nodes[0].state, NodeState::Up, "back within its lease: {nodes:?}");
    assert_eq!(live_vmms(&id), vmm, "the same VM, taken back");
    let (status, r) =
        cp.call(Method::POST, &format!("/v1/sandboxes/{id}/exec"), Some(json!({"cmd": "echo still here"}))).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(serde_json::from_value::<ProcessResult>(r).unwrap().stdout, "still here\n");
    // The guest's API forwarding reaches the --server (this node's id is in its answer).
    let cmd = format!("curl -sf -H 'x-api-key: {}' $LIZARD_API_URL/v1/nodes", cp.key);
    let (status, r) = cp.call(Method::POST, &format!("/v1/sandboxes/{id}/exec"), Some(json!({"cmd": cmd}))).await;
    assert_eq!(status, 200, "{r}");
    let r: ProcessResult = serde_json::from_value(r).unwrap();
    assert!(r.stdout.contains(&node.id), "{r:?}");

    // SIGKILL again, and silent past its lease: the server has the node down and its
    // sandbox lost, though the VM still runs. Its next start is told to stop it.
    agent.signal(Signal::SIGKILL);
    agent.child.wait().unwrap();
    cp.wait_for(&address, NodeState::Down, 60).await;
    assert!(ended_with(&cp, &id, "lost: its node stopped answering").await, "{:?}", sandbox(&cp, &id).await);
    assert_eq!(live_vmms(&id), vmm, "nothing killed the VM yet");
    let mut agent = start_node(data.path(), &cp.url, port, None, &prefix, &[]);
    cp.wait_for(&address, NodeState::Up, 60).await;
    until("the lost sandbox's VM killed by the stop list", 60, || async { live_vmms(&id).is_empty() }).await;
    until("a heartbeat without it", 30, || async { cp.node(&node.id).await.usage.sandboxes == 0 }).await;
    assert!(ended_with(&cp, &id, "lost: its node stopped answering").await, "the record keeps why");

    // SIGTERM: the running sandbox is killed and its record says so; a paused one stays,
    // and after a restart within the lease it resumes through the server.
    let last = create(&cp, &project).await;
    let kept = create(&cp, &project).await;
    let (status, body) =
        cp.call(Method::POST, &format!("/v1/sandboxes/{kept}/exec"), Some(json!({"cmd": "echo 1 > /tmp/mark"}))).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = cp.call(Method::POST, &format!("/v1/sandboxes/{kept}/pause"), None).await;
    assert_eq!((status, body["state"].as_str()), (200, Some("paused")), "{body}");
    assert_eq!(live_vmms(&last).len(), 1);
    agent.signal(Signal::SIGTERM);
    let status = agent.child.wait().unwrap();
    assert!(status.success(), "{status:?}\n{}", agent.log());
    // The node is gone: an ended record is all the server can answer from.
    assert!(ended_with(&cp, &last, "its node shut down").await, "{:?}", sandbox(&cp, &last).await);
    assert!(live_vmms(&data.path().to_string_lossy()).is_empty(), "VMMs left behind");
    let mut agent = start_node(data.path(), &cp.url, port, None, &prefix, &[]);
    let beat = cp.node(&node.id).await.last_heartbeat;
    until("a heartbeat from the restarted agent", 60, || async { cp.node(&node.id).await.last_heartbeat > beat }).await;
    let (status, body) = cp.call(Method::POST, &format!("/v1/sandboxes/{kept}/resume"), None).await;
    assert_eq!((status, body["state"].as_str()), (200, Some("running")), "{body}");
    let (status, r) =
        cp.call(Method::POST, &format!("/v1/sandboxes/{kept}/exec"), Some(json!({"cmd": "cat /tmp/mark"}))).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(serde_json::from_value::<ProcessResult>(r).unwrap().stdout, "1\n", "its state kept across the stop");
    let (status, body) = cp.call(Method::DELETE, &format!("/v1/sandboxes/{kept}"), None).await;
    assert_eq!(status, 204, "{body}");

    // The last stop: nothing is left on the host.
    agent.signal(Signal::SIGTERM);
    let status = agent.child.wait().unwrap();
    assert!(status.success(), "{status:?}\n{}", agent.log());
    assert_eq!(cp.node(&node.id).await.usage.sandboxes, 0, "the goodbye heartbeat holds nothing");
    assert!(live_vmms(&data.path().to_string_lossy()).is_empty(), "VMMs left behind");
    let left: Vec<_> = std::fs::read_dir(data.path().join("sandboxes")).unwrap().flatten().collect();
    assert!(left.is_empty(), "sandbox directories left: {left:?}");
    assert_eq!(networks(&prefix), Vec::<String>::new(), "networks left behind");
}
