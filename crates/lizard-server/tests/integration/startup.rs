//! `lizard server`'s start order: every listener is bound before the database is
//! bootstrapped, so a taken port fails the start before the owner's key (shown once) is
//! created and printed. No root or QEMU needed: the start fails before the node does.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lizard_server::run::{run, RunOptions};
use lizard_server::ServerConfig;

#[tokio::test]
async fn a_taken_proxy_port_fails_the_start_before_any_key_exists() {
    let dir = tempfile::tempdir().unwrap();
    // Held for the whole test: the proxy cannot have it.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap();
    let mut server = ServerConfig::new(dir.path());
    server.listen = "127.0.0.1:0".parse().unwrap();
    let opts = RunOptions {
        server: server.clone(),
        node: lizard_node::NodeConfig::new(dir.path().join("node")),
        proxy_listen: Some(taken_addr),
        proxy_tls: None,
        proxy_limits: Default::default(),
        local_node: true,
        node_connector: None,
        faces: Default::default(),
    };
    let err = tokio::time::timeout(std::time::Duration::from_secs(30), run(opts, std::future::pending()))
        .await
        .expect("run returns at once")
        .expect_err("the proxy port is taken");
    let msg = err.to_string();
    assert!(msg.contains("proxy") && msg.contains(&taken_addr.to_string()), "unclear error: {msg}");

    // Nothing was bootstrapped: the first successful open is still the first start, and
    // hands out the owner's key (so none was created, let alone printed, before).
    let opened = lizard_server::open(server).await.unwrap();
    assert!(opened.initial_key().is_some(), "the failed start created the owner");
    drop(taken);
}
