//! TCP tunnels through the real agent binary (dev mode: the agent runs on the host, so
//! "the guest's loopback" is the host's, and the servers here are plain tokio servers).

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

use crate::common;

use common::Agent;
use lizard_agent_client::{ClientError, ErrorCode, ExecRequest, TcpTunnel};
use sha2::{Digest, Sha256};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const LIMIT: Duration = Duration::from_secs(20);

/// An echo server on host loopback: echoes each connection until EOF, then closes it.
async fn echo_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (conn, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let (mut r, mut w) = conn.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    port
}

/// Everything the tunnel sends until EOF.
async fn read_to_end(t: &mut TcpTunnel) -> Vec<u8> {
    let mut v = vec![];
    tokio::time::timeout(LIMIT, t.read_to_end(&mut v)).await.expect("no EOF").unwrap();
    v
}

fn agent_error_code<T: std::fmt::Debug>(r: Result<T, ClientError>) -> ErrorCode {
    match r {
        Err(ClientError::Agent(e)) => e.code,
        other => panic!("expected an agent error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_round_trip_with_half_close() {
    let agent = Agent::start();
    let client = agent.connect().await;
    let port = echo_server().await;
    let mut t = client.connect_tcp(port).await.unwrap();
    assert_eq!(t.port(), port);
    for msg in [&b"hello"[..], b"world, twice"] {
        t.write_all(msg).await.unwrap();
        let mut got = vec![0u8; msg.len()];
        tokio::time::timeout(LIMIT, t.read_exact(&mut got)).await.unwrap().unwrap();
        assert_eq!(got, msg);
    }
    // Half-close: the server sees EOF, yet what it sends after that still arrives.
    t.write_all(b"last words").await.unwrap();
    t.shutdown().await.unwrap();
    assert_eq!(read_to_end(&mut t).await, b"last words");
    // The channel still serves other calls.
    let out = client.exec_collect(ExecRequest { cmd: Some("echo ok".into()), ..Default::default() }).await.unwrap();
    assert_eq!(out.stdout, b"ok\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_tunnels_at_once() {
    let agent = Agent::start();
    let client = agent.connect().await;
    let port = echo_server().await;
    let mut tasks = vec![];
    for i in 0..10u8 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut t = client.connect_tcp(port).await.unwrap();
            let msg: Vec<u8> = std::iter::repeat_n(i, 1000 + i as usize * 100).collect();
            t.write_all(&msg).await.unwrap();
            t.shutdown().await.unwrap();
            assert_eq!(read_to_end(&mut t).await, msg, "tunnel {i}");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_megabytes_both_ways_through_one_tunnel() {
    const SIZE: usize = 10 << 20;
    let agent = Agent::start();
    let client = agent.connect().await;
    let port = echo_server().await;
    let t = client.connect_tcp(port).await.unwrap();
    let data: Vec<u8> = (0..SIZE).map(|i| (i * 7 + i / 4096).to_le_bytes()[0]).collect(); // the low byte
    let want = Sha256::digest(&data);
    let start = Instant::now();
    let (mut r, mut w) = tokio::io::split(t);
    // Write and read at once: the echo comes back while we still send.
    let writer = tokio::spawn(async move {
        for chunk in data.chunks(256 * 1024) {
            w.write_all(chunk).await.unwrap();
        }
        w.shutdown().await.unwrap();
    });
    let mut got = Sha256::new();
    let mut n = 0;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let k = tokio::time::timeout(LIMIT, r.read(&mut buf)).await.unwrap().unwrap();
        if k == 0 {
            break;
        }
        got.update(&buf[..k]);
        n += k;
    }
    writer.await.unwrap();
    assert_eq!(n, SIZE);
    assert_eq!(got.finalize(), want);
    let secs = start.elapsed().as_secs_f64();
    println!(
        "MEASURE 10 MiB each way through one tunnel: {:.0} MiB/s per direction (dev mode, unix socket)",
        10.0 / secs
    );
}

#[tokio::test]
async fn refused_and_invalid_ports_are_clear_errors() {
    let agent = Agent::start();
    let client = agent.connect().await;
    // A port that was just free: nothing listens there.
    let free = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
    let e = client.connect_tcp(free).await;
    let msg = format!("{e:?}");
    assert_eq!(agent_error_code(e), ErrorCode::ConnectionRefused, "{msg}");
    assert!(msg.contains(&format!("port {free}")), "{msg}");
    assert_eq!(agent_error_code(client.connect_tcp(0).await), ErrorCode::InvalidArgument);
    // The session survives failed tunnels.
    assert!(client.health().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnel_ends_when_the_server_closes() {
    let agent = Agent::start();
    let client = agent.connect().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut hello = [0u8; 5];
        conn.read_exact(&mut hello).await.unwrap();
        conn.write_all(b"bye").await.unwrap();
        // Dropped: the connection closes without waiting for the host.
    });
    let mut t = client.connect_tcp(port).await.unwrap();
    t.write_all(b"hello").await.unwrap();
    assert_eq!(read_to_end(&mut t).await, b"bye");
    server.await.unwrap();
    // Writing into a tunnel whose guest side is gone fails soon (the agent resets it).
    let deadline = Instant::now() + LIMIT;
    while t.write_all(b"anyone?").await.is_ok() {
        assert!(Instant::now() < deadline, "writes into a closed tunnel kept succeeding");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Open descriptors of a process.
fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_tunnel_releases_the_guest_socket() {
    let agent = Agent::start();
    let client = agent.connect().await;
    // A server that keeps its side open after EOF and never writes: only the agent can
    // end this connection.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (eof_tx, eof_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut sink = vec![];
        let _ = conn.read_to_end(&mut sink).await;
        let _ = eof_tx.send(sink);
        std::future::pending::<()>().await;
        drop(conn);
    });
    let baseline = fd_count(agent.pid());
    let mut t = client.connect_tcp(port).await.unwrap();
    t.write_all(b"x").await.unwrap();
    let deadline = Instant::now() + LIMIT;
    while fd_count(agent.pid()) <= baseline {
        assert!(Instant::now() < deadline, "the agent never opened the guest socket");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(t);
    assert_eq!(tokio::time::timeout(LIMIT, eof_rx).await.unwrap().unwrap(), b"x");
    // The client lingers for the guest side's end (5 s), then resets; the agent notices
    // the reset within a second although this server never writes.
    let deadline = Instant::now() + Duration::from_secs(15);
    while fd_count(agent.pid()) > baseline {
        assert!(Instant::now() < deadline, "the agent kept the socket of an abandoned tunnel");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_written_just_before_a_drop_arrive() {
    let agent = Agent::start();
    let client = agent.connect().await;
    // Counts what each connection sends until EOF, then closes it.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (count_tx, mut counts) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = listener.accept().await.unwrap();
            let count_tx = count_tx.clone();
            tokio::spawn(async move {
                let mut all = vec![];
                let r = conn.read_to_end(&mut all).await;
                let _ = count_tx.send((all.len(), r.is_ok()));
            });
        }
    });
    const SIZE: usize = 1 << 20;
    for _ in 0..5 {
        let mut t = client.connect_tcp(port).await.unwrap();
        t.write_all(&vec![7u8; SIZE]).await.unwrap();
        drop(t); // like closing a socket: what was written still goes out
        let got = tokio::time::timeout(LIMIT, counts.recv()).await.unwrap().unwrap();
        assert_eq!(got, (SIZE, true));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_outlives_its_client_handle() {
    let agent = Agent::start();
    let client = agent.connect().await;
    let port = echo_server().await;
    let mut t = client.connect_tcp(port).await.unwrap();
    drop(client);
    t.write_all(b"still here").await.unwrap();
    t.shutdown().await.unwrap();
    assert_eq!(read_to_end(&mut t).await, b"still here");
}
