//! Background processes and PTYs through the real agent binary (dev mode) and the client:
//! they outlive the session that started them, a new session reattaches, and a PTY is a
//! real terminal (its own tty, a size that follows resizes, job control).

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

use crate::common;

use common::Agent;
use futures_util::StreamExt;
use lizard_agent_client::{ClientError, ErrorCode, ProcessFrames, ProcessInfo, PtySize, StartProcess};
use lizard_agent_proto::frame::FrameKind;
use std::time::Duration;

const PATIENCE: Duration = Duration::from_secs(20);

fn sh(cmd: &str) -> StartProcess {
    StartProcess { cmd: Some(cmd.into()), ..Default::default() }
}

/// The `Started` frame's process.
async fn started(frames: &mut ProcessFrames) -> ProcessInfo {
    let f = frames.next().await.unwrap().unwrap();
    assert_eq!(f.kind, FrameKind::Started);
    serde_json::from_slice(&f.data).unwrap()
}

/// Read output until `done(text so far)` holds; returns the text.
async fn read_until(frames: &mut ProcessFrames, done: impl Fn(&str) -> bool) -> String {
    let mut text = String::new();
    tokio::time::timeout(PATIENCE, async {
        while !done(&text) {
            let f = frames.next().await.expect("the stream ended early").unwrap();
            assert!(matches!(f.kind, FrameKind::Stdout | FrameKind::Stderr), "{:?}", f.kind);
            text.push_str(&String::from_utf8_lossy(&f.data));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out; the output so far: {text:?}"));
    text
}

/// Skip output until the exit frame; its exit code.
async fn exit_code(frames: &mut ProcessFrames) -> i32 {
    tokio::time::timeout(PATIENCE, async {
        while let Some(f) = frames.next().await {
            let f = f.unwrap();
            if f.kind == FrameKind::Exit {
                return serde_json::from_slice::<lizard_agent_client::ExitStatus>(&f.data).unwrap().exit_code;
            }
        }
        panic!("no exit frame")
    })
    .await
    .unwrap()
}

/// Poll (bounded) until the command lines of session `sid`'s processes satisfy `done`: a
/// keystroke must not race the shell starting or ending the job it is meant for.
async fn wait_for_session(client: &lizard_agent_client::AgentClient, sid: u32, done: impl Fn(&str) -> bool) {
    let ps = || lizard_agent_client::ExecRequest { cmd: Some(format!("ps -o args= -s {sid}")), ..Default::default() };
    tokio::time::timeout(PATIENCE, async {
        loop {
            let out = client.exec_collect(ps()).await.unwrap();
            if done(&String::from_utf8_lossy(&out.stdout)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("session {sid} never reached the awaited state"));
}

#[tokio::test]
async fn a_process_outlives_its_session_and_a_new_session_reattaches() {
    let agent = Agent::start();
    let client = agent.connect().await;
    let mut frames = client.start_process(&sh("echo one; read line; echo \"got $line\"; exit 4")).await.unwrap();
    let info = started(&mut frames).await;
    assert_eq!(read_until(&mut frames, |t| t == "one\n").await, "one\n");
    // The host goes away (a pause, a node restart): the process runs on.
    drop(frames);
    client.close().await;
    let client = agent.connect().await;
    let listed = client.list_processes().await.unwrap();
    assert!(listed.iter().any(|p| p.pid == info.pid && p.exit_code.is_none()), "{listed:?}");
    let mut frames = client.process_output(info.pid).await.unwrap();
    assert_eq!(started(&mut frames).await.pid, info.pid);
    // The kept output first, then what it prints from now on.
    assert_eq!(read_until(&mut frames, |t| t == "one\n").await, "one\n");
    client.process_stdin(info.pid, "hi\n".into()).await.unwrap();
    assert_eq!(read_until(&mut frames, |t| t.contains("got hi\n")).await, "got hi\n");
    assert_eq!(exit_code(&mut frames).await, 4);
    // Ended: its input is closed, a signal changes nothing, it stays listed.
    let e = client.process_stdin(info.pid, "late".into()).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Conflict), "{e}");
    client.signal_process(info.pid, "TERM").await.unwrap();
    assert_eq!(client.list_processes().await.unwrap().iter().find(|p| p.pid == info.pid).unwrap().exit_code, Some(4));
}

#[tokio::test]
async fn stdin_closes_signals_reach_the_group_and_errors_have_codes() {
    let agent = Agent::start();
    let client = agent.connect().await;
    let mut cat = client.start_process(&sh("cat; echo eof")).await.unwrap();
    let pid = started(&mut cat).await.pid;
    client.process_stdin(pid, "abc".into()).await.unwrap();
    client.close_process_stdin(pid).await.unwrap();
    assert_eq!(read_until(&mut cat, |t| t.ends_with("eof\n")).await, "abceof\n");
    assert_eq!(exit_code(&mut cat).await, 0);
    // `sh -c 'sleep & wait'`: the signal reaches the shell's child too (its group).
    let mut group = client.start_process(&sh("sleep 600 & echo started; wait")).await.unwrap();
    let pid = started(&mut group).await.pid;
    read_until(&mut group, |t| t == "started\n").await;
    client.signal_process(pid, "SIGTERM").await.unwrap();
    assert_eq!(exit_code(&mut group).await, 143);
    let ps = client.exec_collect(lizard_agent_client::ExecRequest {
        cmd: Some(format!("pgrep -g {pid} || true")),
        ..Default::default()
    });
    assert_eq!(String::from_utf8(ps.await.unwrap().stdout).unwrap().trim(), "", "the group is gone");
    for (e, code) in [
        (client.process_output(4_000_000).await.err().unwrap(), ErrorCode::NotFound),
        (client.signal_process(pid, "SIGNOPE").await.unwrap_err(), ErrorCode::InvalidArgument),
        (client.resize_process(pid, PtySize { cols: 10, rows: 10 }).await.unwrap_err(), ErrorCode::Conflict),
        (client.start_process(&StartProcess::default()).await.err().unwrap(), ErrorCode::InvalidArgument),
    ] {
        assert!(matches!(&e, ClientError::Agent(a) if a.code == code), "{e} (wanted {code:?})");
    }
}

#[tokio::test]
async fn a_pty_is_a_terminal_with_a_size_and_job_control() {
    let agent = Agent::start();
    let client = agent.connect().await;
    let req = StartProcess { pty: Some(PtySize { cols: 100, rows: 30 }), ..sh("exec sh -i") };
    let mut pty = client.start_process(&req).await.unwrap();
    let info = started(&mut pty).await;
    assert!(info.pty);
    client.process_stdin(info.pid, "tty; stty size; echo TERM=$TERM\n".into()).await.unwrap();
    let text = read_until(&mut pty, |t| t.contains("30 100") && t.contains("TERM=xterm-256color")).await;
    assert!(text.contains("/dev/pts/"), "{text:?}");
    client.resize_process(info.pid, PtySize { cols: 120, rows: 40 }).await.unwrap();
    client.process_stdin(info.pid, "stty size\n".into()).await.unwrap();
    read_until(&mut pty, |t| t.contains("40 120")).await;
    // Job control: a background job is listed, ^C reaches only the foreground job.
    client.process_stdin(info.pid, "sleep 100 &\njobs\n".into()).await.unwrap();
    read_until(&mut pty, |t| t.contains("Running") && t.contains("sleep 100")).await;
    client.process_stdin(info.pid, "sleep 50\n".into()).await.unwrap();
    wait_for_session(&client, info.pid, |args| args.contains("sleep 50")).await;
    // ^C flushes the terminal's input queue: what follows is typed after it.
    client.process_stdin(info.pid, "\x03".into()).await.unwrap();
    wait_for_session(&client, info.pid, |args| !args.contains("sleep 50")).await;
    client.process_stdin(info.pid, "echo interrupted $?\n".into()).await.unwrap();
    read_until(&mut pty, |t| t.contains("interrupted 130")).await;
    client.process_stdin(info.pid, "jobs\n".into()).await.unwrap();
    read_until(&mut pty, |t| t.contains("Running") && t.contains("sleep 100")).await;
    // A full-screen program draws on it: `top` clears the screen and positions its cursor.
    // Wait for the shell again before typing on: keys typed while `top` runs are its commands.
    // The marker is computed so the terminal's echo of the typed line does not match it.
    client.process_stdin(info.pid, "top -n 1; echo top-$((40+2))\n".into()).await.unwrap();
    let screen = read_until(&mut pty, |t| t.contains("top-42")).await;
    assert!(screen.contains("load average") && screen.contains("PID"), "{screen:?}");
    assert!(screen.contains("\x1b[H"), "the cursor is sent home: {screen:?}");
    client.process_stdin(info.pid, "kill %1; exit 6\n".into()).await.unwrap();
    assert_eq!(exit_code(&mut pty).await, 6);
    let bad = StartProcess { pty: Some(PtySize { cols: 0, rows: 24 }), ..sh("true") };
    let e = client.start_process(&bad).await.err().unwrap();
    assert_eq!(e.code(), Some(ErrorCode::InvalidArgument), "{e}");
}

#[tokio::test]
async fn a_port_wait_answers_when_something_listens_and_times_out_otherwise() {
    let agent = Agent::start();
    let client = agent.connect().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    client.wait_for_port(port, 5_000).await.unwrap();
    drop(listener);
    let e = client.wait_for_port(port, 200).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::TimedOut), "{e}");
}
