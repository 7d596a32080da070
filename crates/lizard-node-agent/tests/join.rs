//! The agent against the real control plane (`lizard_server::run`, no node of its own;
//! no VM is booted): it joins once with a minted token and shows `up` in `GET /v1/nodes`,
//! keeps `node.json`, heartbeats with its credential, serves the node API behind it, and
//! a restart heartbeats without joining again. A wrong, revoked or expired token is
//! refused and nothing joins; a node cannot heartbeat or post events as another node.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use common::{free_port, kept, until, ControlPlane, REGION};
use lizard_api::cluster::{NodeReport, NodeState, SandboxEnded, SandboxHalt};
use lizard_api::{routes, ErrorCode};
use lizard_node_agent::server_api::{CallError, ServerApi};
use lizard_node_agent::{run, AgentConfig, AgentError};
use std::path::Path;
use std::time::Duration;

/// An agent of `server` with its data in `dir`, its API on `port`; no sandbox networks
/// (nothing boots here, and no root is needed).
fn agent_config(dir: &Path, server: &str, token: Option<&str>, port: u16) -> AgentConfig {
    let mut node = lizard_node::NodeConfig::new(dir);
    node.network = None;
    AgentConfig {
        node,
        server: server.to_owned(),
        token: token.map(str::to_owned),
        region: REGION.into(),
        listen: format!("127.0.0.1:{port}").parse().unwrap(),
        advertise: None,
    }
}

/// An agent running in this process until the sender is used.
struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), AgentError>>,
}

fn spawn_agent(config: AgentConfig) -> Running {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(run(config, async move {
        let _ = stopped.await;
    }));
    Running { stop, task }
}

impl Running {
    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.task.await.unwrap().unwrap();
    }
}

/// The error of an agent whose join the server refused with `code`.
fn refused_with(e: &AgentError, code: ErrorCode) -> bool {
    matches!(e, AgentError::Join(CallError::Refused(api)) if api.code == code)
}

#[tokio::test(flavor = "multi_thread")]
async fn joins_once_heartbeats_and_serves_its_api_behind_the_credential() {
    let cp = ControlPlane::start(5000).await;
    let (_, token) = cp.mint_token().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let address = format!("http://127.0.0.1:{port}");
    let config = agent_config(dir.path(), &cp.url, Some(&token), port);
    let agent = spawn_agent(config.clone());

    // The server's view: one node, up, with what the agent reported at its join.
    let joined = cp.wait_up(&address, 30).await;
    assert_eq!(cp.nodes().await.len(), 1);
    assert_eq!(joined.region, REGION);
    assert!(joined.id.starts_with("node_"), "{joined:?}");
    assert!(joined.capacity.vcpus > 0 && joined.capacity.memory_mib > 0, "{joined:?}");
    assert_eq!((joined.usage.vcpus, joined.usage.sandboxes), (0, 0));
    let (id, credential) = kept(dir.path());
    assert_eq!(id, joined.id, "node.json keeps the id the server gave");
    assert!(!credential.is_empty() && credential != token);
    // Heartbeats go on (each one a call the server authenticated).
    let first = joined.last_heartbeat.clone();
    until("a later heartbeat", 20, || async { cp.node(&id).await.last_heartbeat > first }).await;

    // The node API: /health for anyone, the rest with the credential only.
    let http = reqwest::Client::new();
    assert_eq!(http.get(format!("{address}/health")).send().await.unwrap().status(), 200);
    let list = format!("{address}{}", routes::node::LIST_SANDBOXES.path);
    assert_eq!(http.get(&list).send().await.unwrap().status(), 401);
    assert_eq!(http.get(&list).bearer_auth(&token).send().await.unwrap().status(), 401);
    assert_eq!(http.get(&list).bearer_auth(&cp.key).send().await.unwrap().status(), 401);
    assert_eq!(http.get(&list).bearer_auth(&credential).send().await.unwrap().status(), 200);

    agent.stop().await;
    let at_stop = cp.node(&id).await.last_heartbeat;

    // A restart: no token, no join, heartbeats again with the kept credential.
    let again = spawn_agent(AgentConfig { token: None, ..config });
    until("heartbeats after the restart", 20, || async { cp.node(&id).await.last_heartbeat > at_stop }).await;
    let nodes = cp.nodes().await;
    assert_eq!(nodes.len(), 1, "a restart does not join again: {nodes:?}");
    assert_eq!((nodes[0].id.as_str(), nodes[0].state), (id.as_str(), NodeState::Up));
    again.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_revoked_expired_or_spent_token_is_refused_and_nothing_joins() {
    let cp = ControlPlane::start(5000).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();

    let wrong = run(agent_config(dir.path(), &cp.url, Some("lzn_not-a-token"), port), std::future::pending()).await;
    let e = wrong.unwrap_err();
    assert!(refused_with(&e, ErrorCode::Unauthenticated), "{e}");

    let (token_id, token) = cp.mint_token().await;
    let (status, _) = cp.call(reqwest::Method::DELETE, &format!("/v1/node-tokens/{token_id}"), None).await;
    assert_eq!(status, 204);
    let revoked = run(agent_config(dir.path(), &cp.url, Some(&token), port), std::future::pending()).await;
    let e = revoked.unwrap_err();
    assert!(refused_with(&e, ErrorCode::Unauthenticated), "{e}");

    let (status, t) = cp.call(reqwest::Method::POST, "/v1/node-tokens", Some(serde_json::json!({"ttlSecs": 1}))).await;
    assert_eq!(status, 201, "{t}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let expired = run(agent_config(dir.path(), &cp.url, t["token"].as_str(), port), std::future::pending()).await;
    let e = expired.unwrap_err();
    assert!(refused_with(&e, ErrorCode::Unauthenticated), "{e}");

    assert!(cp.nodes().await.is_empty(), "a refused join leaves no node");
    assert!(!dir.path().join("node.json").exists(), "a refused join keeps nothing");

    // The same data directory joins with a good token.
    let (_, good) = cp.mint_token().await;
    let agent = spawn_agent(agent_config(dir.path(), &cp.url, Some(&good), port));
    cp.wait_up(&format!("http://127.0.0.1:{port}"), 30).await;
    assert_eq!(cp.nodes().await.len(), 1);
    // Its one join is spent: the same token copied to another machine joins nothing.
    let other = tempfile::tempdir().unwrap();
    let copied = run(agent_config(other.path(), &cp.url, Some(&good), free_port()), std::future::pending()).await;
    let e = copied.unwrap_err();
    assert!(refused_with(&e, ErrorCode::Unauthenticated), "{e}");
    assert_eq!(cp.nodes().await.len(), 1);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_speaks_only_for_itself() {
    let cp = ControlPlane::start(5000).await;
    let (_, token) = cp.mint_token_for(2).await;
    // One token for a fleet of two: both join with it.
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (port_a, port_b) = (free_port(), free_port());
    let a = spawn_agent(agent_config(dir_a.path(), &cp.url, Some(&token), port_a));
    let b = spawn_agent(agent_config(dir_b.path(), &cp.url, Some(&token), port_b));
    let node_a = cp.wait_up(&format!("http://127.0.0.1:{port_a}"), 30).await;
    let node_b = cp.wait_up(&format!("http://127.0.0.1:{port_b}"), 30).await;
    assert_ne!(node_a.id, node_b.id);
    let (id_a, cred_a) = kept(dir_a.path());
    let (id_b, cred_b) = kept(dir_b.path());
    assert_eq!((id_a.as_str(), id_b.as_str()), (node_a.id.as_str(), node_b.id.as_str()));
    assert_ne!(cred_a, cred_b);

    // A's credential does not speak for B (heartbeat, events), nor for a node that is not.
    let api = ServerApi::new(&cp.url);
    let report = NodeReport { capacity: node_a.capacity.clone(), ..Default::default() };
    let unauthenticated =
        |r: Result<_, CallError>| matches!(r, Err(CallError::Refused(e)) if e.code == ErrorCode::Unauthenticated);
    assert!(unauthenticated(api.heartbeat(&id_b, &cred_a, &report).await.map(|_| ())));
    assert!(unauthenticated(api.heartbeat("node_nobody", &cred_a, &report).await.map(|_| ())));
    assert!(unauthenticated(api.heartbeat(&id_a, &token, &report).await.map(|_| ())));
    let ended = [SandboxEnded { sandbox_id: "sbx_x".into(), reason: "forged".into() }];
    assert!(unauthenticated(api.events(&id_b, &cred_a, &ended).await));
    let halts = [SandboxHalt { sandbox_id: "sbx_x".into(), halted: true }];
    assert!(unauthenticated(api.halts(&id_b, &cred_a, &halts).await));
    // Its own credential works.
    assert!(api.heartbeat(&id_a, &cred_a, &report).await.is_ok());

    // B's record is B's own report still: nothing A sent was taken as B's.
    let seen_b = cp.node(&id_b).await;
    assert_eq!((seen_b.capacity, seen_b.state), (node_b.capacity, NodeState::Up));
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_on_another_address_is_refused_not_left_unreachable() {
    let cp = ControlPlane::start(5000).await;
    let (_, token) = cp.mint_token().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let agent = spawn_agent(agent_config(dir.path(), &cp.url, Some(&token), port));
    let joined = cp.wait_up(&format!("http://127.0.0.1:{port}"), 30).await;
    agent.stop().await;

    // The servers know the node by the address it joined with: a restart that would serve
    // elsewhere would heartbeat as `up` while nothing reaches it. It is refused, clearly.
    let moved = free_port();
    let restarted = run(agent_config(dir.path(), &cp.url, None, moved), std::future::pending());
    let e = tokio::time::timeout(Duration::from_secs(10), restarted).await.expect("refused at once").unwrap_err();
    let message = e.to_string();
    assert!(message.contains(&format!("http://127.0.0.1:{port}")) && message.contains(&moved.to_string()), "{message}");
    assert_eq!(cp.node(&joined.id).await.address, joined.address, "the server's view is unchanged");

    // The same address again is fine.
    let again = spawn_agent(agent_config(dir.path(), &cp.url, None, port));
    let at_stop = cp.node(&joined.id).await.last_heartbeat;
    until("heartbeats after the restart", 20, || async { cp.node(&joined.id).await.last_heartbeat > at_stop }).await;
    again.stop().await;
}

#[tokio::test]
async fn without_node_json_a_token_is_required() {
    let dir = tempfile::tempdir().unwrap();
    let config = agent_config(dir.path(), "http://127.0.0.1:9", None, 0);
    let e = run(config, std::future::pending()).await.unwrap_err().to_string();
    assert!(e.contains("pass --token"), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_is_down_at_first_is_joined_when_it_comes_up() {
    let server_port = free_port();
    let mut cp = ControlPlane::start_on(server_port, 5000).await;
    let (_, token) = cp.mint_token().await;
    cp.stop().await;

    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let agent = spawn_agent(agent_config(dir.path(), &cp.url, Some(&token), port));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!agent.task.is_finished(), "an unreachable server is waited for, not an error");
    assert!(!dir.path().join("node.json").exists());

    cp.resume().await;
    let joined = cp.wait_up(&format!("http://127.0.0.1:{port}"), 60).await;
    assert_eq!(cp.nodes().await.len(), 1);
    assert_eq!(kept(dir.path()).0, joined.id);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_removed_node_is_refused_and_its_agent_ends() {
    let cp = ControlPlane::start(5000).await;
    let (_, token) = cp.mint_token().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let agent = tokio::spawn(run(agent_config(dir.path(), &cp.url, Some(&token), port), std::future::pending()));
    let node = cp.wait_up(&format!("http://127.0.0.1:{port}"), 30).await;
    let (status, body) = cp.call(reqwest::Method::DELETE, &format!("/v1/nodes/{}", node.id), None).await;
    assert_eq!(status, 204, "{body}");
    // Its next heartbeat is refused: the agent stops, saying why.
    let ended = tokio::time::timeout(Duration::from_secs(30), agent).await.expect("the agent ended").unwrap();
    let e = ended.unwrap_err();
    assert!(matches!(&e, AgentError::Removed(why) if why.contains("was removed")), "{e}");
    assert!(cp.nodes().await.is_empty(), "nothing came back");
}
