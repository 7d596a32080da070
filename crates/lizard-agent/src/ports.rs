//! `GET /v1/ports/{port}/wait?timeoutMs=`: answer once something listens on a TCP port in
//! the guest; `GET /v1/ports`: every listening TCP socket, with the process that holds it.
//!
//! The kernel lists every socket in `/proc/net/tcp` and `/proc/net/tcp6`; a listener is a
//! line in state `0A` (`TCP_LISTEN`) whose local port is the one asked for, on any address
//! (`0.0.0.0`, `127.0.0.1`, `::`). The agent reads both every [`POLL`] until one shows up
//! or the time limit passes. Reading them costs microseconds and connects to nothing, so
//! the program being waited for sees no probe connections. A listener's owner is the
//! process with a descriptor `socket:[<inode>]` of the line's inode in `/proc/<pid>/fd`
//! (the agent runs as root, so it sees every process's).

use crate::app::AppError;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::Json;
use lizard_agent_proto::routes::PORT_WAIT_MAX_MS;
use lizard_agent_proto::types::{AgentError, ErrorCode, ListeningPort};
use serde::Deserialize;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

/// How often the socket tables are read.
const POLL: Duration = Duration::from_millis(50);
/// The wait when the request names none.
pub const DEFAULT_WAIT_MS: u64 = 60_000;
/// The kernel's socket tables.
const TABLES: [&str; 2] = ["/proc/net/tcp", "/proc/net/tcp6"];
/// `TCP_LISTEN` as `/proc/net/tcp` writes it.
const LISTEN: &str = "0A";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WaitQuery {
    timeout_ms: Option<u64>,
}

/// A `LISTEN` line of a socket table.
#[derive(Debug, PartialEq)]
struct Listener {
    address: IpAddr,
    port: u16,
    /// The socket's inode (`None` where the line has none).
    inode: Option<u64>,
}

/// An address as `/proc/net/tcp{,6}` writes it: the bytes of each 32-bit word in host
/// (little-endian) order, 8 hex digits for IPv4, 32 for IPv6.
fn parse_address(hex: &str) -> Option<IpAddr> {
    let word = |i: usize| hex.get(i * 8..i * 8 + 8).and_then(|w| u32::from_str_radix(w, 16).ok()).map(u32::to_le_bytes);
    match hex.len() {
        8 => Some(IpAddr::V4(Ipv4Addr::from(word(0)?))),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            Some(IpAddr::V6(Ipv6Addr::from(bytes)))
        }
        _ => None,
    }
}

/// The listeners of one table (the text of `/proc/net/tcp` or `/proc/net/tcp6`).
fn listeners(table: &str) -> impl Iterator<Item = Listener> + '_ {
    table.lines().skip(1).filter_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(3) != Some(&LISTEN) {
            return None;
        }
        let (address, port) = fields.get(1)?.rsplit_once(':')?;
        Some(Listener {
            address: parse_address(address)?,
            port: u16::from_str_radix(port, 16).ok()?,
            inode: fields.get(9).and_then(|i| i.parse().ok()),
        })
    })
}

/// Whether one of `tables` (the text of `/proc/net/tcp{,6}`) has a listener on `port`.
fn listens(tables: &[String], port: u16) -> bool {
    tables.iter().flat_map(|t| listeners(t)).any(|l| l.port == port)
}

fn listening_now(port: u16) -> bool {
    listens(&read_tables(), port)
}

fn read_tables() -> Vec<String> {
    TABLES.iter().filter_map(|t| std::fs::read_to_string(t).ok()).collect()
}

/// The processes holding the sockets `inodes`: inode → pid (the first process found, for
/// a socket several share after a fork).
fn socket_owners(proc: &std::path::Path, inodes: &[u64]) -> HashMap<u64, u32> {
    let wanted: HashMap<String, u64> = inodes.iter().map(|i| (format!("socket:[{i}]"), *i)).collect();
    let mut owners = HashMap::new();
    let Ok(entries) = std::fs::read_dir(proc) else { return owners };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else { continue };
            if let Some(inode) = target.to_str().and_then(|t| wanted.get(t)) {
                owners.entry(*inode).or_insert(pid);
            }
        }
    }
    owners
}

/// A process's command line, its arguments joined by spaces (its name for a kernel thread).
fn command_line(proc: &std::path::Path, pid: u32) -> Option<String> {
    let dir = proc.join(pid.to_string());
    let raw = std::fs::read(dir.join("cmdline")).ok()?;
    let args: Vec<String> =
        raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    if !args.is_empty() {
        return Some(args.join(" "));
    }
    std::fs::read_to_string(dir.join("comm")).ok().map(|c| c.trim_end().to_string())
}

/// Every listening TCP socket in the guest, by port then address.
fn listening_ports() -> Vec<ListeningPort> {
    let tables = read_tables();
    let found: Vec<Listener> = tables.iter().flat_map(|t| listeners(t)).collect();
    let proc = std::path::Path::new("/proc");
    let owners = socket_owners(proc, &found.iter().filter_map(|l| l.inode).collect::<Vec<_>>());
    let mut ports: Vec<ListeningPort> = found
        .into_iter()
        .map(|l| {
            let pid = l.inode.and_then(|i| owners.get(&i).copied());
            ListeningPort {
                port: l.port,
                address: l.address.to_string(),
                pid,
                cmd: pid.and_then(|p| command_line(proc, p)),
            }
        })
        .collect();
    ports.sort_by(|a, b| (a.port, &a.address).cmp(&(b.port, &b.address)));
    ports.dedup_by(|a, b| (a.port, &a.address) == (b.port, &b.address));
    ports
}

/// `GET /v1/ports`: the guest's listening TCP sockets.
pub async fn list() -> Result<Json<Vec<ListeningPort>>, AppError> {
    let ports = tokio::task::spawn_blocking(listening_ports)
        .await
        .map_err(|e| AppError(AgentError::new(ErrorCode::Internal, format!("listing ports: {e}"))))?;
    Ok(Json(ports))
}

/// The handler: 204 once something listens on `port`; 408 `TIMED_OUT` when nothing did
/// within `timeoutMs` (default [`DEFAULT_WAIT_MS`], at most [`PORT_WAIT_MAX_MS`]).
pub async fn wait(
    path: Result<Path<u16>, PathRejection>,
    query: Result<Query<WaitQuery>, QueryRejection>,
) -> Result<StatusCode, AppError> {
    let invalid = |m: String| AppError(AgentError::new(ErrorCode::InvalidArgument, m));
    let port = path.map_err(|e| invalid(e.body_text()))?.0;
    let timeout_ms = query.map_err(|e| invalid(e.body_text()))?.0.timeout_ms.unwrap_or(DEFAULT_WAIT_MS);
    if port == 0 || timeout_ms > PORT_WAIT_MAX_MS {
        return Err(invalid(format!("port must be 1..=65535 and timeoutMs at most {PORT_WAIT_MAX_MS}")));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_millis(timeout_ms);
    loop {
        if listening_now(port) {
            return Ok(StatusCode::NO_CONTENT);
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            let message = format!("nothing listened on port {port} within {timeout_ms} ms");
            return Err(AppError(AgentError::new(ErrorCode::TimedOut, message)));
        }
        tokio::time::sleep_until(deadline.min(now + POLL)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::tests::call;
    use axum::body::Body;
    use lizard_agent_proto::routes;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:0BB8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 20 4 30 10 -1";
    const TCP6: &str = "  sl  local_address                         remote_address                        st
   0: 00000000000000000000000000000000:1F40 00000000000000000000000000000000:0000 0A 00000000:00000000";

    #[test]
    fn finds_listeners_on_either_family_and_nothing_else() {
        let tables = [TCP.to_string(), TCP6.to_string()];
        assert!(listens(&tables, 3000));
        assert!(listens(&tables, 8000));
        // 8080 is only an established connection's local port.
        assert!(!listens(&tables, 8080));
        assert!(!listens(&tables, 1));
    }

    #[test]
    fn parses_addresses_ports_and_inodes() {
        let v4: Vec<Listener> = listeners(TCP).collect();
        assert_eq!(v4, [Listener { address: [127, 0, 0, 1].into(), port: 3000, inode: Some(1) }]);
        let v6: Vec<Listener> = listeners(TCP6).collect();
        assert_eq!(v6, [Listener { address: Ipv6Addr::UNSPECIFIED.into(), port: 8000, inode: None }]);
        // ::1 as the kernel writes it.
        assert_eq!(parse_address("00000000000000000000000001000000"), Some(Ipv6Addr::LOCALHOST.into()));
        assert_eq!(parse_address("0100007"), None);
    }

    #[tokio::test]
    async fn lists_listeners_with_their_process() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (status, body) = call("GET", routes::PORTS, Body::empty()).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let ports: Vec<ListeningPort> = serde_json::from_slice(&body).unwrap();
        let mine = ports.iter().find(|p| p.port == port).unwrap_or_else(|| panic!("{port} missing: {ports:?}"));
        assert_eq!((mine.address.as_str(), mine.pid), ("127.0.0.1", Some(std::process::id())));
        assert!(mine.cmd.as_deref().is_some_and(|c| !c.is_empty()), "{mine:?}");
        assert!(ports.windows(2).all(|w| w[0].port <= w[1].port), "{ports:?}");
        drop(listener);
        let (_, body) = call("GET", routes::PORTS, Body::empty()).await;
        let ports: Vec<ListeningPort> = serde_json::from_slice(&body).unwrap();
        assert!(!ports.iter().any(|p| p.port == port), "a closed listener is listed: {ports:?}");
    }

    #[tokio::test]
    async fn answers_once_a_port_listens_and_times_out_otherwise() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (status, _) = call("GET", &format!("{}?timeoutMs=5000", routes::port_wait(port)), Body::empty()).await;
        assert_eq!(status, 204);
        drop(listener);
        let started = std::time::Instant::now();
        let (status, body) = call("GET", &format!("{}?timeoutMs=300", routes::port_wait(port)), Body::empty()).await;
        assert_eq!(status, 408, "{}", String::from_utf8_lossy(&body));
        let e: AgentError = serde_json::from_slice(&body).unwrap();
        assert_eq!(e.code, ErrorCode::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(300));
        // A listener that comes up during the wait ends it.
        let late = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            std::net::TcpListener::bind(("127.0.0.1", port)).ok()
        });
        let (status, _) = call("GET", &format!("{}?timeoutMs=5000", routes::port_wait(port)), Body::empty()).await;
        assert!(late.await.unwrap().is_some(), "the port was free again");
        assert_eq!(status, 204);
        for bad in ["?timeoutMs=999999999", "?timeoutMs=x", "?bogus=1"] {
            let (status, _) = call("GET", &format!("{}{bad}", routes::port_wait(port)), Body::empty()).await;
            assert_eq!(status, 400, "{bad}");
        }
        assert_eq!(call("GET", "/v1/ports/0/wait", Body::empty()).await.0, 400);
    }
}
