//! The agent against a stand-in control plane (no VM is booted): it joins once, keeps
//! `node.json`, heartbeats with its credential, serves the node API behind it, and a
//! restart heartbeats without joining again.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use lizard_api::cluster::{HeartbeatResponse, JoinRequest, JoinResponse, NodeReport, NodeState, SandboxEnded};
use lizard_api::routes;
use lizard_node_agent::{run, AgentConfig};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Seen {
    joins: Vec<(String, JoinRequest)>,
    heartbeats: Vec<(String, String, NodeReport)>,
    events: Vec<SandboxEnded>,
}

type Shared = Arc<Mutex<Seen>>;

fn bearer(h: &HeaderMap) -> String {
    h.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned()
}

async fn stand_in_server() -> (String, Shared) {
    stand_in_server_on(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap())
}

fn stand_in_server_on(listener: tokio::net::TcpListener) -> (String, Shared) {
    let seen = Shared::default();
    let app = Router::new()
        .route(
            routes::CLUSTER_JOIN.path,
            post(|State(s): State<Shared>, h: HeaderMap, Json(req): Json<JoinRequest>| async move {
                s.lock().unwrap().joins.push((bearer(&h), req));
                Json(JoinResponse {
                    node_id: "node_t".into(),
                    credential: "cred-t".into(),
                    heartbeat_ms: 100,
                    lease_ms: 2000,
                })
            }),
        )
        .route(
            routes::CLUSTER_HEARTBEAT.path,
            post(
                |State(s): State<Shared>, Path(id): Path<String>, h: HeaderMap, Json(r): Json<NodeReport>| async move {
                    s.lock().unwrap().heartbeats.push((id, bearer(&h), r));
                    Json(HeartbeatResponse { state: NodeState::Up, stop: vec!["sbx_not_here".into()] })
                },
            ),
        )
        .route(
            routes::CLUSTER_EVENTS.path,
            post(|State(s): State<Shared>, Json(e): Json<Vec<SandboxEnded>>| async move {
                s.lock().unwrap().events.extend(e);
                StatusCode::NO_CONTENT
            }),
        )
        .with_state(seen.clone());
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(20), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn joins_once_heartbeats_and_serves_its_api_behind_the_credential() {
    let (server, seen) = stand_in_server().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = AgentConfig {
        node: lizard_node::NodeConfig::new(dir.path()),
        server: server.clone(),
        token: Some("lzn_join".into()),
        region: "eu-1".into(),
        listen: format!("127.0.0.1:{port}").parse().unwrap(),
        advertise: None,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let agent = tokio::spawn(run(config.clone(), async move {
        let _ = stopped.await;
    }));
    until("two heartbeats", || seen.lock().unwrap().heartbeats.len() >= 2).await;
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.joins.len(), 1);
        let (token, join) = &seen.joins[0];
        assert_eq!(token, "Bearer lzn_join");
        assert_eq!((join.region.as_str(), join.address.clone()), ("eu-1", format!("http://127.0.0.1:{port}")));
        assert!(join.report.capacity.vcpus > 0 && join.report.capacity.memory_mib > 0, "{:?}", join.report);
        let (id, auth, report) = &seen.heartbeats[0];
        assert_eq!((id.as_str(), auth.as_str()), ("node_t", "Bearer cred-t"));
        assert!(report.sandboxes.is_empty());
    }
    let kept: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("node.json")).unwrap()).unwrap();
    assert_eq!((kept["nodeId"].as_str(), kept["credential"].as_str()), (Some("node_t"), Some("cred-t")));

    // The node API: /health for anyone, the rest with the credential only.
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    assert_eq!(http.get(format!("{base}/health")).send().await.unwrap().status(), 200);
    let list = format!("{base}{}", routes::node::LIST_SANDBOXES.path);
    assert_eq!(http.get(&list).send().await.unwrap().status(), 401);
    assert_eq!(http.get(&list).bearer_auth("lzn_join").send().await.unwrap().status(), 401);
    assert_eq!(http.get(&list).bearer_auth("cred-t").send().await.unwrap().status(), 200);

    stop.send(()).unwrap();
    agent.await.unwrap().unwrap();
    let beats = seen.lock().unwrap().heartbeats.len();

    // A restart: no token, no join, heartbeats again with the kept credential.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let again = tokio::spawn(run(AgentConfig { token: None, ..config }, async move {
        let _ = stopped.await;
    }));
    until("heartbeats after the restart", || seen.lock().unwrap().heartbeats.len() >= beats + 2).await;
    assert_eq!(seen.lock().unwrap().joins.len(), 1, "a restart does not join again");
    stop.send(()).unwrap();
    again.await.unwrap().unwrap();
    assert!(seen.lock().unwrap().events.is_empty(), "nothing ran, nothing ended");
}

#[tokio::test]
async fn without_node_json_a_token_is_required() {
    let dir = tempfile::tempdir().unwrap();
    let config = AgentConfig {
        node: lizard_node::NodeConfig::new(dir.path()),
        server: "http://127.0.0.1:9".into(),
        token: None,
        region: "eu-1".into(),
        listen: "127.0.0.1:0".parse().unwrap(),
        advertise: None,
    };
    let e = run(config, std::future::pending()).await.unwrap_err().to_string();
    assert!(e.contains("pass --token"), "{e}");
}

#[tokio::test]
async fn a_server_that_is_down_at_first_is_joined_when_it_comes_up() {
    let server_port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let config = AgentConfig {
        node: lizard_node::NodeConfig::new(dir.path()),
        server: format!("http://127.0.0.1:{server_port}"),
        token: Some("lzn_join".into()),
        region: "eu-1".into(),
        listen: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
        advertise: None,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let agent = tokio::spawn(run(config, async move {
        let _ = stopped.await;
    }));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!agent.is_finished(), "an unreachable server is waited for, not an error");
    assert!(!dir.path().join("node.json").exists());
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", server_port)).await.unwrap();
    let (_, seen) = stand_in_server_on(listener);
    until("the join and a heartbeat", || !seen.lock().unwrap().heartbeats.is_empty()).await;
    assert_eq!(seen.lock().unwrap().joins.len(), 1);
    stop.send(()).unwrap();
    agent.await.unwrap().unwrap();
}
