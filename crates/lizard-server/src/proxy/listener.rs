//! The proxy's listener, bounded: a client that sends its headers slowly (or opens a
//! connection and sends nothing, or idles between requests) is cut off after
//! [`Limits::header_read_timeout`], and at most [`Limits::max_connections`] connections are
//! served at once — one more is answered 503 and closed at once, so a flood costs the
//! server a bounded number of file descriptors and never queues behind the ones served.
//!
//! HTTP/1.1 only (with upgrades, for WebSockets): the proxy speaks HTTP/1.1 to guests.
//! With a TLS acceptor ([`super::tls`]) the same listener serves HTTPS; its handshake
//! counts against the header-read timeout.

pub use super::connection::{ClientConn, ConnectionSlot};
use crate::state::AppState;
use crate::ServerError;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

/// Bounds of the proxy listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How long a request's headers may take to arrive, counted from the connection's
    /// start or the end of its previous request (so it is also the idle timeout).
    pub header_read_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { header_read_timeout: Duration::from_secs(10), max_connections: 4096 }
    }
}

/// How long shutdown waits for connections in flight to finish their requests.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// What a connection over the cap gets before it is closed.
const BUSY: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\nretry-after: 1\r\n\r\n";

/// Serve the proxy on `listener` within `limits` until `shutdown` resolves; over TLS when
/// given an acceptor.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    limits: Limits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors, or a connection reset before accept: not fatal.
                    tracing::warn!("sandbox-URL proxy accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "sandbox-URL proxy at its connection cap: refused");
            tokio::spawn(async move {
                let mut stream = stream;
                let _ = tokio::time::timeout(Duration::from_secs(1), async {
                    stream.write_all(BUSY).await?;
                    stream.shutdown().await
                })
                .await;
            });
            continue;
        };
        let _ = stream.set_nodelay(true);
        let slot = Arc::new(slot);
        let conn = Connection { state: state.clone(), peer, slot, limits, stop: stop_rx.clone() };
        match tls.clone() {
            None => {
                tokio::spawn(conn.serve(stream, false));
            }
            Some(acceptor) => {
                tokio::spawn(async move {
                    match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => conn.serve(stream, true).await,
                        Ok(Err(e)) => tracing::debug!(%peer, "sandbox-URL TLS handshake: {e}"),
                        Err(_) => tracing::debug!(%peer, "sandbox-URL TLS handshake timed out"),
                    }
                });
            }
        }
    }
    let _ = stop_tx.send(true);
    // Wait for connections to finish (every slot back), but not forever.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, slots.acquire_many(all)).await;
    Ok(())
}

/// One accepted connection and what serving it needs.
struct Connection {
    state: AppState,
    peer: SocketAddr,
    slot: Arc<OwnedSemaphorePermit>,
    limits: Limits,
    stop: watch::Receiver<bool>,
}

impl Connection {
    /// Serve its requests until the client closes it, it idles out, or shutdown.
    async fn serve<S>(self, stream: S, tls: bool)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let Connection { state, peer, slot, limits, mut stop } = self;
        let client = ClientConn { addr: peer, tls };
        let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            req.extensions_mut().insert(client);
            req.extensions_mut().insert(ConnectionSlot(slot.clone()));
            let state = state.clone();
            async move { Ok::<_, Infallible>(super::handle(&state, req.map(Body::new)).await) }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        let mut conn = std::pin::pin!(conn);
        tokio::select! {
            r = conn.as_mut() => if let Err(e) = r { tracing::debug!(%peer, "proxy connection: {e}") },
            _ = async { let _ = stop.wait_for(|s| *s).await; } => {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
        }
    }
}
