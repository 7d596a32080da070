//! The operator's `lizard node …` commands against a stand-in control plane (no VM):
//! the routes and methods they call, the key they send, what they print.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

mod common;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use common::lizard_command;
use lizard_api::cluster::{CreateNodeTokenRequest, NodeCapacity, NodeInfo, NodeState, NodeToken, NodeUsage};
use lizard_api::routes;
use std::sync::{Arc, Mutex};

type Calls = Arc<Mutex<Vec<String>>>;

fn node(id: &str, state: NodeState) -> NodeInfo {
    NodeInfo {
        id: id.into(),
        region: "eu-1".into(),
        address: Some("http://10.0.0.5:7180".into()),
        state,
        capacity: NodeCapacity { vcpus: 16, memory_mib: 32_000, disk_gib: 50 },
        usage: NodeUsage { vcpus: 2, memory_mib: 1024, sandboxes: 1 },
        templates: vec!["base".into()],
        last_heartbeat: Some("2026-12-01T12:00:00Z".into()),
        joined_at: "2026-12-01T11:00:00Z".into(),
    }
}

fn seen(calls: &Calls, h: &HeaderMap, what: String) {
    assert_eq!(h.get("x-api-key").unwrap(), "lz_operator", "{what}");
    calls.lock().unwrap().push(what);
}

/// The operator routes, answering fixed values and recording each call.
fn stand_in(rt: &tokio::runtime::Runtime) -> (String, Calls) {
    let calls = Calls::default();
    let app = Router::new()
        .route(
            routes::LIST_NODES.path,
            get(|State(c): State<Calls>, h: HeaderMap| async move {
                seen(&c, &h, "list".into());
                Json(vec![node("node_a", NodeState::Up), node("node_b", NodeState::Down)])
            }),
        )
        .route(
            routes::GET_NODE.path,
            get(|State(c): State<Calls>, h: HeaderMap, Path(id): Path<String>| async move {
                seen(&c, &h, format!("get {id}"));
                Json(node(&id, NodeState::Up))
            }),
        )
        .route(
            routes::DRAIN_NODE.path,
            post(|State(c): State<Calls>, h: HeaderMap, Path(id): Path<String>| async move {
                seen(&c, &h, format!("drain {id}"));
                Json(node(&id, NodeState::Draining))
            }),
        )
        .route(
            routes::UNDRAIN_NODE.path,
            post(|State(c): State<Calls>, h: HeaderMap, Path(id): Path<String>| async move {
                seen(&c, &h, format!("undrain {id}"));
                Json(node(&id, NodeState::Up))
            }),
        )
        .route(
            routes::CREATE_NODE_TOKEN.path,
            post(|State(c): State<Calls>, h: HeaderMap, Json(req): Json<CreateNodeTokenRequest>| async move {
                seen(&c, &h, format!("create ttl={:?}", req.ttl_secs));
                let token = NodeToken {
                    id: "ntk_1".into(),
                    token: Some("lzn_secret".into()),
                    created_at: "2026-12-01T12:00:00Z".into(),
                    expires_at: req.ttl_secs.map(|_| "2026-12-01T13:00:00Z".into()),
                };
                (StatusCode::CREATED, Json(token))
            })
            .get(|State(c): State<Calls>, h: HeaderMap| async move {
                seen(&c, &h, "tokens".into());
                Json(vec![NodeToken {
                    id: "ntk_1".into(),
                    token: None,
                    created_at: "2026-12-01T12:00:00Z".into(),
                    expires_at: None,
                }])
            }),
        )
        .route(
            routes::REVOKE_NODE_TOKEN.path,
            delete(|State(c): State<Calls>, h: HeaderMap, Path(id): Path<String>| async move {
                seen(&c, &h, format!("revoke {id}"));
                StatusCode::NO_CONTENT
            }),
        )
        .with_state(calls.clone());
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    rt.spawn(async move { axum::serve(listener, app).await });
    (url, calls)
}

fn lizard(url: &str, args: &[&str]) -> String {
    let o =
        lizard_command().env("LIZARD_API_URL", url).env("LIZARD_API_KEY", "lz_operator").args(args).output().unwrap();
    assert!(o.status.success(), "lizard {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn operator_commands_call_the_operator_routes() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (url, calls) = stand_in(&rt);

    let list = lizard(&url, &["node", "list"]);
    let lines: Vec<_> = list.lines().collect();
    assert!(lines[0].starts_with("ID      REGION  STATE"), "{list}");
    assert!(lines[1].starts_with("node_a  eu-1    up") && lines[2].starts_with("node_b  eu-1    down"), "{list}");
    let json: Vec<NodeInfo> = serde_json::from_str(&lizard(&url, &["--json", "node", "list"])).unwrap();
    assert_eq!(json.len(), 2);
    assert!(lizard(&url, &["node", "get", "node_a"]).contains("vcpus           2 of 16"));
    assert!(lizard(&url, &["node", "drain", "node_a"]).contains("state           draining"));
    assert!(lizard(&url, &["node", "undrain", "node_a"]).contains("state           up"));
    let made = lizard(&url, &["node", "token", "create", "--ttl", "1h"]);
    assert!(made.contains("lzn_secret") && made.contains("2026-12-01T13:00:00Z"), "{made}");
    lizard(&url, &["node", "token", "create"]);
    assert!(lizard(&url, &["node", "token", "list"]).contains("ntk_1"));
    assert_eq!(lizard(&url, &["node", "token", "revoke", "ntk_1"]), "revoked ntk_1\n");
    assert_eq!(
        *calls.lock().unwrap(),
        [
            "list",
            "list",
            "get node_a",
            "drain node_a",
            "undrain node_a",
            "create ttl=Some(3600)",
            "create ttl=None",
            "tokens",
            "revoke ntk_1"
        ]
    );

    // Without a server: a clear error, no call.
    let o = lizard_command().args(["node", "list"]).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("`lizard node list` talks to a Lizard server"));
}
