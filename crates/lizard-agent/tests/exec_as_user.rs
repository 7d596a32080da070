//! Exec as another user through the real agent binary (dev mode): switching users needs
//! the agent to run as root, as it does in a guest. Behind the `vm-tests` feature.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

mod common;

use common::Agent;
use lizard_agent_client::ExecRequest;

fn sh(cmd: &str) -> ExecRequest {
    ExecRequest { cmd: Some(cmd.into()), ..Default::default() }
}

#[tokio::test]
async fn exec_as_root_and_as_a_numeric_uid() {
    assert!(nix::unistd::Uid::effective().is_root(), "this test runs as root (cargo test --features vm-tests)");
    let agent = Agent::start();
    let client = agent.connect().await;
    let out = client.exec_collect(ExecRequest { user: Some("root".into()), ..sh("id -u; echo $HOME") }).await.unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "0\n/root\n");
    let out = client.exec_collect(ExecRequest { user: Some("65534".into()), ..sh("id -u; id -g") }).await.unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap().lines().next(), Some("65534"));
}

/// `SIGHUP` to a process on a terminal hangs the terminal up, as closing a terminal window
/// does: a shell that ignores the signal still ends, at its next read (EOF).
#[tokio::test]
async fn a_hang_up_ends_a_terminal_shell_that_ignores_sighup() {
    use futures_util::StreamExt;
    use lizard_agent_proto::frame::FrameKind;
    use lizard_agent_proto::types::{ProcessInfo, PtySize, StartProcess};
    use std::time::Duration;

    let agent = Agent::start();
    let client = agent.connect().await;
    let cmd = "trap '' HUP; echo ignoring-$((40+2)); read line";
    let req = StartProcess { cmd: Some(cmd.into()), pty: Some(PtySize { cols: 80, rows: 24 }), ..Default::default() };
    let mut frames = client.start_process(&req).await.unwrap();
    let started = frames.next().await.unwrap().unwrap();
    assert_eq!(started.kind, FrameKind::Started);
    let pid = serde_json::from_slice::<ProcessInfo>(&started.data).unwrap().pid;
    let mut screen = String::new();
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        let mut signalled = false;
        while let Some(frame) = frames.next().await {
            let frame = frame.unwrap();
            match frame.kind {
                FrameKind::Exit => return,
                _ => screen.push_str(&String::from_utf8_lossy(&frame.data)),
            }
            if !signalled && screen.contains("ignoring-42") {
                client.signal_process(pid, "SIGHUP").await.unwrap();
                signalled = true;
            }
        }
        panic!("the output ended without an exit");
    })
    .await;
    assert!(ended.is_ok(), "the shell ignoring SIGHUP was not hung up: {screen:?}");
}
