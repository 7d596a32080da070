//! File operations through the real agent binary (dev mode) and the client.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

use crate::common;
use lizard_agent_client::WriteOptions;

use bytes::Bytes;
use common::Agent;
use futures_util::TryStreamExt;
use lizard_agent_client::{AgentClient, ClientError, ErrorCode, FileType};

fn body(data: &'static [u8]) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    futures_util::stream::iter([Ok(Bytes::from_static(data))])
}

async fn read_all(client: &AgentClient, path: &str) -> Result<Vec<u8>, ClientError> {
    let file = client.read_file(path).await?;
    file.try_fold(Vec::new(), |mut all, chunk| async move {
        all.extend_from_slice(&chunk);
        Ok(all)
    })
    .await
}

fn code<T: std::fmt::Debug>(r: Result<T, ClientError>) -> ErrorCode {
    match r {
        Err(ClientError::Agent(e)) => e.code,
        other => panic!("expected an agent error, got {other:?}"),
    }
}

#[tokio::test]
async fn write_read_list_remove_mkdir() {
    let agent = Agent::start();
    let client = agent.connect().await;
    let d = agent.dir.path().display().to_string();

    let w = client
        .write_file(&format!("{d}/sub dir/a.txt"), &WriteOptions::mode(Some(0o600)), body(b"alpha"))
        .await
        .unwrap();
    assert_eq!((w.path, w.bytes_written), (format!("{d}/sub dir/a.txt"), 5));
    client
        .write_file(&format!("{d}/sub dir/b.sh"), &WriteOptions::mode(Some(0o755)), body(b"#!/bin/sh\n"))
        .await
        .unwrap();
    client.make_dir(&format!("{d}/sub dir/c/d"), None).await.unwrap();
    client.make_dir(&format!("{d}/sub dir/c/d"), None).await.unwrap();

    assert_eq!(read_all(&client, &format!("{d}/sub dir/a.txt")).await.unwrap(), b"alpha");
    let file = client.read_file(&format!("{d}/sub dir/a.txt")).await.unwrap();
    assert_eq!(file.content_length(), Some(5));
    // Files that report size 0 but have content still stream whole.
    let version = read_all(&client, "/proc/version").await.unwrap();
    assert!(version.starts_with(b"Linux"));

    let entries = client.list_dir(&format!("{d}/sub dir")).await.unwrap();
    let summary: Vec<_> = entries.iter().map(|e| (e.name.as_str(), e.file_type, e.mode)).collect();
    assert_eq!(
        summary,
        [("a.txt", FileType::File, 0o600), ("b.sh", FileType::File, 0o755), ("c", FileType::Dir, 0o755)]
    );
    assert_eq!(entries[0].path, format!("{d}/sub dir/a.txt"));
    assert!(entries[0].mtime_ms > 1_600_000_000_000);

    // The command side sees the same files.
    let out = client
        .exec_collect(lizard_agent_client::ExecRequest {
            argv: Some(vec![format!("{d}/sub dir/b.sh")]),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(out.status.exit_code, 0);

    client.remove(&format!("{d}/sub dir/a.txt")).await.unwrap();
    client.remove(&format!("{d}/sub dir")).await.unwrap();
    assert!(!agent.dir.path().join("sub dir").exists());
}

#[tokio::test]
async fn errors_carry_codes() {
    let agent = Agent::start();
    let client = agent.connect().await;
    let d = agent.dir.path().display().to_string();
    client.write_file(&format!("{d}/file"), &WriteOptions::default(), body(b"x")).await.unwrap();

    assert_eq!(code(read_all(&client, &format!("{d}/missing")).await), ErrorCode::NotFound);
    assert_eq!(code(read_all(&client, &d).await), ErrorCode::IsADirectory);
    assert_eq!(code(client.list_dir(&format!("{d}/file")).await), ErrorCode::NotADirectory);
    assert_eq!(code(client.list_dir(&format!("{d}/missing")).await), ErrorCode::NotFound);
    assert_eq!(code(client.read_file("relative/path").await.map(drop)), ErrorCode::InvalidArgument);
    assert_eq!(
        code(client.write_file("relative", &WriteOptions::default(), body(b"")).await),
        ErrorCode::InvalidArgument
    );
    assert_eq!(code(client.write_file(&d, &WriteOptions::default(), body(b"")).await), ErrorCode::IsADirectory);
    assert_eq!(
        code(client.write_file(&format!("{d}/file/below"), &WriteOptions::default(), body(b"")).await),
        ErrorCode::NotADirectory
    );
    assert_eq!(code(client.remove(&format!("{d}/missing")).await), ErrorCode::NotFound);
    assert_eq!(code(client.remove("/").await), ErrorCode::InvalidArgument);
    assert_eq!(code(client.remove(&format!("{d}/../../")).await), ErrorCode::InvalidArgument);
    assert_eq!(code(client.make_dir(&format!("{d}/file"), None).await), ErrorCode::AlreadyExists);
    // Nothing was left behind by the failed writes.
    let names: Vec<_> = client.list_dir(&d).await.unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["agent.sock", "file", "secret"]);
}

#[tokio::test]
async fn a_failing_upload_leaves_no_file() {
    let agent = Agent::start();
    let client = agent.connect().await;
    let d = agent.dir.path().display().to_string();
    let broken = futures_util::stream::iter([
        Ok(Bytes::from_static(b"partial")),
        Err(std::io::Error::other("the source broke")),
    ]);
    let err = client.write_file(&format!("{d}/upload"), &WriteOptions::default(), broken).await.unwrap_err();
    assert!(!matches!(err, ClientError::Closed), "{err}");
    // The agent removes its temporary file once it sees the request fail (bounded
    // generously: a loaded CI machine can take seconds to schedule it).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let names: Vec<_> = client.list_dir(&d).await.unwrap().into_iter().map(|e| e.name).collect();
        if names == ["agent.sock", "secret"] {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{names:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Read a watch's stream until `n` events came (blank heartbeat lines skipped).
async fn events(stream: &mut lizard_agent_client::ReadFile, n: usize) -> Vec<lizard_agent_client::FsEvent> {
    use futures_util::StreamExt;
    let mut buf = Vec::new();
    let mut out = vec![];
    while out.len() < n {
        let chunk =
            tokio::time::timeout(std::time::Duration::from_secs(10), stream.next()).await.unwrap().unwrap().unwrap();
        buf.extend_from_slice(&chunk);
        while let Some(end) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=end).collect();
            if line.len() > 1 {
                out.push(serde_json::from_slice(&line[..line.len() - 1]).unwrap());
            }
        }
    }
    out
}

#[tokio::test]
async fn info_rename_watch_and_archives_over_the_channel() {
    use lizard_agent_client::FsEventKind;
    let agent = Agent::start();
    let client = agent.connect().await;
    let d = agent.dir.path().display().to_string();
    let mut watch = client.watch(&d, true).await.unwrap();
    // Several files in one call, as a tar archive.
    let mut tar = tar::Builder::new(Vec::new());
    for (name, data) in [("up/a.txt", &b"alpha"[..]), ("up/deep/b.txt", b"beta")] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        tar.append_data(&mut h, name, data).unwrap();
    }
    let tar = Bytes::from(tar.into_inner().unwrap());
    let r = client.write_archive(&d, futures_util::stream::iter([Ok(tar)])).await.unwrap();
    assert_eq!((r.entries, r.bytes_written), (2, 9));
    let seen = events(&mut watch, 1).await;
    assert_eq!((seen[0].kind, seen[0].path.as_str()), (FsEventKind::Create, format!("{d}/up").as_str()));
    let info = client.file_info(&format!("{d}/up/a.txt")).await.unwrap();
    assert_eq!((info.size, info.file_type, info.owner.is_empty()), (5, FileType::File, false));
    let moved = client.rename(&format!("{d}/up/a.txt"), &format!("{d}/up/c.txt")).await.unwrap();
    assert_eq!(moved.path, format!("{d}/up/c.txt"));
    // Let the watch catch up to the rename (the unpack's own events come first).
    let mut seen = events(&mut watch, 1).await;
    while seen.last().unwrap().kind != FsEventKind::Rename {
        seen.extend(events(&mut watch, 1).await);
    }
    let rename = seen.last().unwrap();
    assert_eq!(
        (rename.path.clone(), rename.new_path.clone()),
        (format!("{d}/up/a.txt"), Some(format!("{d}/up/c.txt")))
    );
    drop(watch);
    // The directory back as one archive.
    let archive: Vec<u8> = client
        .read_archive(&format!("{d}/up"))
        .await
        .unwrap()
        .try_fold(Vec::new(), |mut all, chunk| async move {
            all.extend_from_slice(&chunk);
            Ok(all)
        })
        .await
        .unwrap();
    let mut names: Vec<String> = tar::Archive::new(&archive[..])
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["c.txt", "deep", "deep/b.txt"]);
    assert_eq!(code(client.file_info(&format!("{d}/up/a.txt")).await), ErrorCode::NotFound);
    assert_eq!(code(client.read_archive(&format!("{d}/up/c.txt")).await.map(drop)), ErrorCode::NotADirectory);
    assert_eq!(code(client.watch(&format!("{d}/nope"), false).await.map(drop)), ErrorCode::NotFound);
}
