//! Two replicas on one PostgreSQL database, two node agents, real microVMs: creates spread
//! over the nodes, any replica reaches any sandbox (API and sandbox URL), a SIGKILLed node
//! is leased out (its sandboxes lost, the other node untouched) and reconciled when back,
//! a SIGKILLed replica leaves the other serving and reaping, and a revoked key is refused
//! by every replica at once. What each node left on the host is counted before and after.

use lizard_cluster_tests::fleet::{Fleet, HostCounts, LEASE_MS};
use reqwest::Method;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A guest web server answering `served by <id>` on port 8000.
const SERVE: &str = "mkdir -p /tmp/www && hostname > /tmp/www/index.html && \
    (cd /tmp/www && nohup python3 -m http.server 8000 >/dev/null 2>&1 &)";

/// A GET through a replica's sandbox-URL proxy: status and body.
async fn through_proxy(fleet: &Fleet, r: usize, id: &str, port: u16) -> (u16, String) {
    let host = format!("{id}-{port}.sandbox.local.lizard.localhost");
    let mut conn = tokio::net::TcpStream::connect(fleet.replicas[r].proxy).await.expect("connect the proxy");
    let req = format!("GET /index.html HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    conn.write_all(req.as_bytes()).await.expect("send");
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

async fn state(fleet: &Fleet, r: usize, id: &str) -> String {
    let (status, info) = fleet.call(r, Method::GET, &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(status, 200, "{info}");
    info["state"].as_str().unwrap_or_default().to_string()
}

/// Whether sandbox `id` has ended (404 naming why, containing `why`); while its node is
/// silent but not yet leased out, the replica answers 503 `UNAVAILABLE` (not reachable),
/// which is "not yet".
async fn ended(fleet: &Fleet, r: usize, id: &str, why: &str) -> bool {
    let (status, info) = fleet.call(r, Method::GET, &format!("/v1/sandboxes/{id}"), None).await;
    match status {
        200 => false,
        404 => {
            let message = info["message"].as_str().unwrap_or_default();
            assert!(message.contains(why), "{id} ended, but not as {why:?}: {info}");
            true
        }
        503 => {
            assert_eq!(info["code"], "UNAVAILABLE", "{info}");
            false
        }
        _ => panic!("GET {id}: {status} {info}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleet_spreads_routes_and_survives_losing_a_node_and_a_replica() {
    let mut fleet = Fleet::start(2, 2).await;
    let empty = HostCounts { vmms: 0, netns: 0, links: 0, volumes: 0 };
    for n in 0..2 {
        assert_eq!(fleet.host_counts(n), empty, "node {n} starts with nothing");
    }

    // The reference's basic flow through each replica: create, exec, files, pause/resume, kill.
    for r in 0..2 {
        let id = fleet.create(r, json!({})).await;
        assert_eq!(fleet.exec(r, &id, "echo hi").await, (0, "hi\n".into()));
        let other = 1 - r;
        let (status, _) = fleet.call(other, Method::POST, &format!("/v1/sandboxes/{id}/pause"), None).await;
        assert_eq!(status, 200, "pause through the other replica");
        assert_eq!(state(&fleet, r, &id).await, "paused");
        let (status, info) = fleet.call(r, Method::POST, &format!("/v1/sandboxes/{id}/resume"), None).await;
        assert_eq!(status, 200, "resume: {info}");
        assert_eq!(fleet.exec(other, &id, "echo again").await, (0, "again\n".into()));
        let (status, _) = fleet.call(other, Method::DELETE, &format!("/v1/sandboxes/{id}"), None).await;
        assert_eq!(status, 204);
    }

    // Ten creates, alternating replicas, spread over both nodes.
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(fleet.create(i % 2, json!({})).await);
    }
    let mut per_node = BTreeMap::new();
    for id in &ids {
        let n = fleet.node_of(id).unwrap_or_else(|| panic!("{id} runs on no node agent"));
        *per_node.entry(n).or_insert(0) += 1;
    }
    assert_eq!(per_node.len(), 2, "creates spread over both nodes: {per_node:?}");
    assert!(per_node.values().all(|&c| c >= 3), "least loaded first: {per_node:?}");
    let on = |n: usize| ids.iter().filter(|id| fleet.node_of(id) == Some(n)).cloned().collect::<Vec<_>>();
    let (on_a, on_b) = (on(0), on(1));
    assert_eq!(fleet.host_counts(1).vmms, on_b.len(), "node B runs exactly its sandboxes");

    // A sandbox on node B answers through replica A's sandbox-URL proxy (and B's).
    let web = on_b[0].clone();
    let (code, _) = fleet.exec(0, &web, SERVE).await;
    assert_eq!(code, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = through_proxy(&fleet, 0, &web, 8000).await;
        if status == 200 {
            let (_, hostname) = fleet.exec(1, &web, "hostname").await;
            assert_eq!(body, hostname, "the proxy reached this sandbox");
            break;
        }
        assert!(Instant::now() < deadline, "the guest server never answered through replica A: {status} {body}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(through_proxy(&fleet, 1, &web, 8000).await.0, 200, "and through replica B");

    // A template pushed through replica A (no replica runs a node): built on a joined node,
    // and a sandbox of it created through replica B lands where the build is.
    let recipe = tempfile::tempdir().unwrap();
    std::fs::write(recipe.path().join("hello.txt"), "hello from the fleet\n").unwrap();
    std::fs::write(
        recipe.path().join("lizard.template.toml"),
        "name = \"fleet-tpl\"\nfrom = \"base\"\n[build]\nvcpus = 1\nmemory_mib = 1024\ninternet = false\n\
         [[steps]]\ncopy = { src = \"hello.txt\", dest = \"/opt/hello.txt\" }\n",
    )
    .unwrap();
    let dir = recipe.path().to_str().unwrap();
    let (pushed, out, err) = fleet.cli(0, &["push", dir, "--project", &fleet.project]).await;
    assert!(pushed, "push through replica A:\n{out}\n{err}");
    // At once: the build's end notes the node holding it (no waiting for its heartbeat).
    let (status, info) = fleet.try_create(1, json!({"template": "fleet-tpl"})).await;
    assert_eq!(status, 201, "create fleet-tpl right after its push: {info}");
    let from_template = info["sandboxId"].as_str().expect("sandboxId").to_string();
    assert_eq!(fleet.exec(0, &from_template, "cat /opt/hello.txt").await, (0, "hello from the fleet\n".into()));
    assert_eq!(fleet.call(0, Method::DELETE, &format!("/v1/sandboxes/{from_template}"), None).await.0, 204);

    // Two volumes: the second goes to the node with fewer. The one on B holds a file that survives
    // B's loss below (a down node's volumes are unavailable, never deleted).
    let mut volumes = Vec::new();
    for name in ["va", "vb"] {
        let (status, v) = fleet
            .call(0, Method::POST, "/v1/volumes", Some(json!({"name": name, "projectId": fleet.project, "sizeGb": 1})))
            .await;
        assert_eq!(status, 201, "{v}");
        volumes.push(v["id"].as_str().expect("volume id").to_string());
    }
    let homes: Vec<_> = volumes.iter().map(|v| fleet.node_of_volume(v)).collect();
    assert!(homes == [Some(0), Some(1)] || homes == [Some(1), Some(0)], "one volume on each node: {homes:?}");
    let vb = if homes[1] == Some(1) { "vb" } else { "va" };
    let holder = fleet.create(1, json!({"volumeName": vb})).await;
    assert_eq!(fleet.node_of(&holder), Some(1), "a sandbox with a volume runs on its node");
    assert_eq!(fleet.exec(0, &holder, "echo kept > /workspace/f && sync").await.0, 0);
    assert_eq!(fleet.call(0, Method::DELETE, &format!("/v1/sandboxes/{holder}"), None).await.0, 204);

    // A revoked key is refused by both replicas at once.
    let (status, key) = fleet.call(0, Method::POST, "/v1/api-keys", Some(json!({"name": "short-lived"}))).await;
    assert_eq!(status, 201, "{key}");
    let (key_id, secret) = (key["id"].as_str().unwrap().to_string(), key["key"].as_str().unwrap().to_string());
    for r in 0..2 {
        assert_eq!(fleet.call_as(&secret, r, Method::GET, "/v1/sandboxes", None).await.0, 200);
    }
    assert_eq!(fleet.call(1, Method::DELETE, &format!("/v1/api-keys/{key_id}"), None).await.0, 204);
    for r in 0..2 {
        assert_eq!(fleet.call_as(&secret, r, Method::GET, "/v1/sandboxes", None).await.0, 401, "replica {r}");
    }

    // Node B SIGKILLed: within its lease its sandboxes are lost, node A's are untouched,
    // and creates keep succeeding (on A).
    let b_left = fleet.host_counts(1);
    fleet.nodes[1].process.kill9();
    let killed_at = Instant::now();
    fleet
        .wait_for(Duration::from_millis(LEASE_MS * 3), "node B's sandboxes recorded lost", || async {
            let mut all = true;
            for id in &on_b {
                all &= ended(&fleet, 1, id, "lost: its node stopped answering").await;
            }
            all
        })
        .await;
    assert!(killed_at.elapsed() >= Duration::from_millis(LEASE_MS / 2), "not before the lease ran out");
    assert_eq!(fleet.node_info(0, 1).await["state"], "down");
    for id in &on_a {
        assert_eq!(fleet.exec(1, id, "echo alive").await, (0, "alive\n".into()), "{id} on node A");
    }
    for r in 0..2 {
        let id = fleet.create(r, json!({})).await;
        assert_eq!(fleet.node_of(&id), Some(0), "a create while B is down goes to A");
        ids.push(id);
    }
    let (status, err) = fleet.try_create(0, json!({"volumeName": vb})).await;
    assert_eq!((status, err["code"].as_str()), (503, Some("UNAVAILABLE")), "a volume on a down node: {err}");
    assert_eq!(fleet.host_counts(1).volumes, 1, "its disk is kept");

    // Node A drained too: no node has room, and the create says so at once.
    assert_eq!(fleet.call(0, Method::POST, &format!("/v1/nodes/{}/drain", fleet.nodes[0].id), None).await.0, 200);
    let asked = Instant::now();
    let (status, err) = fleet.try_create(1, json!({})).await;
    assert_eq!((status, err["code"].as_str()), (503, Some("UNAVAILABLE")), "{err}");
    assert!(asked.elapsed() < Duration::from_secs(5), "a full fleet answers at once");
    assert_eq!(fleet.call(1, Method::POST, &format!("/v1/nodes/{}/undrain", fleet.nodes[0].id), None).await.0, 200);

    // Node B back: it reconciles (the VMs it left are stopped, their networks gone) and is up.
    assert_eq!(b_left.vmms, on_b.len(), "B's VMMs outlived its agent, as after a crash");
    fleet.nodes[1].process.restart();
    fleet.wait_nodes_up().await;
    fleet
        .wait_for(Duration::from_secs(60), "node B's leftovers stopped", || async {
            fleet.host_counts(1) == HostCounts { volumes: 1, ..empty.clone() }
        })
        .await;
    let id = fleet.create(0, json!({"volumeName": vb})).await;
    assert_eq!(fleet.exec(1, &id, "cat /workspace/f").await, (0, "kept\n".into()), "the volume is back with B");
    assert_eq!(fleet.call(1, Method::DELETE, &format!("/v1/sandboxes/{id}"), None).await.0, 204);

    // Replica A SIGKILLed: B serves, and reaps (a short timeout still ends its sandbox).
    fleet.replicas[0].process.kill9();
    let short = fleet.create(1, json!({"timeoutMs": 3000})).await;
    assert_eq!(fleet.exec(1, &short, "echo served").await, (0, "served\n".into()));
    fleet
        .wait_for(Duration::from_secs(30), "the timeout reaped by replica B", || async {
            ended(&fleet, 1, &short, "timed out").await
        })
        .await;
    for id in &on_a {
        assert_eq!(fleet.exec(1, id, "echo still").await.0, 0);
    }
    for n in 0..2 {
        assert_eq!(fleet.node_info(1, n).await["state"], "up", "both nodes stay up without replica A");
    }

    // Everything killed through the surviving replica: nothing is left on either node.
    for id in &ids {
        let (status, _) = fleet.call(1, Method::DELETE, &format!("/v1/sandboxes/{id}"), None).await;
        assert!(status == 204 || status == 404, "kill {id}: {status}");
    }
    for v in &volumes {
        let (status, body) = fleet.call(1, Method::DELETE, &format!("/v1/volumes/{v}"), None).await;
        assert_eq!(status, 204, "delete volume {v}: {body}");
    }
    for n in 0..2 {
        fleet
            .wait_for(Duration::from_secs(30), &format!("node {n} left with nothing"), || async {
                fleet.host_counts(n) == empty
            })
            .await;
    }
}
