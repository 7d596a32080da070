//! The operator's `lizard node …` commands against the real control plane (`lizard server
//! --no-local-node`) with real `lizard node join` agents (no VM is booted): a token the
//! CLI mints is one nodes join with; what `node list/get` print is what `GET /v1/nodes`
//! holds; drain and undrain change it (a drained node is not placed on); a revoked token joins nothing; only an operator
//! key is served.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

use crate::cluster;
use crate::common;

use cluster::{start_node, until, ControlPlane, Process, REGION};
use common::{free_port, lizard_command, stderr};
use lizard_api::cluster::{NodeInfo, NodeState, NodeToken};
use reqwest::Method;
use serde_json::json;
use std::process::Output;

fn run(cp: &ControlPlane, key: &str, args: &[&str]) -> Output {
    lizard_command().env("LIZARD_API_URL", &cp.url).env("LIZARD_API_KEY", key).args(args).output().unwrap()
}

/// `lizard ARGS` as the operator: its stdout.
fn lizard(cp: &ControlPlane, args: &[&str]) -> String {
    let o = run(cp, &cp.key, args);
    assert!(o.status.success(), "lizard {args:?}: {}", stderr(&o));
    String::from_utf8(o.stdout).unwrap()
}

/// `lizard ARGS` with `key`, failing with `error: CODE: …`.
fn fails(cp: &ControlPlane, key: &str, args: &[&str], code: &str) {
    let o = run(cp, key, args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "lizard {args:?}: {err}");
    assert!(err.starts_with(&format!("error: {code}: ")), "lizard {args:?}: expected {code}: {err}");
}

/// The value of `field` in `lizard node get`-style output (`field   value` lines).
fn field(out: &str, name: &str) -> String {
    let line = out.lines().find(|l| l.split_whitespace().next() == Some(name)).unwrap_or_else(|| panic!("{out}"));
    line[name.len()..].trim().to_owned()
}

/// A no-VM node agent (no prespawned VMs) joined with `token`, its data in `dir`.
fn node(cp: &ControlPlane, dir: &std::path::Path, port: u16, token: &str) -> Process {
    static NODES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NODES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let prefix = format!("lzo{:03}{n}", std::process::id() % 1000);
    start_node(dir, &cp.url, port, Some(token), &prefix, &["--prespawn", "0"])
}

#[tokio::test(flavor = "multi_thread")]
async fn operator_commands_against_the_real_control_plane() {
    let cp = ControlPlane::start(3000).await;

    // Tokens: the CLI mints them (shown once), lists them, and a node joins with one.
    let made = lizard(&cp, &["node", "token", "create", "--ttl", "2h", "--uses", "2"]);
    let (ttl_id, token) = (field(&made, "id"), field(&made, "token"));
    assert!(token.starts_with("lzn_"), "{made}");
    assert!(field(&made, "expires").starts_with("20"), "an expiry two hours out: {made}");
    assert_eq!(field(&made, "uses"), "2", "{made}");
    let default: NodeToken = serde_json::from_str(&lizard(&cp, &["--json", "node", "token", "create"])).unwrap();
    assert!(default.expires_at.is_some() && default.uses_left == Some(1), "an hour, one join: {default:?}");
    let listed = lizard(&cp, &["node", "token", "list"]);
    assert!(listed.contains(&ttl_id) && listed.contains(&default.id), "{listed}");
    assert!(!listed.contains(&token), "a token's plaintext is shown once: {listed}");

    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (port_a, port_b) = (free_port(), free_port());
    let _a = node(&cp, dir_a.path(), port_a, &token);
    let a = cp.wait_for(&format!("http://127.0.0.1:{port_a}"), NodeState::Up, 60).await;
    let b_agent = node(&cp, dir_b.path(), port_b, &token);
    let b = cp.wait_for(&format!("http://127.0.0.1:{port_b}"), NodeState::Up, 60).await;
    // B stops: past its lease the server has it down.
    b_agent.signal(nix::sys::signal::Signal::SIGTERM);
    drop(b_agent);
    cp.wait_for(&format!("http://127.0.0.1:{port_b}"), NodeState::Down, 30).await;

    // list: the server's nodes, oldest first, as a table and as JSON.
    let list = lizard(&cp, &["node", "list"]);
    let lines: Vec<Vec<&str>> = list.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines[0][..3], ["ID", "REGION", "STATE"], "{list}");
    assert_eq!(lines[1][..3], [a.id.as_str(), REGION, "up"], "{list}");
    assert_eq!(lines[2][..3], [b.id.as_str(), REGION, "down"], "{list}");
    assert_eq!(lines[1][6], format!("http://127.0.0.1:{port_a}"), "{list}");
    let json: Vec<NodeInfo> = serde_json::from_str(&lizard(&cp, &["--json", "node", "list"])).unwrap();
    let ids: Vec<_> = json.iter().map(|n| (n.id.as_str(), n.state)).collect();
    assert_eq!(ids, [(a.id.as_str(), NodeState::Up), (b.id.as_str(), NodeState::Down)]);

    // get: what the node reported.
    let got = lizard(&cp, &["node", "get", &a.id]);
    assert_eq!(field(&got, "vcpus"), format!("0 of {}", a.capacity.vcpus), "{got}");
    assert_eq!(field(&got, "memory_mib"), format!("0 of {}", a.capacity.memory_mib), "{got}");
    assert_eq!(field(&got, "state"), "up", "{got}");
    fails(&cp, &cp.key, &["node", "get", "node_nobody"], "NOT_FOUND");

    // drain and undrain change the server's record; a down node stays down.
    assert_eq!(field(&lizard(&cp, &["node", "drain", &a.id]), "state"), "draining");
    assert_eq!(cp.node(&a.id).await.state, NodeState::Draining);
    // Placement skips it: with no other node up, a create is refused at once (no VM boots).
    let body = json!({"template": "base", "projectId": cp.project().await});
    let (status, refused) = cp.call(Method::POST, "/v1/sandboxes", Some(body)).await;
    assert_eq!((status, refused["code"].as_str()), (503, Some("UNAVAILABLE")), "{refused}");
    assert!(refused["message"].as_str().unwrap().starts_with("no node has room"), "{refused}");
    // Heartbeats do not undo a drain.
    let beat = cp.node(&a.id).await.last_heartbeat;
    until("a heartbeat while draining", 20, || async { cp.node(&a.id).await.last_heartbeat > beat }).await;
    assert_eq!(cp.node(&a.id).await.state, NodeState::Draining);
    assert_eq!(field(&lizard(&cp, &["node", "undrain", &a.id]), "state"), "up");
    assert_eq!(cp.node(&a.id).await.state, NodeState::Up);
    assert_eq!(field(&lizard(&cp, &["node", "drain", &b.id]), "state"), "down");
    fails(&cp, &cp.key, &["node", "undrain", &b.id], "CONFLICT");

    // revoke: gone from the list, and a node that tries it is refused and never joins.
    assert_eq!(lizard(&cp, &["node", "token", "revoke", &ttl_id]), format!("revoked {ttl_id}\n"));
    assert!(!lizard(&cp, &["node", "token", "list"]).contains(&ttl_id));
    let dir_c = tempfile::tempdir().unwrap();
    let mut c = node(&cp, dir_c.path(), free_port(), &token);
    let exited = c.child.wait().unwrap();
    assert!(!exited.success(), "a join with a revoked token fails");
    assert!(c.log().contains("UNAUTHENTICATED") || c.log().contains("401"), "{}", c.log());
    assert_eq!(cp.nodes().await.len(), 2, "nothing joined");

    // remove: the stopped B is forgotten (the server refuses its credential from now on,
    // `cluster::tests`); A, which runs, is refused nothing.
    assert_eq!(lizard(&cp, &["node", "remove", &b.id]), format!("removed {}\n", b.id));
    fails(&cp, &cp.key, &["node", "get", &b.id], "NOT_FOUND");
    fails(&cp, &cp.key, &["node", "remove", &b.id], "NOT_FOUND");
    assert_eq!(cp.nodes().await.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(), [a.id.as_str()]);

    // Only an operator key: a workspace's key is refused, a wrong key unknown.
    let (status, ws) = cp.call(Method::POST, "/v1/workspaces", Some(json!({"name": "scoped"}))).await;
    assert_eq!(status, 201, "{ws}");
    let body = json!({"name": "scoped", "workspaces": [ws["id"]]});
    let (status, scoped) = cp.call(Method::POST, "/v1/api-keys", Some(body)).await;
    assert_eq!(status, 201, "{scoped}");
    let scoped = scoped["key"].as_str().unwrap();
    for args in [&["node", "list"][..], &["node", "drain", &a.id], &["node", "token", "create"]] {
        fails(&cp, scoped, args, "FORBIDDEN");
    }
    fails(&cp, "lz_wrong", &["node", "list"], "UNAUTHENTICATED");
    assert_eq!(cp.node(&a.id).await.state, NodeState::Up, "the refused drain changed nothing");

    // Without a server: a clear error, no call.
    let o = lizard_command().args(["node", "list"]).output().unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("`lizard node list` talks to a Lizard server"));
}
