//! Background processes, port waits and the PTY WebSocket through the control plane,
//! with a real microVM: the frames of a start, scopes (another workspace's key gets 404 on
//! every route), `TIMED_OUT`, the listening ports, and a terminal over a WebSocket whose key travels as a
//! subprotocol, as a browser sends it.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::Api;
use futures_util::{SinkExt, StreamExt};
use lizard_agent_proto::frame::{Frame, FrameCodec, FrameKind};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::codec::Decoder;

type Socket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

fn frames(body: &[u8]) -> Vec<Frame> {
    let mut buf = bytes::BytesMut::from(body);
    std::iter::from_fn(|| FrameCodec.decode(&mut buf).unwrap()).collect()
}

/// Open the PTY WebSocket of sandbox `id` with `key` as a subprotocol; the handshake's
/// status when refused.
async fn open_pty(api: &Api, id: &str, key: &str, query: &str) -> Result<Socket, u16> {
    let addr = api.base.trim_start_matches("http://");
    let mut req = format!("ws://{addr}/v1/sandboxes/{id}/pty?{query}").into_client_request().unwrap();
    req.headers_mut().insert("sec-websocket-protocol", format!("lizard.pty, lizard.key.{key}").parse().unwrap());
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    match tokio_tungstenite::client_async(req, tcp).await {
        Ok((ws, resp)) => {
            assert_eq!(resp.headers()["sec-websocket-protocol"], "lizard.pty");
            Ok(ws)
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => Err(resp.status().as_u16()),
        Err(e) => panic!("{e}"),
    }
}

/// The next text message as JSON, skipping the terminal's bytes.
async fn next_text(ws: &mut Socket) -> Value {
    loop {
        match tokio::time::timeout(Duration::from_secs(60), ws.next()).await.unwrap().unwrap().unwrap() {
            Message::Text(t) => return serde_json::from_str(&t).unwrap(),
            Message::Binary(_) => continue,
            other => panic!("{other:?}"),
        }
    }
}

/// The server's Close (1000), after any of the terminal's bytes.
async fn expect_close(ws: &mut Socket) {
    loop {
        match tokio::time::timeout(Duration::from_secs(60), ws.next()).await.unwrap() {
            Some(Ok(Message::Binary(_))) => continue,
            Some(Ok(Message::Close(Some(frame)))) => return assert_eq!(u16::from(frame.code), 1000),
            other => panic!("not the server's Close: {other:?}"),
        }
    }
}

/// The terminal's bytes until `done(screen)` holds.
async fn screen_until(ws: &mut Socket, done: impl Fn(&str) -> bool) -> String {
    let mut screen = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done(&screen) {
        assert!(Instant::now() < deadline, "timed out; the screen: {screen:?}");
        match tokio::time::timeout(Duration::from_secs(60), ws.next()).await.unwrap().unwrap().unwrap() {
            Message::Binary(b) => screen.push_str(&String::from_utf8_lossy(&b)),
            other => panic!("{other:?} before {screen:?}"),
        }
    }
    screen
}

#[tokio::test(flavor = "multi_thread")]
async fn processes_ports_and_the_pty_websocket_behind_scopes() {
    let api = Api::builder("lizard-server-processes-").start().await;
    let owner = api.owner.clone();
    let w1 = api.ok("POST", "/v1/workspaces", &owner, Some(json!({"name": "w1"}))).await;
    let w2 = api.ok("POST", "/v1/workspaces", &owner, Some(json!({"name": "w2"}))).await;
    api.ok("POST", "/v1/projects", &owner, Some(json!({"workspaceId": w1["id"], "name": "p1"}))).await;
    let k1 = api.ok("POST", "/v1/api-keys", &owner, Some(json!({"name": "u1", "workspaces": [w1["id"]]}))).await;
    let k2 = api.ok("POST", "/v1/api-keys", &owner, Some(json!({"name": "u2", "workspaces": [w2["id"]]}))).await;
    let (k1, k2) = (k1["key"].as_str().unwrap().to_string(), k2["key"].as_str().unwrap().to_string());
    let s = api.ok("POST", "/v1/sandboxes", &k1, Some(json!({"template": "base", "project": "p1"}))).await;
    let id = s["sandboxId"].as_str().unwrap().to_string();

    // A start answers with its frames: Started, output, Exit.
    let resp = api
        .client
        .post(format!("{}/v1/sandboxes/{id}/processes", api.base))
        .header("x-api-key", &k1)
        .json(&json!({"cmd": "echo hi; exit 2"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let got = frames(&resp.bytes().await.unwrap());
    assert_eq!(got[0].kind, FrameKind::Started);
    let pid = serde_json::from_slice::<Value>(&got[0].data).unwrap()["pid"].as_u64().unwrap();
    assert_eq!((got[1].kind, &got[1].data[..]), (FrameKind::Stdout, &b"hi\n"[..]));
    assert_eq!(got.last().unwrap().kind, FrameKind::Exit);
    let list = api.ok("GET", &format!("/v1/sandboxes/{id}/processes"), &k1, None).await;
    assert!(list.as_array().unwrap().iter().any(|p| p["pid"] == pid && p["exitCode"] == 2), "{list}");

    // Another workspace's key reaches none of it: 404, as for a sandbox that does not exist.
    let p = format!("/v1/sandboxes/{id}");
    for (method, path, body) in [
        ("POST", format!("{p}/processes"), Some(json!({"cmd": "touch /tmp/pwned"}))),
        ("GET", format!("{p}/processes"), None),
        ("GET", format!("{p}/processes/{pid}/output"), None),
        ("DELETE", format!("{p}/processes/{pid}/stdin"), None),
        ("POST", format!("{p}/processes/{pid}/signal"), Some(json!({"signal": "KILL"}))),
        ("POST", format!("{p}/processes/{pid}/resize"), Some(json!({"cols": 10, "rows": 10}))),
        ("GET", format!("{p}/ports/22/wait?timeoutMs=10"), None),
        ("GET", format!("{p}/ports"), None),
    ] {
        api.fails(method, &path, &k2, body, "NOT_FOUND").await;
    }
    assert_eq!(open_pty(&api, &id, &k2, "").await.err(), Some(404));
    assert_eq!(open_pty(&api, &id, "lz_not-a-key", "").await.err(), Some(401));
    assert_eq!(api.sh(&k1, &id, "test -e /tmp/pwned; echo $?").await.1, "1\n");

    // Bad requests, and a wait that runs out of time.
    api.fails("GET", &format!("{p}/ports/0/wait"), &k1, None, "INVALID_ARGUMENT").await;
    api.fails("GET", &format!("{p}/ports/80/wait?timeoutMs=600001"), &k1, None, "INVALID_ARGUMENT").await;
    api.fails("POST", &format!("{p}/processes"), &k1, Some(json!({"cmd": "x", "argv": ["y"]})), "INVALID_ARGUMENT")
        .await;
    api.fails("POST", &format!("{p}/processes/{pid}/resize"), &k1, Some(json!({"cols": 5, "rows": 5})), "CONFLICT")
        .await;
    api.fails("GET", &format!("{p}/processes/nope/output"), &k1, None, "INVALID_ARGUMENT").await;
    let started = Instant::now();
    api.fails("GET", &format!("{p}/ports/3999/wait?timeoutMs=300"), &k1, None, "TIMED_OUT").await;
    assert!(started.elapsed() >= Duration::from_millis(300));

    // The listening ports: a user's server with its process; the agent's API forward (which
    // listens in every guest) is the platform's, never listed.
    let server = json!({"cmd": "exec python3 -m http.server 8123 --bind 127.0.0.1"});
    let resp = api.client.post(format!("{}{p}/processes", api.base)).header("x-api-key", &k1).json(&server);
    let resp = resp.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    drop(resp);
    api.ok("GET", &format!("{p}/ports/8123/wait?timeoutMs=120000"), &k1, None).await;
    let tables = api.sh(&k1, &id, "cat /proc/net/tcp").await.1;
    assert!(tables.lines().any(|l| l.contains(":C013 ") && l.split_whitespace().nth(3) == Some("0A")), "{tables}");
    let ports = api.ok("GET", &format!("{p}/ports"), &k1, None).await;
    let listed: Vec<u64> = ports.as_array().unwrap().iter().map(|p| p["port"].as_u64().unwrap()).collect();
    assert!(!listed.contains(&49171), "{ports}");
    let web = ports.as_array().unwrap().iter().find(|p| p["port"] == 8123).unwrap_or_else(|| panic!("{ports}"));
    assert_eq!(web["address"], "127.0.0.1", "{web}");
    assert!(web["pid"].as_u64().is_some() && web["cmd"].as_str().unwrap().contains("http.server"), "{web}");

    // A terminal over a WebSocket, the key as a subprotocol (no X-API-Key).
    let mut ws = open_pty(&api, &id, &k1, "cols=80&rows=24").await.unwrap();
    let hello = next_text(&mut ws).await;
    assert_eq!(hello["type"], "started", "{hello}");
    let pty_pid = hello["pid"].as_u64().unwrap();
    ws.send(Message::binary(b"tty; echo hi-$((40+2))\n".to_vec())).await.unwrap();
    let screen = screen_until(&mut ws, |s| s.contains("hi-42")).await;
    assert!(screen.contains("/dev/pts/"), "{screen:?}");
    ws.send(Message::text(r#"{"type":"resize","cols":100,"rows":33}"#)).await.unwrap();
    ws.send(Message::binary(b"stty size\n".to_vec())).await.unwrap();
    screen_until(&mut ws, |s| s.contains("33 100")).await;
    ws.send(Message::binary(b"exit 3\n".to_vec())).await.unwrap();
    assert_eq!(next_text(&mut ws).await, json!({"type": "exit", "exitCode": 3}));
    let list = api.ok("GET", &format!("{p}/processes"), &k1, None).await;
    assert!(list.as_array().unwrap().iter().any(|p| p["pid"] == pty_pid && p["pty"] == true), "{list}");

    // A client that goes away hangs its terminal up.
    let mut ws = open_pty(&api, &id, &k1, "").await.unwrap();
    let pty_pid = next_text(&mut ws).await["pid"].as_u64().unwrap();
    ws.close(None).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let list = api.ok("GET", &format!("{p}/processes"), &k1, None).await;
        let ended = list.as_array().unwrap().iter().find(|p| p["pid"] == pty_pid).unwrap()["exitCode"].clone();
        if !ended.is_null() {
            break;
        }
        assert!(Instant::now() < deadline, "the terminal was not hung up: {list}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // `detach=true`: the client leaves, the shell stays; `pid=` reattaches with its output.
    let mut ws = open_pty(&api, &id, &k1, "detach=true").await.unwrap();
    let pty_pid = next_text(&mut ws).await["pid"].as_u64().unwrap();
    ws.send(Message::binary(b"export MARK=$((40+2)); echo marked-$MARK\n".to_vec())).await.unwrap();
    screen_until(&mut ws, |s| s.contains("marked-42")).await;
    ws.close(None).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut ws = open_pty(&api, &id, &k1, &format!("pid={pty_pid}&detach=true")).await.unwrap();
    assert_eq!(next_text(&mut ws).await, json!({"type": "started", "pid": pty_pid}));
    screen_until(&mut ws, |s| s.contains("marked-42")).await;
    ws.send(Message::binary(b"echo again-$MARK\n".to_vec())).await.unwrap();
    screen_until(&mut ws, |s| s.contains("again-42")).await;
    ws.send(Message::binary(b"exit 4\n".to_vec())).await.unwrap();
    assert_eq!(next_text(&mut ws).await, json!({"type": "exit", "exitCode": 4}));
    // The server ends the socket with the closing handshake: what the client still sends is
    // read, not left unread to reset the connection (a browser then loses the Close).
    for _ in 0..16 {
        ws.send(Message::binary(vec![b' '; 4096])).await.unwrap();
    }
    expect_close(&mut ws).await;
    // Reattaching to the ended shell, as a browser reloading its page does (a resize as it
    // opens): how it ended, then the Close.
    let mut ws = open_pty(&api, &id, &k1, &format!("pid={pty_pid}&detach=true")).await.unwrap();
    ws.send(Message::text(r#"{"type":"resize","cols":90,"rows":30}"#)).await.unwrap();
    assert_eq!(next_text(&mut ws).await, json!({"type": "started", "pid": pty_pid}));
    assert_eq!(next_text(&mut ws).await, json!({"type": "exit", "exitCode": 4}));
    expect_close(&mut ws).await;

    // A paused sandbox's guest answers nothing: the ports are a conflict, as every in-guest route.
    api.ok("POST", &format!("{p}/pause"), &k1, None).await;
    api.fails("GET", &format!("{p}/ports"), &k1, None, "CONFLICT").await;
    api.ok("DELETE", &p, &k1, None).await;
}
