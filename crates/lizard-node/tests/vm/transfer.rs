//! File transfers of real guests through the staging disk: 256 MiB each way with
//! checksums across a pause and resume of a sandbox restored from a template snapshot,
//! errors with the codes clients know, and nothing left behind.

// Helpers of these tests unwrap as the tests do (clippy.toml's allow-unwrap-in-tests
// covers only the #[test] functions themselves).
#![allow(clippy::unwrap_used)]

use crate::common;
use lizard_node::WriteOptions;

use bytes::Bytes;
use common::sh;
use futures_util::StreamExt;
use lizard_api::{CreateSandboxRequest, ErrorCode};
use lizard_node::{Sandbox, TransferStats};
use sha2::{Digest, Sha256};
use std::time::Instant;

const MIB: usize = 1 << 20;

/// Chunk `i` of a deterministic test file (incompressible-looking), of an odd length
/// so that chunks and staging windows never line up.
fn chunk(i: usize) -> Bytes {
    let len = MIB - 4096 + 17;
    let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    Bytes::from(v)
}

/// Write `chunks` chunks to `path` in the guest; their SHA-256 and the rate in MiB/s.
async fn write_pattern(sbx: &Sandbox, path: &str, chunks: usize) -> (String, u64, f64) {
    let mut want = Sha256::new();
    let mut len = 0u64;
    for i in 0..chunks {
        let c = chunk(i);
        len += c.len() as u64;
        want.update(&c);
    }
    let body = futures_util::stream::iter(0..chunks).map(|i| Ok(chunk(i)));
    let t = Instant::now();
    let w = sbx.write_file(path, &WriteOptions::default(), body).await.unwrap();
    let rate = len as f64 / MIB as f64 / t.elapsed().as_secs_f64();
    assert_eq!(w.bytes_written, len);
    (hex::encode(want.finalize()), len, rate)
}

/// Read `path` out of the guest; its SHA-256, length and the rate in MiB/s.
async fn read_hash(sbx: &Sandbox, path: &str) -> (String, u64, f64) {
    let t = Instant::now();
    let (announced, mut stream) = sbx.read_file(path).await.unwrap();
    let (mut h, mut n) = (Sha256::new(), 0u64);
    while let Some(c) = stream.next().await {
        let c = c.unwrap();
        n += c.len() as u64;
        h.update(&c);
    }
    let rate = n as f64 / MIB as f64 / t.elapsed().as_secs_f64();
    assert_eq!(announced, Some(n));
    (hex::encode(h.finalize()), n, rate)
}

/// `sha256sum` of `path` in the guest.
async fn guest_hash(sbx: &Sandbox, path: &str) -> String {
    let r = sbx.exec_collect(sh(&format!("sha256sum {path}"))).await.unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    r.stdout.split_whitespace().next().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn quarter_gigabyte_both_ways_across_pause_and_resume() {
    let t = common::node().await;
    let sbx = t.node.create(CreateSandboxRequest { template: "base".into(), ..Default::default() }).await.unwrap();
    assert!(sbx.from_snapshot(), "the sandbox was not restored from the template snapshot");

    // 256 MiB into a guest restored from a template snapshot: through the staging disk.
    let (want, len, write_rate) = write_pattern(&sbx, "/root/big.bin", 256 * MIB / (MIB - 4096 + 17) + 1).await;
    assert!(len >= 256 * MIB as u64);
    assert_eq!(sbx.transfer_stats(), TransferStats { staged: 1, channel: 0 });
    assert_eq!(guest_hash(&sbx, "/root/big.bin").await, want, "the guest has other bytes");
    // A file the guest made itself.
    let r = sbx.exec_collect(sh("head -c 100000007 /dev/urandom > /root/guest.bin")).await.unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    let guest_made = guest_hash(&sbx, "/root/guest.bin").await;

    t.node.pause(&sbx.id).await.unwrap();
    t.node.resume(&sbx.id).await.unwrap();

    let (got, n, read_rate) = read_hash(&sbx, "/root/big.bin").await;
    assert_eq!((got, n), (want.clone(), len), "256 MiB came back different after a resume");
    let (got, n, _) = read_hash(&sbx, "/root/guest.bin").await;
    assert_eq!((got, n), (guest_made, 100_000_007));
    // Written again after the resume, and read back: still the fast path.
    let (want2, _, _) = write_pattern(&sbx, "/root/again.bin", 9).await;
    assert_eq!(read_hash(&sbx, "/root/again.bin").await.0, want2);
    assert_eq!(sbx.transfer_stats(), TransferStats { staged: 5, channel: 0 });
    println!("MEASURE 256 MiB write {write_rate:.0} MiB/s, read after resume {read_rate:.0} MiB/s (TCG, loaded host)");

    // The staging disk keeps no transferred data on the host once a transfer is done.
    let staging = t.dir.path().join("sandboxes").join(&sbx.id).join("staging.img");
    let used = std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&staging).unwrap()) * 512;
    assert!(used <= 64 * 1024, "the staging file holds {used} bytes");
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn staged_errors_keep_their_codes() {
    let t = common::node().await;
    let sbx = t.node.create(CreateSandboxRequest { template: "base".into(), ..Default::default() }).await.unwrap();
    let code = |e: lizard_node::NodeError| e.code();
    let body = || futures_util::stream::iter([Ok(Bytes::from_static(b"data"))]);

    assert_eq!(code(sbx.read_file("/root/missing").await.err().unwrap()), ErrorCode::NotFound);
    assert_eq!(code(sbx.read_file("/root").await.err().unwrap()), ErrorCode::InvalidArgument);
    assert_eq!(
        code(sbx.write_file("/root", &WriteOptions::default(), body()).await.unwrap_err()),
        ErrorCode::InvalidArgument
    );
    assert_eq!(
        code(sbx.write_file("/etc/hostname/x", &WriteOptions::default(), body()).await.unwrap_err()),
        ErrorCode::InvalidArgument
    );

    // No space in the guest: a 1 MiB file system (the template has no `mount` binary:
    // mount(2) through Python), 3 MiB written. The old file stays, and no temporary file
    // is left.
    const MOUNT: &str = "mkdir -p /mnt/small && python3 -c 'import ctypes,sys; \
        sys.exit(ctypes.CDLL(None).mount(b\"tmpfs\", b\"/mnt/small\", b\"tmpfs\", 0, b\"size=1m\"))' \
        && echo old > /mnt/small/f";
    let r = sbx.exec_collect(sh(MOUNT)).await.unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    let big = futures_util::stream::iter(0..3).map(|i| Ok(chunk(i)));
    let e = sbx.write_file("/mnt/small/f", &WriteOptions::default(), big).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Internal, "{e}");
    assert!(e.to_api().message.contains("No space left"), "{}", e.to_api().message);
    let r = sbx.exec_collect(sh("ls -A /mnt/small; cat /mnt/small/f")).await.unwrap();
    assert_eq!(r.stdout, "f\nold\n");
    // The failures freed their slots: the fast path still works.
    let before = sbx.transfer_stats();
    sbx.write_file("/root/ok", &WriteOptions::default(), body()).await.unwrap();
    assert_eq!(sbx.transfer_stats().staged, before.staged + 1);

    // Written as another user: the file and the directories the write made are theirs,
    // what was there before stays root's; the same for a mkdir; an unknown user is
    // refused before anything is made.
    let nobody = WriteOptions { owner: Some("nobody".into()), ..Default::default() };
    sbx.write_file("/tmp/owned/a/b.txt", &nobody, body()).await.unwrap();
    sbx.make_dir("/tmp/owned/c/d", Some("nobody")).await.unwrap();
    for p in ["/tmp/owned", "/tmp/owned/a", "/tmp/owned/a/b.txt", "/tmp/owned/c", "/tmp/owned/c/d"] {
        assert_eq!(sbx.file_info(p).await.unwrap().owner, "nobody", "{p}");
    }
    assert_eq!(sbx.file_info("/tmp").await.unwrap().owner, "root");
    let stranger = WriteOptions { owner: Some("no-such-user".into()), ..Default::default() };
    let e = sbx.write_file("/tmp/stranger/f", &stranger, body()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    assert_eq!(code(sbx.file_info("/tmp/stranger").await.unwrap_err()), ErrorCode::NotFound);

    // Metadata rides a staged write onto the file, and stat and list read it back.
    let metadata: std::collections::BTreeMap<_, _> = [("Kind".to_string(), "report".to_string())].into();
    let tagged = WriteOptions { metadata, ..Default::default() };
    let before = sbx.transfer_stats();
    sbx.write_file("/root/tagged/f", &tagged, body()).await.unwrap();
    assert_eq!(sbx.transfer_stats().staged, before.staged + 1);
    let kept: std::collections::BTreeMap<_, _> = [("kind".to_string(), "report".to_string())].into();
    assert_eq!(sbx.file_info("/root/tagged/f").await.unwrap().metadata, kept);
    assert_eq!(sbx.list_dir("/root/tagged").await.unwrap()[0].metadata, kept);

    // A pause in the middle of a read: the pause goes ahead, the read fails, and after
    // the resume both slots are free again.
    let (want, _, _) = write_pattern(&sbx, "/root/mid.bin", 20).await;
    let (_, mut interrupted) = sbx.read_file("/root/mid.bin").await.unwrap();
    assert!(interrupted.next().await.unwrap().is_ok());
    t.node.pause(&sbx.id).await.unwrap();
    t.node.resume(&sbx.id).await.unwrap();
    let mut failed = false;
    while let Some(c) = interrupted.next().await {
        failed |= c.is_err();
    }
    assert!(failed, "a read cut by a pause ended as if complete");
    drop(interrupted);
    let before = sbx.transfer_stats();
    let (a, b) = tokio::join!(read_hash(&sbx, "/root/mid.bin"), read_hash(&sbx, "/root/mid.bin"));
    assert_eq!((a.0, b.0), (want.clone(), want));
    assert_eq!(sbx.transfer_stats().staged, before.staged + 2);
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cold_boots_and_fork_copies_use_the_staging_disk() {
    let t = common::node_with(|c| c.snapshots = false).await;
    let sbx = t.node.create(CreateSandboxRequest { template: "base".into(), ..Default::default() }).await.unwrap();
    assert!(!sbx.from_snapshot());
    let (want, _, _) = write_pattern(&sbx, "/root/before-fork.bin", 9).await;
    let copies = t.node.fork(&sbx.id, 1).await.unwrap();
    for s in [&sbx, &copies[0]] {
        assert_eq!(read_hash(s, "/root/before-fork.bin").await.0, want);
        let (mine, _, _) = write_pattern(s, "/root/after-fork.bin", 5).await;
        assert_eq!(guest_hash(s, "/root/after-fork.bin").await, mine);
    }
    assert_eq!(sbx.transfer_stats(), TransferStats { staged: 3, channel: 0 });
    assert_eq!(copies[0].transfer_stats(), TransferStats { staged: 2, channel: 0 });
    t.finish().await;
}
