//! Exec through the real agent binary (dev mode) and the client.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

use crate::common;

use bytes::Bytes;
use common::Agent;
use futures_util::StreamExt;
use lizard_agent_client::{AgentClient, ClientError, ErrorCode, ExecEvent, ExecRequest, NoStdin, Secret};
use lizard_agent_proto::handshake::HandshakeError;
use sha2::{Digest, Sha256};
use std::time::{Duration, Instant};

fn sh(cmd: &str) -> ExecRequest {
    ExecRequest { cmd: Some(cmd.into()), ..Default::default() }
}

async fn run(client: &AgentClient, cmd: &str) -> (String, String, i32) {
    let out = client.exec_collect(sh(cmd)).await.unwrap();
    (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap(), out.status.exit_code)
}

#[tokio::test]
async fn wrong_secret_is_refused() {
    let agent = Agent::start();
    let stream = tokio::net::UnixStream::connect(&agent.socket).await.unwrap();
    let err = AgentClient::connect(stream, &Secret::generate()).await.err().unwrap();
    assert!(matches!(err, ClientError::Handshake(HandshakeError::Denied)), "{err}");
    // The agent still serves the rightful host.
    let health = agent.connect().await.health().await.unwrap();
    assert_eq!(health.protocol, lizard_agent_proto::PROTOCOL_VERSION);
}

#[tokio::test]
async fn stdout_stderr_and_exit_code() {
    let agent = Agent::start();
    let client = agent.connect().await;
    assert_eq!(run(&client, "echo out; echo err >&2; exit 3").await, ("out\n".into(), "err\n".into(), 3));
    let out = client.exec_collect(sh("kill -TERM $$")).await.unwrap();
    assert_eq!((out.status.exit_code, out.status.signal), (143, Some(15)));
    // Round-trip time of a trivial command, as a measurement.
    let n = 50;
    let t = Instant::now();
    for _ in 0..n {
        let out =
            client.exec_collect(ExecRequest { argv: Some(vec!["true".into()]), ..Default::default() }).await.unwrap();
        assert_eq!(out.status.exit_code, 0);
    }
    println!("MEASURE exec round trip (argv true): {:.2} ms", t.elapsed().as_secs_f64() * 1000.0 / n as f64);
}

#[tokio::test]
async fn argv_cwd_env_and_user() {
    let agent = Agent::start();
    let client = agent.connect().await;
    let argv = |a: &[&str]| ExecRequest { argv: Some(a.iter().map(|s| s.to_string()).collect()), ..Default::default() };
    let out = client.exec_collect(argv(&["printf", "%s|", "a b", "$HOME"])).await.unwrap();
    assert_eq!(out.stdout, b"a b|$HOME|");
    let err = client.exec_collect(argv(&["no-such-program-xyz"])).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::NotFound), "{err}");

    let req = ExecRequest {
        cwd: Some(agent.dir.path().display().to_string()),
        env: [("FOO".to_string(), "bar baz".to_string())].into(),
        ..sh("pwd; echo \"$FOO\"; echo $LANG")
    };
    let out = client.exec_collect(req).await.unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), format!("{}\nbar baz\nC.UTF-8\n", agent.dir.path().display()));

    let err = client.exec_collect(ExecRequest { cwd: Some("/no/such/dir".into()), ..sh("true") }).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::NotFound), "{err}");
    let err = client.exec_collect(ExecRequest { user: Some("no-such-user".into()), ..sh("true") }).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::NotFound), "{err}");
    let err = client.exec_collect(ExecRequest::default()).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidArgument), "{err}");
}

#[tokio::test]
async fn missing_command_is_127_quickly() {
    let agent = Agent::start();
    let client = agent.connect().await;
    let t = Instant::now();
    let (_, stderr, code) = run(&client, "nosuchcmd").await;
    assert_eq!(code, 127);
    assert!(stderr.contains("not found"), "{stderr}");
    assert!(t.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn timeout_kills_the_process_group() {
    let agent = Agent::start();
    let client = agent.connect().await;
    let t = Instant::now();
    let req = ExecRequest { timeout_ms: Some(300), ..sh("echo $$; sleep 100 & sleep 100") };
    let out = client.exec_collect(req).await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(out.status.timed_out);
    assert_eq!(out.status.exit_code, 124);
    assert!(out.status.duration_ms >= 300);
    let pgid: i32 = String::from_utf8(out.stdout).unwrap().trim().parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    // The group is gone once its members are killed and reaped.
    while nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), None).is_ok() {
        assert!(Instant::now() < deadline, "process group {pgid} survived the timeout");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A command that finishes in time is not marked.
    let out = client.exec_collect(ExecRequest { timeout_ms: Some(5000), ..sh("exit 0") }).await.unwrap();
    assert!(!out.status.timed_out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_megabytes_of_output_arrive_complete() {
    let agent = Agent::start();
    let client = agent.connect().await;
    let t = Instant::now();
    let mut stream = client.exec(sh("head -c 50000000 /dev/zero; echo done >&2"), None::<NoStdin>).await.unwrap();
    let (mut total, mut nonzero, mut stderr) = (0usize, 0usize, Vec::new());
    while let Some(event) = stream.next().await {
        match event {
            ExecEvent::Stdout(b) => {
                total += b.len();
                nonzero += b.iter().filter(|&&x| x != 0).count();
            }
            ExecEvent::Stderr(b) => stderr.extend_from_slice(&b),
        }
    }
    assert_eq!(stream.wait().await.unwrap().exit_code, 0);
    assert_eq!((total, nonzero, stderr.as_slice()), (50_000_000, 0, &b"done\n"[..]));
    println!("MEASURE exec output 50 MB: {:.0} MB/s", 50.0 / t.elapsed().as_secs_f64());
    // The agent streamed it rather than buffering it.
    let peak = agent.peak_rss();
    assert!(peak < 40 << 20, "agent peak RSS {peak}");
}

#[tokio::test]
async fn background_children_do_not_hold_the_exec() {
    let agent = Agent::start();
    let client = agent.connect().await;
    let t = Instant::now();
    assert_eq!(run(&client, "sleep 30 > /dev/null & echo started").await.0, "started\n");
    assert!(t.elapsed() < Duration::from_millis(900), "{:?}", t.elapsed());

    // The child holds both pipes and keeps running after the exec returned.
    let t = Instant::now();
    let (pid, _, code) = run(&client, "sleep 30 & echo $!").await;
    assert!(t.elapsed() < Duration::from_millis(900));
    assert_eq!(code, 0);
    let pid = pid.trim();
    assert_eq!(run(&client, &format!("kill -0 {pid} && echo alive")).await.0, "alive\n");
    run(&client, &format!("kill {pid}")).await;

    // Late output from a background child goes nowhere and breaks nothing.
    let t = Instant::now();
    assert_eq!(run(&client, "(sleep 1; echo late) & echo now").await.0, "now\n");
    assert!(t.elapsed() < Duration::from_millis(900));
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(run(&client, "echo still fine").await.0, "still fine\n");
    client.health().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_is_piped() {
    let agent = Agent::start();
    let client = agent.connect().await;
    let chunks = vec![Bytes::from_static(b"hello "), Bytes::from_static(b"world\n")];
    let stream = client.exec(sh("cat"), Some(futures_util::stream::iter(chunks))).await.unwrap();
    let (stdout, status) = collect_stdout(stream).await;
    assert_eq!((stdout.as_slice(), status), (&b"hello world\n"[..], 0));

    // 8 MB through `cat` both ways at once: needs both directions to stream.
    let data: Vec<u8> = (0..8_000_000u32).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
    let want = Sha256::digest(&data);
    let chunks: Vec<Bytes> = data.chunks(100_000).map(Bytes::copy_from_slice).collect();
    let stream = client.exec(sh("cat"), Some(futures_util::stream::iter(chunks))).await.unwrap();
    let (stdout, status) = collect_stdout(stream).await;
    assert_eq!(status, 0);
    assert_eq!(Sha256::digest(&stdout), want);

    // A command that ignores its stdin still finishes.
    let stream = client.exec(sh("echo ignored"), Some(futures_util::stream::pending::<Bytes>())).await.unwrap();
    let (stdout, _) = tokio::time::timeout(Duration::from_secs(5), collect_stdout(stream)).await.unwrap();
    assert_eq!(stdout, b"ignored\n");
}

async fn collect_stdout(mut stream: lizard_agent_client::ExecStream) -> (Vec<u8>, i32) {
    let mut out = vec![];
    while let Some(event) = stream.next().await {
        if let ExecEvent::Stdout(b) = event {
            out.extend_from_slice(&b);
        }
    }
    (out, stream.wait().await.unwrap().exit_code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_parallel_execs_share_one_connection() {
    let agent = Agent::start();
    let client = agent.connect().await;
    let t = Instant::now();
    let runs = (0..20).map(|i| {
        let client = client.clone();
        tokio::spawn(async move { client.exec_collect(sh(&format!("sleep 0.5; echo {i}"))).await.unwrap() })
    });
    let outs = futures_util::future::join_all(runs).await;
    for (i, out) in outs.into_iter().enumerate() {
        assert_eq!(out.unwrap().stdout, format!("{i}\n").into_bytes());
    }
    // Concurrent, not one after another (20 × 0.5 s).
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

#[tokio::test]
async fn a_dead_agent_reads_as_closed() {
    let mut agent = Agent::start();
    let client = agent.connect().await;
    let running = client.exec(sh("sleep 5"), None::<NoStdin>).await.unwrap();
    agent.kill();
    tokio::time::timeout(Duration::from_secs(5), client.closed()).await.unwrap();
    assert!(client.is_closed());
    assert!(matches!(running.wait().await, Err(ClientError::Closed)));
    assert!(matches!(client.health().await, Err(ClientError::Closed)));
}

#[tokio::test]
async fn a_dropped_exec_keeps_running_and_never_blocks() {
    let agent = Agent::start();
    let client = agent.connect().await;
    let marker = agent.dir.path().join("marker");
    // 20 MB of output that nobody reads: the agent must discard it so the command can end.
    let cmd = format!("head -c 20000000 /dev/zero; touch {}", marker.display());
    let stream = client.exec(sh(&cmd), None::<NoStdin>).await.unwrap();
    drop(stream);
    drop(client);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !marker.exists() {
        assert!(Instant::now() < deadline, "the abandoned command did not finish");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A new session works as before.
    assert_eq!(run(&agent.connect().await, "echo new").await.0, "new\n");
}
