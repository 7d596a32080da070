//! `lizard server`: the control plane and, in the default single-machine mode, the node
//! in the same process.
//!
//! Every listener is bound before anything else: a taken port fails the start before the
//! very first start creates the owner and prints its key (shown once). Then the store
//! opens, the node starts, and the background jobs (metering, timeouts) run beside the
//! API and the sandbox-URL proxy until shutdown.
//!
//! On shutdown the node kills running sandboxes and their records are ended ("server
//! stopped"). A crashed process's running sandboxes run on in their VMM processes: the
//! next start takes them back, billed from the last metering tick; those it cannot take
//! back are ended ("lost: the server restarted") and their meters closed at that tick.

use crate::nodes::Nodes;
use crate::ops;
use crate::{ServerConfig, ServerError};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;

/// What `lizard server` runs.
pub struct RunOptions {
    pub server: ServerConfig,
    pub node: lizard_node::NodeConfig,
    /// Where the sandbox-URL proxy listens (`None`: no proxy).
    pub proxy_listen: Option<SocketAddr>,
    /// Bounds of the sandbox-URL proxy's listener.
    pub proxy_limits: crate::proxy::Limits,
}

async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Io { context: format!("bind the {what} on {addr}"), source })
}

/// Serve the API until `shutdown` resolves; print `LIZARD_API_KEY=<key>` on stdout on the
/// very first start.
pub async fn run(
    opts: RunOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let listener = bind(opts.server.listen, "API").await?;
    let proxy_listener = match opts.proxy_listen {
        Some(addr) => Some(bind(addr, "sandbox-URL proxy").await?),
        None => None,
    };
    let server = crate::open(opts.server).await?;
    if let Some(key) = server.initial_key() {
        println!("LIZARD_API_KEY={key}");
    }
    let mut node_config = opts.node;
    // Guests reach this API through their agent (they have no route to the host).
    if let Ok(addr) = listener.local_addr() {
        node_config.api_forward = Some(forward_target(addr));
    }
    let node = lizard_node::Node::start(node_config).await.map_err(|e| ServerError::Io {
        context: "start the node".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let state = server.app_state(Nodes::local(node.clone()));
    // Before any record is ended below or any sandbox starts: a VM that dies is ended at once.
    let node_events = ops::node_events::follow(&state);
    // Sandboxes a dead process left running were billed up to its last metering tick:
    // close their meters there (never billing its downtime), then end their records —
    // unless the node took their VMs back (they ran all along and are billed on).
    let taken_back: Vec<String> = node
        .list()
        .into_iter()
        .filter(|s| s.state == lizard_api::SandboxState::Running)
        .map(|s| s.sandbox_id)
        .collect();
    match state.server.store.close_meters_at_watermark(&taken_back).await {
        Ok(0) => {}
        Ok(n) => tracing::warn!(sandboxes = n, "closed the meters of sandboxes a previous process left running"),
        Err(e) => tracing::warn!("cannot close leftover meters: {e}"),
    }
    ops::sandboxes::end_unrun(&state, "lost: the server restarted").await;
    // A VM the node took back whose create the dead process never recorded (it died
    // in between) would run unbilled: it goes.
    for unrecorded in node.list().into_iter().map(|s| s.sandbox_id) {
        match state.server.store.get_sandbox(&unrecorded).await {
            Ok(Some(record)) if record.is_live() => {}
            Ok(_) => {
                tracing::warn!(id = %unrecorded, "killing a sandbox the previous process left unrecorded or ended");
                let _ = node.kill(&unrecorded).await;
            }
            Err(e) => tracing::warn!(id = %unrecorded, "cannot check the record of a sandbox taken back: {e}"),
        }
    }
    ops::templates::fail_unfinished(&state).await;
    match state.server.store.release_stale_attachments().await {
        Ok(0) => {}
        Ok(n) => tracing::info!(n, "released volumes held by sandboxes that no longer run"),
        Err(e) => tracing::warn!("cannot release stale volume attachments: {e}"),
    }
    let metering = tokio::spawn(crate::billing::run_metering(
        state.server.store.clone(),
        state.server.config.billing.clone(),
        Arc::new(ops::hooks::BillingPauser(state.clone())),
    ));
    tracing::info!("API on http://{}", listener.local_addr().map(|a| a.to_string()).unwrap_or_default());
    let reaper = tokio::spawn(ops::timeouts::reap_expired(state.clone()));
    // One shutdown signal for both listeners.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let proxy = proxy_listener.map(|l| {
        if let Ok(addr) = l.local_addr() {
            tracing::info!(
                "sandbox URLs on http://*.{}:{}",
                state.server.config.sandbox_domain(&state.server.config.region),
                addr.port()
            );
        }
        tokio::spawn(crate::proxy::serve(l, state.clone(), opts.proxy_limits, stopped(stop_rx.clone())))
    });
    let router = crate::build_router(state.clone(), crate::api::all_routes());
    let result = crate::serve_within(listener, router, stopped(stop_rx), &state.server.config.traffic).await;
    if let Some(p) = proxy {
        let _ = p.await;
    }
    reaper.abort();
    metering.abort();
    node_events.iter().for_each(|t| t.abort());
    // Builds in flight stop with the node (their VMs, layers and networks go).
    state.builds.cancel_all();
    node.shutdown().await;
    ops::sandboxes::end_unrun(&state, "server stopped").await;
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
