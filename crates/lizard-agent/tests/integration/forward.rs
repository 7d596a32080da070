//! Forwarded connections (guest → host) through the real agent binary in dev mode: the
//! agent listens on a loopback port of the host here, as it does on 127.0.0.1:49171 in a
//! guest, and hands each connection to a waiting `accept_forward` call.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

use crate::common;

use common::Agent;
use lizard_agent_client::{ClientError, ErrorCode};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMIT: Duration = Duration::from_secs(20);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_connection_reaches_the_waiting_host_both_ways() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let agent = Agent::start_with(&["--forward-listen", &addr]);
    let client = agent.connect().await;
    let waiting = tokio::spawn({
        let client = client.clone();
        async move { client.accept_forward().await }
    });
    // Nothing connected yet: the host's request keeps waiting.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished());
    let mut guest = TcpStream::connect(&addr).await.unwrap();
    let mut host = tokio::time::timeout(LIMIT, waiting).await.unwrap().unwrap().unwrap();
    guest.write_all(b"GET /v1/whoami").await.unwrap();
    let mut got = [0u8; 14];
    tokio::time::timeout(LIMIT, host.read_exact(&mut got)).await.unwrap().unwrap();
    assert_eq!(&got, b"GET /v1/whoami");
    host.write_all(b"200 OK").await.unwrap();
    host.shutdown().await.unwrap();
    let mut back = vec![];
    tokio::time::timeout(LIMIT, guest.read_to_end(&mut back)).await.unwrap().unwrap();
    assert_eq!(back, b"200 OK");
    // The guest's half-close reaches the host as EOF.
    guest.shutdown().await.unwrap();
    let mut rest = vec![];
    tokio::time::timeout(LIMIT, host.read_to_end(&mut rest)).await.unwrap().unwrap();
    assert!(rest.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_queue_until_picked_up_and_an_abandoned_wait_loses_none() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let agent = Agent::start_with(&["--forward-listen", &addr]);
    let client = agent.connect().await;
    // A wait the host gives up on before anything connects.
    let abandoned = tokio::spawn({
        let client = client.clone();
        async move { client.accept_forward().await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    abandoned.abort();
    let _ = abandoned.await;
    // The reset reaches the agent asynchronously; a connection arriving before it does
    // would go to the abandoned stream (the guest sees it closed). The node abandons waits
    // only when the whole session ends, when no connection can live on anyway.
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Three guest connections before any host waits: all three arrive, in order.
    let mut guests = vec![];
    for i in 0..3u8 {
        let mut g = TcpStream::connect(&addr).await.unwrap();
        g.write_all(&[i]).await.unwrap();
        guests.push(g);
    }
    let mut seen = vec![];
    for _ in 0..3 {
        let mut t = tokio::time::timeout(LIMIT, client.accept_forward()).await.unwrap().unwrap();
        let mut b = [0u8; 1];
        tokio::time::timeout(LIMIT, t.read_exact(&mut b)).await.unwrap().unwrap();
        seen.push(b[0]);
    }
    seen.sort();
    assert_eq!(seen, vec![0, 1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_without_a_listener_says_so() {
    let agent = Agent::start();
    let client = agent.connect().await;
    match tokio::time::timeout(LIMIT, client.accept_forward()).await.unwrap() {
        Err(ClientError::Agent(e)) => assert_eq!(e.code, ErrorCode::NotFound, "{e}"),
        other => panic!("expected NOT_FOUND, got {other:?}"),
    }
}
