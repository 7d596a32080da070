//! JSON bodies exchanged with the agent. Field names are camelCase, like the public API.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What to run. Exactly one of `cmd` (a shell string, run with `/bin/sh -c`) or `argv`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    /// Working directory; defaults to the user's home (or `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Added to (and overriding) the agent's default environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// User name or numeric uid from the guest's /etc/passwd; defaults to root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Kill the command (its whole process group) after this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// When true, the request body carries [`crate::frame::FrameKind::Stdin`] frames after
    /// the start frame, ended by `StdinEof`; otherwise stdin is /dev/null.
    #[serde(default)]
    pub stdin: bool,
}

/// `POST /v1/processes`: a process that outlives the request that started it (see
/// [`crate::routes::PROCESSES`]). Exactly one of `cmd` or `argv`, as for [`ExecRequest`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StartProcess {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Run on a pseudo-terminal of this size (stdout and stderr are then one stream, the
    /// terminal's output) instead of pipes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
}

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PtySize {
    pub cols: u16,
    pub rows: u16,
}

/// A background process the agent keeps (running, or exited and not yet forgotten).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ProcessInfo {
    pub pid: u32,
    /// The command line as given (`cmd`, or `argv` joined by spaces).
    pub cmd: String,
    /// When it started, milliseconds since the Unix epoch (the guest's clock).
    pub started_at_ms: u64,
    /// Whether it runs on a pseudo-terminal.
    pub pty: bool,
    /// Its exit code once it ended (`128 + signal` when a signal ended it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

/// A listening TCP socket in the guest, from `/proc/net/tcp{,6}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ListeningPort {
    pub port: u16,
    /// The local address it listens on (`0.0.0.0`, `127.0.0.1`, `::`).
    pub address: String,
    /// The process holding the socket, where the agent finds it in `/proc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// That process's command line (arguments joined by spaces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<String>,
}

/// `POST /v1/processes/{pid}/signal`: a signal by name (`SIGTERM`, `TERM`) or number.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SignalRequest {
    pub signal: String,
}

/// How a command ended: the last frame of an exec stream.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ExitStatus {
    /// The exit code; `128 + signal` when killed by a signal (as a shell reports it);
    /// 124 when the timeout killed it.
    pub exit_code: i32,
    /// The signal that killed it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// True when the agent killed it because `timeoutMs` passed.
    #[serde(default)]
    pub timed_out: bool,
    /// Wall time from spawn to exit, in the guest.
    pub duration_ms: u64,
}

/// Kind of a directory entry.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum FileType {
    File,
    Dir,
    Symlink,
    Other,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FileEntry {
    pub name: String,
    /// Absolute path of the entry.
    pub path: String,
    #[serde(rename = "type")]
    pub file_type: FileType,
    pub size: u64,
    /// Permission bits, e.g. 0o644.
    pub mode: u32,
    /// Modification time, milliseconds since the Unix epoch.
    pub mtime_ms: i64,
    /// Its metadata ([`METADATA_XATTR_PREFIX`] extended attributes), if any.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// Where a file's metadata lives: extended attributes of this prefix, the key after it
/// (`user.e2b.<key>`). E2B's namespace, so that code in the guest finds them where E2B's
/// own envd puts them.
pub const METADATA_XATTR_PREFIX: &str = "user.e2b.";

/// What `lstat` says of one path (`GET /v1/files/info`): a symlink is described itself,
/// with its target, not followed.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FileInfo {
    pub name: String,
    /// Absolute path, as asked.
    pub path: String,
    #[serde(rename = "type")]
    pub file_type: FileType,
    pub size: u64,
    /// Permission bits, e.g. 0o644.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// The owner's and group's names in the guest's /etc/passwd and /etc/group (the
    /// number as text where there is none).
    pub owner: String,
    pub group: String,
    /// Modification time, milliseconds since the Unix epoch.
    pub mtime_ms: i64,
    /// Where a symlink points (as written in the link).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    /// Its metadata ([`METADATA_XATTR_PREFIX`] extended attributes), if any.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// What happened to a watched path.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum FsEventKind {
    /// A file, directory or link appeared (created, or moved in from outside the watch).
    Create,
    /// A file's content changed.
    Write,
    /// Removed (or moved out of the watch).
    Remove,
    /// Moved within the watch: from `path` to `newPath`.
    Rename,
    /// The guest kernel's event queue overflowed: events were lost (the watch goes on;
    /// rescan what matters).
    Overflow,
}

/// One line of a watch's answer (`GET /v1/files/watch`, NDJSON). Blank lines between
/// events keep an idle stream checked.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FsEvent {
    #[serde(rename = "type")]
    pub kind: FsEventKind,
    /// The absolute path the event is about (empty for `overflow`).
    #[serde(default)]
    pub path: String,
    /// Where a `rename` moved it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_path: Option<String>,
    #[serde(default)]
    pub is_dir: bool,
}

/// Answer to an archive upload (`PUT /v1/files/archive`): the directory it was unpacked
/// in and what it held.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveResult {
    pub path: String,
    /// Files, directories and links unpacked.
    pub entries: u64,
    /// Bytes of file content written.
    pub bytes_written: u64,
}

/// How a file is written: its mode (without one an existing file keeps its own and a new
/// one gets 0644) and whom it, and the directories the write creates, belong to (a user
/// name or uid; root without one).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteOptions {
    pub mode: Option<u32>,
    pub owner: Option<String>,
    /// Metadata to keep on the file ([`METADATA_XATTR_PREFIX`]), replacing what it had;
    /// keys are lowercased.
    pub metadata: BTreeMap<String, String>,
}

impl WriteOptions {
    /// With `mode` only.
    pub fn mode(mode: Option<u32>) -> WriteOptions {
        WriteOptions { mode, ..WriteOptions::default() }
    }
}

/// Answer to a file write.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct WriteResult {
    pub path: String,
    pub bytes_written: u64,
}

/// Answer to the health probe.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Health {
    pub agent_version: String,
    pub protocol: u32,
    pub hostname: String,
    pub kernel: String,
    pub uptime_ms: u64,
}

/// What makes a guest restored from a template snapshot its own machine. Every clone of
/// a snapshot wakes up with the template's secret, hostname, RNG state and a wall clock
/// stuck at snapshot time; the host sends this first thing after a restore. Before
/// answering, the agent
///
/// 1. replaces its secret: later sessions must authenticate with `secret` (the session
///    that sent this request may continue),
/// 2. sets the hostname,
/// 3. mixes `entropy` into the kernel's RNG, credits it and forces a reseed, so that
///    clones stop sharing the template's random stream,
/// 4. sets the wall clock to `unixTimeMs`,
/// 5. gives the guest a new `/proc/sys/kernel/random/boot_id` when `sandboxId` is not
///    the sandbox it last was (a clone, a fork's copy); a resumed guest keeps its own.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Identity {
    pub sandbox_id: String,
    pub hostname: String,
    /// The new handshake secret, hex.
    pub secret: String,
    /// Random bytes from the host (hex; [`IDENTITY_ENTROPY_BYTES`] of them).
    pub entropy: String,
    /// The host's wall clock, milliseconds since the Unix epoch.
    pub unix_time_ms: u64,
}

/// Mount the volume disk at [`crate::routes::WORKSPACE`]. A guest restored from a snapshot
/// learns the disk's real size through a config-change interrupt that may arrive after
/// the request: the agent waits (bounded) until the kernel reports `sizeBytes`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeMount {
    pub size_bytes: u64,
}

/// How many random bytes the host sends in [`Identity::entropy`].
pub const IDENTITY_ENTROPY_BYTES: usize = 64;

/// Stable error codes of the agent; the node maps them onto the public API's codes.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    NotFound,
    IsADirectory,
    NotADirectory,
    AlreadyExists,
    PermissionDenied,
    InvalidArgument,
    /// Nothing accepted a connection to the port a TCP tunnel named.
    ConnectionRefused,
    /// What the request waited for did not happen within its time limit.
    TimedOut,
    /// The request does not fit the state of what it names (input to a process that
    /// closed its stdin, a resize of a process without a terminal).
    Conflict,
    Internal,
}

/// Error body of every failed agent call.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct AgentError {
    pub code: ErrorCode,
    pub message: String,
}

impl AgentError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        AgentError { code, message: message.into() }
    }

    /// Map an I/O error on `path` to a stable code and a message that names the path.
    pub fn from_io(err: &std::io::Error, path: &str) -> Self {
        use std::io::ErrorKind as K;
        let code = match err.kind() {
            K::NotFound => ErrorCode::NotFound,
            K::PermissionDenied => ErrorCode::PermissionDenied,
            K::AlreadyExists => ErrorCode::AlreadyExists,
            K::IsADirectory => ErrorCode::IsADirectory,
            K::NotADirectory => ErrorCode::NotADirectory,
            K::InvalidInput => ErrorCode::InvalidArgument,
            _ => ErrorCode::Internal,
        };
        AgentError::new(code, format!("{path}: {err}"))
    }

    /// The HTTP status the agent answers with for this code.
    pub fn http_status(&self) -> u16 {
        match self.code {
            ErrorCode::NotFound => 404,
            ErrorCode::IsADirectory | ErrorCode::NotADirectory | ErrorCode::InvalidArgument => 400,
            ErrorCode::AlreadyExists | ErrorCode::Conflict => 409,
            ErrorCode::PermissionDenied => 403,
            // The agent is a gateway here, and the upstream (the guest's port) failed.
            ErrorCode::ConnectionRefused => 502,
            ErrorCode::TimedOut => 408,
            ErrorCode::Internal => 500,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_request_rejects_unknown_fields() {
        let r: Result<ExecRequest, _> = serde_json::from_str(r#"{"cmd":"true","bogus":1}"#);
        assert!(r.is_err());
        let r: ExecRequest = serde_json::from_str(r#"{"cmd":"true","timeoutMs":5}"#).unwrap();
        assert_eq!(r.timeout_ms, Some(5));
    }

    #[test]
    fn identity_is_camel_case() {
        let i = Identity {
            sandbox_id: "s".into(),
            hostname: "h".into(),
            secret: "ab".into(),
            entropy: "cd".into(),
            unix_time_ms: 5,
        };
        let s = serde_json::to_string(&i).unwrap();
        assert_eq!(s, r#"{"sandboxId":"s","hostname":"h","secret":"ab","entropy":"cd","unixTimeMs":5}"#);
        assert_eq!(serde_json::from_str::<Identity>(&s).unwrap(), i);
    }

    #[test]
    fn io_errors_map_to_codes() {
        let e = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(AgentError::from_io(&e, "/x").code, ErrorCode::NotFound);
        assert_eq!(AgentError::from_io(&e, "/x").http_status(), 404);
        let s = serde_json::to_string(&AgentError::new(ErrorCode::IsADirectory, "m")).unwrap();
        assert_eq!(s, r#"{"code":"IS_A_DIRECTORY","message":"m"}"#);
        let e = AgentError::new(ErrorCode::ConnectionRefused, "127.0.0.1:1: refused");
        assert_eq!(e.http_status(), 502);
        assert!(serde_json::to_string(&e).unwrap().contains(r#""code":"CONNECTION_REFUSED""#));
    }
}
