//! Local mode: the node daemon (`lizard node run`) and how the CLI finds or starts it.

use crate::client::{ApiClient, Endpoint};
use anyhow::{bail, Context, Result};
use clap::Args;
use lizard_node::{Node, NodeConfig};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Unix socket to serve on [default: <data-dir>/node.sock]
    #[arg(long)]
    socket: Option<PathBuf>,
    #[command(flatten)]
    pub node: NodeOpts,
}

/// How a node boots guests (`lizard node run` and `lizard server`).
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Node")]
pub struct NodeOpts {
    /// Skip the probe and use this accelerator (kvm or tcg).
    #[arg(long, value_parser = parse_accel, env = "LIZARD_ACCEL")]
    pub accel: Option<lizard_node::Accel>,
    /// The static guest agent [default: lizard-agent next to this binary]
    #[arg(long, env = "LIZARD_AGENT_BIN")]
    pub agent: Option<PathBuf>,
    /// Seconds a cold boot may take before it is abandoned.
    #[arg(long, default_value_t = 60)]
    pub boot_timeout: u64,
    /// Names of this node's network namespaces and host links start with this [default:
    /// lizard- and lzv]. Several nodes on one host each need their own: a node sweeps
    /// leftovers with its prefixes at start. At most 10 of [a-z0-9-].
    #[arg(long, value_name = "PREFIX", env = "LIZARD_NET_PREFIX")]
    pub net_prefix: Option<String>,
    /// VMM processes kept started and waiting for a template snapshot's state, per template
    /// and size that sandboxes were created from (the 4 most recently used): a create then
    /// skips QEMU's start. 0 turns it off.
    #[arg(long, value_name = "N", default_value_t = 2, env = "LIZARD_PRESPAWN")]
    pub prespawn: u32,
    /// Keep N sandboxes of TEMPLATE restored ahead of demand (e.g. `--warm-pool base=4`;
    /// repeat or separate with commas). They belong to nobody until a create claims one:
    /// no identity, closed network, not billed.
    #[arg(long, value_name = "TEMPLATE=N", value_parser = parse_warm_pool, value_delimiter = ',', env = "LIZARD_WARM_POOL")]
    pub warm_pool: Vec<(String, u32)>,
    /// Seconds a paused sandbox's VM stays in memory, stopped, once its state is saved: a
    /// resume within that time continues it at once instead of restoring the save. Kept
    /// VMs give way to creates that need their memory. 0 ends them at once.
    #[arg(long, value_name = "SECS", default_value_t = 60, env = "LIZARD_KEEP_PAUSED_VM")]
    pub keep_paused_vm: u64,
    /// MiB kept free on the data directory's filesystem for running sandboxes' disks to
    /// grow into: below it, creates and forks are refused (503) until space is freed. A
    /// running sandbox whose disk write finds the filesystem full halts, and continues by
    /// itself once there is room.
    #[arg(long, value_name = "MIB", default_value_t = lizard_node::DEFAULT_DISK_HEADROOM >> 20, env = "LIZARD_DISK_HEADROOM_MIB")]
    pub disk_headroom_mib: u64,
    /// Minutes a template snapshot no clone was made of is kept (at least 1): after
    /// that it is deleted unless it is its template's latest or a sandbox's disk backs
    /// onto it (a size-specific one costs 130–220 MB; the next create of its size makes
    /// it anew).
    #[arg(long, value_name = "MINUTES", default_value_t = 60, env = "LIZARD_SNAPSHOT_IDLE_MINUTES")]
    pub snapshot_idle_minutes: u64,
    /// Run VMMs unconfined (as root: no own uid, no seccomp, no cgroups) when the host
    /// cannot confine them, instead of refusing sandboxes. Development hosts only: one
    /// emulator bug is then host root.
    #[arg(long, env = "LIZARD_INSECURE_NO_CONFINE")]
    pub insecure_no_confine: bool,
    /// vCPUs the node promises per host CPU: a create beyond that is refused (503).
    #[arg(long, value_name = "RATIO", default_value_t = 8.0, env = "LIZARD_CPU_OVERCOMMIT")]
    pub cpu_overcommit: f64,
    /// Guest memory the node promises per byte of host memory: a create beyond that is
    /// refused (503).
    #[arg(long, value_name = "RATIO", default_value_t = 1.5, env = "LIZARD_MEMORY_OVERCOMMIT")]
    pub memory_overcommit: f64,
    /// Memory a VMM may use beyond its guest's (its cgroup's limit is the sum).
    #[arg(long, value_name = "MIB", default_value_t = 512, env = "LIZARD_VMM_MEMORY_OVERHEAD_MIB")]
    pub vmm_memory_overhead_mib: u32,
    /// Bandwidth each disk of a VMM may use (reads and writes together), in MiB/s; 0: no limit.
    #[arg(long, value_name = "MIB", default_value_t = 512, env = "LIZARD_VMM_DISK_MIB_PER_SECOND")]
    pub vmm_disk_mib_per_second: u64,
    /// I/O operations per second each disk of a VMM may do; 0: no limit.
    #[arg(long, value_name = "N", default_value_t = 20_000, env = "LIZARD_VMM_DISK_IOPS")]
    pub vmm_disk_iops: u64,
    /// Host uids (and gids) for VMM processes, one per running VMM, as FIRST:COUNT; the
    /// gid FIRST-1 is the group they share. Must be the same for every node of the host.
    #[arg(long, value_name = "FIRST:COUNT", default_value = "1500000:65536", value_parser = parse_uid_range, env = "LIZARD_VMM_UIDS")]
    pub vmm_uids: lizard_node::confine::UidRange,
    /// A DNS resolver (ADDR:PORT) that guests' queries are relayed to; repeat for more
    /// [default: the nameservers of the host's /etc/resolv.conf].
    #[arg(long = "dns-resolver", value_name = "ADDR")]
    pub dns_resolvers: Vec<std::net::SocketAddr>,
    /// Guest → API connections all sandboxes of the node share beyond each one's first
    /// 8, which are its own (a sandbox has at most 64 open).
    #[arg(long, value_name = "N", default_value_t = lizard_node::forward::TOTAL, env = "LIZARD_GUEST_API_CONNECTION_POOL")]
    pub guest_api_connection_pool: usize,
    /// TESTS ONLY: a CIDR the egress proxy may dial although it is private (a test's own
    /// namespace). Never set in production.
    #[arg(long = "egress-test-allow", value_name = "CIDR", hide = true)]
    pub egress_test_allow: Vec<lizard_api::network::Cidr>,
}

/// `FIRST:COUNT`.
fn parse_uid_range(s: &str) -> Result<lizard_node::confine::UidRange, String> {
    let (first, count) = s.split_once(':').ok_or_else(|| format!("expected FIRST:COUNT, got {s:?}"))?;
    let number = |n: &str| n.parse::<u32>().map_err(|_| format!("expected FIRST:COUNT, got {s:?}"));
    Ok(lizard_node::confine::UidRange { first: number(first)?, count: number(count)? })
}

impl NodeOpts {
    pub fn apply(&self, config: &mut NodeConfig) {
        config.accel = self.accel;
        config.boot_timeout = Duration::from_secs(self.boot_timeout);
        config.prespawn = self.prespawn;
        config.warm_pool = self.warm_pool.iter().cloned().collect();
        config.keep_paused_vm = Duration::from_secs(self.keep_paused_vm);
        config.disk_headroom = self.disk_headroom_mib << 20;
        config.snapshot_idle = Duration::from_secs(self.snapshot_idle_minutes.max(1) * 60);
        config.api_forward_shared = self.guest_api_connection_pool.max(1);
        config.confine.insecure_no_confine = self.insecure_no_confine;
        config.confine.cpu_overcommit = self.cpu_overcommit;
        config.confine.memory_overcommit = self.memory_overcommit;
        config.confine.memory_overhead_mib = self.vmm_memory_overhead_mib;
        config.confine.disk_io = lizard_node::confine::DiskIo {
            bytes_per_second: self.vmm_disk_mib_per_second.saturating_mul(1 << 20),
            ops_per_second: self.vmm_disk_iops,
        };
        config.confine.uids = self.vmm_uids;
        if let Some(a) = &self.agent {
            config.agent_bin = a.clone();
        }
        if let (Some(prefix), Some(net)) = (&self.net_prefix, config.network.as_mut()) {
            net.netns_prefix = prefix.clone();
            net.link_prefix = prefix.clone();
        }
        if let (false, Some(net)) = (self.dns_resolvers.is_empty(), config.network.as_mut()) {
            net.resolvers = self.dns_resolvers.clone();
        }
        if let Some(net) = config.network.as_mut() {
            net.egress_test_allow = self.egress_test_allow.clone();
        }
    }
}

/// `TEMPLATE=N`, N of 1..=64.
fn parse_warm_pool(s: &str) -> Result<(String, u32), String> {
    let (template, n) = s.split_once('=').ok_or_else(|| format!("expected TEMPLATE=N, got {s:?}"))?;
    let n: u32 = n.parse().map_err(|_| format!("expected a count after {template}=, got {n:?}"))?;
    if template.is_empty() || !(1..=64).contains(&n) {
        return Err(format!("expected TEMPLATE=N with N in 1..=64, got {s:?}"));
    }
    Ok((template.to_owned(), n))
}

fn parse_accel(s: &str) -> Result<lizard_node::Accel, String> {
    match s {
        "kvm" => Ok(lizard_node::Accel::Kvm),
        "tcg" => Ok(lizard_node::Accel::Tcg),
        _ => Err(format!("expected kvm or tcg, got {s:?}")),
    }
}

fn socket_path(data_dir: &Path) -> PathBuf {
    data_dir.join("node.sock")
}

/// Serve the node until SIGTERM or SIGINT, then kill its sandboxes.
pub async fn run_node(data_dir: PathBuf, args: RunArgs) -> Result<()> {
    let mut config = NodeConfig::new(&data_dir);
    args.node.apply(&mut config);
    let node = Node::start(config).await?;
    let socket = args.socket.unwrap_or_else(|| socket_path(&data_dir));
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket).with_context(|| format!("bind {}", socket.display()))?;
    // The socket is the local mode's only credential: owner only.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))?;
    tracing::info!("node serving on {}", socket.display());
    let app = lizard_node::http::router(node.clone());
    let shutdown = shutdown_signal()?;
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await?;
    tracing::info!("node stopping: killing its sandboxes");
    node.shutdown().await;
    let _ = std::fs::remove_file(&socket);
    Ok(())
}

/// Resolves at the first SIGTERM or SIGINT (the handlers are installed now, so a signal
/// that arrives before the future is polled is not lost).
pub fn shutdown_signal() -> Result<impl std::future::Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("install the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("install the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

/// The local node's API, starting the daemon if it is not running.
pub async fn connect(data_dir: &Path) -> Result<ApiClient> {
    let socket = socket_path(data_dir);
    let api = ApiClient { endpoint: Endpoint::Unix(socket.clone()), api_key: None };
    if tokio::net::UnixStream::connect(&socket).await.is_ok() {
        return Ok(api);
    }
    std::fs::create_dir_all(data_dir).with_context(|| format!("create {}", data_dir.display()))?;
    let log = std::fs::OpenOptions::new().create(true).append(true).open(data_dir.join("node.log"))?;
    let exe = std::env::current_exe()?;
    std::process::Command::new(exe)
        .arg("--data-dir")
        .arg(data_dir)
        .args(["node", "run"])
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own session: the daemon must outlive this CLI and its terminal.
        .process_group(0)
        .spawn()
        .context("start the local node (lizard node run)")?;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if tokio::net::UnixStream::connect(&socket).await.is_ok() {
            return Ok(api);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("the local node did not start; see {}", data_dir.join("node.log").display())
}

/// The images-build node, once no other `lizard images build` on this data directory
/// has it (their builds are what the other would wait for anyway).
async fn start_waiting(config: NodeConfig) -> Result<Arc<Node>> {
    const LONGEST_WAIT: Duration = Duration::from_secs(3 * 3600);
    let started = Instant::now();
    let mut told = false;
    loop {
        match Node::start(config.clone()).await {
            Err(e @ lizard_node::NodeError::DataDirInUse { .. }) if started.elapsed() < LONGEST_WAIT => {
                if !told {
                    eprintln!("waiting: {e} (another `lizard images build`?)");
                    told = true;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            other => return Ok(other?),
        }
    }
}

/// `lizard images build`: kernel, initramfs and built-in templates, in this process.
/// A built-in that is not cached is built like any template: its Debian root on the host,
/// its steps in a build VM of a node whose scratch directory is `<data>/images-build`.
/// Every step is shown as `lizard push` shows a build (`follow::Display`): the step,
/// whether it was cached, its duration and its output.
pub async fn build_images(data_dir: PathBuf, templates: Vec<String>, node_opts: NodeOpts) -> Result<()> {
    let templates = if templates.is_empty() {
        lizard_image::ImageStore::template_names().into_iter().map(String::from).collect()
    } else {
        templates
    };
    let mut config = NodeConfig::new(data_dir.join("images-build"));
    config.image_root = data_dir.clone();
    config.snapshots = false;
    node_opts.apply(&mut config);
    let node = start_waiting(config).await?;
    // SIGINT/SIGTERM cancel the build, which removes its VM and layers.
    let cancel = tokio_util::sync::CancellationToken::new();
    let on_signal = cancel.clone();
    let shutdown = shutdown_signal()?;
    tokio::spawn(async move {
        shutdown.await;
        on_signal.cancel();
    });
    for name in templates {
        let started = Instant::now();
        eprintln!("==> template {name}");
        let (events, mut rx) = tokio::sync::mpsc::unbounded_channel();
        // Every line of the steps' output: a first build takes minutes, and this is
        // where an install shows what it is doing.
        let show = tokio::spawn(async move {
            let mut display = crate::follow::Display::new(true, false);
            while let Some(event) = rx.recv().await {
                display.show(event);
            }
        });
        let built = node.prepare_reporting(&name, &events, &cancel).await;
        drop(events);
        let _ = show.await;
        built.with_context(|| format!("build template {name}"))?;
        eprintln!("==> template {name} ready ({:.0} s)", started.elapsed().as_secs_f64());
    }
    node.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_warm_pool;

    #[test]
    fn warm_pool_sizes_are_template_equals_count() {
        assert_eq!(parse_warm_pool("base=4"), Ok(("base".to_owned(), 4)));
        for bad in ["base", "=4", "base=0", "base=65", "base=x"] {
            assert!(parse_warm_pool(bad).is_err(), "{bad} was accepted");
        }
    }
}
