//! A 100 MB file through the agent and back, streamed: byte-identical, and neither the
//! client process nor the agent holds it in memory. Its own test binary, so that the
//! memory it measures is its own.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

use crate::common;
use lizard_agent_client::WriteOptions;

use bytes::Bytes;
use common::{peak_rss_of, Agent};
use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use std::time::Instant;

const SIZE: usize = 100 << 20;
const CHUNK: usize = 1 << 20;

/// Deterministic, incompressible-looking bytes: chunk `i` of the test file.
fn chunk(i: usize) -> Bytes {
    let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut v = Vec::with_capacity(CHUNK);
    while v.len() < CHUNK {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    Bytes::from(v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_megabytes_round_trip() {
    let agent = Agent::start();
    let client = agent.connect().await;
    let path = format!("{}/big.bin", agent.dir.path().display());
    let before = peak_rss_of("/proc/self/status");

    let mut want = Sha256::new();
    for i in 0..SIZE / CHUNK {
        want.update(chunk(i));
    }
    let want = want.finalize();

    let t = Instant::now();
    let body = futures_util::stream::iter(0..SIZE / CHUNK).map(|i| Ok(chunk(i)));
    let w = client.write_file(&path, &WriteOptions::default(), body).await.unwrap();
    let write_s = t.elapsed().as_secs_f64();
    assert_eq!(w.bytes_written, SIZE as u64);

    let t = Instant::now();
    let mut file = client.read_file(&path).await.unwrap();
    assert_eq!(file.content_length(), Some(SIZE as u64));
    let (mut got, mut n) = (Sha256::new(), 0usize);
    while let Some(c) = file.next().await {
        let c = c.unwrap();
        n += c.len();
        got.update(&c);
    }
    let read_s = t.elapsed().as_secs_f64();
    assert_eq!(n, SIZE);
    assert_eq!(got.finalize(), want);
    println!(
        "MEASURE 100 MiB write {:.0} MiB/s, read {:.0} MiB/s (unix socket, debug build)",
        100.0 / write_s,
        100.0 / read_s
    );

    let grew = peak_rss_of("/proc/self/status").saturating_sub(before);
    assert!(grew < 40 << 20, "the test process grew by {} MiB", grew >> 20);
    let agent_peak = agent.peak_rss();
    assert!(agent_peak < 48 << 20, "agent peak RSS {} MiB", agent_peak >> 20);
    println!("MEASURE peak RSS growth: client {} MiB, agent peak {} MiB", grew >> 20, agent_peak >> 20);
}
