//! File routes: write, read, list, remove, mkdir. Paths come as the `path` query parameter
//! and must be absolute.
//!
//! Reads and writes stream: a write goes chunk by chunk into a temporary file next to the
//! target, is fsynced and then renamed over it (readers never see half a file); a read
//! streams the file with its length. Neither holds a whole file in memory. The staged
//! routes ([`crate::staged`]) move file contents through the staging disk instead of the
//! channel, with the same checks and the same atomic replace ([`WriteTarget`]).

use crate::app::AppError;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::Query;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use lizard_agent_proto::types::{AgentError, ErrorCode, FileEntry, FileInfo, FileType, WriteResult};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::UNIX_EPOCH;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::io::ReaderStream;

/// Size of the chunks a file is read in.
const READ_CHUNK: usize = 256 * 1024;
/// Mode of a newly created file when the request gives none.
const DEFAULT_MODE: u32 = 0o644;

/// Why a file operation failed.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    /// The query string is malformed or lacks `path`.
    #[error("bad query: {0}")]
    Query(String),
    /// Paths must be absolute.
    #[error("path must be absolute: {0:?}")]
    Relative(String),
    /// `mode` is not an octal permission value.
    #[error("mode must be octal permission bits, got {0:?}")]
    Mode(String),
    /// The user a write or a directory should belong to has no passwd entry.
    #[error("unknown user {0:?}")]
    UnknownUser(String),
    /// A write's metadata cannot be kept (see [`crate::metadata::checked`]).
    #[error("{0}")]
    Metadata(String),
    /// Removing or moving `/` is never what anyone meant.
    #[error("refusing to remove or move /")]
    RemoveRoot,
    /// The path names a directory where a file is needed.
    #[error("{0} is a directory")]
    IsADirectory(String),
    /// The path names something else where a directory is needed.
    #[error("{0} is not a directory")]
    NotADirectory(String),
    /// The body is not a tar archive (or ended inside one).
    #[error("not a readable tar archive: {0}")]
    BadArchive(String),
    /// An archive entry would land outside the directory it is unpacked in.
    #[error("archive entry {entry:?} leaves {dir}")]
    Escape { entry: String, dir: String },
    /// The operation failed on the file system.
    #[error("{path}: {cause}")]
    Io { path: String, cause: io::Error },
}

impl FilesError {
    pub(crate) fn io(path: &Path) -> impl FnOnce(io::Error) -> FilesError + '_ {
        move |cause| FilesError::Io { path: path.display().to_string(), cause }
    }
}

impl From<FilesError> for AgentError {
    fn from(e: FilesError) -> AgentError {
        let code = match &e {
            FilesError::Query(_)
            | FilesError::Relative(_)
            | FilesError::Mode(_)
            | FilesError::UnknownUser(_)
            | FilesError::Metadata(_)
            | FilesError::RemoveRoot
            | FilesError::BadArchive(_)
            | FilesError::Escape { .. } => ErrorCode::InvalidArgument,
            FilesError::IsADirectory(_) => ErrorCode::IsADirectory,
            FilesError::NotADirectory(_) => ErrorCode::NotADirectory,
            FilesError::Io { cause: source, path } => AgentError::from_io(source, path).code,
        };
        AgentError::new(code, e.to_string())
    }
}

/// Query parameters of the file routes.
#[derive(Debug, Deserialize)]
pub struct FileQuery {
    path: String,
    /// Octal permission bits for a write, e.g. `644` or `0755`.
    mode: Option<String>,
    /// Who a written file, and the directories a write or mkdir creates, belong to (a
    /// name or uid; the agent's own, root, without it).
    user: Option<String>,
    /// A write's metadata: a JSON object of strings ([`crate::metadata`]).
    metadata: Option<String>,
}

/// The owner of what a write or mkdir creates: uid and primary gid.
pub(crate) type Owner = (u32, u32);

/// A write's request: where, with which mode (octal text), owner and metadata.
pub(crate) struct WriteQuery {
    pub path: PathBuf,
    pub mode: Option<String>,
    pub owner: Option<Owner>,
    pub metadata: BTreeMap<String, String>,
}

impl FileQuery {
    pub(crate) fn from(q: Result<Query<FileQuery>, QueryRejection>) -> Result<(PathBuf, Option<String>), FilesError> {
        let w = Self::for_write(q)?;
        Ok((w.path, w.mode))
    }

    /// The path, and the owner its `user` names.
    pub(crate) fn with_owner(
        q: Result<Query<FileQuery>, QueryRejection>,
    ) -> Result<(PathBuf, Option<Owner>), FilesError> {
        let w = Self::for_write(q)?;
        Ok((w.path, w.owner))
    }

    /// The whole request of a write.
    pub(crate) fn for_write(q: Result<Query<FileQuery>, QueryRejection>) -> Result<WriteQuery, FilesError> {
        let Query(q) = q.map_err(|e| FilesError::Query(e.body_text()))?;
        if !q.path.starts_with('/') {
            return Err(FilesError::Relative(q.path));
        }
        let owner = match q.user.as_deref().filter(|u| !u.is_empty()) {
            None => None,
            Some(user) => {
                let found = crate::users::resolve(user).map_err(|_| FilesError::UnknownUser(user.to_string()))?;
                Some((found.uid, found.gid))
            }
        };
        let metadata = match q.metadata.as_deref().filter(|m| !m.is_empty()) {
            None => BTreeMap::new(),
            Some(json) => {
                let given = serde_json::from_str(json)
                    .map_err(|e| FilesError::Metadata(format!("metadata must be a JSON object of strings: {e}")))?;
                crate::metadata::checked(given).map_err(FilesError::Metadata)?
            }
        };
        Ok(WriteQuery { path: PathBuf::from(q.path), mode: q.mode, owner, metadata })
    }
}

/// `mkdir -p dir`, each directory it creates given to `owner`.
fn create_dirs(dir: &Path, owner: Option<Owner>) -> io::Result<()> {
    let missing: Vec<&Path> = match owner {
        Some(_) => dir.ancestors().take_while(|d| d.symlink_metadata().is_err()).collect(),
        None => vec![],
    };
    std::fs::create_dir_all(dir)?;
    if let Some((uid, gid)) = owner {
        for d in missing {
            std::os::unix::fs::chown(d, Some(uid), Some(gid))?;
        }
    }
    Ok(())
}

fn parse_mode(mode: &str) -> Result<u32, FilesError> {
    let digits = mode.strip_prefix("0o").unwrap_or(mode);
    match u32::from_str_radix(digits, 8) {
        Ok(m) if m <= 0o7777 => Ok(m),
        _ => Err(FilesError::Mode(mode.to_string())),
    }
}

/// A name for the temporary file of a write, unique within this agent's lifetime.
fn temp_path(target: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    target.with_file_name(format!(".{name}.lizard-{}-{n}.tmp", std::process::id()))
}

/// Where a write goes: the target, its temporary file beside it, the mode it gets and
/// whom it belongs to.
#[derive(Debug, Clone)]
pub(crate) struct WriteTarget {
    pub path: PathBuf,
    pub tmp: PathBuf,
    pub mode: u32,
    pub owner: Option<Owner>,
    pub metadata: BTreeMap<String, String>,
    /// The path as the answer names it.
    pub shown: String,
}

impl WriteTarget {
    /// Check the target before any data moves (a directory there fails now, not after the
    /// upload), create its parents (given to the owner), and pick its mode: the one asked
    /// (octal text), else the existing file's, else [`DEFAULT_MODE`].
    pub(crate) async fn prepare(q: WriteQuery) -> Result<WriteTarget, FilesError> {
        let WriteQuery { path, mode, owner, metadata } = q;
        let mode = mode.as_deref().map(parse_mode).transpose()?;
        let shown = path.display().to_string();
        let Some(parent) = path.parent() else { return Err(FilesError::IsADirectory(shown)) };
        let existing = match tokio::fs::metadata(&path).await {
            Ok(m) if m.is_dir() => return Err(FilesError::IsADirectory(shown)),
            Ok(m) => Some(m.permissions().mode() & 0o7777),
            Err(_) => None,
        };
        let dirs = parent.to_path_buf();
        tokio::task::spawn_blocking(move || create_dirs(&dirs, owner))
            .await
            .map_err(io::Error::other)
            .and_then(|r| r)
            // EEXIST here means some ancestor exists but is not a directory.
            .map_err(|e| if e.kind() == io::ErrorKind::AlreadyExists { io::ErrorKind::NotADirectory.into() } else { e })
            .map_err(FilesError::io(parent))?;
        let tmp = temp_path(&path);
        Ok(WriteTarget { mode: mode.or(existing).unwrap_or(DEFAULT_MODE), tmp, path, shown, owner, metadata })
    }

    /// Create the temporary file (owner-only until it is complete).
    pub(crate) fn create_tmp(&self) -> Result<std::fs::File, FilesError> {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&self.tmp)
            .map_err(FilesError::io(&self.tmp))
    }

    /// Give the complete temporary file its owner, mode and metadata, sync it and rename
    /// it over the target.
    pub(crate) fn commit(&self, file: std::fs::File) -> Result<(), FilesError> {
        crate::metadata::set(&file, &self.metadata).map_err(|e| match e.raw_os_error() {
            // tmpfs before Linux 6.6 (the guest's /tmp) keeps no user attributes.
            Some(libc::EOPNOTSUPP) => {
                FilesError::Metadata(format!("the file system of {} keeps no file metadata", self.shown))
            }
            _ => FilesError::io(&self.tmp)(e),
        })?;
        if let Some((uid, gid)) = self.owner {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid)).map_err(FilesError::io(&self.tmp))?;
        }
        // Set exactly the requested bits, whatever the umask (after the owner: a chown
        // clears set-id bits).
        file.set_permissions(std::fs::Permissions::from_mode(self.mode)).map_err(FilesError::io(&self.tmp))?;
        file.sync_all().map_err(FilesError::io(&self.tmp))?;
        drop(file);
        std::fs::rename(&self.tmp, &self.path).map_err(FilesError::io(&self.path))
    }

    /// Remove the temporary file of a write that failed.
    pub(crate) fn discard(&self) {
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// `PUT /v1/files?path=&mode=&user=`: stream the body into the file, atomically.
pub async fn write(q: Result<Query<FileQuery>, QueryRejection>, body: Body) -> Result<Json<WriteResult>, AppError> {
    let target = WriteTarget::prepare(FileQuery::for_write(q)?).await?;
    let result = write_via(&target, body).await;
    if result.is_err() {
        target.discard();
    }
    Ok(Json(WriteResult { path: target.shown.clone(), bytes_written: result? }))
}

async fn write_via(target: &WriteTarget, body: Body) -> Result<u64, FilesError> {
    let mut file = tokio::fs::File::from_std(target.create_tmp()?);
    let mut written = 0u64;
    let mut data = body.into_data_stream();
    while let Some(chunk) = data.next().await {
        let chunk = chunk.map_err(|e| FilesError::Io { path: target.shown.clone(), cause: io::Error::other(e) })?;
        file.write_all(&chunk).await.map_err(FilesError::io(&target.tmp))?;
        written += chunk.len() as u64;
    }
    file.flush().await.map_err(FilesError::io(&target.tmp))?;
    let file = file.into_std().await;
    let t = target.clone();
    tokio::task::spawn_blocking(move || t.commit(file))
        .await
        .map_err(|e| FilesError::Io { path: target.shown.clone(), cause: io::Error::other(e) })??;
    Ok(written)
}

/// `GET /v1/files?path=`: stream the file, with its length where the file system knows it.
pub async fn read(q: Result<Query<FileQuery>, QueryRejection>) -> Result<Response, AppError> {
    let (path, _) = FileQuery::from(q)?;
    let file = tokio::fs::File::open(&path).await.map_err(FilesError::io(&path))?;
    let meta = file.metadata().await.map_err(FilesError::io(&path))?;
    if meta.is_dir() {
        return Err(FilesError::IsADirectory(path.display().to_string()).into());
    }
    // Files in /proc and /sys report size 0 but have content: stream those to EOF.
    if meta.is_file() && meta.len() > 0 {
        // Never send more than announced, even if the file grows meanwhile.
        let body = Body::from_stream(ReaderStream::with_capacity(file.take(meta.len()), READ_CHUNK));
        Ok(([(CONTENT_TYPE, "application/octet-stream".to_string()), (CONTENT_LENGTH, meta.len().to_string())], body)
            .into_response())
    } else {
        let body = Body::from_stream(ReaderStream::with_capacity(file, READ_CHUNK));
        Ok(([(CONTENT_TYPE, "application/octet-stream")], body).into_response())
    }
}

/// `GET /v1/files/list?path=`: the directory's entries, sorted by name.
pub async fn list(q: Result<Query<FileQuery>, QueryRejection>) -> Result<Json<Vec<FileEntry>>, AppError> {
    let (path, _) = FileQuery::from(q)?;
    Ok(Json(blocking(move || list_dir(&path)).await?))
}

fn list_dir(path: &Path) -> Result<Vec<FileEntry>, FilesError> {
    let mut entries = vec![];
    for entry in std::fs::read_dir(path).map_err(FilesError::io(path))? {
        let entry = entry.map_err(FilesError::io(path))?;
        // The entry may vanish between readdir and lstat; skip it then.
        let Ok(meta) = entry.path().symlink_metadata() else { continue };
        entries.push(FileEntry {
            name: entry.file_name().to_string_lossy().into_owned(),
            path: entry.path().display().to_string(),
            file_type: file_type(&meta),
            size: meta.len(),
            mode: meta.mode() & 0o7777,
            mtime_ms: mtime_ms(&meta),
            metadata: crate::metadata::read(&entry.path()),
        });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

/// What kind of entry `meta` (from `lstat`) describes.
pub(crate) fn file_type(meta: &std::fs::Metadata) -> FileType {
    let ft = meta.file_type();
    if ft.is_symlink() {
        FileType::Symlink
    } else if ft.is_dir() {
        FileType::Dir
    } else if ft.is_file() {
        FileType::File
    } else {
        FileType::Other
    }
}

fn mtime_ms(meta: &std::fs::Metadata) -> i64 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .and_then(|d| i64::try_from(d.as_millis()).ok())
        .unwrap_or(meta.mtime() * 1000)
}

/// `lstat` of `path`, as the API describes it.
fn file_info(path: &Path) -> Result<FileInfo, FilesError> {
    let meta = path.symlink_metadata().map_err(FilesError::io(path))?;
    let symlink_target = if meta.file_type().is_symlink() {
        Some(std::fs::read_link(path).map_err(FilesError::io(path))?.display().to_string())
    } else {
        None
    };
    let (owner, group) = crate::users::owner_names(meta.uid(), meta.gid());
    Ok(FileInfo {
        name: path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "/".to_string()),
        path: path.display().to_string(),
        file_type: file_type(&meta),
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        owner,
        group,
        mtime_ms: mtime_ms(&meta),
        symlink_target,
        metadata: crate::metadata::read(path),
    })
}

/// `GET /v1/files/info?path=`: what `lstat` says of the path (a link is not followed).
pub async fn info(q: Result<Query<FileQuery>, QueryRejection>) -> Result<Json<FileInfo>, AppError> {
    let (path, _) = FileQuery::from(q)?;
    Ok(Json(blocking(move || file_info(&path)).await?))
}

/// Query parameters of a rename.
#[derive(Debug, Deserialize)]
pub struct RenameQuery {
    path: String,
    to: String,
}

/// `POST /v1/files/rename?path=&to=`: `rename(2)`, replacing a file at `to` (a
/// directory only when it is empty); answers what is at `to` now.
pub async fn rename(q: Result<Query<RenameQuery>, QueryRejection>) -> Result<Json<FileInfo>, AppError> {
    let Query(q) = q.map_err(|e| FilesError::Query(e.body_text()))?;
    for p in [&q.path, &q.to] {
        if !p.starts_with('/') {
            return Err(FilesError::Relative(p.clone()).into());
        }
    }
    let (from, to) = (PathBuf::from(q.path), PathBuf::from(q.to));
    if is_root(&from) {
        return Err(FilesError::RemoveRoot.into());
    }
    Ok(Json(
        blocking(move || {
            // Name the missing source, not the target, when there is nothing to move.
            from.symlink_metadata().map_err(FilesError::io(&from))?;
            std::fs::rename(&from, &to).map_err(FilesError::io(&to))?;
            file_info(&to)
        })
        .await?,
    ))
}

/// Run blocking file-system work off the runtime's threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, FilesError> + Send + 'static,
) -> Result<T, AppError> {
    Ok(tokio::task::spawn_blocking(f).await.map_err(|e| AgentError::new(ErrorCode::Internal, e.to_string()))??)
}

/// True when `path` (absolute) names `/` once `.` and `..` are resolved lexically.
fn is_root(path: &Path) -> bool {
    let mut depth = 0usize;
    for c in path.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::ParentDir => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    depth == 0
}

/// `DELETE /v1/files?path=`: remove a file, a symlink, or a directory recursively.
pub async fn remove(q: Result<Query<FileQuery>, QueryRejection>) -> Result<StatusCode, AppError> {
    let (path, _) = FileQuery::from(q)?;
    if is_root(&path) {
        return Err(FilesError::RemoveRoot.into());
    }
    blocking(move || {
        let meta = path.symlink_metadata().map_err(FilesError::io(&path))?;
        if meta.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) }
            .map_err(FilesError::io(&path))
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/files/mkdir?path=&user=`: create a directory and its parents (those it
/// creates given to `user`); fine if it exists.
pub async fn mkdir(q: Result<Query<FileQuery>, QueryRejection>) -> Result<StatusCode, AppError> {
    let (path, owner) = FileQuery::with_owner(q)?;
    blocking(move || create_dirs(&path, owner).map_err(FilesError::io(&path))).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::tests::call;

    fn code(body: &[u8]) -> ErrorCode {
        serde_json::from_slice::<AgentError>(body).unwrap().code
    }

    #[test]
    fn modes_and_root_detection() {
        assert_eq!(parse_mode("644").unwrap(), 0o644);
        assert_eq!(parse_mode("0o4755").unwrap(), 0o4755);
        assert!(parse_mode("999").is_err());
        assert!(parse_mode("77777").is_err());
        assert!(is_root(Path::new("/")));
        assert!(is_root(Path::new("//./tmp/..")));
        assert!(is_root(Path::new("/../..")));
        assert!(!is_root(Path::new("/tmp/x/..")));
    }

    #[tokio::test]
    async fn write_read_list_remove() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let (s, body) = call("PUT", &format!("/v1/files?path={d}/a/b/f.txt&mode=0600"), "hello").await;
        assert_eq!(s, 200, "{body:?}");
        let w: WriteResult = serde_json::from_slice(&body).unwrap();
        assert_eq!(w.bytes_written, 5);
        let meta = std::fs::metadata(dir.path().join("a/b/f.txt")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // Overwriting keeps the mode when none is given, and leaves no temporary file.
        let (s, _) = call("PUT", &format!("/v1/files?path={d}/a/b/f.txt"), "hello again").await;
        assert_eq!(s, 200);
        assert_eq!(std::fs::metadata(dir.path().join("a/b/f.txt")).unwrap().permissions().mode() & 0o777, 0o600);
        let (s, body) = call("GET", &format!("/v1/files?path={d}/a/b/f.txt"), Body::empty()).await;
        assert_eq!((s, &body[..]), (StatusCode::OK, &b"hello again"[..]));
        let (s, body) = call("GET", &format!("/v1/files/list?path={d}/a/b"), Body::empty()).await;
        assert_eq!(s, 200);
        let entries: Vec<FileEntry> = serde_json::from_slice(&body).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!((entries[0].name.as_str(), entries[0].size, entries[0].file_type), ("f.txt", 11, FileType::File));
        let (s, _) = call("DELETE", &format!("/v1/files?path={d}/a"), Body::empty()).await;
        assert_eq!(s, StatusCode::NO_CONTENT);
        assert!(!dir.path().join("a").exists());
    }

    #[tokio::test]
    async fn errors_have_codes() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        std::fs::write(dir.path().join("file"), "x").unwrap();
        let cases = [
            ("GET", format!("/v1/files?path={d}/missing"), 404, ErrorCode::NotFound),
            ("GET", format!("/v1/files?path={d}"), 400, ErrorCode::IsADirectory),
            ("GET", format!("/v1/files/list?path={d}/file"), 400, ErrorCode::NotADirectory),
            ("GET", "/v1/files?path=relative/x".to_string(), 400, ErrorCode::InvalidArgument),
            ("GET", "/v1/files".to_string(), 400, ErrorCode::InvalidArgument),
            ("DELETE", format!("/v1/files?path={d}/missing"), 404, ErrorCode::NotFound),
            ("DELETE", "/v1/files?path=/".to_string(), 400, ErrorCode::InvalidArgument),
            ("POST", format!("/v1/files/mkdir?path={d}/file"), 409, ErrorCode::AlreadyExists),
            ("PUT", format!("/v1/files?path={d}"), 400, ErrorCode::IsADirectory),
            ("PUT", format!("/v1/files?path={d}/y&mode=abc"), 400, ErrorCode::InvalidArgument),
        ];
        for (method, uri, status, want) in cases {
            let (s, body) = call(method, &uri, Body::empty()).await;
            assert_eq!((s.as_u16(), code(&body)), (status, want), "{method} {uri}");
        }
        let (s, _) = call("POST", &format!("/v1/files/mkdir?path={d}/n/m"), Body::empty()).await;
        assert_eq!(s, StatusCode::NO_CONTENT);
        let (s, _) = call("POST", &format!("/v1/files/mkdir?path={d}/n/m"), Body::empty()).await;
        assert_eq!(s, StatusCode::NO_CONTENT);
    }

    #[tokio::test]
    async fn info_and_rename() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        std::fs::write(dir.path().join("f"), "12345").unwrap();
        std::fs::set_permissions(dir.path().join("f"), std::fs::Permissions::from_mode(0o640)).unwrap();
        std::os::unix::fs::symlink("f", dir.path().join("l")).unwrap();
        let (s, body) = call("GET", &format!("/v1/files/info?path={d}/f"), Body::empty()).await;
        assert_eq!(s, StatusCode::OK);
        let f: FileInfo = serde_json::from_slice(&body).unwrap();
        let me = nix::unistd::getuid().as_raw();
        assert_eq!((f.name.as_str(), f.file_type, f.size, f.mode, f.uid), ("f", FileType::File, 5, 0o640, me));
        assert!(f.symlink_target.is_none() && !f.owner.is_empty() && f.mtime_ms > 0);
        let (_, body) = call("GET", &format!("/v1/files/info?path={d}/l"), Body::empty()).await;
        let l: FileInfo = serde_json::from_slice(&body).unwrap();
        assert_eq!((l.file_type, l.symlink_target.as_deref()), (FileType::Symlink, Some("f")));
        let (_, body) = call("GET", &format!("/v1/files/info?path={d}"), Body::empty()).await;
        assert_eq!(serde_json::from_slice::<FileInfo>(&body).unwrap().file_type, FileType::Dir);
        // Rename answers what is at the new path.
        let (s, body) = call("POST", &format!("/v1/files/rename?path={d}/f&to={d}/g"), Body::empty()).await;
        assert_eq!(s, StatusCode::OK, "{body:?}");
        let g: FileInfo = serde_json::from_slice(&body).unwrap();
        assert_eq!((g.path, g.size), (format!("{d}/g"), 5));
        assert!(!dir.path().join("f").exists());
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let cases = [
            ("GET", format!("/v1/files/info?path={d}/missing"), 404, ErrorCode::NotFound),
            ("GET", "/v1/files/info?path=rel".to_string(), 400, ErrorCode::InvalidArgument),
            ("POST", format!("/v1/files/rename?path={d}/missing&to={d}/x"), 404, ErrorCode::NotFound),
            ("POST", format!("/v1/files/rename?path={d}/g&to={d}/sub"), 400, ErrorCode::IsADirectory),
            ("POST", format!("/v1/files/rename?path={d}/sub&to={d}/g"), 400, ErrorCode::NotADirectory),
            ("POST", format!("/v1/files/rename?path={d}/g&to=rel"), 400, ErrorCode::InvalidArgument),
            ("POST", format!("/v1/files/rename?path=/&to={d}/x"), 400, ErrorCode::InvalidArgument),
            ("POST", format!("/v1/files/rename?path={d}/g"), 400, ErrorCode::InvalidArgument),
        ];
        for (method, uri, status, want) in cases {
            let (s, body) = call(method, &uri, Body::empty()).await;
            assert_eq!((s.as_u16(), code(&body)), (status, want), "{method} {uri}");
        }
    }
}
