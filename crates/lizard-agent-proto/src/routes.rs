//! The agent's HTTP/2 routes. Paths take the file path as the `path` query parameter.
//!
//! | method | path                | request body                | response body            |
//! |--------|---------------------|-----------------------------|--------------------------|
//! | GET    | [`HEALTH`]          | –                           | [`crate::types::Health`] |
//! | POST   | [`EXEC`]            | frames: Start, Stdin*, Eof  | frames: Stdout/Stderr*, Exit or Error |
//! | PUT    | [`FILES`]`?path=&mode=` | raw bytes (streamed)    | [`crate::types::WriteResult`] |
//! | GET    | [`FILES`]`?path=`   | –                           | raw bytes (streamed)     |
//! | DELETE | [`FILES`]`?path=`   | –                           | – (204), recursive       |
//! | GET    | [`FILES_LIST`]`?path=` | –                        | `[FileEntry]`            |
//! | POST   | [`FILES_MKDIR`]`?path=` | –                       | – (204), with parents    |
//! | GET    | [`FILES_INFO`]`?path=` | –                        | [`crate::types::FileInfo`] (lstat) |
//! | POST   | [`FILES_RENAME`]`?path=&to=` | –                  | [`crate::types::FileInfo`] of `to` |
//! | GET    | [`FILES_WATCH`]`?path=&recursive=` | –            | NDJSON [`crate::types::FsEvent`]s until the host drops it |
//! | GET    | [`FILES_ARCHIVE`]`?path=` | –                     | a directory as a tar archive (streamed) |
//! | PUT    | [`FILES_ARCHIVE`]`?path=` | a tar archive (streamed) | [`crate::types::ArchiveResult`] |
//! | POST   | [`crate::staging::STAGED_WRITE`]`?path=&mode=&slot=` | notices (JSON lines) | notices, then `Written` |
//! | POST   | [`crate::staging::STAGED_READ`]`?path=&slot=` | acks (JSON lines) | notices, then `End`      |
//! | POST   | [`IDENTITY`]        | [`crate::types::Identity`]  | – (204)                  |
//! | POST   | [`VOLUME_MOUNT`]    | [`crate::types::VolumeMount`] | – (204)                |
//! | POST   | [`VOLUME_SYNC`]     | –                           | – (204)                  |
//! | POST   | [`PROCESSES`]       | [`crate::types::StartProcess`] | frames: Started, Stdout/Stderr*, Exit |
//! | GET    | [`PROCESSES`]       | –                           | `[ProcessInfo]`          |
//! | GET    | [`process_output`]  | –                           | frames: Started, Stdout/Stderr* (kept output, then live), Exit |
//! | POST   | [`process_stdin`]   | raw bytes                   | – (204)                  |
//! | DELETE | [`process_stdin`]   | –                           | – (204): stdin closed    |
//! | POST   | [`process_signal`]  | [`crate::types::SignalRequest`] | – (204)              |
//! | POST   | [`process_resize`]  | [`crate::types::PtySize`]   | – (204)                  |
//! | GET    | [`PORTS`]           | –                           | `[ListeningPort]`: TCP listeners, by port |
//! | GET    | [`port_wait`]`?timeoutMs=` | –                    | – (204) once something listens on the port |
//! | CONNECT | authority `127.0.0.1:<port>` | raw TCP bytes, host → guest | raw TCP bytes, guest → host |
//!
//! Every failure answers with a 4xx/5xx status and a JSON [`crate::types::AgentError`].
//!
//! # TCP tunnels
//!
//! The guest has no network device, so ports inside it (a dev server, a WebSocket
//! endpoint) are reached through the agent. A tunnel is a plain HTTP/2 `CONNECT` stream
//! (RFC 9113 §8.5), not extended CONNECT and not a request/response body pair: CONNECT
//! is HTTP/2's own way to turn one stream into a full-duplex byte pipe, hyper supports it
//! on both ends (`hyper::upgrade::on`), and its END_STREAM flag maps exactly onto a TCP
//! half-close, which a `POST` whose response could only start after the request ended
//! could not give.
//!
//! 1. The host opens a stream with `:method = CONNECT` and `:authority =
//!    127.0.0.1:<port>` ([`tunnel_authority`]); no `:scheme`, no `:path`, no body yet.
//! 2. The agent checks the authority ([`parse_tunnel_authority`]): only the guest's own
//!    loopback is reachable (host [`TUNNEL_HOST`]), port 1..=65535; anything else is
//!    400 `INVALID_ARGUMENT`. The tunnel grants nothing a process in the guest could not
//!    already do, and cannot be pointed anywhere else.
//! 3. The agent connects to that port in the guest. Nothing listening: 502
//!    `CONNECTION_REFUSED` with the usual JSON error body, and the stream ends.
//! 4. Connected: the agent answers `200` with no body. From then on the stream's DATA
//!    frames carry the connection's bytes, in both directions at once, under HTTP/2 flow
//!    control (a slow reader on either end stops the writer; nothing piles up).
//! 5. END_STREAM from one side is a half-close (TCP FIN) in that direction only; the
//!    other direction keeps flowing until it ends too. The agent sends END_STREAM when
//!    the guest's socket reads EOF, and shuts the socket's write side when the host's
//!    END_STREAM arrives. A reset (RST_STREAM) on either side aborts the connection.
//!
//! Tunnels are ordinary streams of the one session: any number run at once next to execs
//! and file transfers, and all of them end with the session.
//!
//! # Forwarded connections (guest → host)
//!
//! The guest has no route to the host, yet code in a sandbox may use the Lizard API (the
//! `lizard` CLI with the key given as `lizardToken`). The agent listens on
//! [`FORWARD_GUEST_ADDR`] in the guest; the host keeps a few `CONNECT` streams with the
//! authority [`FORWARD_AUTHORITY`] open on the agent. Each such request waits until a guest
//! process connects to the listener; the agent then answers `200` and the stream carries
//! that connection, exactly like a tunnel (half-closes, resets). The host connects the
//! other end to the one target it was configured with (the API server); the guest cannot
//! name any other destination.

pub const HEALTH: &str = "/v1/health";
pub const EXEC: &str = "/v1/exec";
pub const FILES: &str = "/v1/files";
pub const FILES_LIST: &str = "/v1/files/list";
pub const FILES_MKDIR: &str = "/v1/files/mkdir";
pub const FILES_INFO: &str = "/v1/files/info";
pub const FILES_RENAME: &str = "/v1/files/rename";
/// inotify on a directory (and, `recursive=true`, every directory under it, new ones
/// included). The answer starts once the watches are in place, so a change made after
/// it began is reported; the watches go when the host drops the stream (the session
/// ends at a pause, so does the watch).
pub const FILES_WATCH: &str = "/v1/files/watch";
/// A directory's tree as a tar archive, or a tar archive unpacked into a directory.
/// Entries stay inside it: an absolute path, a `..` component or a path through a link
/// is refused (`INVALID_ARGUMENT`), and nothing of the archive is unpacked then.
pub const FILES_ARCHIVE: &str = "/v1/files/archive";
/// Give a guest restored from a template snapshot its own identity; see
/// [`crate::types::Identity`].
pub const IDENTITY: &str = "/v1/identity";
/// Mount the volume disk ([`VOLUME_DEVICE`]) at [`WORKSPACE`].
pub const VOLUME_MOUNT: &str = "/v1/volume/mount";
/// Write everything cached for [`WORKSPACE`] to the volume disk (`syncfs`); answers once
/// the disk acknowledged the flush. Nothing mounted there: a no-op.
pub const VOLUME_SYNC: &str = "/v1/volume/sync";

/// Background processes and PTYs: they belong to the agent, not to the session that
/// started them, so they run on when the host goes away (a pause, a node restart) and a
/// later session reattaches with [`process_output`].
pub const PROCESSES: &str = "/v1/processes";
/// Route templates (axum syntax) of one process's routes.
pub const PROCESS_OUTPUT: &str = "/v1/processes/{pid}/output";
pub const PROCESS_STDIN: &str = "/v1/processes/{pid}/stdin";
pub const PROCESS_SIGNAL: &str = "/v1/processes/{pid}/signal";
pub const PROCESS_RESIZE: &str = "/v1/processes/{pid}/resize";
/// The guest's listening TCP sockets ([`crate::types::ListeningPort`]), the agent's own
/// included (the host decides what a user sees).
pub const PORTS: &str = "/v1/ports";
/// Answers once something listens on a TCP port in the guest (`timeoutMs`, default and
/// cap [`PORT_WAIT_MAX_MS`]).
pub const PORT_WAIT: &str = "/v1/ports/{port}/wait";
/// The longest a port wait may last.
pub const PORT_WAIT_MAX_MS: u64 = 10 * 60 * 1000;

pub fn process_output(pid: u32) -> String {
    PROCESS_OUTPUT.replace("{pid}", &pid.to_string())
}
pub fn process_stdin(pid: u32) -> String {
    PROCESS_STDIN.replace("{pid}", &pid.to_string())
}
pub fn process_signal(pid: u32) -> String {
    PROCESS_SIGNAL.replace("{pid}", &pid.to_string())
}
pub fn process_resize(pid: u32) -> String {
    PROCESS_RESIZE.replace("{pid}", &pid.to_string())
}
pub fn port_wait(port: u16) -> String {
    PORT_WAIT.replace("{port}", &port.to_string())
}

/// The guest's second virtio-blk disk: every VM has it (a placeholder when the sandbox
/// has no volume), so snapshots and their clones have the same devices.
pub const VOLUME_DEVICE: &str = "/dev/vdb";
/// Where a sandbox's volume is mounted in the guest.
pub const WORKSPACE: &str = "/workspace";

/// Content type of a framed exec stream.
pub const FRAMES_CONTENT_TYPE: &str = "application/vnd.lizard.frames";

/// The only host a tunnel may name: the guest's own loopback.
pub const TUNNEL_HOST: &str = "127.0.0.1";

/// The `:authority` of a tunnel to `port` in the guest.
pub fn tunnel_authority(port: u16) -> String {
    format!("{TUNNEL_HOST}:{port}")
}

/// The `:authority` of a `CONNECT` that waits for the next guest connection to
/// [`FORWARD_GUEST_ADDR`] (see "Forwarded connections").
pub const FORWARD_AUTHORITY: &str = "lizard-forward:1";

/// Where processes in the guest connect to reach the host's Lizard API.
pub const FORWARD_GUEST_ADDR: &str = "127.0.0.1:49171";

/// `LIZARD_API_URL` as a guest process should use it.
pub const FORWARD_GUEST_URL: &str = "http://127.0.0.1:49171";

/// Why a tunnel's authority is unacceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TunnelTargetError {
    /// Only the guest's loopback is reachable through a tunnel.
    #[error("tunnels reach only {TUNNEL_HOST}:<port> in the guest, not {0:?}")]
    Host(String),
    /// The port is missing, not a number, or 0.
    #[error("tunnel port must be 1..=65535, got {0:?}")]
    Port(String),
}

/// The guest port a tunnel's `:authority` names; see [`tunnel_authority`].
pub fn parse_tunnel_authority(authority: &str) -> Result<u16, TunnelTargetError> {
    let Some((host, port)) = authority.rsplit_once(':') else {
        return Err(TunnelTargetError::Port(String::new()));
    };
    if host != TUNNEL_HOST {
        return Err(TunnelTargetError::Host(host.to_string()));
    }
    match port.parse::<u16>() {
        Ok(p) if p != 0 && port.bytes().all(|b| b.is_ascii_digit()) => Ok(p),
        _ => Err(TunnelTargetError::Port(port.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tunnel_authorities_round_trip_and_stay_on_loopback() {
        assert_eq!(tunnel_authority(3000), "127.0.0.1:3000");
        assert_eq!(parse_tunnel_authority(&tunnel_authority(3000)), Ok(3000));
        assert_eq!(parse_tunnel_authority("127.0.0.1:65535"), Ok(65535));
        for bad in ["127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:", "127.0.0.1:+80", "127.0.0.1"] {
            assert!(matches!(parse_tunnel_authority(bad), Err(TunnelTargetError::Port(_))), "{bad}");
        }
        for bad in ["10.0.0.1:80", "localhost:80", "[::1]:80", "127.0.0.2:80", "user@127.0.0.1:80"] {
            assert!(matches!(parse_tunnel_authority(bad), Err(TunnelTargetError::Host(_))), "{bad}");
        }
    }
}
