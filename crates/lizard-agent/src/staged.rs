//! Staged file routes: writes and reads whose data goes through the staging disk
//! ([`crate::staging_disk`]), while the request carries only window notices (the protocol
//! is in `lizard_agent_proto::staging`).
//!
//! Each transfer runs on a blocking thread of its own, which owns the file and the slot;
//! the async side only turns body lines into notices for it and its notices into answer
//! lines. The checks and the atomic replace are those of the plain routes in
//! [`crate::files`], so both paths answer the same errors with the same codes.

use crate::app::AppError;
use crate::direct::DirectFile;
use crate::files::{FileQuery, FilesError, WriteTarget};
use crate::staging_disk::{AlignedBuf, StagingError, StagingSlot};
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::Query;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use lizard_agent_proto::staging::{self, AgentMsg, HostMsg, LineBuffer, WINDOWS_PER_SLOT};
use lizard_agent_proto::types::{AgentError, ErrorCode, WriteResult};
use serde::Deserialize;
use std::io;
use std::sync::mpsc;
use tokio::sync::mpsc as tokio_mpsc;

/// Response header on every answer of these routes, so that the host can tell "this agent
/// has no staged routes" (an older agent's 404) from an error of the transfer.
pub const STAGED_HEADER: &str = "x-lizard-staged";

/// Why a staged transfer failed.
#[derive(Debug, thiserror::Error)]
pub enum StagedError {
    /// `slot` is missing or not a number.
    #[error("bad query: {0}")]
    Query(String),
    /// The file side failed; same codes as the plain routes.
    #[error(transparent)]
    Files(#[from] FilesError),
    /// The staging disk is missing or failed.
    #[error(transparent)]
    Staging(#[from] StagingError),
    /// The host broke the protocol (a notice out of order, a wrong total).
    #[error("staging protocol: {0}")]
    Protocol(String),
}

impl From<StagedError> for AgentError {
    fn from(e: StagedError) -> AgentError {
        match e {
            StagedError::Files(e) => e.into(),
            StagedError::Query(_) | StagedError::Protocol(_) | StagedError::Staging(StagingError::Layout(_)) => {
                AgentError::new(ErrorCode::InvalidArgument, e.to_string())
            }
            StagedError::Staging(_) => AgentError::new(ErrorCode::Internal, e.to_string()),
        }
    }
}

/// `slot` beside the usual `path` and `mode`.
#[derive(Debug, Deserialize)]
pub struct SlotQuery {
    slot: u64,
}

/// An answer of these routes: an error before the transfer started (with the usual status
/// and code; 503 when there is no staging disk), or the stream of notices.
fn answer(result: Result<Response, StagedError>) -> Response {
    let mut resp = match result {
        Ok(resp) => resp,
        Err(StagedError::Staging(StagingError::Missing)) => {
            let e = AgentError::new(ErrorCode::Internal, StagingError::Missing.to_string());
            (StatusCode::SERVICE_UNAVAILABLE, axum::Json(e)).into_response()
        }
        Err(e) => AppError::from(e).into_response(),
    };
    resp.headers_mut().insert(STAGED_HEADER, HeaderValue::from_static("1"));
    resp
}

/// A staged request's write request and staging slot.
fn parse(
    q: Result<Query<FileQuery>, QueryRejection>,
    slot: Result<Query<SlotQuery>, QueryRejection>,
) -> Result<(crate::files::WriteQuery, u64), StagedError> {
    let write = FileQuery::for_write(q)?;
    let Query(slot) = slot.map_err(|e| StagedError::Query(e.body_text()))?;
    Ok((write, slot.slot))
}

/// The notices a transfer thread sends, as the answer's body.
fn notice_body(rx: tokio_mpsc::UnboundedReceiver<AgentMsg>) -> Response {
    let lines = tokio_stream_of(rx).map(|m| Ok::<_, io::Error>(staging::encode(&m)));
    ([(CONTENT_TYPE, staging::CONTENT_TYPE)], Body::from_stream(lines)).into_response()
}

fn tokio_stream_of<T: Send + 'static>(rx: tokio_mpsc::UnboundedReceiver<T>) -> impl futures_util::Stream<Item = T> {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) })
}

/// Forward the host's notices from the request body to the transfer thread. A body that
/// fails or ends early just ends the forwarding: the thread sees its channel close and
/// gives up.
fn forward_notices(body: Body, tx: mpsc::Sender<HostMsg>) {
    tokio::spawn(async move {
        let mut data = body.into_data_stream();
        let mut lines = LineBuffer::default();
        while let Some(Ok(chunk)) = data.next().await {
            lines.push(&chunk);
            loop {
                match lines.next_message::<HostMsg>() {
                    Ok(Some(msg)) => {
                        if tx.send(msg).is_err() {
                            return;
                        }
                    }
                    Ok(None) => break,
                    // A garbled notice ends the transfer like a dropped connection.
                    Err(_) => return,
                }
            }
        }
    });
}

/// `POST /v1/files/staged/write?path=&mode=&slot=`.
pub async fn write(
    q: Result<Query<FileQuery>, QueryRejection>,
    slot: Result<Query<SlotQuery>, QueryRejection>,
    body: Body,
) -> Response {
    answer(start_write(q, slot, body).await)
}

async fn start_write(
    q: Result<Query<FileQuery>, QueryRejection>,
    slot: Result<Query<SlotQuery>, QueryRejection>,
    body: Body,
) -> Result<Response, StagedError> {
    let (write, slot) = parse(q, slot)?;
    // The disk first: without one the host falls back, and nothing may have changed
    // (parents created) by then.
    let staging = tokio::task::spawn_blocking(move || StagingSlot::open(slot))
        .await
        .map_err(|e| StagedError::Protocol(e.to_string()))??;
    let target = WriteTarget::prepare(write).await?;
    let file = target.create_tmp()?;
    let (notices, from_host) = mpsc::channel();
    let (to_host, answers) = tokio_mpsc::unbounded_channel();
    forward_notices(body, notices);
    tokio::task::spawn_blocking(move || {
        let result = receive(&staging, file, &target, &from_host, &to_host);
        let last = match result {
            Ok(Some(bytes)) => AgentMsg::Written(WriteResult { path: target.shown.clone(), bytes_written: bytes }),
            // The host went away: nobody to tell.
            Ok(None) => {
                target.discard();
                return;
            }
            Err(e) => {
                target.discard();
                AgentMsg::Error(e.into())
            }
        };
        let _ = to_host.send(last);
    });
    Ok(notice_body(answers))
}

/// Copy each window the host announces into `file`, then commit it. `None`: the host
/// left before the end.
fn receive(
    staging: &StagingSlot,
    file: std::fs::File,
    target: &WriteTarget,
    from_host: &mpsc::Receiver<HostMsg>,
    to_host: &tokio_mpsc::UnboundedSender<AgentMsg>,
) -> Result<Option<u64>, StagedError> {
    let mut file = DirectFile::new(file);
    let mut buf = AlignedBuf::window();
    let mut written = 0u64;
    loop {
        let Ok(msg) = from_host.recv() else { return Ok(None) };
        match msg {
            HostMsg::Chunk { window, len } => {
                staging.read_window(window, len, buf.as_mut())?;
                // The window is ours now: the host may fill it again while we write.
                let _ = to_host.send(AgentMsg::Ack { window });
                let n = usize::try_from(len).map_err(|_| StagedError::Protocol(format!("chunk of {len} bytes")))?;
                file.write_all(&buf.as_ref()[..n]).map_err(FilesError::io(&target.tmp))?;
                written += len;
            }
            HostMsg::End { bytes } if bytes == written => {
                target.commit(file.into_inner())?;
                return Ok(Some(written));
            }
            HostMsg::End { bytes } => {
                return Err(StagedError::Protocol(format!("host sent {written} bytes but announced {bytes}")))
            }
            HostMsg::Ack { .. } => return Err(StagedError::Protocol("an ack during a write".into())),
        }
    }
}

/// `POST /v1/files/staged/read?path=&slot=`.
pub async fn read(
    q: Result<Query<FileQuery>, QueryRejection>,
    slot: Result<Query<SlotQuery>, QueryRejection>,
    body: Body,
) -> Response {
    answer(start_read(q, slot, body).await)
}

async fn start_read(
    q: Result<Query<FileQuery>, QueryRejection>,
    slot: Result<Query<SlotQuery>, QueryRejection>,
    body: Body,
) -> Result<Response, StagedError> {
    let (crate::files::WriteQuery { path, .. }, slot) = parse(q, slot)?;
    let file = std::fs::File::open(&path).map_err(FilesError::io(&path))?;
    let meta = file.metadata().map_err(FilesError::io(&path))?;
    if meta.is_dir() {
        return Err(FilesError::IsADirectory(path.display().to_string()).into());
    }
    // Files in /proc and /sys report size 0 but have content: those go to EOF.
    let length = (meta.is_file() && meta.len() > 0).then_some(meta.len());
    let staging = tokio::task::spawn_blocking(move || StagingSlot::open(slot))
        .await
        .map_err(|e| StagedError::Protocol(e.to_string()))??;
    let (acks, from_host) = mpsc::channel();
    let (to_host, answers) = tokio_mpsc::unbounded_channel();
    forward_notices(body, acks);
    tokio::task::spawn_blocking(move || {
        let result = send(&staging, file, length, &path, &from_host, &to_host);
        if let Err(e) = result {
            let _ = to_host.send(AgentMsg::Error(e.into()));
        }
    });
    let mut resp = notice_body(answers);
    if let Some(len) = length {
        resp.headers_mut().insert(staging::LENGTH_HEADER, HeaderValue::from(len));
    }
    Ok(resp)
}

/// Fill the slot's windows with the file in turn, each once the host has copied it out,
/// then announce the end. Never more than `length` bytes, even if the file grows.
fn send(
    staging: &StagingSlot,
    file: std::fs::File,
    length: Option<u64>,
    path: &std::path::Path,
    from_host: &mpsc::Receiver<HostMsg>,
    to_host: &tokio_mpsc::UnboundedSender<AgentMsg>,
) -> Result<(), StagedError> {
    // Only regular files of known size go direct; /proc and the like never do.
    let mut file = if length.is_some() { DirectFile::new(file) } else { DirectFile::buffered(file) };
    let mut buf = AlignedBuf::window();
    let mut busy = [false; WINDOWS_PER_SLOT];
    let (mut window, mut sent) = (0usize, 0u64);
    loop {
        while busy[window] {
            match from_host.recv() {
                Ok(HostMsg::Ack { window: w }) => match busy.get_mut(usize::try_from(w).unwrap_or(usize::MAX)) {
                    Some(b) => *b = false,
                    None => return Err(StagedError::Protocol(format!("ack of window {w}"))),
                },
                Ok(other) => return Err(StagedError::Protocol(format!("{other:?} during a read"))),
                // The host went away.
                Err(_) => return Ok(()),
            }
        }
        let mut n = file.fill(buf.as_mut()).map_err(FilesError::io(path))?;
        if let Some(length) = length {
            n = n.min(usize::try_from(length - sent).unwrap_or(usize::MAX));
        }
        if n == 0 {
            let _ = to_host.send(AgentMsg::End { bytes: sent });
            return Ok(());
        }
        let len = n as u64;
        let w = window as u64;
        staging.write_window(w, len, buf.as_ref())?;
        if to_host.send(AgentMsg::Chunk { window: w, len }).is_err() {
            return Ok(());
        }
        sent += len;
        busy[window] = true;
        window = (window + 1) % busy.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn slot(dir: &std::path::Path) -> StagingSlot {
        let path = dir.join("staging.img");
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(staging::DISK_LEN).unwrap();
        f.write_all_at(staging::MAGIC, 0).unwrap();
        StagingSlot::open_file(&path, 0)
    }

    async fn target(dir: &std::path::Path) -> WriteTarget {
        let q =
            crate::files::WriteQuery { path: dir.join("out"), mode: None, owner: None, metadata: Default::default() };
        WriteTarget::prepare(q).await.unwrap()
    }

    /// Run `receive` on `notices`; its result and what it answered.
    async fn run_receive(notices: Vec<HostMsg>) -> (Result<Option<u64>, StagedError>, Vec<AgentMsg>, bool) {
        let dir = tempfile::tempdir().unwrap();
        let (staging, target) = (slot(dir.path()), target(dir.path()).await);
        let file = target.create_tmp().unwrap();
        let (tx, rx) = mpsc::channel();
        for n in notices {
            tx.send(n).unwrap();
        }
        drop(tx);
        let (to_host, mut answers) = tokio_mpsc::unbounded_channel();
        let result = receive(&staging, file, &target, &rx, &to_host);
        drop(to_host);
        let mut got = vec![];
        while let Some(m) = answers.recv().await {
            got.push(m);
        }
        (result, got, target.path.exists())
    }

    #[tokio::test]
    async fn a_write_checks_the_hosts_notices() {
        let (r, answers, exists) =
            run_receive(vec![HostMsg::Chunk { window: 1, len: 3 }, HostMsg::End { bytes: 3 }]).await;
        assert_eq!((r.unwrap(), answers, exists), (Some(3), vec![AgentMsg::Ack { window: 1 }], true));
        // A total that does not match, an ack, a window outside the slot: refused.
        let (r, _, exists) = run_receive(vec![HostMsg::Chunk { window: 0, len: 3 }, HostMsg::End { bytes: 4 }]).await;
        assert!(matches!(r, Err(StagedError::Protocol(_))) && !exists);
        let (r, _, _) = run_receive(vec![HostMsg::Ack { window: 0 }]).await;
        assert!(matches!(r, Err(StagedError::Protocol(_))));
        let (r, _, _) = run_receive(vec![HostMsg::Chunk { window: 2, len: 3 }]).await;
        assert_eq!(AgentError::from(r.unwrap_err()).code, ErrorCode::InvalidArgument);
        // The host leaving midway is no error, and replaces nothing.
        let (r, _, exists) = run_receive(vec![HostMsg::Chunk { window: 0, len: 3 }]).await;
        assert!(matches!(r, Ok(None)) && !exists);
    }

    #[tokio::test]
    async fn a_read_checks_the_hosts_acks() {
        let dir = tempfile::tempdir().unwrap();
        let staging = slot(dir.path());
        // Three windows' worth: the third waits for an ack.
        let data = dir.path().join("data");
        std::fs::write(&data, vec![7u8; usize::try_from(2 * staging::WINDOW + 5).unwrap()]).unwrap();
        let run = |acks: Vec<HostMsg>| {
            let (tx, rx) = mpsc::channel();
            for a in acks {
                tx.send(a).unwrap();
            }
            drop(tx);
            let (to_host, mut answers) = tokio_mpsc::unbounded_channel();
            let file = std::fs::File::open(&data).unwrap();
            let r = send(&staging, file, Some(2 * staging::WINDOW + 5), &data, &rx, &to_host);
            drop(to_host);
            let mut got = vec![];
            while let Ok(m) = answers.try_recv() {
                got.push(m);
            }
            (r, got)
        };
        let (r, got) = run(vec![HostMsg::Ack { window: 0 }, HostMsg::Ack { window: 1 }]);
        assert!(r.is_ok());
        let total: u64 = got.iter().map(|m| if let AgentMsg::Chunk { len, .. } = m { *len } else { 0 }).sum();
        assert_eq!(total, 2 * staging::WINDOW + 5);
        assert_eq!(got.last(), Some(&AgentMsg::End { bytes: total }));
        assert!(matches!(run(vec![HostMsg::Ack { window: 9 }]).0, Err(StagedError::Protocol(_))));
        assert!(matches!(run(vec![HostMsg::End { bytes: 1 }]).0, Err(StagedError::Protocol(_))));
        // The host leaving midway ends the read quietly.
        let (r, got) = run(vec![]);
        assert!(r.is_ok() && got.len() == 2, "{got:?}");
    }
}
