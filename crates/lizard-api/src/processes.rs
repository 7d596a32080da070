//! Background processes, terminals and port waits inside a sandbox: the bodies of
//! `/v1/sandboxes/{id}/processes…`, `…/pty` and `…/ports/{port}/wait`.
//!
//! A started process belongs to the sandbox, not to the request or the client that
//! started it: it runs on when the client goes away (or the sandbox is paused and
//! resumed), and any client reattaches to it by pid. Its output streams as exec frames
//! (`application/vnd.lizard.frames`): `Started` (a [`ProcessInfo`]) first, then `Stdout`
//! / `Stderr`, then `Exit`. The guest keeps the newest [`OUTPUT_CAP`] bytes of each
//! process's output, which a reattach replays before it follows live output.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Output kept per process (the guest agent's buffer); older output is dropped.
pub const OUTPUT_CAP: u64 = 1 << 20;
/// A port wait's time limit when the request names none.
pub const DEFAULT_PORT_WAIT_MS: u64 = 60_000;
/// What a terminal runs when the request names nothing: the login shell, bash where it
/// exists.
pub const DEFAULT_SHELL: &str = "command -v bash >/dev/null && exec bash -l; exec sh -l";
/// The longest a port wait may last.
pub const MAX_PORT_WAIT_MS: u64 = lizard_agent_proto::routes::PORT_WAIT_MAX_MS;

/// `POST /v1/sandboxes/{id}/processes`. Exactly one of `cmd` (run by `/bin/sh -c`) or
/// `argv`; the directory, user and environment default as for an exec.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StartProcessRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, alias = "envs", skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Run on a pseudo-terminal of this size: stdout and stderr are then one stream, the
    /// terminal's, and stdin is its keyboard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
}

/// A terminal's size in character cells (1..=1000 each).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PtySize {
    pub cols: u16,
    pub rows: u16,
}

/// A process the sandbox keeps: running, or ended (the 64 most recent ended ones stay,
/// with their output and exit code).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

/// `GET /v1/sandboxes/{id}/ports`: a TCP port something listens on in the sandbox, as
/// the guest's socket table shows it. The platform's own guest ports
/// ([`crate::code::RESERVED_GUEST_PORTS`]) are never listed: no sandbox URL routes to them.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ListeningPort {
    pub port: u16,
    /// The address it listens on: `0.0.0.0` or `::` (every address) or a loopback one.
    pub address: String,
    /// The process holding the socket, where the guest's agent found it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// That process's command line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<String>,
}

/// The user's listening ports among what the guest's agent reports: the platform's own
/// guest ports left out.
pub fn user_ports(ports: Vec<lizard_agent_proto::types::ListeningPort>) -> Vec<ListeningPort> {
    ports
        .into_iter()
        .filter(|p| !crate::code::is_reserved_guest_port(p.port))
        .map(|p| ListeningPort { port: p.port, address: p.address, pid: p.pid, cmd: p.cmd })
        .collect()
}

/// `POST /v1/sandboxes/{id}/processes/{pid}/signal`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SignalRequest {
    /// A name (`SIGTERM`, `TERM`) or a number; default `SIGKILL`. It goes to the process's
    /// whole group (the process leads its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
}

impl SignalRequest {
    /// The signal to send.
    pub fn signal(&self) -> &str {
        self.signal.as_deref().unwrap_or("SIGKILL")
    }
}

/// What a client can do to a running process besides reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessControl {
    /// Bytes for its stdin (its terminal's keyboard, for a PTY).
    Stdin(Vec<u8>),
    /// End its stdin (a PTY gets `^D`).
    CloseStdin,
    /// A signal by name or number.
    Signal(String),
    /// A new terminal size.
    Resize(PtySize),
}

/// A port wait's port (from the path) and time limit, checked: 422 unless the port is
/// 1..=65535 and `timeoutMs` at most [`MAX_PORT_WAIT_MS`].
pub fn port_wait_args(port: &str, timeout_ms: Option<u64>) -> Result<(u16, u64), crate::ApiError> {
    let timeout_ms = timeout_ms.unwrap_or(DEFAULT_PORT_WAIT_MS);
    match port.parse::<u16>() {
        Ok(port) if port != 0 && timeout_ms <= MAX_PORT_WAIT_MS => Ok((port, timeout_ms)),
        _ => Err(crate::ApiError::new(
            crate::ErrorCode::InvalidArgument,
            format!("the port must be 1..=65535 (not {port:?}) and timeoutMs at most {MAX_PORT_WAIT_MS}"),
        )),
    }
}

impl From<PtySize> for lizard_agent_proto::types::PtySize {
    fn from(s: PtySize) -> Self {
        lizard_agent_proto::types::PtySize { cols: s.cols, rows: s.rows }
    }
}

impl From<lizard_agent_proto::types::ProcessInfo> for ProcessInfo {
    fn from(p: lizard_agent_proto::types::ProcessInfo) -> Self {
        ProcessInfo { pid: p.pid, cmd: p.cmd, started_at_ms: p.started_at_ms, pty: p.pty, exit_code: p.exit_code }
    }
}

/// `GET /v1/sandboxes/{id}/pty` (a WebSocket): the terminal a browser or `lizard sandbox
/// shell` opens. Query: `cols`, `rows` (default 80×24), `cwd`, `user`, `cmd` (default the
/// user's login shell, `bash -l` where it exists), or `pid` to reattach to a PTY process.
///
/// Messages: binary frames are the terminal's bytes both ways (client → keyboard,
/// server → screen); a client text frame is a [`PtyClientMessage`], the server's text
/// frames are [`PtyServerMessage`]s (`started` first, `exit` last). Closing the socket
/// hangs the terminal up (`SIGHUP`) unless the server closed it first (the sandbox
/// stopped answering, say): then the process runs on and `pid` reattaches.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", tag = "type", deny_unknown_fields)]
pub enum PtyClientMessage {
    Resize { cols: u16, rows: u16 },
}

/// A text frame the server sends on a PTY WebSocket.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum PtyServerMessage {
    /// The terminal's process.
    Started { pid: u32 },
    /// It ended.
    #[serde(rename_all = "camelCase")]
    Exit { exit_code: i32 },
    /// The stream broke off (the process may still run: reattach with `pid`).
    Error { code: crate::ErrorCode, message: String },
}

/// The WebSocket subprotocol of the PTY route. A browser cannot set `X-API-Key` on a
/// WebSocket, so it may send its key as a second subprotocol,
/// `lizard.key.<key>` ([`PTY_KEY_PROTOCOL_PREFIX`]); the server answers with this one.
pub const PTY_PROTOCOL: &str = "lizard.pty";
pub const PTY_KEY_PROTOCOL_PREFIX: &str = "lizard.key.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_tagged_camel_case() {
        let m: PtyClientMessage = serde_json::from_str(r#"{"type":"resize","cols":100,"rows":30}"#).unwrap();
        assert_eq!(m, PtyClientMessage::Resize { cols: 100, rows: 30 });
        assert!(serde_json::from_str::<PtyClientMessage>(r#"{"type":"resize","cols":1}"#).is_err());
        let s = serde_json::to_string(&PtyServerMessage::Exit { exit_code: 3 }).unwrap();
        assert_eq!(s, r#"{"type":"exit","exitCode":3}"#);
        let r: StartProcessRequest =
            serde_json::from_str(r#"{"cmd":"top","envs":{"A":"1"},"pty":{"cols":80,"rows":24}}"#).unwrap();
        assert_eq!((r.env["A"].as_str(), r.pty), ("1", Some(PtySize { cols: 80, rows: 24 })));
        assert_eq!(SignalRequest::default().signal(), "SIGKILL");
        assert_eq!(port_wait_args("3000", None), Ok((3000, DEFAULT_PORT_WAIT_MS)));
        let guest = |port| lizard_agent_proto::types::ListeningPort {
            port,
            address: "127.0.0.1".into(),
            pid: Some(1),
            cmd: Some("x".into()),
        };
        let listed = user_ports(vec![
            guest(8000),
            guest(crate::code::FORWARD_GUEST_PORT),
            guest(crate::code::CODE_SERVICE_PORT),
        ]);
        assert_eq!(listed.iter().map(|p| p.port).collect::<Vec<_>>(), [8000]);
        for (port, t) in [("0", None), ("65536", None), ("x", None), ("80", Some(MAX_PORT_WAIT_MS + 1))] {
            assert_eq!(port_wait_args(port, t).unwrap_err().code, crate::ErrorCode::InvalidArgument, "{port}");
        }
    }
}
