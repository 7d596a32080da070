//! `GET /v1/files/archive?path=`: a directory's tree as a tar archive (streamed as it is
//! made; links stored as links, never followed). `PUT /v1/files/archive?path=`: a tar
//! archive unpacked into a directory (created with its parents), many files in one call.
//!
//! Every entry must stay inside that directory: an absolute name, a `..` component, or a
//! name whose parent inside the directory is a symlink (which could point anywhere) is
//! refused with `INVALID_ARGUMENT`; unpacking stops there, entries before it stay. A link
//! may point anywhere: it is written as a link, and nothing is written through it. Files
//! keep the archive's permission bits; a file already there is replaced.
//!
//! The `tar` crate reads and writes the format; it is synchronous, so both directions run
//! on the blocking pool, joined to the HTTP body by a channel (out) or `SyncIoBridge` (in).

use crate::app::AppError;
use crate::files::{blocking, FileQuery, FilesError};
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::Query;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use futures_util::TryStreamExt;
use lizard_agent_proto::types::ArchiveResult;
use std::io::{self, Read, Write};
use std::path::{Component, Path};
use tokio::sync::mpsc;

/// Archive bytes are sent in pieces of about this size.
const CHUNK: usize = 256 * 1024;

/// `GET /v1/files/archive?path=`: see the module doc.
pub async fn read(q: Result<Query<FileQuery>, QueryRejection>) -> Result<Response, AppError> {
    let (dir, _) = FileQuery::from(q)?;
    let meta = tokio::fs::metadata(&dir).await.map_err(FilesError::io(&dir))?;
    if !meta.is_dir() {
        return Err(FilesError::NotADirectory(dir.display().to_string()).into());
    }
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(4);
    tokio::task::spawn_blocking(move || {
        let mut builder = tar::Builder::new(ChannelWriter { tx: tx.clone(), buf: Vec::with_capacity(CHUNK) });
        builder.follow_symlinks(false);
        let done = builder.append_dir_all("", &dir).and_then(|()| builder.into_inner()).and_then(|mut w| w.flush());
        if let Err(e) = done {
            // The answer has started: the reader sees the body fail, not a clean end.
            eprintln!("lizard-agent: archive of {}: {e}", dir.display());
            let _ = tx.blocking_send(Err(e));
        }
    });
    let body = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|piece| (piece, rx)) });
    Ok(([(CONTENT_TYPE, "application/x-tar")], Body::from_stream(body)).into_response())
}

/// A `Write` that sends what it is given, in [`CHUNK`]s, to the response body.
struct ChannelWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: Vec<u8>,
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let piece = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        // The reader went away: stop making the archive.
        self.tx.blocking_send(Ok(piece)).map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the reader left"))
    }
}

/// `PUT /v1/files/archive?path=`: see the module doc.
pub async fn write(q: Result<Query<FileQuery>, QueryRejection>, body: Body) -> Result<Json<ArchiveResult>, AppError> {
    let (dir, _) = FileQuery::from(q)?;
    let reader = tokio_util::io::StreamReader::new(body.into_data_stream().map_err(io::Error::other));
    let reader = tokio_util::io::SyncIoBridge::new(reader);
    Ok(Json(blocking(move || unpack(reader, &dir)).await?))
}

/// Unpack the archive `reader` gives into `dir`.
fn unpack(reader: impl Read, dir: &Path) -> Result<ArchiveResult, FilesError> {
    let shown = dir.display().to_string();
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => return Err(FilesError::NotADirectory(shown)),
        Ok(_) => {}
        Err(_) => std::fs::create_dir_all(dir).map_err(FilesError::io(dir))?,
    }
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(true);
    archive.set_overwrite(true);
    let mut result = ArchiveResult { path: shown.clone(), entries: 0, bytes_written: 0 };
    let bad = |e: io::Error| FilesError::BadArchive(e.to_string());
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        let name = entry.path().map_err(bad)?.into_owned();
        let escape = || FilesError::Escape { entry: name.display().to_string(), dir: shown.clone() };
        if !stays_inside(dir, &name) {
            return Err(escape());
        }
        // `unpack_in` checks again (and skips what it refuses): refuse instead.
        if !entry.unpack_in(dir).map_err(FilesError::io(&dir.join(&name)))? {
            return Err(escape());
        }
        result.entries += 1;
        if entry.header().entry_type().is_file() {
            result.bytes_written += entry.size();
        }
    }
    Ok(result)
}

/// Whether `name` (an entry's path) lands inside `dir`: relative, no `..`, and no
/// directory on the way that is a symlink.
fn stays_inside(dir: &Path, name: &Path) -> bool {
    let mut at = dir.to_path_buf();
    let mut parts = name.components().peekable();
    while let Some(part) = parts.next() {
        match part {
            Component::Normal(p) => {
                at.push(p);
                let last = parts.peek().is_none();
                if !last && at.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink()) {
                    return false;
                }
            }
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::tests::call;
    use axum::http::StatusCode;
    use lizard_agent_proto::types::{AgentError, ErrorCode};
    use std::os::unix::fs::PermissionsExt;

    /// A tar archive of `(name, content)` files, written raw so that names the `tar`
    /// crate's builder would refuse (`..`, absolute) can be tested too.
    fn archive(files: &[(&str, &[u8])], links: &[(&str, &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o640);
            h.set_entry_type(tar::EntryType::Regular);
            h.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name.as_bytes());
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        for (name, target) in links {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            h.set_mode(0o777);
            b.append_link(&mut h, name, target).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn code(body: &[u8]) -> ErrorCode {
        serde_json::from_slice::<AgentError>(body).unwrap().code
    }

    #[tokio::test]
    async fn upload_then_download_a_tree() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let tar = archive(&[("a.txt", b"hello"), ("sub/deeper/b.bin", &[0, 1, 2])], &[("link", "/etc/hostname")]);
        let (s, body) = call("PUT", &format!("/v1/files/archive?path={d}/new/dest"), tar).await;
        assert_eq!(s, StatusCode::OK, "{body:?}");
        let r: ArchiveResult = serde_json::from_slice(&body).unwrap();
        assert_eq!((r.entries, r.bytes_written), (3, 8));
        let dest = dir.path().join("new/dest");
        assert_eq!(std::fs::read(dest.join("a.txt")).unwrap(), b"hello");
        assert_eq!(std::fs::metadata(dest.join("a.txt")).unwrap().permissions().mode() & 0o777, 0o640);
        assert_eq!(std::fs::read(dest.join("sub/deeper/b.bin")).unwrap(), [0, 1, 2]);
        assert_eq!(std::fs::read_link(dest.join("link")).unwrap(), Path::new("/etc/hostname"));
        // And back, links as links.
        let (s, body) = call("GET", &format!("/v1/files/archive?path={}", dest.display()), Body::empty()).await;
        assert_eq!(s, StatusCode::OK);
        let mut names = vec![];
        for e in tar::Archive::new(&body[..]).entries().unwrap() {
            let mut e = e.unwrap();
            let name = e.path().unwrap().display().to_string();
            let mut content = vec![];
            e.read_to_end(&mut content).unwrap();
            names.push((name, e.header().entry_type(), content));
        }
        names.sort_by(|a, b| a.0.cmp(&b.0));
        let kinds: Vec<(&str, bool)> = names.iter().map(|(n, t, _)| (n.as_str(), t.is_symlink())).collect();
        assert_eq!(
            kinds,
            [("a.txt", false), ("link", true), ("sub", false), ("sub/deeper", false), ("sub/deeper/b.bin", false)]
        );
        assert_eq!(names[0].2, b"hello");
    }

    #[tokio::test]
    async fn escaping_entries_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        let dest = dir.path().join("dest");
        let cases: Vec<Vec<u8>> = vec![
            archive(&[("../outside/x", b"no")], &[]),
            archive(&[("ok/../../outside/x", b"no")], &[]),
            archive(&[("/outside-abs", b"no")], &[]),
        ];
        for tar in cases {
            let (s, body) = call("PUT", &format!("/v1/files/archive?path={}", dest.display()), tar).await;
            assert_eq!((s, code(&body)), (StatusCode::BAD_REQUEST, ErrorCode::InvalidArgument), "{body:?}");
        }
        // A link into the outside, then a file through it.
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, "door", &outside).unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_size(2);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, "door/x", &b"no"[..]).unwrap();
        let (s, body) =
            call("PUT", &format!("/v1/files/archive?path={}", dest.display()), b.into_inner().unwrap()).await;
        assert_eq!((s, code(&body)), (StatusCode::BAD_REQUEST, ErrorCode::InvalidArgument), "{body:?}");
        assert!(std::str::from_utf8(&body).unwrap().contains("door/x"));
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "nothing was written outside");
        assert!(!dir.path().join("outside-abs").exists() && !Path::new("/outside-abs").exists());
    }

    #[tokio::test]
    async fn a_file_where_a_directory_is_expected() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        for (method, body) in [("GET", Vec::new()), ("PUT", archive(&[("a", b"1")], &[]))] {
            let (s, answer) = call(method, &format!("/v1/files/archive?path={}", file.display()), body).await;
            assert_eq!((s, code(&answer)), (StatusCode::BAD_REQUEST, ErrorCode::NotADirectory), "{method}");
        }
        let (s, answer) =
            call("GET", &format!("/v1/files/archive?path={}/missing", dir.path().display()), Body::empty()).await;
        assert_eq!((s, code(&answer)), (StatusCode::NOT_FOUND, ErrorCode::NotFound));
        let (s, answer) =
            call("PUT", &format!("/v1/files/archive?path={}", dir.path().display()), b"not a tar".to_vec()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{answer:?}");
    }
}
