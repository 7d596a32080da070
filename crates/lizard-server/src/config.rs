//! The server's settings: plain data, no machinery, so a CLI can fill it from flags and a
//! file, and tests from a temp directory.

use lizard_api::Region;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Settings of a control-plane server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Where the HTTP API listens.
    pub listen: SocketAddr,
    /// Holds `lizard.db` (and whatever else the server keeps).
    pub data_dir: PathBuf,
    /// Where the state lives (`--database`): `None` is SQLite in [`Self::data_dir`];
    /// `sqlite:///path/lizard.db` another SQLite file; `postgres://…` a PostgreSQL server
    /// shared by replicas. See [`lizard_store::database`].
    pub database: Option<lizard_store::database::DatabaseUrl>,
    /// The region this server places sandboxes in.
    pub region: String,
    /// Public sandbox URLs are `{id}-{port}.sandbox.{region}.{domain}`.
    pub domain: String,
    /// The port public URLs name (the sandbox-URL proxy's, unless a front serves them on
    /// 80); `None`: none.
    pub public_proxy_port: Option<u16>,
    /// The port of the sandbox-URL listener's TLS mode (`--proxy-tls-listen`), when it has
    /// one: public URLs are then `https` on it.
    pub public_proxy_tls_port: Option<u16>,
    /// What `GET /v1/regions` lists. Empty: just [`Self::region`].
    pub regions: Vec<Region>,
    /// The owner account's email, set on first start.
    pub owner_email: String,
    /// The owner account's plan, set on first start.
    pub owner_plan: String,
    /// Prices, free credits, metering tick and the grace period at zero balance.
    pub billing: crate::billing::BillingConfig,
    /// How long a paused sandbox is kept before it is killed.
    pub paused_retention_ms: u64,
    /// What one key, one connection and all clients together may take of the server.
    pub traffic: TrafficLimits,
    /// Nodes' heartbeats and leases, and this replica's name for leader leases.
    pub cluster: ClusterConfig,
    /// Whether pushed files are also kept in the store for other replicas
    /// (`--share-pushed-files`); see [`BlobSharing`] and [`Self::shares_blobs`].
    pub blob_sharing: BlobSharing,
    /// The operator's Prometheus endpoint (`--metrics-listen`): `None` serves none.
    pub metrics: Option<MetricsListen>,
}

/// Where `GET /metrics` is served ([`crate::scrape`]): a listener apart from the API's,
/// optionally behind a bearer token.
#[derive(Clone, PartialEq, Eq)]
pub struct MetricsListen {
    pub addr: SocketAddr,
    /// The token a scrape must send as `Authorization: Bearer …`; `None`: the listener's
    /// address is the only protection (keep it on loopback or a private network).
    pub token: Option<String>,
}

impl std::fmt::Debug for MetricsListen {
    /// Never the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsListen")
            .field("addr", &self.addr)
            .field("token", &self.token.as_ref().map(|_| "…"))
            .finish()
    }
}

/// Whether a server keeps pushed files' content in the store as well as on its disk, so
/// that any replica can serve any call of a push (behind a load balancer the upload and
/// the push may reach different replicas). It costs the store the files' size; a single
/// server on SQLite (the embedded default) needs only its disk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BlobSharing {
    /// On with PostgreSQL (replicas), off with SQLite.
    #[default]
    Auto,
    /// Always (e.g. several servers on one SQLite file of a shared disk).
    On,
    /// Never (e.g. replicas whose data directories are one shared file system).
    Off,
}

/// Many machines: how often nodes heartbeat, how long until a silent one is down, and
/// who this replica is when it contends for leader leases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// How often a node heartbeats (`--node-heartbeat-ms`).
    pub heartbeat_ms: u64,
    /// How long without a heartbeat before a node is down (`--node-lease-ms`).
    pub lease_ms: u64,
    /// This replica's holder name in leader leases (`--replica-id`; default random).
    pub replica_id: String,
}

/// Default [`ClusterConfig::heartbeat_ms`].
pub const DEFAULT_NODE_HEARTBEAT_MS: u64 = 2_000;
/// Default [`ClusterConfig::lease_ms`].
pub const DEFAULT_NODE_LEASE_MS: u64 = 10_000;

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            heartbeat_ms: DEFAULT_NODE_HEARTBEAT_MS,
            lease_ms: DEFAULT_NODE_LEASE_MS,
            replica_id: lizard_api::ids::new_id("replica"),
        }
    }
}

/// Limits on clients: per key (request rate, requests in flight) and per listener
/// (connections, how long a request's head and body may take to arrive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrafficLimits {
    /// Requests per second one key may make, sustained (its token bucket's refill).
    pub rate_per_sec: u32,
    /// Requests one key may make at once above the rate (the bucket's size).
    pub burst: u32,
    /// Requests of one key being served at the same time.
    pub concurrent_per_key: u32,
    /// Connections one listener holds at once; more wait to be accepted.
    pub max_connections: usize,
    /// How long a client may take to send a request's head — also how long an idle
    /// keep-alive connection is kept (slowloris clients are cut off after it).
    pub header_read: std::time::Duration,
    /// How long a client may take to send a JSON request body.
    pub body_read: std::time::Duration,
    /// Bytes of guest-decided data (non-streamed exec output, code-service lines) the
    /// server holds at once, all sandboxes together ([`crate::guest_buffers`]).
    pub guest_buffer_bytes: usize,
    /// Template builds one workspace may have queued or running at once.
    pub builds_per_workspace: u32,
    /// GiB of volumes one account may hold, all its workspaces together (a workspace's
    /// own quota, set by the account, may bound it further).
    pub volume_gb_per_account: u32,
}

impl Default for TrafficLimits {
    /// Far above what a client, the SDK suites or the test suite do, far below what
    /// exhausts the server.
    fn default() -> Self {
        TrafficLimits {
            rate_per_sec: 100,
            burst: 1000,
            concurrent_per_key: 256,
            max_connections: 2048,
            header_read: std::time::Duration::from_secs(30),
            body_read: std::time::Duration::from_secs(60),
            guest_buffer_bytes: crate::guest_buffers::DEFAULT_TOTAL_BYTES,
            builds_per_workspace: 4,
            volume_gb_per_account: 100,
        }
    }
}

/// Default [`ServerConfig::paused_retention_ms`]: 7 days.
pub const DEFAULT_PAUSED_RETENTION_MS: u64 = 7 * 24 * 60 * 60 * 1000;

/// Default listen address: loopback only, since the API is reachable by key alone.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7171";

impl ServerConfig {
    /// Defaults for everything but the data directory: region `local`, domain
    /// `lizard.localhost` (resolves to loopback without DNS setup), loopback port 7171.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        ServerConfig {
            listen: DEFAULT_LISTEN.parse().expect("valid address"),
            data_dir: data_dir.into(),
            database: None,
            region: "local".into(),
            domain: "lizard.localhost".into(),
            regions: Vec::new(),
            public_proxy_port: None,
            public_proxy_tls_port: None,
            owner_email: "owner@lizard.localhost".into(),
            owner_plan: "free".into(),
            billing: crate::billing::BillingConfig::default(),
            paused_retention_ms: DEFAULT_PAUSED_RETENTION_MS,
            traffic: TrafficLimits::default(),
            cluster: ClusterConfig::default(),
            blob_sharing: BlobSharing::Auto,
            metrics: None,
        }
    }

    /// Whether this server shares pushed files through the store ([`BlobSharing`]):
    /// `Auto` means on exactly when the database is PostgreSQL.
    pub fn shares_blobs(&self) -> bool {
        match self.blob_sharing {
            BlobSharing::On => true,
            BlobSharing::Off => false,
            BlobSharing::Auto => self.database.as_ref().is_some_and(|d| {
                matches!(
                    lizard_store::database::Database::parse(Some(d.expose())),
                    Ok(lizard_store::database::Database::Postgres(_))
                )
            }),
        }
    }

    /// `sandbox.{region}.{domain}`: the suffix of every public sandbox host of `region`.
    pub fn sandbox_domain(&self, region: &str) -> String {
        format!("sandbox.{region}.{}", self.domain)
    }

    /// The scheme of public URLs and the `:port` after their host (empty for the scheme's
    /// own port): `https` on the TLS listener when there is one, else `http`.
    pub fn public_scheme_and_port(&self) -> (&'static str, String) {
        let (scheme, port, default) = match self.public_proxy_tls_port {
            Some(port) => ("https", Some(port), 443),
            None => ("http", self.public_proxy_port, 80),
        };
        (scheme, port.filter(|p| *p != default).map(|p| format!(":{p}")).unwrap_or_default())
    }

    /// `svc.{region}.{domain}`: the suffix of every service host of `region`.
    pub fn service_domain(&self, region: &str) -> String {
        format!("svc.{region}.{}", self.domain)
    }

    /// The regions to list: the configured ones, or this server's own.
    pub fn effective_regions(&self) -> Vec<Region> {
        if !self.regions.is_empty() {
            return self.regions.clone();
        }
        vec![Region {
            id: self.region.clone(),
            name: self.region.clone(),
            sandbox_domain: self.sandbox_domain(&self.region),
        }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let c = ServerConfig::new("/tmp/x");
        assert_eq!(c.region, "local");
        assert_eq!(c.domain, "lizard.localhost");
        assert!(c.listen.ip().is_loopback());
        let r = c.effective_regions();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].sandbox_domain, "sandbox.local.lizard.localhost");
    }

    #[test]
    fn public_urls_take_the_tls_listeners_scheme_and_name_only_a_port_other_than_its_own() {
        let mut c = ServerConfig::new("/tmp/x");
        assert_eq!(c.public_scheme_and_port(), ("http", String::new()));
        c.public_proxy_port = Some(7172);
        assert_eq!(c.public_scheme_and_port(), ("http", ":7172".into()));
        c.public_proxy_port = Some(80);
        assert_eq!(c.public_scheme_and_port(), ("http", String::new()));
        c.public_proxy_tls_port = Some(7173);
        assert_eq!(c.public_scheme_and_port(), ("https", ":7173".into()));
        c.public_proxy_tls_port = Some(443);
        assert_eq!(c.public_scheme_and_port(), ("https", String::new()));
    }

    #[test]
    fn pushed_files_are_shared_by_default_only_on_postgres() {
        let mut c = ServerConfig::new("/tmp/x");
        assert!(!c.shares_blobs(), "embedded SQLite: the disk is enough");
        c.database = Some(lizard_store::database::DatabaseUrl::new("sqlite:///tmp/x/lizard.db"));
        assert!(!c.shares_blobs());
        c.database = Some(lizard_store::database::DatabaseUrl::new("postgres://lizard@db/lizard"));
        assert!(c.shares_blobs(), "replicas");
        c.blob_sharing = BlobSharing::Off;
        assert!(!c.shares_blobs());
        c.database = None;
        c.blob_sharing = BlobSharing::On;
        assert!(c.shares_blobs());
    }
}
