//! Background processes and PTYs in a real guest, across a pause and resume: the VM is
//! frozen whole, so the agent's process table, terminals and output buffers survive; the
//! host's streams break, and new ones reattach to the same processes.

// Helpers of these tests unwrap as the tests do (clippy.toml's allow-unwrap-in-tests
// covers only the #[test] functions themselves).
#![allow(clippy::unwrap_used)]

use crate::common;

use futures_util::StreamExt;
use lizard_agent_proto::frame::FrameKind;
use lizard_api::processes::{ProcessControl, ProcessInfo, PtySize, StartProcessRequest};
use lizard_api::{CreateSandboxRequest, ErrorCode};
use lizard_node::ProcessFrameStream;
use std::time::Duration;

const PATIENCE: Duration = Duration::from_secs(60);

fn sh(cmd: &str) -> StartProcessRequest {
    StartProcessRequest { cmd: Some(cmd.into()), ..Default::default() }
}

async fn started(frames: &mut ProcessFrameStream) -> u32 {
    let f = frames.next().await.unwrap().unwrap();
    assert_eq!(f.kind, FrameKind::Started);
    serde_json::from_slice::<ProcessInfo>(&f.data).unwrap().pid
}

/// Output until `done(text)` holds.
async fn read_until(frames: &mut ProcessFrameStream, done: impl Fn(&str) -> bool) -> String {
    let mut text = String::new();
    tokio::time::timeout(PATIENCE, async {
        while !done(&text) {
            let f = frames.next().await.expect("the stream ended early").unwrap();
            assert!(matches!(f.kind, FrameKind::Stdout | FrameKind::Stderr), "{:?}: {text:?}", f.kind);
            text.push_str(&String::from_utf8_lossy(&f.data));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out; the output so far: {text:?}"));
    text
}

/// All output up to the exit frame, and the exit code.
async fn to_the_end(frames: &mut ProcessFrameStream) -> (String, i32) {
    let mut text = String::new();
    tokio::time::timeout(PATIENCE, async {
        while let Some(f) = frames.next().await {
            let f = f.unwrap();
            match f.kind {
                FrameKind::Exit => {
                    let code = serde_json::from_slice::<lizard_api::ExitStatus>(&f.data).unwrap().exit_code;
                    return (text, code);
                }
                FrameKind::Stdout | FrameKind::Stderr => text.push_str(&String::from_utf8_lossy(&f.data)),
                other => panic!("{other:?}: {}", String::from_utf8_lossy(&f.data)),
            }
        }
        panic!("no exit frame; the output: {text:?}")
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn processes_and_ptys_run_on_across_a_pause_and_reattach() {
    let t = common::node().await;
    let sbx = t.node.create(CreateSandboxRequest { template: "base".into(), ..Default::default() }).await.unwrap();

    let mut counter = sbx.start_process(sh("for i in $(seq 1 30); do echo $i; sleep 0.2; done")).await.unwrap();
    let counter_pid = started(&mut counter).await;
    read_until(&mut counter, |t| t.contains("3\n")).await;
    let pty_req = StartProcessRequest { pty: Some(PtySize { cols: 90, rows: 20 }), ..sh("exec bash --norc -i") };
    let mut pty = sbx.start_process(pty_req).await.unwrap();
    let pty_pid = started(&mut pty).await;
    sbx.control_process(pty_pid, ProcessControl::Stdin(b"tty; stty size; echo before-$((1+1))\n".to_vec()))
        .await
        .unwrap();
    let screen = read_until(&mut pty, |t| t.contains("before-2")).await;
    assert!(screen.contains("/dev/pts/") && screen.contains("20 90"), "{screen:?}");

    t.node.pause(&sbx.id).await.unwrap();
    // The old streams end: with an error frame, or cut off with the session.
    for frames in [&mut counter, &mut pty] {
        let rest = tokio::time::timeout(PATIENCE, async {
            let mut kinds = vec![];
            while let Some(Ok(f)) = frames.next().await {
                kinds.push(f.kind);
            }
            kinds
        })
        .await
        .unwrap();
        assert!(!rest.contains(&FrameKind::Exit), "a process ended with the pause: {rest:?}");
    }
    let e = sbx.list_processes().await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Conflict, "{e}");
    let e = sbx.listening_ports().await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Conflict, "{e}");
    t.node.resume(&sbx.id).await.unwrap();

    // Both run on: the counter's whole output once, in order, then its end.
    let listed = sbx.list_processes().await.unwrap();
    assert!(listed.iter().any(|p| p.pid == counter_pid), "{listed:?}");
    let mut again = sbx.process_output(counter_pid).await.unwrap();
    assert_eq!(started(&mut again).await, counter_pid);
    let expected: String = (1..=30).map(|i| format!("{i}\n")).collect();
    assert_eq!(to_the_end(&mut again).await, (expected, 0));
    // The same shell: its screen so far, then what it does now.
    let mut pty = sbx.process_output(pty_pid).await.unwrap();
    started(&mut pty).await;
    read_until(&mut pty, |t| t.contains("before-2")).await;
    sbx.control_process(pty_pid, ProcessControl::Stdin(b"echo after-$((20+1)); exit 5\n".to_vec())).await.unwrap();
    let (rest, code) = to_the_end(&mut pty).await;
    assert!(rest.contains("after-21"), "{rest:?}");
    assert_eq!(code, 5);

    // A port wait: a Node server takes seconds to listen under TCG; a free port times out.
    let server = r#"node -e "require('http').createServer((q,s)=>s.end('up')).listen(3000)""#;
    drop(sbx.start_process(sh(server)).await.unwrap());
    sbx.wait_for_port(3000, 60_000).await.unwrap();
    let ports = sbx.listening_ports().await.unwrap();
    let web = ports.iter().find(|p| p.port == 3000).unwrap_or_else(|| panic!("{ports:?}"));
    assert!(web.pid.is_some() && web.cmd.as_deref().is_some_and(|c| c.contains("createServer")), "{web:?}");
    assert!(!ports.iter().any(|p| lizard_api::code::is_reserved_guest_port(p.port)), "{ports:?}");
    let e = sbx.wait_for_port(3999, 300).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::TimedOut, "{e}");
    t.finish().await;
}
