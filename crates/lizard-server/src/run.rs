//! `lizard server`: the control plane and, in the default single-machine mode, the node
//! in the same process.
//!
//! Sandboxes do not outlive the process: on shutdown the node kills them and their
//! records are ended ("server stopped"); records a crashed process left running are ended
//! at the next start ("lost: the server restarted") while the node sweeps their VMs.

use crate::api::{self, AppState};
use crate::{ServerConfig, ServerError};
use std::net::SocketAddr;
use std::sync::Arc;

/// What `lizard server` runs.
pub struct RunOptions {
    pub server: ServerConfig,
    pub node: lizard_node::NodeConfig,
    /// Where the sandbox-URL proxy listens (`None`: no proxy).
    pub proxy_listen: Option<SocketAddr>,
}

/// Serve the API until `shutdown` resolves; print `LIZARD_API_KEY=<key>` on stdout on the
/// very first start.
pub async fn run(
    opts: RunOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let server = crate::open(opts.server).await?;
    if let Some(key) = server.initial_key() {
        println!("LIZARD_API_KEY={key}");
    }
    let listener = server.bind().await?;
    let mut node_config = opts.node;
    // Guests reach this API through their agent (they have no route to the host).
    if let Ok(addr) = listener.local_addr() {
        node_config.api_forward = Some(forward_target(addr));
    }
    let node = lizard_node::Node::start(node_config).await.map_err(|e| ServerError::Io {
        context: "start the node".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let state = AppState {
        server: server.state().clone().with_reaper(Arc::new(api::sandboxes::NodeReaper(node.clone()))),
        node: node.clone(),
    };
    // Sandboxes a dead process left running were billed up to its last metering tick:
    // close their meters there (never billing its downtime), then end their records.
    match state.server.store.close_meters_at_watermark().await {
        Ok(0) => {}
        Ok(n) => tracing::warn!(sandboxes = n, "closed the meters of sandboxes a previous process left running"),
        Err(e) => tracing::warn!("cannot close leftover meters: {e}"),
    }
    end_leftover_records(&state, "lost: the server restarted").await;
    match state.server.store.release_stale_attachments().await {
        Ok(0) => {}
        Ok(n) => tracing::info!(n, "released volumes held by sandboxes that no longer run"),
        Err(e) => tracing::warn!("cannot release stale volume attachments: {e}"),
    }
    let metering = tokio::spawn(crate::billing::run_metering(
        state.server.store.clone(),
        state.server.config.billing.clone(),
        Arc::new(api::billing::NodePauser(state.clone())),
    ));
    tracing::info!("API on http://{}", listener.local_addr().map(|a| a.to_string()).unwrap_or_default());
    let reaper = tokio::spawn(api::sandboxes::reap_expired(state.clone()));
    // One shutdown signal for both listeners.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let proxy = match opts.proxy_listen {
        Some(addr) => {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ServerError::Io { context: format!("bind the proxy on {addr}"), source })?;
            tracing::info!(
                "sandbox URLs on http://*.{}:{}",
                state.server.config.sandbox_domain(&state.server.config.region),
                addr.port()
            );
            Some(tokio::spawn(crate::serve(l, crate::proxy::router(state.clone()), stopped(stop_rx.clone()))))
        }
        None => None,
    };
    let router = crate::build_router(state.clone(), api::all_routes());
    let result = crate::serve(listener, router, stopped(stop_rx)).await;
    if let Some(p) = proxy {
        let _ = p.await;
    }
    reaper.abort();
    metering.abort();
    node.shutdown().await;
    end_leftover_records(&state, "server stopped").await;
    result
}

/// The address the node connects guests' API connections to: the listen address, with an
/// unspecified IP (0.0.0.0, ::) replaced by loopback.
fn forward_target(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, listen.port()))
        }
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, listen.port()))
        }
        _ => listen,
    }
}

/// End the records of sandboxes this process does not run.
async fn end_leftover_records(state: &AppState, reason: &str) {
    let store = &state.server.store;
    match store.sandboxes_due(i64::MAX).await {
        Ok(live) => {
            for s in live.into_iter().filter(|s| state.node.get(&s.id).is_err()) {
                let _ = store.end_sandbox(&s.id, crate::ids::now_ms(), reason).await;
            }
        }
        Err(e) => tracing::warn!("cannot list sandbox records: {e}"),
    }
}
