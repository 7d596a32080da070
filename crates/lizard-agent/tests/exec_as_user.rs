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
