//! `GET /v1/ports/{port}/wait?timeoutMs=`: answer once something listens on a TCP port in
//! the guest.
//!
//! The kernel lists every socket in `/proc/net/tcp` and `/proc/net/tcp6`; a listener is a
//! line in state `0A` (`TCP_LISTEN`) whose local port is the one asked for, on any address
//! (`0.0.0.0`, `127.0.0.1`, `::`). The agent reads both every [`POLL`] until one shows up
//! or the time limit passes. Reading them costs microseconds and connects to nothing, so
//! the program being waited for sees no probe connections.

use crate::server::AppError;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use lizard_agent_proto::routes::PORT_WAIT_MAX_MS;
use lizard_agent_proto::types::{AgentError, ErrorCode};
use serde::Deserialize;
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

/// Whether one of `tables` (the text of `/proc/net/tcp{,6}`) has a listener on `port`.
fn listens(tables: &[String], port: u16) -> bool {
    let port = format!("{port:04X}");
    tables.iter().flat_map(|t| t.lines().skip(1)).any(|line| {
        let mut fields = line.split_whitespace();
        let local = fields.nth(1);
        let state = fields.nth(1);
        state == Some(LISTEN) && local.and_then(|l| l.rsplit_once(':')).is_some_and(|(_, p)| p == port)
    })
}

fn listening_now(port: u16) -> bool {
    let tables: Vec<String> = TABLES.iter().filter_map(|t| std::fs::read_to_string(t).ok()).collect();
    listens(&tables, port)
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
