//! `GET /v1/files/watch?path=&recursive=`: a directory's changes as NDJSON [`FsEvent`]s,
//! from inotify (nix's binding, read through tokio's `AsyncFd`).
//!
//! - The answer starts once every watch is in place: a change made after the host got the
//!   response head is reported.
//! - `recursive=true` watches every directory under `path` (links are not followed) and
//!   each directory created or moved in later; what such a directory already holds when
//!   its watch is added is reported as `create` too, so files made right after `mkdir`
//!   are not missed.
//! - `rename` pairs a move's two halves (same cookie), read in one batch or the next within
//!   [`MOVE_GRACE`]; a move out of the watched tree is a `remove`, a move in a `create`.
//! - Consecutive `write`s of one file in a batch are one event.
//! - The kernel's queue overflowing (`max_queued_events`, 16384 by default) is an
//!   `overflow` event; the watch goes on. So is a directory that could not be watched
//!   (`max_user_watches` reached).
//! - A blank line every [`HEARTBEAT`] of silence lets the host see the stream is alive.
//! - Dropping the stream (the host went away, the sandbox paused) closes the inotify
//!   descriptor, which frees every watch.

use crate::app::AppError;
use crate::files::{blocking, FilesError};
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::Query;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use lizard_agent_proto::types::{FsEvent, FsEventKind};
use nix::sys::inotify::{AddWatchFlags as Mask, InitFlags, Inotify, InotifyEvent, WatchDescriptor};
use serde::Deserialize;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Silence after which a blank line is sent.
pub const HEARTBEAT: Duration = Duration::from_secs(15);
/// How long the second half of a move is waited for once the first was read alone.
const MOVE_GRACE: Duration = Duration::from_millis(50);

/// Query parameters of a watch.
#[derive(Debug, Deserialize)]
pub struct WatchQuery {
    path: String,
    #[serde(default)]
    recursive: bool,
}

/// What each watch asks the kernel for.
fn mask() -> Mask {
    Mask::IN_CREATE | Mask::IN_MODIFY | Mask::IN_DELETE | Mask::IN_MOVED_FROM | Mask::IN_MOVED_TO | Mask::IN_ONLYDIR
}

/// The inotify descriptor, as `AsyncFd` takes it.
struct Fd(Inotify);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// One watch session: the descriptor and the directory of each watch.
pub(crate) struct Watcher {
    fd: AsyncFd<Fd>,
    dirs: HashMap<WatchDescriptor, PathBuf>,
    recursive: bool,
    /// Moves out of a watched directory (cookie, path, is a directory) whose other half
    /// has not been read yet.
    moved_from: Vec<(u32, PathBuf, bool)>,
}

impl Watcher {
    /// Watch `root` (a directory) and, when `recursive`, everything under it.
    pub(crate) fn new(root: &Path, recursive: bool) -> Result<Watcher, FilesError> {
        let meta = std::fs::metadata(root).map_err(FilesError::io(root))?;
        if !meta.is_dir() {
            return Err(FilesError::NotADirectory(root.display().to_string()));
        }
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|e| FilesError::io(root)(io::Error::from(e)))?;
        // SAFETY: `Fd` owns the inotify descriptor (an `OwnedFd`), which stays open until the
        // `AsyncFd` drops it, and `as_raw_fd` always returns that one descriptor.
        let fd = unsafe { AsyncFd::register_with_interest(Fd(inotify), Interest::READABLE) }
            .map_err(|e| FilesError::io(root)(io::Error::from(e)))?;
        let mut w = Watcher { fd, dirs: HashMap::new(), recursive, moved_from: vec![] };
        w.add(root).map_err(FilesError::io(root))?;
        if recursive {
            let mut found = vec![];
            w.add_tree(root, &mut found)?;
        }
        Ok(w)
    }

    fn add(&mut self, dir: &Path) -> std::io::Result<()> {
        let wd = self.fd.get_ref().0.add_watch(dir, mask()).map_err(std::io::Error::from)?;
        self.dirs.insert(wd, dir.to_path_buf());
        Ok(())
    }

    /// Watch the directories under `dir` (not `dir` itself), noting in `found` what they
    /// hold. A directory that vanished meanwhile is skipped; one that cannot be watched
    /// fails the call.
    fn add_tree(&mut self, dir: &Path, found: &mut Vec<FsEvent>) -> Result<(), FilesError> {
        let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
        for entry in entries.flatten() {
            let path = entry.path();
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            found.push(event(FsEventKind::Create, &path, is_dir));
            if is_dir {
                match self.add(&path) {
                    Ok(()) => self.add_tree(&path, found)?,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(FilesError::io(&path)(e)),
                }
            }
        }
        Ok(())
    }

    /// A directory appeared in the tree: watch it and report what it already holds.
    fn adopt(&mut self, dir: &Path, out: &mut VecDeque<FsEvent>) {
        let mut found = vec![];
        let added = match self.add(dir) {
            Ok(()) => self.add_tree(dir, &mut found).map_err(|e| e.to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.to_string()),
        };
        out.extend(found);
        if let Err(e) = added {
            // Its events will be missed: say so as the queue overflowing does.
            eprintln!("lizard-agent: watch: {}: {e}", dir.display());
            out.push_back(event(FsEventKind::Overflow, Path::new(""), false));
        }
    }

    /// Forget the watches of `dir` and everything under it (moved out of the tree).
    fn drop_tree(&mut self, dir: &Path) {
        let gone: Vec<WatchDescriptor> =
            self.dirs.iter().filter(|(_, p)| p.starts_with(dir)).map(|(wd, _)| *wd).collect();
        for wd in gone {
            let _ = self.fd.get_ref().0.rm_watch(wd);
            self.dirs.remove(&wd);
        }
    }

    /// A directory moved within the tree: its watches (which follow it) now name the new
    /// place.
    fn move_tree(&mut self, from: &Path, to: &Path) {
        for p in self.dirs.values_mut() {
            if let Ok(rest) = p.strip_prefix(from) {
                *p = to.join(rest);
            }
        }
    }

    /// Turn one batch of inotify events into API events (appended to `out`). A move whose
    /// other half is not in the batch waits in `moved_from` (see [`Watcher::flush_moves`]).
    pub(crate) fn translate(&mut self, batch: Vec<InotifyEvent>, out: &mut VecDeque<FsEvent>) {
        for ev in batch {
            if ev.mask.contains(Mask::IN_Q_OVERFLOW) {
                out.push_back(event(FsEventKind::Overflow, Path::new(""), false));
                continue;
            }
            if ev.mask.contains(Mask::IN_IGNORED) {
                self.dirs.remove(&ev.wd);
                continue;
            }
            let (Some(dir), Some(name)) = (self.dirs.get(&ev.wd), ev.name.as_ref()) else { continue };
            let path = dir.join(name);
            let is_dir = ev.mask.contains(Mask::IN_ISDIR);
            if ev.mask.contains(Mask::IN_CREATE) {
                out.push_back(event(FsEventKind::Create, &path, is_dir));
                if is_dir && self.recursive {
                    self.adopt(&path, out);
                }
            } else if ev.mask.contains(Mask::IN_MODIFY) {
                let last = out.back();
                if !last.is_some_and(|l| l.kind == FsEventKind::Write && Path::new(&l.path) == path) {
                    out.push_back(event(FsEventKind::Write, &path, is_dir));
                }
            } else if ev.mask.contains(Mask::IN_DELETE) {
                out.push_back(event(FsEventKind::Remove, &path, is_dir));
            } else if ev.mask.contains(Mask::IN_MOVED_FROM) {
                self.moved_from.push((ev.cookie, path, is_dir));
            } else if ev.mask.contains(Mask::IN_MOVED_TO) {
                match self.moved_from.iter().position(|(c, ..)| *c == ev.cookie) {
                    Some(i) => {
                        let (_, from, _) = self.moved_from.remove(i);
                        if is_dir && self.recursive {
                            self.move_tree(&from, &path);
                        }
                        let mut e = event(FsEventKind::Rename, &from, is_dir);
                        e.new_path = Some(path.display().to_string());
                        out.push_back(e);
                    }
                    None => {
                        out.push_back(event(FsEventKind::Create, &path, is_dir));
                        if is_dir && self.recursive {
                            self.adopt(&path, out);
                        }
                    }
                }
            }
        }
    }

    /// Moves whose other half never came left the watched tree: `remove`s.
    pub(crate) fn flush_moves(&mut self, out: &mut VecDeque<FsEvent>) {
        for (_, from, is_dir) in std::mem::take(&mut self.moved_from) {
            if is_dir {
                self.drop_tree(&from);
            }
            out.push_back(event(FsEventKind::Remove, &from, is_dir));
        }
    }
}

fn event(kind: FsEventKind, path: &Path, is_dir: bool) -> FsEvent {
    FsEvent { kind, path: path.display().to_string(), new_path: None, is_dir }
}

impl Watcher {
    /// The next batch of events, waiting for one; `None` after [`HEARTBEAT`] of silence.
    async fn next_batch(&mut self) -> std::io::Result<Option<Vec<InotifyEvent>>> {
        loop {
            let Ok(guard) = tokio::time::timeout(HEARTBEAT, self.fd.readable()).await else { return Ok(None) };
            match guard?.try_io(|fd| fd.get_ref().0.read_events().map_err(std::io::Error::from)) {
                Ok(batch) => return batch.map(Some),
                Err(_would_block) => continue,
            }
        }
    }

    /// The watch as NDJSON lines (blank ones as heartbeats), until the reader drops it.
    fn lines(self) -> impl futures_util::Stream<Item = std::io::Result<Bytes>> + Send {
        futures_util::stream::unfold(Some((self, VecDeque::new())), |state| async move {
            let (mut w, mut out) = state?;
            loop {
                if let Some(e) = out.pop_front() {
                    let mut line = serde_json::to_vec(&e).unwrap_or_default();
                    line.push(b'\n');
                    return Some((Ok(Bytes::from(line)), Some((w, out))));
                }
                match w.next_batch().await {
                    Ok(Some(batch)) => {
                        w.translate(batch, &mut out);
                        // A reader can wake between a move's two halves: give the second
                        // one a moment before calling the first a removal.
                        if !w.moved_from.is_empty() {
                            if let Ok(Ok(Some(more))) = tokio::time::timeout(MOVE_GRACE, w.next_batch()).await {
                                w.translate(more, &mut out);
                            }
                            w.flush_moves(&mut out);
                        }
                    }
                    Ok(None) => return Some((Ok(Bytes::from_static(b"\n")), Some((w, out)))),
                    Err(e) => return Some((Err(e), None)),
                }
            }
        })
    }
}

/// `GET /v1/files/watch?path=&recursive=`: see the module doc.
pub async fn handle(q: Result<Query<WatchQuery>, QueryRejection>) -> Result<Response, AppError> {
    let Query(q) = q.map_err(|e| FilesError::Query(e.body_text()))?;
    if !q.path.starts_with('/') {
        return Err(FilesError::Relative(q.path).into());
    }
    let root = PathBuf::from(q.path);
    let watcher = blocking(move || Watcher::new(&root, q.recursive)).await?;
    Ok(([(CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(watcher.lines())).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::tests::test_router;
    use futures_util::StreamExt;
    use tower::ServiceExt;

    /// Start a watch through the router; the events as they come.
    async fn watch(path: &Path, recursive: bool) -> impl futures_util::Stream<Item = FsEvent> {
        let uri = format!("/v1/files/watch?path={}&recursive={recursive}", path.display());
        let req = http::Request::builder().uri(uri).body(Body::empty()).unwrap();
        let resp = test_router().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.into_body().into_data_stream().map(|chunk| chunk.unwrap()).flat_map(|chunk| {
            let lines: Vec<FsEvent> = chunk
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .map(|l| serde_json::from_slice(l).unwrap())
                .collect();
            futures_util::stream::iter(lines)
        })
    }

    async fn next_events(
        events: &mut (impl futures_util::Stream<Item = FsEvent> + Unpin),
        n: usize,
    ) -> Vec<(FsEventKind, String, Option<String>)> {
        let mut got = vec![];
        while got.len() < n {
            let e =
                tokio::time::timeout(Duration::from_secs(10), events.next()).await.expect("an event in time").unwrap();
            got.push((e.kind, e.path, e.new_path));
        }
        got
    }

    fn s(p: &Path) -> String {
        p.display().to_string()
    }

    #[tokio::test]
    async fn create_write_rename_remove() {
        let dir = tempfile::tempdir().unwrap();
        let mut events = Box::pin(watch(dir.path(), false).await);
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, "1").unwrap();
        assert_eq!(
            next_events(&mut events, 2).await,
            [(FsEventKind::Create, s(&a), None), (FsEventKind::Write, s(&a), None)]
        );
        std::fs::rename(&a, &b).unwrap();
        std::fs::remove_file(&b).unwrap();
        assert_eq!(
            next_events(&mut events, 2).await,
            [(FsEventKind::Rename, s(&a), Some(s(&b))), (FsEventKind::Remove, s(&b), None)]
        );
        // Not recursive: a subdirectory's content is not watched.
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/x"), "1").unwrap();
        std::fs::write(dir.path().join("c"), "").unwrap();
        assert_eq!(
            next_events(&mut events, 2).await,
            [
                (FsEventKind::Create, s(&dir.path().join("sub")), None),
                (FsEventKind::Create, s(&dir.path().join("c")), None)
            ]
        );
    }

    #[tokio::test]
    async fn recursive_follows_new_and_moved_directories() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("old/deep")).unwrap();
        let mut events = Box::pin(watch(dir.path(), true).await);
        std::fs::write(dir.path().join("old/deep/f"), "").unwrap();
        assert_eq!(next_events(&mut events, 1).await, [(FsEventKind::Create, s(&dir.path().join("old/deep/f")), None)]);
        // A new tree at once: what it holds by the time its watch is added is reported too.
        std::fs::create_dir_all(dir.path().join("new/a/b")).unwrap();
        std::fs::write(dir.path().join("new/a/b/g"), "x").unwrap();
        let got = next_events(&mut events, 4).await;
        for p in ["new", "new/a", "new/a/b", "new/a/b/g"] {
            assert!(
                got.iter().any(|(k, path, _)| *k == FsEventKind::Create && *path == s(&dir.path().join(p))),
                "{p}: {got:?}"
            );
        }
        // A moved directory's watches name its new place.
        std::fs::rename(dir.path().join("old"), dir.path().join("moved")).unwrap();
        assert_eq!(
            next_events(&mut events, 1).await,
            [(FsEventKind::Rename, s(&dir.path().join("old")), Some(s(&dir.path().join("moved"))))]
        );
        std::fs::remove_file(dir.path().join("moved/deep/f")).unwrap();
        let mut rest = next_events(&mut events, 1).await;
        // The tree's own events may come first (g's write), then the removal.
        while rest[0].0 != FsEventKind::Remove {
            rest = next_events(&mut events, 1).await;
        }
        assert_eq!(rest[0].1, s(&dir.path().join("moved/deep/f")));
    }

    #[tokio::test]
    async fn overflow_is_an_event_and_errors_have_codes() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = blocking({
            let p = dir.path().to_path_buf();
            move || Watcher::new(&p, false)
        })
        .await
        .unwrap();
        let wd = *w.dirs.keys().next().unwrap();
        let mut out = VecDeque::new();
        w.translate(vec![InotifyEvent { wd, mask: Mask::IN_Q_OVERFLOW, cookie: 0, name: None }], &mut out);
        assert_eq!(out.pop_front().map(|e| e.kind), Some(FsEventKind::Overflow));
        // A move read in two batches is still one rename; an unpaired half is a removal.
        let half = |mask, name: &str| InotifyEvent { wd, mask, cookie: 7, name: Some(name.into()) };
        w.translate(vec![half(Mask::IN_MOVED_FROM, "a")], &mut out);
        assert!(out.is_empty());
        w.translate(vec![half(Mask::IN_MOVED_TO, "b")], &mut out);
        let e = out.pop_front().unwrap();
        assert_eq!((e.kind, e.new_path), (FsEventKind::Rename, Some(s(&dir.path().join("b")))));
        w.translate(vec![half(Mask::IN_MOVED_FROM, "c")], &mut out);
        w.flush_moves(&mut out);
        assert_eq!(out.pop_front().map(|e| (e.kind, e.path)), Some((FsEventKind::Remove, s(&dir.path().join("c")))));
        std::fs::write(dir.path().join("file"), "x").unwrap();
        let d = dir.path().display();
        for (uri, status, code) in [
            (format!("/v1/files/watch?path={d}/missing"), 404, "NOT_FOUND"),
            (format!("/v1/files/watch?path={d}/file"), 400, "NOT_A_DIRECTORY"),
            ("/v1/files/watch?path=rel".to_string(), 400, "INVALID_ARGUMENT"),
        ] {
            let (s, body) = crate::server::tests::call("GET", &uri, Body::empty()).await;
            assert_eq!(s.as_u16(), status, "{uri}");
            assert!(std::str::from_utf8(&body).unwrap().contains(code), "{uri}: {body:?}");
        }
    }

    #[tokio::test]
    async fn dropping_the_stream_closes_the_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        let w = blocking({
            let p = dir.path().to_path_buf();
            move || Watcher::new(&p, true)
        })
        .await
        .unwrap();
        let link = format!("/proc/self/fd/{}", w.fd.as_raw_fd());
        let is_inotify = || std::fs::read_link(&link).is_ok_and(|t| t.to_string_lossy().contains("inotify"));
        assert!(is_inotify());
        let mut lines = Box::pin(w.lines());
        std::fs::write(dir.path().join("f"), "").unwrap();
        assert!(lines.next().await.unwrap().unwrap().starts_with(b"{"));
        // Closing the descriptor frees every watch of the instance (inotify(7)).
        drop(lines);
        assert!(!is_inotify(), "the inotify descriptor outlived its stream");
    }
}
