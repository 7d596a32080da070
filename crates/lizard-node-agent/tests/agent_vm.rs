//! The agent with real microVMs, against the real control plane (`lizard_server::run`, no
//! node of its own): sandboxes created through the server's API run on the agent and show
//! in its heartbeats (`GET /v1/nodes/{id}`) and across a restart of the server; another
//! node cannot end them; a drain stops nothing and places nothing; a kill through the API stops the VM; a record
//! ended while the server cannot reach the node (a timeout during a partition) reaches the
//! node by the heartbeat's stop list; a VMM SIGKILLed is posted and its record ends with
//! why; a stop of the agent kills what runs and the records say so.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use common::{free_port, kept, until, ControlPlane, Partition, REGION};
use lizard_api::cluster::{JoinRequest, NodeReport, SandboxEnded};
use lizard_api::routes;
use lizard_node_agent::server_api::ServerApi;
use lizard_node_agent::{run, AgentConfig};
use lizard_vmm::census::live_vmms;
use reqwest::Method;
use serde_json::{json, Value};
use std::path::Path;

/// The data directory of the machine's one image store (outside the checkout: a fresh
/// clone reuses its images).
use lizard_node::shared_image_root as image_root;

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
async fn the_real_control_plane_drives_real_vms_through_the_agent() {
    let mut cp = ControlPlane::start(30_000).await;
    let project = cp.project().await;
    // Two joins: this node, and a stranger below.
    let (_, token) = cp.mint_token_for(2).await;
    let dir = tempfile::Builder::new().prefix("lizard-agent-").tempdir().unwrap();
    let mut node = lizard_node::NodeConfig::new(dir.path());
    node.image_root = image_root();
    if let Some(net) = node.network.as_mut() {
        let tag = format!("{:03}", std::process::id() % 1000);
        net.netns_prefix = format!("lizard-g{tag}-");
        net.link_prefix = format!("lzg{tag}");
    }
    let port = free_port();
    // The server reaches the node API through a link the test can cut.
    let link = Partition::start(([127, 0, 0, 1], port).into()).await;
    let config = AgentConfig {
        node,
        server: cp.url.clone(),
        token: Some(token.clone()),
        region: REGION.into(),
        listen: format!("127.0.0.1:{port}").parse().unwrap(),
        advertise: Some(format!("http://{}", link.addr)),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let agent = tokio::spawn(run(config, async move {
        let _ = stopped.await;
    }));
    let node_id = cp.wait_up(&format!("http://{}", link.addr), 60).await.id;
    let (_, credential) = kept(dir.path());
    let http = reqwest::Client::new();
    let on_node = |id: &str| format!("http://127.0.0.1:{port}{}", routes::node::GET_SANDBOX.uri(&[id]));

    // Two sandboxes through the server's API: they run on the agent and its heartbeats say so.
    let (killed, crashed) = (create(&cp, &project).await, create(&cp, &project).await);
    assert_eq!((live_vmms(&killed).len(), live_vmms(&crashed).len()), (1, 1), "one VMM each");
    until("a heartbeat with both", 30, || async {
        let n = cp.node(&node_id).await;
        n.usage.sandboxes == 2 && n.usage.vcpus > 0 && n.usage.memory_mib > 0
    })
    .await;

    // The server restarts: the node's sandboxes are not its to judge; they run on, and
    // exec through the restarted server reaches them.
    cp.stop().await;
    cp.resume().await;
    let (status, r) =
        cp.call(Method::POST, &format!("/v1/sandboxes/{killed}/exec"), Some(json!({"cmd": "echo still here"}))).await;
    assert_eq!((status, r["stdout"].as_str()), (200, Some("still here\n")), "{r}");
    assert_eq!(cp.node(&node_id).await.state, lizard_api::cluster::NodeState::Up);

    // Drained: nothing is stopped, nothing new is placed there (the only node: 503 at once).
    let (status, n) = cp.call(Method::POST, &format!("/v1/nodes/{node_id}/drain"), None).await;
    assert_eq!((status, n["state"].as_str()), (200, Some("draining")), "{n}");
    let (status, r) =
        cp.call(Method::POST, &format!("/v1/sandboxes/{crashed}/exec"), Some(json!({"cmd": "echo draining"}))).await;
    assert_eq!((status, r["stdout"].as_str()), (200, Some("draining\n")), "{r}");
    let body = json!({"template": "base", "projectId": project});
    let (status, r) = cp.call(Method::POST, "/v1/sandboxes", Some(body)).await;
    assert_eq!((status, r["code"].as_str()), (503, Some("UNAVAILABLE")), "{r}");
    let (status, n) = cp.call(Method::POST, &format!("/v1/nodes/{node_id}/undrain"), None).await;
    assert_eq!((status, n["state"].as_str()), (200, Some("up")), "{n}");

    // Another node (joined with the same token; no capacity, so never placed on) cannot
    // end this node's sandboxes: its event is taken and ignored.
    let api = ServerApi::new(&cp.url);
    let stranger =
        JoinRequest { region: REGION.into(), address: "http://127.0.0.1:9".into(), report: NodeReport::default() };
    let stranger = api.join(&token, &stranger).await.unwrap();
    let forged = [SandboxEnded { sandbox_id: crashed.clone(), reason: "forged".into() }];
    api.events(&stranger.node_id, &stranger.credential, &forged).await.unwrap();
    assert_eq!(sandbox(&cp, &crashed).await.0, 200, "another node's event ended nothing");

    // A kill through the API stops the VM; the record keeps the server's reason.
    let (status, body) = cp.call(Method::DELETE, &format!("/v1/sandboxes/{killed}"), None).await;
    assert_eq!(status, 204, "{body}");
    assert!(live_vmms(&killed).is_empty(), "the kill reached the node");
    assert!(ended_with(&cp, &killed, "killed").await, "{:?}", sandbox(&cp, &killed).await);

    // A third times out while the server cannot reach the node: the reaper ends its record
    // (its kill fails), and the node learns it from the heartbeat's stop list.
    let timed = create(&cp, &project).await;
    let (status, body) =
        cp.call(Method::POST, &format!("/v1/sandboxes/{timed}/timeout"), Some(json!({"timeoutMs": 2000}))).await;
    assert_eq!(status, 200, "{body}");
    link.cut();
    let (status, body) = sandbox(&cp, &timed).await;
    assert_eq!((status, body["code"].as_str()), (503, Some("UNAVAILABLE")), "the node is cut off: {body}");
    // Meanwhile the second one's VMM dies: the node posts its end, with why.
    let pids = live_vmms(&crashed);
    assert_eq!(pids.len(), 1, "one VMM for {crashed}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pids[0]).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();

    until("the timed-out sandbox stopped by the stop list", 60, || async { live_vmms(&timed).is_empty() }).await;
    let gone = http.get(on_node(&timed)).bearer_auth(&credential).send().await.unwrap().status();
    assert_eq!(gone, 404, "the node no longer has it");
    // The server cannot ask the node now: an ended record is all it can answer from.
    assert!(ended_with(&cp, &timed, "timed out").await, "{:?}", sandbox(&cp, &timed).await);
    until("the crash recorded", 30, || async {
        let (status, body) = sandbox(&cp, &crashed).await;
        status == 404 && body["message"].as_str().is_some_and(|m| m.contains("stopped unexpectedly"))
    })
    .await;
    until("a heartbeat without any", 30, || async {
        let n = cp.node(&node_id).await;
        (n.usage.sandboxes, n.usage.vcpus) == (0, 0)
    })
    .await;
    link.heal();

    // A fourth, then the agent stops: it is killed, the record says so, nothing is left.
    let last = create(&cp, &project).await;
    until("a heartbeat with the last", 30, || async { cp.node(&node_id).await.usage.sandboxes == 1 }).await;
    stop.send(()).unwrap();
    agent.await.unwrap().unwrap();
    assert!(ended_with(&cp, &last, "its node shut down").await, "{:?}", sandbox(&cp, &last).await);
    assert_eq!(cp.node(&node_id).await.usage.sandboxes, 0, "the goodbye heartbeat holds nothing");
    assert!(live_vmms(&dir.path().to_string_lossy()).is_empty(), "VMMs left behind");
    let left: Vec<_> = std::fs::read_dir(Path::new(dir.path()).join("sandboxes")).unwrap().flatten().collect();
    assert!(left.is_empty(), "sandbox directories left: {left:?}");
}
