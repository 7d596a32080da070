//! The listeners' connection handling (HTTP/1.1, upgrades included), with limits that
//! `axum::serve` does not offer:
//!
//! - at most [`TrafficLimits::max_connections`] connections at once per listener; the next
//!   waits in the kernel's backlog until one closes (the server's file descriptors are
//!   never exhausted by clients);
//! - a request's head must arrive within [`TrafficLimits::header_read`], and a keep-alive
//!   connection idle that long is closed: a slowloris client holds a slot only that long.
//!
//! On shutdown it stops accepting, asks every connection to finish its request and close,
//! and waits for them (bounded by [`DRAIN_LIMIT`]).

use crate::config::TrafficLimits;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

/// The longest a shutdown waits for open connections to finish.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(30);

/// Serve `router` on `listener` within `limits` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    limits: &TrafficLimits,
) {
    let max = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let slots = Arc::new(Semaphore::new(max));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_read);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p.expect("the connection slots are never closed"),
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors or a connection reset before accept: wait, go on.
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let conn =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(router.clone())).with_upgrades();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let _slot = permit;
            tokio::pin!(conn);
            tokio::select! {
                done = conn.as_mut() => {
                    if let Err(e) = done {
                        tracing::debug!("connection: {e}");
                    }
                }
                _ = async { stop.wait_for(|s| *s).await.map(drop) } => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    if tokio::time::timeout(DRAIN_LIMIT, slots.acquire_many(all)).await.is_err() {
        tracing::warn!("connections still open {DRAIN_LIMIT:?} after shutdown began: leaving them");
    }
}
