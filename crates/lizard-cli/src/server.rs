//! `lizard server`: the control plane and, unless `--no-local-node`, its node in one process.

use crate::local::{shutdown_signal, NodeOpts};
use anyhow::Result;
use clap::Args;
use lizard_node::NodeConfig;
use lizard_server::billing::{BillingConfig, Pricing};
use lizard_server::run::RunOptions;
use lizard_server::ServerConfig;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Args, Debug, Clone)]
#[command(after_help = "\
Keeps its database in <data-dir>/lizard.db (or where --database says: PostgreSQL for replicas).
Keeps its sandboxes under <data-dir>/server (apart from the local node's, so both can run on one
machine; guest images in <data-dir>/images are shared).
On the very first start it prints LIZARD_API_KEY=<key>, the owner's unscoped key: store it, it
is never shown again. The API is plain HTTP: put TLS in front of it for anything but loopback.")]
pub struct ServerArgs {
    /// Address the API listens on [default: 127.0.0.1:7171]
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Where the state lives: postgres://user[:password]@host[:port]/database (a PostgreSQL
    /// server shared by several `lizard server` replicas) or sqlite:///path/lizard.db
    /// [default: SQLite in <data-dir>/lizard.db]. The environment variable keeps a password
    /// out of the process list; it is never logged.
    #[arg(long, value_name = "URL", env = "LIZARD_DATABASE", hide_env_values = true)]
    pub database: Option<String>,
    /// Address the public sandbox-URL proxy listens on ({id}-{port}.sandbox.{region}.{domain}).
    /// `*.localhost` names resolve to loopback, so the default works on a laptop as is.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7172")]
    pub proxy_listen: SocketAddr,
    /// Run without the sandbox-URL proxy.
    #[arg(long)]
    pub no_proxy: bool,
    /// Also serve sandbox URLs over TLS on this address (e.g. 127.0.0.1:7173, or :443 on a
    /// server with a real wildcard certificate); public URLs are then https on it. The
    /// certificate is --proxy-tls-cert/--proxy-tls-key, by default what `lizard tls init`
    /// wrote in <data-dir>/tls.
    #[arg(long, value_name = "ADDR")]
    pub proxy_tls_listen: Option<SocketAddr>,
    /// The TLS listener's certificate chain (PEM, the server's certificate first)
    /// [default: <data-dir>/tls/cert.pem]
    #[arg(long, value_name = "FILE", requires = "proxy_tls_listen")]
    pub proxy_tls_cert: Option<PathBuf>,
    /// The TLS listener's private key (PEM) [default: <data-dir>/tls/key.pem]
    #[arg(long, value_name = "FILE", requires = "proxy_tls_listen")]
    pub proxy_tls_key: Option<PathBuf>,
    /// Serve the operator's Prometheus metrics (GET /metrics) on this address, apart from
    /// the API: they cover every account and node, so keep it on loopback or a private
    /// network. Off by default.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// Also require `Authorization: Bearer <token>` on every scrape of --metrics-listen.
    /// Give it in the environment, not on the command line (where `ps` shows it).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "LIZARD_METRICS_TOKEN",
        hide_env_values = true,
        requires = "metrics_listen"
    )]
    pub metrics_token: Option<String>,
    /// Seconds a sandbox-URL client may take to send a request's headers (also how long an
    /// idle connection is kept) before it is cut off.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    pub proxy_header_timeout: u64,
    /// Connections the sandbox-URL proxy serves at once; more are answered 503.
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub proxy_max_connections: usize,
    /// The region this server places sandboxes in [default: local]
    #[arg(long, value_name = "R")]
    pub region: Option<String>,
    /// Public sandbox hosts are {id}-{port}.sandbox.{region}.{domain} [default: lizard.localhost]
    #[arg(long, value_name = "D")]
    pub domain: Option<String>,
    /// An E2B template name and the template it stands for in E2B creates and template
    /// bases (defaults: `base=code-interpreter-v1`, `code-interpreter-v1=interpreter`);
    /// repeat for more, `NAME=` drops one
    #[arg(long = "e2b-template", value_name = "NAME=TEMPLATE")]
    pub e2b_templates: Vec<String>,
    /// Run no node in this process: sandboxes run only on nodes that join
    /// (`lizard node join`). For API replicas beside the in-process default.
    #[arg(long)]
    pub no_local_node: bool,
    /// How often joined nodes heartbeat, ms.
    #[arg(long, value_name = "MS", default_value_t = lizard_server::config::DEFAULT_NODE_HEARTBEAT_MS)]
    pub node_heartbeat_ms: u64,
    /// How long a joined node may go without a heartbeat before it is down (its sandboxes
    /// recorded lost), ms.
    #[arg(long, value_name = "MS", default_value_t = lizard_server::config::DEFAULT_NODE_LEASE_MS)]
    pub node_lease_ms: u64,
    /// This replica's name in the leases that make one replica run each background job
    /// (metering, timeouts, node expiry) [default: random]
    #[arg(long, value_name = "ID")]
    pub replica_id: Option<String>,
    /// Keep pushed files (`lizard template push`) in the database as well as on this
    /// server's disk, so that any replica behind a load balancer serves any call of a push:
    /// `auto` = on with PostgreSQL (replicas), off with the embedded SQLite (one server,
    /// its disk is enough); `on` / `off` force it.
    #[arg(long, value_name = "WHEN", value_enum, default_value_t = SharePushedFiles::Auto)]
    pub share_pushed_files: SharePushedFiles,
    #[command(flatten)]
    pub billing: BillingOpts,
    #[command(flatten)]
    pub traffic: crate::traffic::TrafficOpts,
    #[command(flatten)]
    pub node: NodeOpts,
}

/// `--share-pushed-files`: see [`lizard_server::config::BlobSharing`].
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharePushedFiles {
    Auto,
    On,
    Off,
}

/// Prices and credits (money in nano-dollars, 10^-9 USD, so per-second rates are exact).
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Billing")]
pub struct BillingOpts {
    /// Nano-dollars per vCPU per second while running (2000 = $0.0072/hour).
    #[arg(long, value_name = "NANOS", default_value_t = 2_000)]
    pub vcpu_price: i64,
    /// Nano-dollars per GiB of memory per second while running (1000 = $0.0036/hour).
    #[arg(long, value_name = "NANOS", default_value_t = 1_000)]
    pub memory_price: i64,
    /// Nano-dollars per GiB of memory per second while paused (its saved state).
    #[arg(long, value_name = "NANOS", default_value_t = 0)]
    pub paused_memory_price: i64,
    /// Nano-dollars per GiB of volume per second, from its create to its delete.
    #[arg(long, value_name = "NANOS", default_value_t = 0)]
    pub volume_price: i64,
    /// Free credits of a new account, in dollars.
    #[arg(long, value_name = "USD", default_value = "10")]
    pub signup_credit: String,
    /// Milliseconds between metering ticks; also the most a crash can leave unbilled per sandbox.
    #[arg(long, value_name = "MS", default_value_t = 5_000)]
    pub billing_tick_ms: u64,
    /// Seconds an account may stay at zero balance before its running sandboxes are paused.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    pub billing_grace: u64,
}

impl BillingOpts {
    pub fn config(&self) -> Result<BillingConfig> {
        let pricing = Pricing {
            vcpu_nanos_per_second: self.vcpu_price,
            gib_nanos_per_second: self.memory_price,
            paused_gib_nanos_per_second: self.paused_memory_price,
            volume_gib_nanos_per_second: self.volume_price,
        };
        pricing.validate().map_err(anyhow::Error::msg)?;
        let signup_credit_nanos = lizard_api::parse_usd(&self.signup_credit)?;
        if signup_credit_nanos < 0 {
            anyhow::bail!("--signup-credit must not be negative");
        }
        if self.billing_tick_ms < 10 {
            anyhow::bail!("--billing-tick-ms must be at least 10");
        }
        Ok(BillingConfig {
            pricing,
            signup_credit_nanos,
            tick: Duration::from_millis(self.billing_tick_ms),
            grace: Duration::from_secs(self.billing_grace),
        })
    }
}

/// What `lizard server` runs, from its flags and the data directory.
pub fn options(data_dir: &Path, args: &ServerArgs) -> Result<RunOptions> {
    let mut server = ServerConfig::new(data_dir);
    server.billing = args.billing.config()?;
    server.traffic = args.traffic.limits();
    if let Some(l) = args.listen {
        server.listen = l;
    }
    server.database = args.database.as_deref().map(lizard_store::database::DatabaseUrl::new);
    server.metrics = args.metrics_listen.map(|addr| lizard_server::config::MetricsListen {
        addr,
        token: args.metrics_token.clone().filter(|t| !t.is_empty()),
    });
    if let Some(r) = &args.region {
        server.region = r.clone();
    }
    if let Some(d) = &args.domain {
        server.domain = d.clone();
    }
    let mut e2b_templates = lizard_e2b_face::TemplateMap::default();
    for pair in &args.e2b_templates {
        let Some((name, template)) = pair.split_once('=') else {
            anyhow::bail!("--e2b-template takes NAME=TEMPLATE, got {pair:?}");
        };
        e2b_templates.set(name, template);
    }
    if args.node_heartbeat_ms == 0 || args.node_lease_ms <= args.node_heartbeat_ms {
        anyhow::bail!("--node-lease-ms must be longer than --node-heartbeat-ms, and both above 0");
    }
    server.cluster.heartbeat_ms = args.node_heartbeat_ms;
    server.cluster.lease_ms = args.node_lease_ms;
    if let Some(id) = &args.replica_id {
        server.cluster.replica_id = id.clone();
    }
    server.blob_sharing = match args.share_pushed_files {
        SharePushedFiles::Auto => lizard_server::config::BlobSharing::Auto,
        SharePushedFiles::On => lizard_server::config::BlobSharing::On,
        SharePushedFiles::Off => lizard_server::config::BlobSharing::Off,
    };
    let mut node = NodeConfig::new(data_dir.join("server"));
    node.image_root = data_dir.to_path_buf();
    args.node.apply(&mut node);
    let proxy_limits = lizard_server::proxy::Limits {
        header_read_timeout: std::time::Duration::from_secs(args.proxy_header_timeout.max(1)),
        max_connections: args.proxy_max_connections.max(1),
    };
    if !args.no_proxy {
        server.public_proxy_port = Some(args.proxy_listen.port());
    }
    let proxy_tls = args.proxy_tls_listen.map(|listen| {
        let dir = crate::tls::dir(data_dir);
        lizard_server::run::ProxyTls {
            listen,
            files: lizard_server::proxy::tls::TlsFiles {
                cert: args.proxy_tls_cert.clone().unwrap_or_else(|| dir.join("cert.pem")),
                key: args.proxy_tls_key.clone().unwrap_or_else(|| dir.join("key.pem")),
            },
        }
    });
    server.public_proxy_tls_port = proxy_tls.as_ref().map(|t| t.listen.port());
    Ok(RunOptions {
        server,
        node,
        proxy_listen: (!args.no_proxy).then_some(args.proxy_listen),
        proxy_tls,
        proxy_limits,
        local_node: !args.no_local_node,
        node_connector: None,
        // E2B's SDKs drive the same sandboxes (docs/e2b.md).
        faces: lizard_server::state::Faces::new(vec![std::sync::Arc::new(lizard_e2b_face::E2bFace::new(
            e2b_templates,
        ))]),
    })
}

pub async fn run(data_dir: &Path, args: ServerArgs) -> Result<()> {
    std::fs::create_dir_all(data_dir)
        .map_err(|e| anyhow::anyhow!("create the data directory {}: {e}", data_dir.display()))?;
    let opts = options(data_dir, &args)?;
    let shutdown = shutdown_signal()?;
    lizard_server::run::run(opts, shutdown).await?;
    Ok(())
}
