//! envd's directory watches on the node's: `WatchDir` (a Connect stream that opens with
//! `start`) and the polling watcher the sync Python SDK uses (`CreateWatcher`,
//! `GetWatcherEvents`, `RemoveWatcher`), whose events this server keeps until asked.
//!
//! A polling watcher lives in the server process that made it (a later poll reaching
//! another replica finds none); at most [`MAX_WATCHERS`] at once, each keeping its
//! newest [`MAX_KEPT`] events, and one ends with its sandbox.

use bytes::Bytes;
use futures_util::{Stream, StreamExt, TryStreamExt};
use lizard_agent_proto::types::{FsEvent, FsEventKind};
use lizard_e2b::connect;
use lizard_e2b::filesystem::{relative_name, EventType, FilesystemEvent, WatchEvent};
use lizard_node_client::ByteStream;
use lizard_server::ops::sandboxes::LiveSandbox;
use rand::RngCore;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;
use tokio_util::codec::{FramedRead, LinesCodec};
use tokio_util::io::StreamReader;

/// Polling watchers one server keeps at once.
pub const MAX_WATCHERS: usize = 1024;
/// Events one polling watcher keeps between polls (the oldest go first).
pub const MAX_KEPT: usize = 10_000;
/// Longest line of the node's watch answer.
const MAX_LINE: usize = 64 << 10;

/// A watch's events as E2B names them, relative to the watched `dir`.
fn events(stream: ByteStream, dir: String) -> impl Stream<Item = std::io::Result<Vec<FilesystemEvent>>> {
    let lines = FramedRead::new(StreamReader::new(stream), LinesCodec::new_with_max_length(MAX_LINE));
    lines.map_err(std::io::Error::other).map_ok(move |line| {
        let Ok(e) = serde_json::from_str::<FsEvent>(&line) else { return Vec::new() };
        let named = |path: &str, event_type| FilesystemEvent { name: relative_name(&dir, path), event_type };
        match e.kind {
            FsEventKind::Create => vec![named(&e.path, EventType::Create)],
            FsEventKind::Write => vec![named(&e.path, EventType::Write)],
            FsEventKind::Remove => vec![named(&e.path, EventType::Remove)],
            // As envd reports a move: the old name renamed, the new one created.
            FsEventKind::Rename => {
                let mut out = vec![named(&e.path, EventType::Rename)];
                out.extend(e.new_path.as_deref().map(|to| named(to, EventType::Create)));
                out
            }
            FsEventKind::Overflow => Vec::new(),
        }
    })
}

/// `WatchDir`: `start`, then each event as it happens, a keepalive when quiet.
pub(super) fn stream(
    watch: ByteStream,
    dir: String,
    keepalive: Duration,
) -> futures_util::stream::BoxStream<'static, Bytes> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        if tx.send(connect::envelope(&WatchEvent::Start {})).await.is_err() {
            return;
        }
        let mut events = Box::pin(events(watch, dir));
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + keepalive, keepalive);
        let failure = loop {
            let batch = tokio::select! {
                next = events.next() => match next {
                    None => break None,
                    Some(Err(e)) => break Some(connect::Error::new(connect::Code::Unavailable, format!("the watch broke off: {e}"))),
                    Some(Ok(batch)) => batch,
                },
                _ = ticks.tick() => {
                    if tx.send(connect::envelope(&WatchEvent::Keepalive {})).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            for event in batch {
                if tx.send(connect::envelope(&WatchEvent::Filesystem(event))).await.is_err() {
                    return;
                }
            }
        };
        let _ = tx.send(connect::end_stream(failure.as_ref())).await;
    });
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) }).boxed()
}

struct Watcher {
    sandbox: String,
    kept: Arc<Mutex<VecDeque<FilesystemEvent>>>,
    task: tokio::task::AbortHandle,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

static WATCHERS: LazyLock<Mutex<HashMap<String, Watcher>>> = LazyLock::new(Default::default);

fn watchers() -> std::sync::MutexGuard<'static, HashMap<String, Watcher>> {
    WATCHERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why a polling watcher call failed.
pub(super) enum WatcherError {
    TooMany,
    NotFound,
}

/// `CreateWatcher`: a watcher id whose events are kept until polled.
pub(super) fn create(sandbox: &LiveSandbox, watch: ByteStream, dir: String) -> Result<String, WatcherError> {
    let mut all = watchers();
    // Watchers whose watch ended (their sandbox gone) make room first.
    all.retain(|_, w| !w.task.is_finished() || !w.kept.lock().unwrap_or_else(|e| e.into_inner()).is_empty());
    if all.len() >= MAX_WATCHERS {
        return Err(WatcherError::TooMany);
    }
    let kept = Arc::new(Mutex::new(VecDeque::new()));
    let into = kept.clone();
    let task = tokio::spawn(async move {
        let mut events = Box::pin(events(watch, dir));
        while let Some(Ok(batch)) = events.next().await {
            let mut kept = into.lock().unwrap_or_else(|e| e.into_inner());
            for event in batch {
                if kept.len() == MAX_KEPT {
                    kept.pop_front();
                }
                kept.push_back(event);
            }
        }
    });
    let mut id = [0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut id);
    let id = hex::encode(id);
    all.insert(id.clone(), Watcher { sandbox: sandbox.id().to_owned(), kept, task: task.abort_handle() });
    Ok(id)
}

/// `GetWatcherEvents`: what happened since the last poll (only for the sandbox that made it).
pub(super) fn take(sandbox: &LiveSandbox, watcher: &str) -> Result<Vec<FilesystemEvent>, WatcherError> {
    let all = watchers();
    let w = all.get(watcher).filter(|w| w.sandbox == sandbox.id()).ok_or(WatcherError::NotFound)?;
    let taken = w.kept.lock().unwrap_or_else(|e| e.into_inner()).drain(..).collect();
    Ok(taken)
}

/// `RemoveWatcher`.
pub(super) fn remove(sandbox: &LiveSandbox, watcher: &str) -> Result<(), WatcherError> {
    let mut all = watchers();
    match all.get(watcher) {
        Some(w) if w.sandbox == sandbox.id() => {
            all.remove(watcher);
            Ok(())
        }
        _ => Err(WatcherError::NotFound),
    }
}
