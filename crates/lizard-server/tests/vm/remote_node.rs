//! `RemoteNode` against a real node API on TCP (an in-process `lizard_node::Node` behind
//! the node agent's router, on loopback), every `NodeClient` method through it with real
//! microVMs: create, exec (buffered and streamed), files (a 10 MiB file streamed both
//! ways), background processes (start, input, reattach, list) and a port wait, a guest
//! HTTP server through a port tunnel, pause/resume, fork, volumes, a small
//! template build, kill — and the credential: without it or with a wrong one, 401 and
//! nothing happens.

// Helpers of these tests unwrap as the tests do (clippy.toml's allow-unwrap-in-tests
// covers only the #[test] functions themselves).
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use futures_util::StreamExt;
use lizard_agent_proto::frame::FrameKind;
use lizard_api::processes::{ProcessControl, ProcessInfo, PtySize, StartProcessRequest};
use lizard_api::templates::BuildEvent;
use lizard_api::{CreateSandboxRequest, ErrorCode, ExecRequest, SandboxState};
use lizard_node_client::remote::RemoteNode;
use lizard_node_client::{BuildTemplate, NodeClient, WriteOptions};
use lizard_vmm::census::live_vmms;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

const CREDENTIAL: &str = "test-node-credential";

/// The data directory of the machine's one image store (outside the checkout: a fresh
/// clone reuses its images).
use lizard_node::shared_image_root as image_root;

fn sh(cmd: &str) -> ExecRequest {
    ExecRequest { cmd: Some(cmd.to_string()), ..Default::default() }
}

struct Served {
    node: Arc<lizard_node::Node>,
    address: String,
    _dir: tempfile::TempDir,
}

/// A node with its own data directory and network prefixes, its API on loopback.
async fn serve_node() -> Served {
    let dir = tempfile::Builder::new().prefix("lizard-remote-").tempdir().unwrap();
    let mut config = lizard_node::NodeConfig::new(dir.path());
    config.image_root = image_root();
    if let Some(net) = config.network.as_mut() {
        let tag: String = (0..3).map(|_| char::from(b'a' + rand::random::<u8>() % 26)).collect();
        net.netns_prefix = format!("lizard-r{tag}-");
        net.link_prefix = format!("lzr{tag}");
    }
    let node = lizard_node::Node::start(config).await.unwrap();
    let app = lizard_node::http::tcp_router(node.clone(), lizard_node::http::Credential::new(CREDENTIAL));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Served { node, address, _dir: dir }
}

async fn out(remote: &RemoteNode, id: &str, cmd: &str) -> String {
    let r = remote.exec(id, sh(cmd)).await.unwrap();
    assert_eq!(r.exit_code, 0, "{cmd}: {r:?}");
    r.stdout.trim().to_owned()
}

/// 10 MiB that are not all alike, in 64 KiB pieces.
fn big_file() -> Vec<Bytes> {
    (0..160u32)
        .map(|i| Bytes::from((0..65_536u32).map(|j| (j.wrapping_mul(31) ^ i).to_le_bytes()[0]).collect::<Vec<u8>>()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_node_client_method_works_through_the_node_api() {
    let served = serve_node().await;
    let remote = RemoteNode::new("node_t".into(), served.address.clone(), CREDENTIAL.into());
    let base = || CreateSandboxRequest { template: "base".into(), ..Default::default() };

    // --- the credential: nothing happens without it ----------------------------------------
    let http = reqwest::Client::new();
    let create_url = format!("{}{}", served.address, lizard_api::routes::node::CREATE_SANDBOX.path);
    let body = serde_json::to_vec(&base()).unwrap();
    for auth in [None, Some("Bearer wrong"), Some(CREDENTIAL)] {
        let mut req = http.post(&create_url).body(body.clone());
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 401, "{auth:?}");
        let e: lizard_api::ApiError = resp.json().await.unwrap();
        assert_eq!(e.code, ErrorCode::Unauthenticated);
    }
    let wrong = RemoteNode::new("node_t".into(), served.address.clone(), "wrong".into());
    assert_eq!(wrong.create_sandbox(base()).await.unwrap_err().code, ErrorCode::Unavailable);
    assert_eq!(wrong.create_volume("vol_nope", 1).await.unwrap_err().code, ErrorCode::Unavailable);
    assert!(served.node.list().is_empty(), "a refused call created nothing");
    assert_eq!(served.node.volume_holder("vol_nope"), None);
    assert_eq!(http.get(format!("{}/health", served.address)).send().await.unwrap().status(), 200);

    // --- create, look up, exec ------------------------------------------------------------
    assert!(remote.forwards_api());
    assert!(remote.events().next().await.is_none(), "remote nodes post their events");
    assert!(remote.builtin_templates().iter().any(|t| t.name == "base"));
    let started = Instant::now();
    let sbx = remote.create_sandbox(base()).await.unwrap();
    eprintln!("create through the node API: {:.1} s", started.elapsed().as_secs_f64());
    let id = sbx.sandbox_id.clone();
    assert_eq!(sbx.state, SandboxState::Running);
    assert_eq!(remote.sandbox(&id).await.unwrap().sandbox_id, id);
    assert!(remote.sandboxes().await.unwrap().iter().any(|s| s.sandbox_id == id));
    assert_eq!(remote.sandbox("sbx_nope").await.unwrap_err().code, ErrorCode::NotFound);

    let r = remote.exec(&id, sh("echo out; echo err >&2; exit 3")).await.unwrap();
    assert_eq!((r.stdout.as_str(), r.stderr.as_str(), r.exit_code), ("out\n", "err\n", 3));
    let mut frames = remote.exec_stream(&id, sh("for i in 1 2 3; do echo line$i; sleep 0.2; done")).await.unwrap();
    let (mut stdout, mut exit) = (Vec::new(), None);
    while let Some(f) = frames.next().await {
        let f = f.unwrap();
        match f.kind {
            FrameKind::Stdout => stdout.extend_from_slice(&f.data),
            FrameKind::Exit => exit = Some(serde_json::from_slice::<serde_json::Value>(&f.data).unwrap()),
            other => panic!("unexpected frame {other:?}: {:?}", f.data),
        }
    }
    assert_eq!(String::from_utf8(stdout).unwrap(), "line1\nline2\nline3\n");
    assert!(exit.is_some(), "the stream ends with Exit");

    // --- background processes and port waits ----------------------------------------------
    let start = StartProcessRequest { cmd: Some("echo bg; read x; echo got-$x".into()), ..Default::default() };
    let mut frames = remote.start_process(&id, start).await.unwrap();
    let first = frames.next().await.unwrap().unwrap();
    assert_eq!(first.kind, FrameKind::Started);
    let pid = serde_json::from_slice::<ProcessInfo>(&first.data).unwrap().pid;
    remote.control_process(&id, pid, ProcessControl::Stdin(b"1\n".to_vec())).await.unwrap();
    let text = |frames: Vec<lizard_agent_proto::frame::Frame>| {
        let out: Vec<u8> =
            frames.iter().filter(|f| f.kind == FrameKind::Stdout).flat_map(|f| f.data.to_vec()).collect();
        (String::from_utf8(out).unwrap(), frames.last().map(|f| f.kind))
    };
    let rest: Vec<_> = frames.map(|f| f.unwrap()).collect().await;
    assert_eq!(text(rest), ("bg\ngot-1\n".to_string(), Some(FrameKind::Exit)));
    let again: Vec<_> = remote.process_output(&id, pid).await.unwrap().map(|f| f.unwrap()).collect().await;
    assert_eq!(text(again), ("bg\ngot-1\n".to_string(), Some(FrameKind::Exit)));
    let listed = remote.list_processes(&id).await.unwrap();
    assert!(listed.iter().any(|p| p.pid == pid && p.exit_code == Some(0)), "{listed:?}");
    let e = remote.control_process(&id, pid, ProcessControl::Resize(PtySize { cols: 9, rows: 9 })).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Conflict, "{e}");
    assert_eq!(remote.wait_for_port(&id, 3999, 200).await.unwrap_err().code, ErrorCode::TimedOut);
    // The agent's API forward listens in every guest; it is the platform's, never listed.
    let ports = remote.listening_ports(&id).await.unwrap();
    assert!(!ports.iter().any(|p| lizard_api::code::is_reserved_guest_port(p.port)), "{ports:?}");

    // --- files ----------------------------------------------------------------------------
    remote.make_dir(&id, "/tmp/rn/sub", None).await.unwrap();
    let small = futures_util::stream::iter([Ok(Bytes::from_static(b"hello ")), Ok(Bytes::from_static(b"node"))]);
    let w = remote.write_file(&id, "/tmp/rn/small.txt", &WriteOptions::mode(Some(0o640)), small.boxed()).await.unwrap();
    assert_eq!(w.bytes_written, 10);
    assert_eq!(out(&remote, &id, "stat -c %a /tmp/rn/small.txt").await, "640");
    let names: Vec<_> = remote.list_dir(&id, "/tmp/rn").await.unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["small.txt", "sub"]);
    let read = remote.read_file(&id, "/tmp/rn/small.txt").await.unwrap();
    assert_eq!(read.len, Some(10));
    let got: Vec<Bytes> = read.body.map(|b| b.unwrap()).collect().await;
    assert_eq!(got.concat(), b"hello node");

    let pieces = big_file();
    let want = Sha256::digest(pieces.concat());
    let started = Instant::now();
    let upload = futures_util::stream::iter(pieces.into_iter().map(Ok));
    let w = remote.write_file(&id, "/tmp/rn/big.bin", &WriteOptions::default(), upload.boxed()).await.unwrap();
    assert_eq!(w.bytes_written, 10 << 20);
    let read = remote.read_file(&id, "/tmp/rn/big.bin").await.unwrap();
    assert_eq!(read.len, Some(10 << 20));
    let (mut hasher, mut len, mut chunks) = (Sha256::new(), 0usize, 0usize);
    let mut body = read.body;
    while let Some(b) = body.next().await {
        let b = b.unwrap();
        hasher.update(&b);
        len += b.len();
        chunks += 1;
    }
    assert_eq!((len, hasher.finalize()), (10 << 20, want));
    assert!(chunks > 1, "the read streamed in pieces");

    // What is at a path, a rename, a watch and a directory as an archive, through the node's API.
    let info = remote.file_info(&id, "/tmp/rn/small.txt").await.unwrap();
    assert_eq!((info.size, info.mode), (10, 0o640));
    assert_eq!(remote.file_info(&id, "/tmp/rn/nothing").await.unwrap_err().code, ErrorCode::NotFound);
    let mut watch = remote.watch(&id, "/tmp/rn", true).await.unwrap();
    let moved = remote.rename(&id, "/tmp/rn/small.txt", "/tmp/rn/sub/moved.txt").await.unwrap();
    assert_eq!(moved.path, "/tmp/rn/sub/moved.txt");
    let line = watch.next().await.unwrap().unwrap();
    let event: lizard_api::FsEvent = serde_json::from_slice(line.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!((event.path.as_str(), event.new_path.as_deref()), ("/tmp/rn/small.txt", Some("/tmp/rn/sub/moved.txt")));
    drop(watch);
    let mut tar = Vec::new();
    let mut archive = remote.read_archive(&id, "/tmp/rn/sub").await.unwrap();
    while let Some(b) = archive.next().await {
        tar.extend_from_slice(&b.unwrap());
    }
    let back = remote.write_archive(&id, "/tmp/rn/copy", futures_util::stream::iter([Ok(Bytes::from(tar))]).boxed());
    assert_eq!(back.await.unwrap().entries, 1);
    assert_eq!(out(&remote, &id, "cat /tmp/rn/copy/moved.txt").await, "hello node");
    let refused = remote.read_archive(&id, "/tmp/rn/copy/moved.txt").await.err().unwrap();
    assert_eq!(refused.code, ErrorCode::InvalidArgument);
    // Back where the rest of the test expects it.
    remote.rename(&id, "/tmp/rn/sub/moved.txt", "/tmp/rn/small.txt").await.unwrap();
    eprintln!("10 MiB in and out through the node API: {:.1} s", started.elapsed().as_secs_f64());
    assert_eq!(out(&remote, &id, "sha256sum /tmp/rn/big.bin | cut -c1-64").await, hex::encode(want));
    remote.remove(&id, "/tmp/rn/big.bin").await.unwrap();
    assert_eq!(remote.read_file(&id, "/tmp/rn/big.bin").await.err().unwrap().code, ErrorCode::NotFound);

    // --- a guest port through the tunnel -------------------------------------------------------
    let server = r#"require('http').createServer((q,s)=>s.end('hello from '+q.url)).listen(3000)"#;
    out(&remote, &id, &format!("node -e \"{server}\" >/tmp/http.log 2>&1 & echo started")).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut tunnel = loop {
        match remote.connect_port(&id, 3000).await {
            Ok(t) => break t,
            Err(e) if e.code == ErrorCode::PortClosed && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => panic!("the guest's port 3000 never answered: {e}"),
        }
    };
    tunnel.write_all(b"GET /through-the-node HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), tunnel.read_to_end(&mut answer)).await.unwrap().unwrap();
    let answer = String::from_utf8(answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("hello from /through-the-node"), "{answer}");
    assert_eq!(remote.connect_port(&id, 3999).await.err().unwrap().code, ErrorCode::PortClosed);

    // --- pause, resume, fork ---------------------------------------------------------------
    assert_eq!(remote.pause(&id).await.unwrap().state, SandboxState::Paused);
    assert_eq!(remote.resume(&id).await.unwrap().state, SandboxState::Running);
    assert_eq!(out(&remote, &id, "cat /tmp/rn/small.txt").await, "hello node");
    let copies = remote.fork(&id, 1).await.unwrap();
    assert_eq!(copies.len(), 1);
    let copy = &copies[0].sandbox_id;
    assert_eq!(out(&remote, copy, "cat /tmp/rn/small.txt").await, "hello node");
    remote.kill(copy).await.unwrap();

    // --- volumes ------------------------------------------------------------------------------
    remote.create_volume("vol_remote", 1).await.unwrap();
    assert_eq!(remote.volume_holder("vol_remote").await.unwrap(), None);
    let with_volume =
        remote.create_sandbox(CreateSandboxRequest { volume: Some("vol_remote".into()), ..base() }).await.unwrap();
    let holder = with_volume.sandbox_id.clone();
    assert_eq!(remote.volume_holder("vol_remote").await.unwrap(), Some(holder.clone()));
    out(&remote, &holder, "echo kept > /workspace/f && sync").await;
    assert_eq!(remote.delete_volume("vol_remote").await.unwrap_err().code, ErrorCode::Conflict);
    remote.kill(&holder).await.unwrap();
    assert_eq!(remote.volume_holder("vol_remote").await.unwrap(), None);
    remote.delete_volume("vol_remote").await.unwrap();

    // --- a template build, streamed with its context ---------------------------------------
    let pushed = tempfile::tempdir().unwrap();
    std::fs::write(pushed.path().join("greeting.txt"), "built remotely\n").unwrap();
    let context = lizard_recipe::Context::scan(pushed.path(), lizard_recipe::ContextLimits::default()).unwrap();
    let blobs = tempfile::tempdir().unwrap();
    for e in &context.entries {
        if let lizard_recipe::EntryKind::File { sha256, .. } = &e.kind {
            std::fs::copy(pushed.path().join(&e.path), blobs.path().join(sha256)).unwrap();
        }
    }
    let recipe = lizard_recipe::Recipe::from_toml(
        r#"
name = "remote-built"
from = "base"
[[steps]]
copy = { src = "greeting.txt", dest = "/opt/greeting.txt" }
[[steps]]
run = "echo step-ran > /opt/step.txt"
"#,
    )
    .unwrap();
    let build = BuildTemplate {
        template_ref: "tb-remote".into(),
        display_name: "remote-built".into(),
        recipe,
        base_ref: "base".into(),
        context,
        blobs: blobs.path().to_path_buf(),
    };
    let (events, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let started = Instant::now();
    let built = remote.build_template(build, events, CancellationToken::new()).await.unwrap();
    eprintln!("build through the node API: {:.1} s", started.elapsed().as_secs_f64());
    assert_eq!(built.template_ref, "tb-remote");
    assert_eq!(built.steps.len(), 2);
    let mut seen = Vec::new();
    while let Ok(e) = rx.try_recv() {
        seen.push(e);
    }
    assert!(seen.iter().any(|e| matches!(e, BuildEvent::Step { .. })), "{seen:?}");
    assert!(!seen.iter().any(|e| matches!(e, BuildEvent::Done { .. })), "the caller sends Done");
    let from_built =
        remote.create_sandbox(CreateSandboxRequest { template: "tb-remote".into(), ..base() }).await.unwrap();
    let b = from_built.sandbox_id.clone();
    assert_eq!(out(&remote, &b, "cat /opt/greeting.txt /opt/step.txt").await, "built remotely\nstep-ran");
    assert_eq!(remote.delete_template("tb-remote").await.unwrap_err().code, ErrorCode::Conflict);
    remote.kill(&b).await.unwrap();
    remote.delete_template("tb-remote").await.unwrap();
    assert!(served.node.built_templates().is_empty());
    assert!(
        std::fs::read_dir(served._dir.path().join("build-blobs")).unwrap().next().is_none(),
        "a build's received files are gone with it"
    );

    // --- kill ----------------------------------------------------------------------------------
    remote.kill(&id).await.unwrap();
    let e = remote.sandbox(&id).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound, "{e}");
    assert!(remote.sandboxes().await.unwrap().is_empty());
    served.node.shutdown().await;
    let left: Vec<_> = std::fs::read_dir(served._dir.path().join("sandboxes")).unwrap().flatten().collect();
    assert!(left.is_empty(), "sandbox directories left: {left:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_a_remote_build_stops_it_on_the_node() {
    let served = serve_node().await;
    let remote = RemoteNode::new("node_t".into(), served.address.clone(), CREDENTIAL.into());
    let recipe = lizard_recipe::Recipe::from_toml(
        "name = \"never-done\"\nfrom = \"base\"\n[[steps]]\nrun = \"echo going; sleep 600\"\n",
    )
    .unwrap();
    let blobs = tempfile::tempdir().unwrap();
    let build = BuildTemplate {
        template_ref: "tb-cancelled".into(),
        display_name: "never-done".into(),
        recipe,
        base_ref: "base".into(),
        context: lizard_recipe::Context { entries: vec![] },
        blobs: blobs.path().to_path_buf(),
    };
    let (events, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let cancel = CancellationToken::new();
    let task = {
        let (remote, cancel) = (remote.clone(), cancel.clone());
        tokio::spawn(async move { remote.build_template(build, events, cancel).await })
    };
    // Cancel once the step runs (its output arrived): the build VM is up.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let e = tokio::time::timeout_at(deadline.into(), rx.recv()).await.expect("the step never ran").unwrap();
        if matches!(&e, BuildEvent::Output { data, .. } if data.contains("going")) {
            break;
        }
    }
    assert!(!live_vmms(&served._dir.path().to_string_lossy()).is_empty(), "the build VM runs");
    cancel.cancel();
    match task.await.unwrap() {
        Err(lizard_node_client::BuildError::Failed(f)) => assert_eq!(f.code, "CANCELLED"),
        other => panic!("expected a cancelled build, got {other:?}"),
    }
    // The node notices the closed connection and removes what the build made.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !live_vmms(&served._dir.path().to_string_lossy()).is_empty()
        || std::fs::read_dir(served._dir.path().join("build-blobs")).unwrap().next().is_some()
    {
        assert!(Instant::now() < deadline, "the node's build outlived its cancelled connection");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(served.node.built_templates().is_empty());
    served.node.shutdown().await;
}
