//! `lizard server`: the control plane and, in the default single-machine mode, the node
//! in the same process.
//!
//! Every listener is bound before anything else: a taken port fails the start before the
//! very first start creates the owner and prints its key (shown once). Then the store
//! opens, the node starts, and the background jobs (metering, timeouts) run beside the
//! API (with the web console's pages beside it), the sandbox-URL proxy and the operator's
//! metrics listener until shutdown.
//!
//! With `--no-local-node` there is no node in the process: sandboxes run on nodes that
//! join (`lizard node join`). The background jobs that must run once across replicas
//! (metering, timeouts, node-lease expiry) each run on the replica holding their lease
//! ([`crate::cluster::leader`]); a clean shutdown hands the leases over at once.
//!
//! On shutdown the node kills running sandboxes and their records are ended ("server
//! stopped"). A crashed process's running sandboxes run on in their VMM processes: the
//! next start takes them back, billed from the last metering tick; those it cannot take
//! back are ended ("lost: the server restarted") and their meters closed at that tick.

use crate::cluster::{self, leader};
use crate::ops;
use crate::state::AppState;
use crate::{ServerConfig, ServerError};
use lizard_node_client::Nodes;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// What `lizard server` runs.
pub struct RunOptions {
    pub server: ServerConfig,
    pub node: lizard_node::NodeConfig,
    /// Where the sandbox-URL proxy listens (`None`: no proxy).
    pub proxy_listen: Option<SocketAddr>,
    /// Where the sandbox-URL proxy also listens over TLS, and its certificate (`None`: no
    /// TLS listener).
    pub proxy_tls: Option<ProxyTls>,
    /// Bounds of the sandbox-URL proxy's listener.
    pub proxy_limits: crate::proxy::Limits,
    /// Run the in-process node (`false`: `--no-local-node`, remote nodes only; `node` is
    /// then unused).
    pub local_node: bool,
    /// How this server reaches remote nodes (`None`: over their HTTP API, with
    /// [`lizard_node_client::remote::HttpConnector`]; tests put fakes here).
    pub node_connector: Option<Arc<dyn lizard_node_client::NodeConnector>>,
    /// The protocols served in front of the operations besides `/v1` (`lizard server`
    /// installs E2B's).
    pub faces: crate::state::Faces,
}

/// The sandbox-URL proxy's TLS listener.
#[derive(Debug, Clone)]
pub struct ProxyTls {
    pub listen: SocketAddr,
    pub files: crate::proxy::tls::TlsFiles,
}

async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|cause| ServerError::Io { context: format!("bind the {what} on {addr}"), cause })
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
    let proxy_tls_listener = match &opts.proxy_tls {
        Some(tls) => Some((bind(tls.listen, "sandbox-URL TLS proxy").await?, crate::proxy::tls::acceptor(&tls.files)?)),
        None => None,
    };
    let metrics_listener = match &opts.server.metrics {
        Some(m) => Some((bind(m.addr, "metrics").await?, m.token.clone())),
        None => None,
    };
    let server = crate::open(opts.server).await?.with_faces(opts.faces);
    if let Some(key) = server.initial_key() {
        println!("LIZARD_API_KEY={key}");
    }
    let store = server.state().store.clone();
    let key = crate::cluster::credentials::load_key(store.as_ref()).await?;
    let node = if opts.local_node {
        let mut node_config = opts.node;
        // Guests reach this API through their agent (they have no route to the host).
        if let Ok(addr) = listener.local_addr() {
            node_config.api_forward = Some(forward_target(addr));
        }
        Some(lizard_node::Node::start(node_config).await.map_err(|e| ServerError::Io {
            context: "start the node".into(),
            cause: std::io::Error::other(e.to_string()),
        })?)
    } else {
        tracing::info!("no in-process node (--no-local-node): sandboxes run on nodes that join");
        None
    };
    let nodes = node.as_ref().map_or_else(Nodes::none, |n| Nodes::local(n.clone()));
    let state = server.app_state(nodes.with_remote(
        key,
        Some(opts.node_connector.unwrap_or_else(|| Arc::new(lizard_node_client::remote::HttpConnector))),
    ));
    // Before any record is ended below or any sandbox starts: a VM that dies is ended at once.
    let node_events = ops::node_events::follow(&state);
    if let Some(node) = &node {
        take_back(&state, node).await;
    }
    ops::templates::fail_unfinished(&state).await;
    ops::services::fail_interrupted(&state).await;
    match state.server.store.release_stale_attachments().await {
        Ok(0) => {}
        Ok(n) => tracing::info!(n, "released volumes held by sandboxes that no longer run"),
        Err(e) => tracing::warn!("cannot release stale volume attachments: {e}"),
    }
    let jobs = leader_jobs(&state);
    tracing::info!("API on http://{}", listener.local_addr().map(|a| a.to_string()).unwrap_or_default());
    // One shutdown signal for every listener.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let console = lizard_console::Settings {
        sandbox_url_port: proxy_listener.as_ref().and_then(|l| l.local_addr().ok()).map(|a| a.port()),
    };
    let sandbox_domain = state.server.config.sandbox_domain(&state.server.config.region);
    let proxies: Vec<_> = proxy_listener
        .map(|l| (l, None))
        .into_iter()
        .chain(proxy_tls_listener.map(|(l, acceptor)| (l, Some(acceptor))))
        .map(|(l, tls)| {
            if let Ok(addr) = l.local_addr() {
                let scheme = if tls.is_some() { "https" } else { "http" };
                tracing::info!("sandbox URLs on {scheme}://*.{sandbox_domain}:{}", addr.port());
            }
            tokio::spawn(crate::proxy::serve(l, state.clone(), opts.proxy_limits, tls, stopped(stop_rx.clone())))
        })
        .collect();
    let metrics = metrics_listener.map(|(l, token)| {
        if let Ok(addr) = l.local_addr() {
            tracing::info!("metrics on http://{addr}{}", crate::scrape::METRICS_PATH);
        }
        let router = crate::scrape::router(state.clone(), token);
        let limits = state.server.config.traffic.clone();
        let stop = stopped(stop_rx.clone());
        tokio::spawn(async move {
            crate::connections::serve(l, router, stop, &limits).await;
            Ok(())
        })
    });
    // The web console's pages need no key; every call they make is the API's, with one.
    let api = state.server.faces.routes(crate::api::all_routes());
    let router = crate::build_router(state.clone(), api).merge(lizard_console::router(console));
    let result = crate::serve_within(listener, router, stopped(stop_rx), &state.server.config.traffic).await;
    for task in proxies.into_iter().chain(metrics) {
        let _ = task.await;
    }
    for (lease, task) in jobs {
        task.abort();
        // Another replica takes the job over at once, not a lease later.
        lease.release().await;
    }
    node_events.iter().for_each(|t| t.abort());
    // Builds in flight stop with the node (their VMs, layers and networks go).
    state.builds.cancel_all();
    if let Some(node) = node {
        node.shutdown().await;
        ops::sandboxes::end_unrun(&state, "server stopped").await;
    }
    result
}

/// The in-process node's sandboxes after a restart. Sandboxes a dead process left running
/// were billed up to its last metering tick: close their meters there (never billing its
/// downtime), then end their records — unless the node took their VMs back (they ran all
/// along and are billed on). Remote nodes' sandboxes are not this process's to judge.
async fn take_back(state: &AppState, node: &Arc<lizard_node::Node>) {
    if let Err(e) = crate::placement::register_home_node(state).await {
        tracing::warn!("cannot record the in-process node: {}", e.0.message);
    }
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
    ops::sandboxes::end_unrun(state, "lost: the server restarted").await;
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
}

/// The jobs that run once across replicas, each on the replica holding its lease: the
/// metering tick, the timeout reaper, node-lease expiry, the service reconciler.
fn leader_jobs(state: &AppState) -> Vec<(leader::Lease, tokio::task::JoinHandle<()>)> {
    let store = state.server.store.clone();
    let replica = state.server.config.cluster.replica_id.clone();
    let second = Duration::from_secs(1);
    let billing = state.server.config.billing.clone();
    let pauser: Arc<dyn crate::billing::SandboxPauser> = Arc::new(ops::hooks::BillingPauser(state.clone()));
    let metering = {
        let (store, billing, telemetry) = (store.clone(), billing.clone(), state.server.telemetry.clone());
        leader::run_as_leader(store.clone(), leader::METERING, replica.clone(), billing.tick, move || {
            let (store, billing, pauser, telemetry) =
                (store.clone(), billing.clone(), pauser.clone(), telemetry.clone());
            async move {
                let started = std::time::Instant::now();
                crate::billing::meter_once(store.as_ref(), &billing, pauser.as_ref(), lizard_api::ids::now_ms()).await;
                telemetry.billing_tick(started.elapsed());
            }
        })
    };
    let timeouts = {
        let state = state.clone();
        leader::run_as_leader(store.clone(), leader::TIMEOUTS, replica.clone(), second, move || {
            let state = state.clone();
            async move { ops::timeouts::reap_once(&state).await }
        })
    };
    let expiry = {
        let (store, lease_ms) = (store.clone(), state.server.config.cluster.lease_ms);
        leader::run_as_leader(store.clone(), leader::NODE_EXPIRY, replica.clone(), second, move || {
            let store = store.clone();
            async move {
                if let Err(e) = cluster::expiry::expire_once(store.as_ref(), lizard_api::ids::now_ms(), lease_ms).await
                {
                    tracing::warn!("node-lease expiry: {e}");
                }
            }
        })
    };
    let services = {
        let state = state.clone();
        leader::run_as_leader(store.clone(), leader::SERVICES, replica.clone(), second, move || {
            let state = state.clone();
            async move { ops::services::reconcile::reconcile_once(&state).await }
        })
    };
    let lease =
        |name, period: Duration| leader::Lease::new(store.clone(), name, replica.clone(), period * leader::TTL_PERIODS);
    vec![
        (lease(leader::METERING, billing.tick), tokio::spawn(metering)),
        (lease(leader::TIMEOUTS, second), tokio::spawn(timeouts)),
        (lease(leader::NODE_EXPIRY, second), tokio::spawn(expiry)),
        (lease(leader::SERVICES, second), tokio::spawn(services)),
    ]
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
