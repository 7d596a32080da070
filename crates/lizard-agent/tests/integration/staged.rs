//! Staged file transfers through the real agent binary in dev mode, whose "staging disk"
//! is a plain file (`serve --staging FILE`): the same bytes, modes and error codes as the
//! channel, the fallback where there is no disk, and nothing left behind on failure.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

use crate::common;
use lizard_agent_client::WriteOptions;

use bytes::Bytes;
use common::Agent;
use futures_util::{StreamExt, TryStreamExt};
use lizard_agent_client::{AgentClient, ClientError, ErrorCode, StagingFile, TransferPath};
use sha2::{Digest, Sha256};
use std::os::unix::fs::PermissionsExt;

/// An agent with a staging file, and the host's handle on that file.
fn staged_agent() -> (Agent, StagingFile, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("staging.img");
    let staging = StagingFile::create(&path).unwrap();
    let agent = Agent::start_with(&["--staging", path.to_str().unwrap()]);
    (agent, staging, dir)
}

/// `len` deterministic bytes in chunks of `chunk` (odd sizes, so that windows and chunks
/// never line up).
fn pattern(len: usize, chunk: usize) -> (Vec<Bytes>, Vec<u8>) {
    let mut all = Vec::with_capacity(len);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    while all.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        all.push(x.to_le_bytes()[3]);
    }
    let chunks = all.chunks(chunk).map(Bytes::copy_from_slice).collect();
    (chunks, all)
}

fn stream_of(chunks: Vec<Bytes>) -> impl futures_util::Stream<Item = std::io::Result<Bytes>> + Send + Unpin + 'static {
    futures_util::stream::iter(chunks.into_iter().map(Ok))
}

async fn read_via(client: &AgentClient, staging: Option<&StagingFile>, path: &str) -> (Vec<u8>, TransferPath) {
    let (file, how) = client.read_file_via(staging, path).await.unwrap();
    let want = file.content_length();
    let all: Vec<u8> = file
        .try_fold(Vec::new(), |mut all, c| async move {
            all.extend_from_slice(&c);
            Ok(all)
        })
        .await
        .unwrap();
    if let Some(n) = want {
        assert_eq!(n, all.len() as u64);
    }
    (all, how)
}

fn code<T>(r: Result<T, ClientError>) -> ErrorCode {
    match r {
        Err(ClientError::Agent(e)) => e.code,
        Err(other) => panic!("expected an agent error, got {other:?}"),
        Ok(_) => panic!("expected an agent error, got success"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_round_trip_keeps_bytes_and_modes() {
    let (agent, staging, _dir) = staged_agent();
    let client = agent.connect().await;
    let d = agent.dir.path().display().to_string();
    // 2.5 windows and a bit, in chunks of an odd size.
    let (chunks, all) = pattern(10 * (1 << 20) + 12345, 333_333);
    let path = format!("{d}/deep/dir/big.bin");
    let (w, how) = client
        .write_file_via(Some(&staging), &path, &WriteOptions::mode(Some(0o640)), stream_of(chunks))
        .await
        .unwrap();
    assert_eq!((how, w.bytes_written, w.path.as_str()), (TransferPath::Staged, all.len() as u64, path.as_str()));
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(Sha256::digest(&on_disk), Sha256::digest(&all));
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o640);

    let (back, how) = read_via(&client, Some(&staging), &path).await;
    assert_eq!(how, TransferPath::Staged);
    assert_eq!(Sha256::digest(&back), Sha256::digest(&all));

    // Overwrite without a mode keeps the mode; an empty file; a file of exactly a window.
    let (w, _) =
        client.write_file_via(Some(&staging), &path, &WriteOptions::default(), stream_of(vec![])).await.unwrap();
    assert_eq!(w.bytes_written, 0);
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o640);
    assert_eq!(read_via(&client, Some(&staging), &path).await, (vec![], TransferPath::Staged));
    let (chunks, all) = pattern(4 << 20, 1 << 20);
    client.write_file_via(Some(&staging), &path, &WriteOptions::default(), stream_of(chunks)).await.unwrap();
    assert_eq!(read_via(&client, Some(&staging), &path).await.0, all);
    // Files whose size the file system does not know stream to their end.
    let (status, how) = read_via(&client, Some(&staging), "/proc/self/status").await;
    assert!(String::from_utf8(status).unwrap().contains("Name:"));
    assert_eq!(how, TransferPath::Staged);

    // Nothing but the files written is left in the directory (no temporary files).
    let mut names: Vec<_> =
        std::fs::read_dir(format!("{d}/deep/dir")).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, vec!["big.bin"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_errors_have_the_channels_codes() {
    let (agent, staging, _dir) = staged_agent();
    let client = agent.connect().await;
    let d = format!("{}/e", agent.dir.path().display());
    std::fs::create_dir(&d).unwrap();
    std::fs::write(format!("{d}/file"), "x").unwrap();
    let s = Some(&staging);
    assert_eq!(code(client.read_file_via(s, &format!("{d}/missing")).await), ErrorCode::NotFound);
    assert_eq!(code(client.read_file_via(s, &d).await), ErrorCode::IsADirectory);
    assert_eq!(code(client.read_file_via(s, "relative").await), ErrorCode::InvalidArgument);
    let empty = || stream_of(vec![Bytes::from_static(b"data")]);
    assert_eq!(code(client.write_file_via(s, &d, &WriteOptions::default(), empty()).await), ErrorCode::IsADirectory);
    assert_eq!(
        code(client.write_file_via(s, &format!("{d}/file/x"), &WriteOptions::default(), empty()).await),
        ErrorCode::NotADirectory
    );
    assert_eq!(
        code(client.write_file_via(s, &format!("{d}/y"), &WriteOptions::mode(Some(0o77777)), empty()).await),
        ErrorCode::InvalidArgument
    );
    // The plain path answers the same codes.
    assert_eq!(code(client.read_file(&format!("{d}/missing")).await), ErrorCode::NotFound);
    assert_eq!(code(client.write_file(&d, &WriteOptions::default(), empty()).await), ErrorCode::IsADirectory);

    // A body that fails midway replaces nothing and leaves no temporary file.
    let (mut chunks, _) = pattern(9 << 20, 1 << 20);
    chunks.truncate(6);
    let failing = futures_util::stream::iter(chunks.into_iter().map(Ok))
        .chain(futures_util::stream::once(async { Err(std::io::Error::other("upload broke")) }));
    let r = client.write_file_via(s, &format!("{d}/file"), &WriteOptions::default(), Box::pin(failing)).await;
    assert!(matches!(r, Err(ClientError::Io(_))), "{:?}", r.map(|(w, _)| w));
    assert_eq!(std::fs::read_to_string(format!("{d}/file")).unwrap(), "x");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let names: Vec<_> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name()).collect();
        if names.len() == 1 {
            assert_eq!(names, ["file"]);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "temporary file left: {names:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // The slot of the failed transfer is free again, and the session still works.
    let (w, how) = client.write_file_via(s, &format!("{d}/after"), &WriteOptions::default(), empty()).await.unwrap();
    assert_eq!((w.bytes_written, how), (4, TransferPath::Staged));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_staging_disk_transfers_use_the_channel() {
    // The host has a staging file but the agent has no disk: 503, then the channel.
    let dir = tempfile::tempdir().unwrap();
    let staging = StagingFile::create(&dir.path().join("staging.img")).unwrap();
    let agent = Agent::start();
    let client = agent.connect().await;
    let path = format!("{}/f", agent.dir.path().display());
    let (chunks, all) = pattern(5 << 20, 1 << 20);
    let (w, how) =
        client.write_file_via(Some(&staging), &path, &WriteOptions::default(), stream_of(chunks)).await.unwrap();
    assert_eq!((w.bytes_written, how), (all.len() as u64, TransferPath::Channel));
    assert_eq!(read_via(&client, Some(&staging), &path).await, (all.clone(), TransferPath::Channel));
    // No staging file on the host (a VM made before staging disks): the channel too.
    let none = StagingFile::at(dir.path().join("missing.img"));
    assert_eq!(read_via(&client, Some(&none), &path).await, (all.clone(), TransferPath::Channel));
    assert_eq!(read_via(&client, None, &path).await, (all, TransferPath::Channel));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_slots_fall_back_to_the_channel() {
    let (agent, staging, _dir) = staged_agent();
    let client = agent.connect().await;
    let path = format!("{}/f", agent.dir.path().display());
    client
        .write_file_via(Some(&staging), &path, &WriteOptions::default(), stream_of(vec![Bytes::from_static(b"abc")]))
        .await
        .unwrap();
    // Two reads in flight hold both slots (a window each is waiting for the host).
    let (first, how1) = client.read_file_via(Some(&staging), &path).await.unwrap();
    let (second, how2) = client.read_file_via(Some(&staging), &path).await.unwrap();
    let (third, how3) = read_via(&client, Some(&staging), &path).await;
    assert_eq!((how1, how2, how3), (TransferPath::Staged, TransferPath::Staged, TransferPath::Channel));
    assert_eq!(third, b"abc");
    for file in [first, second] {
        let got: Vec<Bytes> = file.collect::<Vec<_>>().await.into_iter().map(Result::unwrap).collect();
        assert_eq!(got.concat(), b"abc");
    }
}
