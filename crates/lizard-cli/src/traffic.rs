//! `lizard server`'s flags for what clients may take of it: per key (request rate,
//! requests in flight), per listener (connections, header and body read times), and the
//! sandbox output the server holds for them, and the disk an account's volumes may take.

use clap::Args;
use lizard_server::config::TrafficLimits;
use std::time::Duration;

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Client limits")]
pub struct TrafficOpts {
    /// Requests per second one API key may make, sustained (429 RATE_LIMITED past it).
    #[arg(long, value_name = "N", default_value_t = TrafficLimits::default().rate_per_sec)]
    pub rate_limit: u32,
    /// Requests one API key may make in a burst above its rate.
    #[arg(long, value_name = "N", default_value_t = TrafficLimits::default().burst)]
    pub rate_burst: u32,
    /// Requests of one API key served at the same time (429 RATE_LIMITED past it).
    #[arg(long, value_name = "N", default_value_t = TrafficLimits::default().concurrent_per_key)]
    pub key_concurrency: u32,
    /// Connections each listener (API, sandbox-URL proxy) holds at once.
    #[arg(long, value_name = "N", default_value_t = TrafficLimits::default().max_connections)]
    pub max_connections: usize,
    /// Milliseconds a client may take to send a request's head; idle keep-alive
    /// connections are closed after the same time.
    #[arg(long, value_name = "MS", default_value_t = millis(TrafficLimits::default().header_read))]
    pub header_read_timeout_ms: u64,
    /// Milliseconds a client may take to send a JSON request body.
    #[arg(long, value_name = "MS", default_value_t = millis(TrafficLimits::default().body_read))]
    pub body_read_timeout_ms: u64,
    /// MiB of sandbox output the server holds at once for calls that must collect it
    /// (non-streamed execs, code executions' lines), all sandboxes together; one sandbox
    /// gets a quarter. A call past it gets 503 UNAVAILABLE (an exec) or an error event.
    #[arg(long, value_name = "MIB", default_value_t = TrafficLimits::default().guest_buffer_bytes >> 20)]
    pub guest_buffer_mib: usize,
    /// Template builds (pushes, service versions) one workspace may have queued or
    /// running at once; a push past it gets 409 CONFLICT.
    #[arg(long, value_name = "N", default_value_t = TrafficLimits::default().builds_per_workspace)]
    pub builds_per_workspace: u32,
    /// GiB of volumes one account may hold, all its workspaces together; a create past
    /// it gets 403 QUOTA_EXCEEDED. (`PATCH /v1/workspaces/{id}` sets a workspace's own.)
    #[arg(long, value_name = "GB", default_value_t = TrafficLimits::default().volume_gb_per_account)]
    pub volume_quota_gb: u32,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl TrafficOpts {
    pub fn limits(&self) -> TrafficLimits {
        TrafficLimits {
            rate_per_sec: self.rate_limit.max(1),
            burst: self.rate_burst.max(1),
            concurrent_per_key: self.key_concurrency.max(1),
            max_connections: self.max_connections.max(1),
            header_read: Duration::from_millis(self.header_read_timeout_ms.max(1)),
            body_read: Duration::from_millis(self.body_read_timeout_ms.max(1)),
            guest_buffer_bytes: self.guest_buffer_mib.max(1).saturating_mul(1 << 20),
            builds_per_workspace: self.builds_per_workspace.max(1),
            volume_gb_per_account: self.volume_quota_gb,
        }
    }
}
