//! Ports inside a real `base` guest, reached through the agent channel (the guest has no
//! network device): an HTTP server and a raw TCP echo, as the edge proxy will use them.

// Helpers of these tests unwrap as the tests do (clippy.toml's allow-unwrap-in-tests
// covers only the #[test] functions themselves).
#![allow(clippy::unwrap_used)]

use crate::common;
use lizard_node::WriteOptions;

use common::sh;
use lizard_api::{CreateSandboxRequest, ErrorCode};
use lizard_node::Sandbox;
use sha2::{Digest, Sha256};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const HTTP_PORT: u16 = 3000;
const ECHO_PORT: u16 = 3001;

/// Connect to a guest port, waiting for a server that is still starting (Node.js takes
/// seconds to start in a TCG guest).
async fn connect_when_listening(sbx: &Sandbox, port: u16) -> lizard_agent_client::TcpTunnel {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match sbx.connect_port(port).await {
            Ok(t) => return t,
            Err(e) if e.code() == ErrorCode::PortClosed && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("port {port} never came up: {e}"),
        }
    }
}

async fn read_to_end(t: &mut lizard_agent_client::TcpTunnel) -> Vec<u8> {
    let mut v = vec![];
    tokio::time::timeout(Duration::from_secs(30), t.read_to_end(&mut v)).await.expect("no EOF").unwrap();
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn guest_ports_are_reachable_through_the_agent() {
    let t = common::node().await;
    let sbx = t.node.create(CreateSandboxRequest { template: "base".into(), ..Default::default() }).await.unwrap();

    let http = r#"require('http').createServer((q,s)=>s.end('hello from '+q.url)).listen(3000)"#;
    let echo = r#"require('net').createServer(c=>c.pipe(c)).listen(3001)"#;
    for (script, log) in [(http, "/tmp/http.log"), (echo, "/tmp/echo.log")] {
        let r = sbx.exec_collect(sh(&format!("node -e \"{script}\" >{log} 2>&1 &"))).await.unwrap();
        assert_eq!(r.exit_code, 0, "{r:?}");
    }

    // Nothing listens there (yet, or ever): a clear error, not a dead tunnel.
    let e = sbx.connect_port(3999).await.expect_err("a tunnel to a closed port");
    assert_eq!(e.code(), ErrorCode::PortClosed, "{e}");
    assert!(e.to_string().contains("3999"), "{e}");
    assert_eq!(sbx.connect_port(0).await.unwrap_err().code(), ErrorCode::InvalidArgument);

    // Plain HTTP/1.1, as the proxy will forward it.
    let mut conn = connect_when_listening(&sbx, HTTP_PORT).await;
    conn.write_all(b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await.unwrap();
    let resp = String::from_utf8(read_to_end(&mut conn).await).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or_else(|| panic!("not HTTP: {resp:?}"));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body, "hello from /x");

    // Raw bytes both ways on one connection (what a WebSocket needs), twice, then close.
    let mut echo = connect_when_listening(&sbx, ECHO_PORT).await;
    for msg in [&b"ping 1"[..], b"second message"] {
        echo.write_all(msg).await.unwrap();
        let mut got = vec![0u8; msg.len()];
        tokio::time::timeout(Duration::from_secs(30), echo.read_exact(&mut got)).await.unwrap().unwrap();
        assert_eq!(got, msg);
    }
    // Other operations share the channel while a tunnel is open.
    assert_eq!(sbx.exec_collect(sh("echo busy")).await.unwrap().stdout, "busy\n");
    echo.shutdown().await.unwrap();
    assert_eq!(read_to_end(&mut echo).await, b"", "the echo server should close after our FIN");

    // Throughput of one tunnel: 10 MiB into the guest and back out at the same time.
    const SIZE: usize = 10 << 20;
    let data: Vec<u8> = (0..SIZE).map(|i| (i * 31 + i / 997).to_le_bytes()[0]).collect();
    let want = Sha256::digest(&data);
    let (mut r, mut w) = tokio::io::split(connect_when_listening(&sbx, ECHO_PORT).await);
    let start = Instant::now();
    let writer = tokio::spawn(async move {
        for chunk in data.chunks(256 * 1024) {
            w.write_all(chunk).await.unwrap();
        }
        w.shutdown().await.unwrap();
    });
    let (mut got, mut n, mut buf) = (Sha256::new(), 0usize, vec![0u8; 256 * 1024]);
    loop {
        let k = tokio::time::timeout(Duration::from_secs(60), r.read(&mut buf)).await.unwrap().unwrap();
        if k == 0 {
            break;
        }
        got.update(&buf[..k]);
        n += k;
    }
    writer.await.unwrap();
    assert_eq!((n, got.finalize()), (SIZE, want));
    println!(
        "MEASURE one tunnel, 10 MiB echoed by node in the guest: {:.1} MiB/s each way ({:.2} s)",
        10.0 / start.elapsed().as_secs_f64(),
        start.elapsed().as_secs_f64()
    );

    // One way at a time, with Python's C socket loop at the guest end (cheaper per byte
    // than Node's stream pipe under TCG): what the tunnel itself moves.
    const MIB: usize = 32;
    let script = format!(
        "import socket, sys\n\
         s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n\
         c, _ = s.accept()\n\
         if sys.argv[2] == 'source':\n    b = bytes(1 << 20)\n    for _ in range({MIB}): c.sendall(b)\n\
         else:\n    n = 0\n    while d := c.recv(1 << 20): n += len(d)\n    c.sendall(str(n).encode())\n\
         c.close()\n"
    );
    let body = futures_util::stream::iter([Ok(bytes::Bytes::from(script))]);
    sbx.write_file("/tmp/bulk.py", &WriteOptions::default(), body).await.unwrap();
    let r = sbx.exec_collect(sh("python3 /tmp/bulk.py 3002 source & python3 /tmp/bulk.py 3003 sink &")).await.unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    let mut down = connect_when_listening(&sbx, 3002).await;
    let start = Instant::now();
    let got = read_to_end(&mut down).await;
    let down_s = start.elapsed().as_secs_f64();
    assert_eq!(got.len(), MIB << 20);
    let mut up = connect_when_listening(&sbx, 3003).await;
    let start = Instant::now();
    let chunk = vec![1u8; 1 << 20];
    for _ in 0..MIB {
        up.write_all(&chunk).await.unwrap();
    }
    up.shutdown().await.unwrap();
    let count = read_to_end(&mut up).await;
    let up_s = start.elapsed().as_secs_f64();
    assert_eq!(String::from_utf8(count).unwrap(), (MIB << 20).to_string());
    println!(
        "MEASURE one tunnel, {MIB} MiB one way (Python at the guest end): out of the guest {:.0} MiB/s, into it {:.0} MiB/s",
        MIB as f64 / down_s,
        MIB as f64 / up_s
    );

    drop((conn, echo, down, up));
    t.finish().await;
}
