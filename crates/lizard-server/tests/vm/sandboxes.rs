//! Sandboxes through the control plane, with real microVMs: projects by name, scoped
//! keys, the token placed in the guest, timeouts, and forced workspace deletes.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::Api;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The control plane with the proxy and the timeout reaper; the owner's key.
async fn start() -> (Api, String) {
    let api = Api::builder("lizard-server-test-").proxy().reaper().start().await;
    let owner = api.owner.clone();
    (api, owner)
}

#[tokio::test(flavor = "multi_thread")]
async fn sandboxes_behind_scopes_timeouts_and_forced_deletes() {
    let (api, owner) = start().await;
    let w1 = api.ok("POST", "/v1/workspaces", &owner, Some(json!({"name": "w1"}))).await;
    let w2 = api.ok("POST", "/v1/workspaces", &owner, Some(json!({"name": "w2"}))).await;
    let p1 = api.ok("POST", "/v1/projects", &owner, Some(json!({"workspaceId": w1["id"], "name": "p1"}))).await;
    let k1 = api.ok("POST", "/v1/api-keys", &owner, Some(json!({"name": "u1", "workspaces": [w1["id"]]}))).await;
    let k2 = api.ok("POST", "/v1/api-keys", &owner, Some(json!({"name": "u2", "workspaces": [w2["id"]]}))).await;
    let (k1, k2) = (k1["key"].as_str().unwrap().to_string(), k2["key"].as_str().unwrap().to_string());

    // Bad requests fail before any VM boots.
    for (body, code) in [
        (json!({"template": "base"}), "INVALID_ARGUMENT"),
        (json!({"template": "base", "project": "p1", "bogus": 1}), "INVALID_ARGUMENT"),
        (json!({"template": "base", "project": "p1", "lizardToken": "lz_forged"}), "INVALID_ARGUMENT"),
        (json!({"template": "base", "project": "p1", "timeoutMs": 0}), "INVALID_ARGUMENT"),
        // Network options reach the node, which checks them before making anything.
        (json!({"template": "base", "project": "p1", "allowOut": ["10.0.0.0/33"]}), "INVALID_ARGUMENT"),
        (json!({"template": "base", "project": "p1", "denyOut": ["not-a-cidr"]}), "INVALID_ARGUMENT"),
        (json!({"template": "base", "project": "p1", "allowInternetAccess": "yes"}), "INVALID_ARGUMENT"),
        (json!({"template": "base", "project": "p1"}), "NOT_FOUND"), // with k2: outside its scope
    ] {
        let key = if code == "NOT_FOUND" { &k2 } else { &owner };
        let (_, v) = api.call("POST", "/v1/sandboxes", key, Some(body.clone())).await;
        assert_eq!(v["code"], code, "{body}: {v}");
    }
    // An unknown template: 404, the answer another workspace's pushed template gets too.
    let (_, v) = api.call("POST", "/v1/sandboxes", &owner, Some(json!({"template": "nope", "project": "p1"}))).await;
    assert_eq!(v["code"], "NOT_FOUND", "{v}");
    assert!(api.node.list().is_empty());

    // Created by project name with a scoped token inside.
    let s = api
        .ok(
            "POST",
            "/v1/sandboxes",
            &k1,
            Some(
                json!({"template": "base", "project": "p1", "timeoutMs": 120000, "env": {"A": "1"}, "lizardToken": k1}),
            ),
        )
        .await;
    let id = s["sandboxId"].as_str().unwrap().to_string();
    assert_eq!(s["projectId"], p1["id"]);
    assert_eq!(s["domain"], "sandbox.local.lizard.localhost");
    let r =
        api.ok("POST", &format!("/v1/sandboxes/{id}/exec"), &k1, Some(json!({"cmd": "echo $A $LIZARD_API_KEY"}))).await;
    assert_eq!(r["stdout"], format!("1 {k1}\n"));
    assert_eq!(r["exitCode"], 0);
    let put = api
        .client
        .put(format!("{}/v1/sandboxes/{id}/files?path=/tmp/x.txt", api.base))
        .header("x-api-key", &k1)
        .body("data")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let got = api
        .client
        .get(format!("{}/v1/sandboxes/{id}/files?path=/tmp/x.txt", api.base))
        .header("x-api-key", &owner)
        .send()
        .await
        .unwrap();
    assert_eq!(got.text().await.unwrap(), "data");

    // Another workspace's key sees and touches nothing of it.
    assert_eq!(api.call("GET", &format!("/v1/sandboxes/{id}"), &k2, None).await.0, 404);
    assert_eq!(api.call("POST", &format!("/v1/sandboxes/{id}/exec"), &k2, Some(json!({"cmd": "true"}))).await.0, 404);
    assert_eq!(api.call("DELETE", &format!("/v1/sandboxes/{id}"), &k2, None).await.0, 404);
    assert_eq!(api.ok("GET", "/v1/sandboxes", &k2, None).await, json!([]));
    assert_eq!(api.ok("GET", "/v1/sandboxes", &k1, None).await.as_array().unwrap().len(), 1);

    // A shorter timeout: the reaper kills it, and it answers 404 with the reason.
    api.ok("POST", &format!("/v1/sandboxes/{id}/timeout"), &k1, Some(json!({"timeoutMs": 1000}))).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (status, v) = api.call("GET", &format!("/v1/sandboxes/{id}"), &k1, None).await;
        if status == 404 {
            assert!(v["message"].as_str().unwrap().contains("timed out"), "{v}");
            break;
        }
        assert!(Instant::now() < deadline, "the sandbox outlived its timeout");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(api.node.get(&id).is_err());

    // A forced workspace delete kills what runs inside.
    let s = api.ok("POST", "/v1/sandboxes", &owner, Some(json!({"template": "base", "projectId": p1["id"]}))).await;
    let id2 = s["sandboxId"].as_str().unwrap().to_string();
    // A snapshot of it (taken as E2B's route takes one, lizard-e2b-face) starts a sandbox
    // through Lizard's API by its id, in its own project only.
    api.sh(&owner, &id2, "echo kept > /root/k").await;
    let store = api.state.server.store.clone();
    let record = store.get_sandbox(&id2).await.unwrap().unwrap();
    let live = lizard_server::ops::sandboxes::live(&api.state, record).await.unwrap();
    let snap = lizard_server::ops::snapshots::take(&api.state, &live, None).await.unwrap().id;
    let from = api.ok("POST", "/v1/sandboxes", &owner, Some(json!({"template": snap, "projectId": p1["id"]}))).await;
    assert_eq!(from["template"], "base");
    let id3 = from["sandboxId"].as_str().unwrap().to_string();
    assert_eq!(api.sh(&owner, &id3, "cat /root/k").await.1, "kept\n");
    let p2 = api.ok("POST", "/v1/projects", &owner, Some(json!({"workspaceId": w2["id"], "name": "p2"}))).await;
    let elsewhere = json!({"template": snap, "projectId": p2["id"]});
    api.fails("POST", "/v1/sandboxes", &owner, Some(elsewhere), "NOT_FOUND").await;
    assert_eq!(api.node.sandbox_snapshots().len(), 1);
    let (status, v) = api.call("DELETE", &format!("/v1/workspaces/{}", w1["id"].as_str().unwrap()), &owner, None).await;
    assert_eq!((status, v["code"].as_str()), (409, Some("CONFLICT")));
    api.ok("DELETE", &format!("/v1/workspaces/{}?force=true", w1["id"].as_str().unwrap()), &owner, None).await;
    assert!(api.node.get(&id2).is_err(), "forced delete left the VM running");
    assert!(api.node.get(&id3).is_err(), "forced delete left the VM running");
    assert_eq!(api.call("GET", &format!("/v1/sandboxes/{id2}"), &owner, None).await.0, 404);
    // Its snapshots went with it, records and saves.
    assert!(store.list_snapshots(&api.account).await.unwrap().is_empty(), "forced delete left a snapshot");
    assert!(api.node.sandbox_snapshots().is_empty(), "forced delete left a snapshot's save");

    // The document lists the sandbox routes.
    let doc = api.ok("GET", "/openapi.json", &owner, None).await;
    for path in [
        "/v1/sandboxes",
        "/v1/sandboxes/{id}",
        "/v1/sandboxes/{id}/exec",
        "/v1/sandboxes/{id}/files",
        "/v1/sandboxes/{id}/timeout",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} missing from /openapi.json");
    }
    api.node.shutdown().await;
    assert!(std::fs::read_dir(api.dir.path().join("node/sandboxes")).unwrap().next().is_none(), "sandbox dirs left");
}

/// The reference's first example, reached through its sandbox URL with a real HTTP
/// client; an upgraded connection (what a WebSocket is) echoes through the proxy.
#[tokio::test(flavor = "multi_thread")]
async fn sandbox_urls_reach_the_right_port_of_the_right_sandbox() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (api, owner) = start().await;
    let w = api.ok("POST", "/v1/workspaces", &owner, Some(json!({"name": "w"}))).await;
    api.ok("POST", "/v1/projects", &owner, Some(json!({"workspaceId": w["id"], "name": "my-project"}))).await;
    let s = api.ok("POST", "/v1/sandboxes", &owner, Some(json!({"template": "base", "project": "my-project"}))).await;
    let id = s["sandboxId"].as_str().unwrap().to_string();
    // Plain HTTP, a raw upgraded echo, and a minimal RFC 6455 WebSocket echo (the base
    // template has no npm packages, so the framing is written out here).
    let server_js = r#"
const http = require('http'), crypto = require('crypto')
const s = http.createServer((req, res) => res.end('hello from Lizard ' + req.url))
s.on('upgrade', (req, sock) => {
  const key = req.headers['sec-websocket-key']
  if (!key) {
    sock.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n')
    return sock.pipe(sock)
  }
  const accept = crypto.createHash('sha1').update(key + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64')
  sock.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ' + accept + '\r\n\r\n')
  let buf = Buffer.alloc(0)
  sock.on('data', d => {
    buf = Buffer.concat([buf, d])
    while (buf.length >= 2) {
      const op = buf[0] & 0x0f
      let len = buf[1] & 0x7f, off = 2
      if (len === 126) { if (buf.length < 4) return; len = buf.readUInt16BE(2); off = 4 }
      const masked = (buf[1] & 0x80) !== 0
      if (buf.length < off + (masked ? 4 : 0) + len) return
      const mask = masked ? buf.subarray(off, off + 4) : null
      if (masked) off += 4
      const payload = Buffer.from(buf.subarray(off, off + len))
      if (mask) for (let i = 0; i < len; i++) payload[i] ^= mask[i % 4]
      buf = buf.subarray(off + len)
      if (op === 8) return sock.end(Buffer.from([0x88, 0]))
      let head
      if (len < 126) head = Buffer.from([0x80 | op, len])
      else { head = Buffer.alloc(4); head[0] = 0x80 | op; head[1] = 126; head.writeUInt16BE(len, 2) }
      sock.write(Buffer.concat([head, payload]))
    }
  })
})
s.listen(3000)
"#;
    let put = api
        .client
        .put(format!("{}/v1/sandboxes/{id}/files?path=/app/server.js", api.base))
        .header("x-api-key", &owner)
        .body(server_js)
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    api.ok(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        &owner,
        Some(json!({"cmd": "node /app/server.js > /dev/null 2>&1 &"})),
    )
    .await;

    let host = format!("{id}-3000.{}", s["domain"].as_str().unwrap());
    let client = reqwest::Client::builder().no_proxy().resolve(&host, api.proxy_addr()).build().unwrap();
    let url = format!("http://{host}:{}/hi", api.proxy_addr().port());
    let deadline = Instant::now() + Duration::from_secs(60);
    let body = loop {
        let resp = client.get(&url).send().await.unwrap();
        if resp.status() == 200 {
            break resp.text().await.unwrap();
        }
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["code"], "PORT_CLOSED", "{v}");
        assert!(Instant::now() < deadline, "the guest server never answered");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(body, "hello from Lizard /hi");

    // Upgrade: after 101 the connection is a byte pipe to the guest.
    let mut tcp = tokio::net::TcpStream::connect(api.proxy_addr()).await.unwrap();
    tcp.write_all(format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        assert_eq!(tcp.read(&mut b).await.unwrap(), 1, "proxy closed during the upgrade");
        head.push(b[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&head));
    for msg in [&b"ping"[..], &b"second message"[..]] {
        tcp.write_all(msg).await.unwrap();
        let mut got = vec![0u8; msg.len()];
        tcp.read_exact(&mut got).await.unwrap();
        assert_eq!(got, msg);
    }

    // A real WebSocket client: text and binary messages echo through the proxy.
    {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::Message;
        let tcp = tokio::net::TcpStream::connect(api.proxy_addr()).await.unwrap();
        let (mut ws, resp) =
            tokio_tungstenite::client_async(format!("ws://{host}:{}/ws", api.proxy_addr().port()), tcp)
                .await
                .expect("WebSocket handshake through the proxy");
        assert_eq!(resp.status(), 101);
        for msg in [Message::text("hello over ws"), Message::binary(vec![7u8; 1000])] {
            ws.send(msg.clone()).await.unwrap();
            assert_eq!(ws.next().await.unwrap().unwrap(), msg);
        }
        ws.close(None).await.unwrap();
    }

    // Never another sandbox: unknown ids, closed ports, other domains.
    let proxy = api.proxy_addr();
    let get = |h: String| {
        let c = reqwest::Client::builder().no_proxy().resolve(&h, proxy).build().unwrap();
        async move {
            let r = c.get(format!("http://{h}:{}/", proxy.port())).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (status, v) = get(format!("nosuchsandbox-3000.{}", s["domain"].as_str().unwrap())).await;
    assert_eq!((status, v["code"].as_str()), (404, Some("NOT_FOUND")));
    let (status, v) = get(format!("{id}-3999.{}", s["domain"].as_str().unwrap())).await;
    assert_eq!((status, v["code"].as_str()), (502, Some("PORT_CLOSED")));
    let (status, _) = get(format!("{id}-3000.sandbox.elsewhere.lizard.localhost")).await;
    assert_eq!(status, 404);
    api.ok("DELETE", &format!("/v1/sandboxes/{id}"), &owner, None).await;
    let (status, _) = get(host.clone()).await;
    assert_eq!(status, 404, "a killed sandbox's URL still answered");
    api.node.shutdown().await;
}

/// A sandbox's counter file: the loop that writes it is a process that must survive a
/// pause. Exec through the API.
async fn counter(api: &Api, key: &str, id: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = api
            .ok(
                "POST",
                &format!("/v1/sandboxes/{id}/exec"),
                key,
                Some(json!({"cmd": "cat /tmp/counter 2>/dev/null || true"})),
            )
            .await;
        if let Ok(n) = r["stdout"].as_str().unwrap().trim().parse() {
            return n;
        }
        assert!(Instant::now() < deadline, "the counter never started");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// GET / through the sandbox URL of port 3000, waiting for a server still starting.
async fn via_url(api: &Api, sandbox: &Value) -> String {
    let host = format!("{}-3000.{}", sandbox["sandboxId"].as_str().unwrap(), sandbox["domain"].as_str().unwrap());
    let client = reqwest::Client::builder().no_proxy().resolve(&host, api.proxy_addr()).build().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let resp = client.get(format!("http://{host}:{}/", api.proxy_addr().port())).send().await.unwrap();
        if resp.status() == 200 {
            return resp.text().await.unwrap();
        }
        assert!(Instant::now() < deadline, "the guest server never answered: {}", resp.status());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_resume_connect_fork_and_pause_on_timeout() {
    let (api, owner) = start().await;
    let w = api.ok("POST", "/v1/workspaces", &owner, Some(json!({"name": "w"}))).await;
    let other = api.ok("POST", "/v1/workspaces", &owner, Some(json!({"name": "other"}))).await;
    api.ok("POST", "/v1/projects", &owner, Some(json!({"workspaceId": w["id"], "name": "p"}))).await;
    let outsider =
        api.ok("POST", "/v1/api-keys", &owner, Some(json!({"name": "o", "workspaces": [other["id"]]}))).await;
    let outsider = outsider["key"].as_str().unwrap().to_string();

    // Paused by its timeout rather than killed.
    let body = json!({"template": "base", "project": "p", "timeoutMs": 20000, "onTimeout": "pause"});
    let s = api.ok("POST", "/v1/sandboxes", &owner, Some(body)).await;
    let id = s["sandboxId"].as_str().unwrap().to_string();
    let exec = |cmd: &str| json!({ "cmd": cmd });
    // One tick a second: it must not tick during the 8 s the sandbox stays paused.
    let counter_loop = "nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/c.tmp; mv /tmp/c.tmp /tmp/counter; sleep 1; done' >/dev/null 2>&1 &";
    api.ok("POST", &format!("/v1/sandboxes/{id}/exec"), &owner, Some(exec(counter_loop))).await;
    let server =
        r#"node -e "require('http').createServer((q,r)=>r.end('pid '+process.pid)).listen(3000)" >/dev/null 2>&1 &"#;
    api.ok("POST", &format!("/v1/sandboxes/{id}/exec"), &owner, Some(exec(server))).await;
    api.ok("POST", &format!("/v1/sandboxes/{id}/exec"), &owner, Some(exec("echo kept > /root/note.txt"))).await;
    let page = via_url(&api, &s).await;
    // Read the counter until the sandbox pauses: the last value read is within a tick of
    // the pause.
    let mut before = counter(&api, &owner, &id).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, r) =
            api.call("POST", &format!("/v1/sandboxes/{id}/exec"), &owner, Some(exec("cat /tmp/counter"))).await;
        if status == 409 {
            assert!(r["message"].as_str().unwrap().contains("paused"), "{r}");
            break;
        }
        assert_eq!(status, 200, "{r}");
        before = r["stdout"].as_str().unwrap().trim().parse().unwrap();
        assert!(Instant::now() < deadline, "never paused at its timeout");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Kept for the operator's retention (7 days by default), not killed. (The record
    // follows the node's pause within moments.)
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let paused = api.ok("GET", &format!("/v1/sandboxes/{id}"), &owner, None).await;
        assert_eq!(paused["state"], "paused");
        let end: humantime::Timestamp = paused["endAt"].as_str().unwrap().parse().unwrap();
        if std::time::SystemTime::from(end) > std::time::SystemTime::now() + Duration::from_secs(6 * 24 * 3600) {
            break;
        }
        assert!(Instant::now() < deadline, "a paused sandbox keeps its old end: {paused}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let list = api.ok("GET", "/v1/sandboxes", &owner, None).await;
    assert_eq!(list.as_array().unwrap().iter().find(|x| x["sandboxId"] == id.as_str()).unwrap()["state"], "paused");
    let (status, e) = api.call("POST", &format!("/v1/sandboxes/{id}/exec"), &owner, Some(exec("true"))).await;
    assert_eq!((status, e["code"].as_str().unwrap()), (409, "CONFLICT"), "{e}");

    // Out of scope: as if it did not exist.
    for route in ["pause", "resume", "connect"] {
        let (status, _) = api.call("POST", &format!("/v1/sandboxes/{id}/{route}"), &outsider, Some(json!({}))).await;
        assert_eq!(status, 404, "{route}");
    }
    let (status, _) = api.call("POST", &format!("/v1/sandboxes/{id}/fork"), &outsider, Some(json!({"count": 1}))).await;
    assert_eq!(status, 404);

    // connect() resumes: the counter goes on, the same server answers, the file is there.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let c = api.ok("POST", &format!("/v1/sandboxes/{id}/connect"), &owner, Some(json!({}))).await;
    assert_eq!(c["state"], "running");
    let after = counter(&api, &owner, &id).await;
    assert!(after >= before && after <= before + 3, "{before} → {after}");
    assert_eq!(via_url(&api, &s).await, page);
    let r = api.ok("POST", &format!("/v1/sandboxes/{id}/exec"), &owner, Some(exec("cat /root/note.txt"))).await;
    assert_eq!(r["stdout"], "kept\n");
    // Its lifetime starts again on resume: 4 s from now, then paused again.
    api.ok("POST", &format!("/v1/sandboxes/{id}/timeout"), &owner, Some(json!({"timeoutMs": 600000}))).await;

    // pause / resume routes.
    let p = api.ok("POST", &format!("/v1/sandboxes/{id}/pause"), &owner, Some(json!({}))).await;
    assert_eq!(p["state"], "paused");
    let r = api.ok("POST", &format!("/v1/sandboxes/{id}/resume"), &owner, Some(json!({}))).await;
    assert_eq!(r["state"], "running");

    // fork: copies in the same project, listed, independent.
    let (status, e) = api.call("POST", &format!("/v1/sandboxes/{id}/fork"), &owner, Some(json!({"count": 0}))).await;
    assert_eq!((status, e["code"].as_str().unwrap()), (422, "INVALID_ARGUMENT"));
    let (status, copies) =
        api.call("POST", &format!("/v1/sandboxes/{id}/fork"), &owner, Some(json!({"count": 2}))).await;
    assert_eq!(status, 201, "{copies}");
    let copies: Vec<String> = copies
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert_eq!(c["projectId"], s["projectId"]);
            c["sandboxId"].as_str().unwrap().to_string()
        })
        .collect();
    let listed: Vec<String> = api
        .ok("GET", "/v1/sandboxes", &owner, None)
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["sandboxId"].as_str().unwrap().to_string())
        .collect();
    for c in &copies {
        assert!(listed.contains(c), "{c} not listed");
        api.ok("POST", &format!("/v1/sandboxes/{c}/exec"), &owner, Some(exec(&format!("echo {c} > /root/note.txt"))))
            .await;
    }
    let r = api.ok("POST", &format!("/v1/sandboxes/{id}/exec"), &owner, Some(exec("cat /root/note.txt"))).await;
    assert_eq!(r["stdout"], "kept\n");
    for sid in copies.iter().chain([&id]) {
        let (status, _) = api.call("DELETE", &format!("/v1/sandboxes/{sid}"), &owner, None).await;
        assert_eq!(status, 204);
    }
    assert!(api.node.list().is_empty());
}
