//! `GET /metrics`, the operator's Prometheus endpoint, on a listener of its own
//! (`lizard server --metrics-listen ADDR`; off by default) and never on the API's: tenants'
//! keys reach the API, and these numbers are about every account and node. With a token
//! configured (`--metrics-token`, read from the environment) a scrape must also send
//! `Authorization: Bearer <token>` (compared in constant time).
//!
//! Each scrape fills the [`ScrapeGauges`] from the store and the nodes' reports, then
//! encodes [`Telemetry`] in the text format: sandboxes by state (from their meters), every
//! node's state, capacity and use (the in-process node's now, joined nodes' from their
//! last heartbeat), and the billing lag.

use crate::cluster::operator;
use crate::error::ApiResult;
use crate::state::AppState;
use crate::telemetry::{NodeLabels, NodeStateLabels, ScrapeGauges, StateLabels, Telemetry};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use lizard_store::cluster::node_state_name;
use lizard_store::MeterState;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The path the metrics are served at.
pub const METRICS_PATH: &str = "/metrics";

/// The content type of the text format [`Telemetry::encode`] writes (OpenMetrics, which
/// Prometheus reads).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

const MIB: i64 = 1 << 20;

#[derive(Clone)]
struct MetricsState {
    app: AppState,
    token: Option<Arc<str>>,
    /// One scrape at a time fills and reads the gauges.
    scraping: Arc<tokio::sync::Mutex<()>>,
}

/// The metrics listener's router: `GET /metrics` and 404 for anything else.
pub fn router(app: AppState, token: Option<String>) -> Router {
    let state = MetricsState { app, token: token.map(Arc::from), scraping: Arc::default() };
    Router::new().route(METRICS_PATH, get(metrics)).with_state(state)
}

async fn metrics(State(state): State<MetricsState>, headers: HeaderMap) -> Response {
    if let Some(token) = &state.token {
        let sent = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !bool::from(sent.as_bytes().ct_eq(token.as_bytes())) {
            return (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], "a metrics token is required\n")
                .into_response();
        }
    }
    let _one = state.scraping.lock().await;
    let telemetry = &state.app.server.telemetry;
    if let Err(e) = refresh(&state.app, telemetry).await {
        tracing::warn!("metrics scrape: {}", e.0.message);
        return (StatusCode::SERVICE_UNAVAILABLE, "the store cannot be read\n").into_response();
    }
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], telemetry.encode()).into_response()
}

/// Fill the scrape gauges from the store and the nodes.
async fn refresh(state: &AppState, telemetry: &Telemetry) -> ApiResult<()> {
    let mut meters = state.server.store.open_meters(None).await?;
    // Sandboxes only: a running template build is metered too.
    meters.retain(|m| !crate::ops::templates::is_build_id(&m.sandbox_id));
    let nodes = operator::current(state).await?;
    let now = lizard_api::ids::now_ms();
    let g: &ScrapeGauges = &telemetry.gauges;
    let count = |s: MeterState| i64::try_from(meters.iter().filter(|m| m.state == s).count()).unwrap_or(i64::MAX);
    g.sandboxes.get_or_create(&StateLabels { state: "running" }).set(count(MeterState::Running));
    g.sandboxes.get_or_create(&StateLabels { state: "paused" }).set(count(MeterState::Paused));
    let oldest = meters.iter().filter(|m| m.state == MeterState::Running).filter_map(|m| m.billed_until).min();
    g.billing_lag_seconds.set(oldest.map_or(0.0, |at| ms_to_secs(now - at)));

    for family in [
        &g.node_capacity_vcpus,
        &g.node_capacity_memory_bytes,
        &g.node_capacity_disk_bytes,
        &g.node_used_vcpus,
        &g.node_used_memory_bytes,
        &g.node_sandboxes,
    ] {
        family.clear();
    }
    g.node_state.clear();
    g.node_heartbeat_age_seconds.clear();
    for node in nodes {
        let labels = NodeLabels { node: node.id.clone(), region: node.region.clone() };
        let (capacity, usage) = (&node.report.capacity, &node.report.usage);
        let set = |family: &Family<NodeLabels, Gauge>, v: i64| {
            family.get_or_create(&labels).set(v);
        };
        set(&g.node_capacity_vcpus, i64::from(capacity.vcpus));
        set(&g.node_capacity_memory_bytes, mib_to_bytes(capacity.memory_mib));
        set(&g.node_capacity_disk_bytes, mib_to_bytes(capacity.disk_gib.saturating_mul(1024)));
        set(&g.node_used_vcpus, i64::from(usage.vcpus));
        set(&g.node_used_memory_bytes, mib_to_bytes(usage.memory_mib));
        set(&g.node_sandboxes, i64::from(usage.sandboxes));
        g.node_state
            .get_or_create(&NodeStateLabels { node: node.id.clone(), state: node_state_name(node.state) })
            .set(1);
        if let Some(at) = node.last_heartbeat {
            g.node_heartbeat_age_seconds.get_or_create(&labels).set(ms_to_secs(now - at));
        }
    }
    Ok(())
}

fn mib_to_bytes(mib: u64) -> i64 {
    i64::try_from(mib).unwrap_or(i64::MAX).saturating_mul(MIB)
}

#[allow(clippy::cast_precision_loss)] // milliseconds as seconds: precision to spare
fn ms_to_secs(ms: i64) -> f64 {
    ms.max(0) as f64 / 1000.0
}
