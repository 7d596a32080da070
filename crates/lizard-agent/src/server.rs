//! One agent session: handshake, then HTTP/2 (prior knowledge) over the authenticated
//! stream, routed by axum.
//!
//! Nothing here knows which transport carries the stream; `transport` hands over any
//! byte stream and the session owns it until the host goes away. All session state lives
//! in the hyper connection and is dropped with it, so a host that reconnects (after a
//! snapshot restore, say) starts from a clean slate.

use crate::app::{AppError, AppState};
use crate::{archive, exec, files, forward, identity, ports, processes, staged, tunnel, volume, watch};
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use lizard_agent_proto::handshake::{self, HandshakeError};
use lizard_agent_proto::types::{AgentError, ErrorCode, Health};
use lizard_agent_proto::{routes, PROTOCOL_VERSION};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};

/// HTTP/2 flow-control windows: large enough that one stream can fill a fast channel.
pub const STREAM_WINDOW: u32 = 4 << 20;
pub const CONNECTION_WINDOW: u32 = 16 << 20;
/// Largest HTTP/2 frame we accept; fewer, larger frames cost less per byte.
pub const MAX_FRAME_SIZE: u32 = 1 << 20;
/// Streams open at once. Tunnels are long-lived streams (a WebSocket stays open for
/// hours), so the limit is far above hyper's default of 200, which open tunnels could
/// otherwise exhaust and thereby block every exec behind them.
pub const MAX_CONCURRENT_STREAMS: u32 = 4096;
/// A host that connects must finish the handshake within this time.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a session ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The host failed the handshake.
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    /// The host did not complete the handshake in time.
    #[error("handshake timed out")]
    HandshakeTimeout,
    /// The HTTP/2 connection failed.
    #[error("http/2 session failed: {0}")]
    Http(hyper::Error),
}

impl From<hyper::Error> for SessionError {
    fn from(e: hyper::Error) -> Self {
        SessionError::Http(e)
    }
}

/// Run one session over `io` until the host disconnects.
pub async fn serve_connection<S>(mut io: S, state: AppState) -> Result<(), SessionError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let secret = state.secret.read().unwrap_or_else(|e| e.into_inner()).clone();
    let apply_identity = |id| identity::apply(&state, id);
    tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake::agent_accept(&mut io, &secret, apply_identity))
        .await
        .map_err(|_| SessionError::HandshakeTimeout)??;
    let service = TowerToHyperService::new(router(state));
    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME_SIZE)
        .max_send_buf_size(MAX_FRAME_SIZE as usize)
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .serve_connection(TokioIo::new(io), service)
        .await?;
    Ok(())
}

/// The agent's routes (see `lizard_agent_proto::routes`).
pub fn router(state: AppState) -> Router {
    Router::new()
        .route(routes::HEALTH, get(health))
        .route(routes::EXEC, post(exec::handle))
        .route(routes::FILES, put(files::write).get(files::read).delete(files::remove))
        .route(routes::FILES_LIST, get(files::list))
        .route(routes::FILES_MKDIR, post(files::mkdir))
        .route(routes::FILES_INFO, get(files::info))
        .route(routes::FILES_RENAME, post(files::rename))
        .route(routes::FILES_WATCH, get(watch::handle))
        .route(routes::FILES_ARCHIVE, get(archive::read).put(archive::write))
        .route(lizard_agent_proto::staging::STAGED_WRITE, post(staged::write))
        .route(lizard_agent_proto::staging::STAGED_READ, post(staged::read))
        .route(routes::IDENTITY, post(identity::handle))
        .route(routes::VOLUME_MOUNT, post(volume::mount))
        .route(routes::VOLUME_SYNC, post(volume::sync))
        .route(routes::PROCESSES, post(processes::start_handler).get(processes::list_handler))
        .route(routes::PROCESS_OUTPUT, get(processes::output_handler))
        .route(routes::PROCESS_STDIN, post(processes::stdin_handler).delete(processes::close_stdin_handler))
        .route(routes::PROCESS_SIGNAL, post(processes::signal_handler))
        .route(routes::PROCESS_RESIZE, post(processes::resize_handler))
        .route(routes::PORTS, get(ports::list))
        .route(routes::PORT_WAIT, get(ports::wait))
        .fallback(fallback)
        .with_state(state)
}

/// Everything no route matched. HTTP/2 `CONNECT` requests (TCP tunnels, forwarded
/// connections) land here too: they carry an authority and no path, so no path route can
/// match them.
async fn fallback(req: Request) -> Response {
    if req.method() == http::Method::CONNECT {
        if req.uri().authority().map(|a| a.as_str()) == Some(routes::FORWARD_AUTHORITY) {
            return forward::handle(req).await.into_response();
        }
        return tunnel::handle(req).await.into_response();
    }
    AppError(AgentError::new(ErrorCode::NotFound, "no such route")).into_response()
}

async fn health() -> Json<Health> {
    let hostname = nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    let uptime_ms = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map(|t| t.tv_sec() as u64 * 1000 + t.tv_nsec() as u64 / 1_000_000)
        .unwrap_or_default();
    Json(Health {
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
        protocol: PROTOCOL_VERSION,
        hostname,
        kernel,
        uptime_ms,
    })
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::StatusCode;
    use http_body_util::BodyExt;
    use lizard_agent_proto::handshake::Secret;
    use std::sync::{Arc, RwLock};
    use tower::ServiceExt;

    /// A router for handler tests, as dev mode would build it.
    pub fn test_router() -> Router {
        crate::reaper::start(false).unwrap();
        router(AppState { secret: Arc::new(RwLock::new(Secret::generate())), pid1: false })
    }

    /// Send one request through the router; returns the status and the whole body.
    pub async fn call(method: &str, uri: &str, body: impl Into<Body>) -> (StatusCode, bytes::Bytes) {
        let req = http::Request::builder().method(method).uri(uri).body(body.into()).unwrap();
        let resp = test_router().oneshot(req).await.unwrap();
        let status = resp.status();
        (status, resp.into_body().collect().await.unwrap().to_bytes())
    }

    /// A fork's copy wakes up in the source's session, its host gone: the new host's
    /// first bytes end that session at once (rather than when the new host gives up).
    #[tokio::test]
    async fn the_stale_session_breaker_ends_an_open_session() {
        use lizard_agent_proto::handshake;
        use tokio::io::AsyncWriteExt;
        crate::reaper::start(false).unwrap();
        let secret = Secret::generate();
        let state = AppState { secret: Arc::new(RwLock::new(secret.clone())), pid1: false };
        let (guest, mut host) = tokio::io::duplex(1 << 16);
        let session = tokio::spawn(serve_connection(guest, state));
        handshake::host_connect(&mut host, &secret).await.unwrap();
        // The old host's HTTP/2 session: the client preface and its (empty) settings.
        host.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0").await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(!session.is_finished(), "the session did not open");
        host.write_all(handshake::STALE_SESSION_BREAKER).await.unwrap();
        let ended = tokio::time::timeout(std::time::Duration::from_secs(5), session).await;
        assert!(ended.expect("the stale session ran on").unwrap().is_err());
    }

    #[tokio::test]
    async fn health_and_unknown_routes() {
        let (status, body) = call("GET", routes::HEALTH, Body::empty()).await;
        assert_eq!(status, StatusCode::OK);
        let h: Health = serde_json::from_slice(&body).unwrap();
        assert_eq!(h.protocol, PROTOCOL_VERSION);
        assert!(!h.kernel.is_empty());
        let (status, body) = call("GET", "/v1/nope", Body::empty()).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let e: AgentError = serde_json::from_slice(&body).unwrap();
        assert_eq!(e.code, ErrorCode::NotFound);
    }
}
