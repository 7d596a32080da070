//! The server's own Prometheus metrics: what the code records as it runs (API requests by
//! route template, operation latencies, metering ticks) and the gauges a scrape fills in
//! from the store and the nodes' reports ([`crate::prometheus`] does that and serves them).
//!
//! Label values come from bounded sets only: a route's template (`/v1/sandboxes/{id}`,
//! never the raw path; requests no route matched share `unmatched`), a known HTTP method or
//! `OTHER`, the status code, an [`Operation`], a node's id and state. A client cannot
//! create series by inventing paths.

use axum::http::Method;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

/// The route label of a request that matched no route.
pub const UNMATCHED_ROUTE: &str = "unmatched";

/// What a sandbox operation's latency is recorded under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// A create: placement, the node's restore of the template snapshot (or cold boot), the record.
    Create,
    /// A buffered or streamed exec, from the request to the command's end.
    Exec,
    Pause,
    /// A resume: the node restores the paused VM.
    Resume,
    Fork,
    Kill,
}

impl Operation {
    fn label(self) -> &'static str {
        match self {
            Operation::Create => "create",
            Operation::Exec => "exec",
            Operation::Pause => "pause",
            Operation::Resume => "resume",
            Operation::Fork => "fork",
            Operation::Kill => "kill",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    method: &'static str,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
    method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: &'static str,
    outcome: &'static str,
}

/// A sandbox state's label (`running`, `paused`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: &'static str,
}

/// A node's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    pub node: String,
    pub region: String,
}

/// A node's labels with its state (`up`, `draining`, `down`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeStateLabels {
    pub node: String,
    pub state: &'static str,
}

type Seconds = Histogram;

fn latency_histogram() -> Seconds {
    // 5 ms … 82 s: an exec of `true` to a cold boot under TCG.
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

fn tick_histogram() -> Seconds {
    // 1 ms … 8 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 14))
}

/// The gauges a scrape fills in (see [`crate::prometheus`]); cleared and refilled each
/// time, so a node that is gone leaves no stale series.
#[derive(Default)]
pub struct ScrapeGauges {
    pub sandboxes: Family<StateLabels, Gauge>,
    pub node_state: Family<NodeStateLabels, Gauge>,
    pub node_capacity_vcpus: Family<NodeLabels, Gauge>,
    pub node_capacity_memory_bytes: Family<NodeLabels, Gauge>,
    pub node_capacity_disk_bytes: Family<NodeLabels, Gauge>,
    pub node_used_vcpus: Family<NodeLabels, Gauge>,
    pub node_used_memory_bytes: Family<NodeLabels, Gauge>,
    pub node_sandboxes: Family<NodeLabels, Gauge>,
    pub node_heartbeat_age_seconds: Family<NodeLabels, Gauge<f64, AtomicU64>>,
    pub billing_lag_seconds: Gauge<f64, AtomicU64>,
}

/// The registry and every metric in it. One per server process.
pub struct Telemetry {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    request_seconds: Family<RouteLabels, Seconds>,
    operations: Family<OperationLabels, Seconds>,
    billing_tick_seconds: Seconds,
    /// Filled in by a scrape.
    pub gauges: ScrapeGauges,
}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry::new()
    }
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

impl Telemetry {
    pub fn new() -> Telemetry {
        let mut registry = Registry::with_prefix("lizard");
        let requests = Family::<RequestLabels, Counter>::default();
        let request_seconds = Family::<RouteLabels, Seconds>::new_with_constructor(latency_histogram as fn() -> _);
        let operations = Family::<OperationLabels, Seconds>::new_with_constructor(latency_histogram as fn() -> _);
        let billing_tick_seconds = tick_histogram();
        let gauges = ScrapeGauges::default();
        registry.register(
            "http_requests",
            "API requests answered, by route template, method and status",
            requests.clone(),
        );
        registry.register_with_unit(
            "http_request_duration",
            "Time to the API's answer (its head: a streamed body may go on), by route template and method",
            Unit::Seconds,
            request_seconds.clone(),
        );
        registry.register_with_unit(
            "operation_duration",
            "Sandbox operations' latency (create: placement, snapshot restore or boot, record; resume: the \
             paused VM's restore), by outcome",
            Unit::Seconds,
            operations.clone(),
        );
        registry.register_with_unit(
            "billing_tick_duration",
            "Metering ticks run by this replica (the leader's job)",
            Unit::Seconds,
            billing_tick_seconds.clone(),
        );
        registry.register_with_unit(
            "billing_lag",
            "How long ago the least recently billed running sandbox was billed up to (the metering \
             tick's lag; about one tick when healthy, 0 with nothing running)",
            Unit::Seconds,
            gauges.billing_lag_seconds.clone(),
        );
        registry.register("sandboxes", "Live sandboxes of every account, by state", gauges.sandboxes.clone());
        registry.register("node_state", "1 for each node's current state", gauges.node_state.clone());
        // Each node's report, one gauge per figure: (name, unit, help, family).
        for (name, unit, help, family) in [
            ("node_capacity_vcpus", None, "vCPUs a node admits (its CPUs × overcommit)", &gauges.node_capacity_vcpus),
            (
                "node_capacity_memory",
                Some(Unit::Bytes),
                "Guest memory a node admits",
                &gauges.node_capacity_memory_bytes,
            ),
            (
                "node_capacity_disk",
                Some(Unit::Bytes),
                "Free space in a node's data directory",
                &gauges.node_capacity_disk_bytes,
            ),
            ("node_used_vcpus", None, "vCPUs of a node's running sandboxes", &gauges.node_used_vcpus),
            (
                "node_used_memory",
                Some(Unit::Bytes),
                "Guest memory of a node's running sandboxes",
                &gauges.node_used_memory_bytes,
            ),
            ("node_sandboxes", None, "Sandboxes a node runs or keeps paused", &gauges.node_sandboxes),
        ] {
            let help = format!("{help}, as of its last report");
            match unit {
                Some(unit) => registry.register_with_unit(name, help, unit, family.clone()),
                None => registry.register(name, help, family.clone()),
            }
        }
        registry.register_with_unit(
            "node_heartbeat_age",
            "Time since a joined node's last heartbeat (the in-process node has none)",
            Unit::Seconds,
            gauges.node_heartbeat_age_seconds.clone(),
        );
        Telemetry { registry, requests, request_seconds, operations, billing_tick_seconds, gauges }
    }

    /// Count an answered API request. `route` is the matched route's template, `None` when
    /// no route matched.
    pub fn request(&self, route: Option<&str>, method: &Method, status: u16, elapsed: Duration) {
        let route = route.unwrap_or(UNMATCHED_ROUTE).to_owned();
        let method = method_label(method);
        self.requests.get_or_create(&RequestLabels { route: route.clone(), method, status }).inc();
        self.request_seconds.get_or_create(&RouteLabels { route, method }).observe(elapsed.as_secs_f64());
    }

    /// Record one operation's latency and whether it succeeded.
    pub fn operation(&self, op: Operation, ok: bool, elapsed: Duration) {
        let labels = OperationLabels { operation: op.label(), outcome: if ok { "ok" } else { "error" } };
        self.operations.get_or_create(&labels).observe(elapsed.as_secs_f64());
    }

    /// Run `work` and record its latency under `op`.
    pub async fn timed<T, E>(
        &self,
        op: Operation,
        work: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let started = Instant::now();
        let result = work.await;
        self.operation(op, result.is_ok(), started.elapsed());
        result
    }

    /// Record one metering tick's duration.
    pub fn billing_tick(&self, elapsed: Duration) {
        self.billing_tick_seconds.observe(elapsed.as_secs_f64());
    }

    /// Everything in the text exposition format (OpenMetrics).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// A known method's name, `OTHER` for any other (methods are client input too).
fn method_label(method: &Method) -> &'static str {
    match method.as_str() {
        "GET" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        _ => "OTHER",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_labelled_by_template_and_unknown_methods_fold_into_other() {
        let t = Telemetry::new();
        t.request(Some("/v1/sandboxes/{id}"), &Method::GET, 200, Duration::from_millis(3));
        t.request(Some("/v1/sandboxes/{id}"), &Method::GET, 200, Duration::from_millis(3));
        t.request(None, &Method::from_bytes(b"BREW").unwrap(), 404, Duration::from_millis(1));
        let text = t.encode();
        assert!(
            text.contains(r#"lizard_http_requests_total{route="/v1/sandboxes/{id}",method="GET",status="200"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"lizard_http_requests_total{route="unmatched",method="OTHER",status="404"} 1"#),
            "{text}"
        );
    }

    #[tokio::test]
    async fn an_operation_is_timed_with_its_outcome() {
        let t = Telemetry::new();
        let ok: Result<(), ()> = t.timed(Operation::Pause, async { Ok(()) }).await;
        assert!(ok.is_ok());
        let _ = t.timed(Operation::Create, async { Err::<(), _>("no room") }).await;
        let text = t.encode();
        assert!(
            text.contains(r#"lizard_operation_duration_seconds_count{operation="pause",outcome="ok"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"lizard_operation_duration_seconds_count{operation="create",outcome="error"} 1"#),
            "{text}"
        );
    }
}
