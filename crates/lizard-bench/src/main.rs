//! `lizard-bench`: how long the sandbox core takes on this machine.
//!
//! Through the HTTP API ([`api`]): create → first `echo hi` from a template snapshot
//! against cold boots, a burst of concurrent creates, pause and resume with 256 MiB of
//! touched memory, host memory (PSS) per idle sandbox, fork into copies, create → a
//! coding agent's first `--version` ([`agents`]), ComputeSDK's public time-to-interactive
//! benchmark in its three modes ([`tti`]).
//!
//! On the node directly: cold create → first exec returns, and
//! the same for creates restored from a template snapshot (unless `--no-snapshots`); the
//! round trip of `exec true` (with the guest's own spawn-to-exit time beside it, so
//! Lizard's overhead is visible apart from the guest's process start); write and read
//! throughput of a 64 MiB file. Prints a Markdown table of percentiles.

use anyhow::{Context, Result};
use bytes::Bytes;
use clap::Parser;
use futures_util::StreamExt;
use lizard_api::{CreateSandboxRequest, ExecRequest};
use lizard_node::WriteOptions;
use lizard_node::{Node, NodeConfig};
use std::path::PathBuf;
use std::time::{Duration, Instant};

mod agents;
mod api;
mod code;
mod desktop;
mod idle;
mod services;
mod templates;
mod transfer;
mod tti;

#[derive(Parser)]
struct Args {
    /// Where images are cached (shared with `lizard images build`).
    #[arg(long, env = "LIZARD_DATA_DIR")]
    image_root: Option<PathBuf>,
    #[arg(long, default_value = "base")]
    template: String,
    /// Creates to time, of each kind (cold, and restored from a snapshot).
    #[arg(long, default_value_t = 10)]
    creates: usize,
    /// Time cold creates only (no template snapshot).
    #[arg(long)]
    no_snapshots: bool,
    /// Also time creates restored from a template snapshot (the default).
    #[arg(long, conflicts_with = "no_snapshots")]
    snapshots: bool,
    /// `exec true` round trips to time.
    #[arg(long, default_value_t = 100)]
    execs: usize,
    /// 64 MiB transfers to time in each direction.
    #[arg(long, default_value_t = 3)]
    transfers: usize,
    /// API: 64 MiB transfers through the HTTP API, each direction (0: skip).
    #[arg(long, default_value_t = 3)]
    api_transfers: usize,
    /// API: creates from the template snapshot, create → first `echo hi` (0: skip the API benchmarks).
    #[arg(long, default_value_t = 100)]
    api_creates: usize,
    /// E2B's wire: creates timed the same way through `/v2/sandboxes` and envd's Start,
    /// each beside one of Lizard's own (0: skip).
    #[arg(long, default_value_t = 20)]
    e2b_creates: usize,
    /// E2B's wire: `code-interpreter-v1` creates timed to a chart's PNG (the first cell,
    /// through `/execute`), as E2B's code interpreter add-on sends them (0: skip).
    #[arg(long, default_value_t = 0)]
    e2b_code_runs: usize,
    /// E2B's wire: the same again with a warm pool of this many `interpreter` machines (0:
    /// skip).
    #[arg(long, default_value_t = 0)]
    e2b_code_pool: usize,
    /// API: restored creates timed the same way on a node agent that joined the server
    /// over TCP (many machines' node channel), beside the in-process node's (0: skip).
    #[arg(long, default_value_t = 0)]
    api_joined_creates: usize,
    /// API: ComputeSDK's public benchmark — create → `node -v` returns, sequential,
    /// staggered (every 200 ms) and burst — with this many sandboxes in each mode (0: skip;
    /// its figures use 100).
    #[arg(long, default_value_t = 0)]
    tti: usize,
    /// API: cold-boot creates timed the same way, for the ratio.
    #[arg(long, default_value_t = 20)]
    api_cold_creates: usize,
    /// API: concurrent creates in one burst.
    #[arg(long, default_value_t = 20)]
    burst: usize,
    /// API: creates timed with pre-spawned VMMs, and claimed from a warm pool of
    /// `--warm-pool` (0: skip).
    #[arg(long, default_value_t = 50)]
    pool_creates: usize,
    #[arg(long, default_value_t = 4)]
    warm_pool: u32,
    /// API: pause/resume cycles of one sandbox holding `--pause-mib` MiB.
    #[arg(long, default_value_t = 10)]
    pause_cycles: usize,
    #[arg(long, default_value_t = 256)]
    pause_mib: u32,
    /// API: idle sandboxes whose VMM memory (PSS) and CPU are measured.
    #[arg(long, default_value_t = 50)]
    idle: usize,
    /// API: seconds over which idle sandboxes' CPU is measured.
    #[arg(long, default_value_t = 30)]
    idle_cpu_window: u64,
    /// API: density, the most idle sandboxes to add (0: skip); see `--density-step`.
    #[arg(long, default_value_t = 0)]
    density_max: usize,
    /// API: idle sandboxes added per density step, each followed by `--density-probes` timed creates.
    #[arg(long, default_value_t = 25)]
    density_step: usize,
    #[arg(long, default_value_t = 5)]
    density_probes: usize,
    /// API: copies per fork.
    #[arg(long, default_value_t = 5)]
    fork_copies: u32,
    /// API: forks to time.
    #[arg(long, default_value_t = 3)]
    fork_rounds: usize,
    /// API: time template pushes (cold cache, one changed step, push → first sandbox) and
    /// the pushed template's size on disk over its base.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pushes: bool,
    /// API: requests to a service whose instance runs, against requests that find it
    /// paused for idling and resume it, in the same run (0: skip).
    #[arg(long, default_value_t = 5)]
    service_wakeups: usize,
    /// API: creates of `--agent-template` timed to its first `--agent-command` (0: skip).
    #[arg(long, default_value_t = 5)]
    agent_creates: usize,
    /// The coding-agent template of the create → `--version` benchmark.
    #[arg(long, default_value = "claude")]
    agent_template: String,
    #[arg(long, default_value = "claude --version")]
    agent_command: String,
    /// API: creates of the `interpreter` template, each timed to its first `runCode`
    /// answering (0: skip; the template must be built).
    #[arg(long, default_value_t = 0)]
    code_runs: usize,
    /// Also time restored creates on a node without sandbox networking, to show what the
    /// network (namespace, links, rules, DNS relay) adds to a create. Needs root.
    #[arg(long)]
    compare_network: bool,
    /// API: creates of the `desktop` template timed to their first screenshot (0: skip;
    /// builds the template first if it is not cached).
    #[arg(long, default_value_t = 0)]
    desktop_creates: usize,
    /// API: idle `desktop` sandboxes whose VMM memory (PSS) is measured.
    #[arg(long, default_value_t = 5)]
    desktop_idle: usize,
}

/// The bench measures speed and density, not admission: its nodes promise whatever a run
/// asks for (bursts and 200 idle sandboxes exceed a small host's default overcommit);
/// VMMs are confined as always.
fn admit_everything(config: &mut NodeConfig) {
    config.confine.cpu_overcommit = 1_000.0;
    config.confine.memory_overcommit = 1_000.0;
}

/// A node of its own in a temporary directory, over the shared image cache.
async fn start_node(
    image_root: PathBuf,
    snapshots: bool,
    network: bool,
) -> Result<(std::sync::Arc<Node>, tempfile::TempDir)> {
    let dir = tempfile::Builder::new().prefix("lizard-bench-").tempdir()?;
    let mut config = NodeConfig::new(dir.path());
    config.image_root = image_root;
    config.snapshots = snapshots;
    admit_everything(&mut config);
    if !network {
        config.network = None;
    }
    Ok((Node::start(config).await?, dir))
}

/// Percentiles of a sample, nearest-rank.
struct Summary(Vec<f64>);

impl Summary {
    fn new(mut v: Vec<f64>) -> Self {
        v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
        Summary(v)
    }
    fn p(&self, q: f64) -> f64 {
        // The rank is clamped to [0, len] before the cast, so it cannot truncate.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let rank = (q.clamp(0.0, 1.0) * self.0.len() as f64).ceil() as usize;
        let i = rank.clamp(1, self.0.len()) - 1;
        self.0[i]
    }
    fn row(&self, name: &str, unit: &str) -> String {
        if self.0.is_empty() {
            return format!("| {name} | 0 | – | – | – | – | – | {unit} |");
        }
        format!(
            "| {name} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {unit} |",
            self.0.len(),
            self.p(0.0),
            self.p(0.5),
            self.p(0.9),
            self.p(0.99),
            self.0.last().copied().unwrap_or(0.0)
        )
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() -> Result<()> {
    // RUST_LOG (e.g. `lizard_node=debug`) shows the node's timestamps of each step.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let args = Args::parse();
    let image_root = args.image_root.clone().unwrap_or_else(lizard_node::shared_image_root);
    let start = |snapshots: bool| start_node(image_root.clone(), snapshots, true);
    let (node, _dir) = start(false).await?;
    eprintln!("preparing images for {} (first run builds them)…", args.template);
    node.prepare(&args.template).await?;
    if args.api_creates > 0 && args.agent_creates > 0 {
        eprintln!("preparing images for {}…", args.agent_template);
        node.prepare(&args.agent_template).await?;
    }
    let mut rows = vec![];
    if args.api_creates > 0 {
        rows.extend(api_benchmarks(&args, &image_root).await?);
    }
    if args.desktop_creates > 0 {
        eprintln!("preparing images for desktop (first run builds them)…");
        node.prepare("desktop").await?;
        rows.extend(desktop_benchmarks(&args, &image_root).await?);
    }
    let create = || CreateSandboxRequest { template: args.template.clone(), ..Default::default() };
    let echo = ExecRequest { cmd: Some("echo hi".into()), ..Default::default() };

    let time_creates = |node: std::sync::Arc<Node>, what: &'static str| {
        let echo = echo.clone();
        let creates = args.creates;
        async move {
            let mut times = vec![];
            for i in 0..creates {
                let t = Instant::now();
                let sbx = node.create(create()).await?;
                let r = sbx.exec_collect(echo.clone()).await?;
                let took = ms(t.elapsed());
                times.push(took);
                anyhow::ensure!(r.stdout == "hi\n", "unexpected output {r:?}");
                node.kill(&sbx.id).await?;
                eprintln!("{what} create {}/{creates}: {took:.0} ms", i + 1);
            }
            anyhow::Ok(times)
        }
    };
    let cold = time_creates(node.clone(), "cold").await?;
    let mut restored = None;
    if !args.no_snapshots {
        let (snode, _sdir) = start(true).await?;
        // The first create makes the snapshot (one cold boot); it is reported apart.
        let t = Instant::now();
        let sbx = snode.create(create()).await?;
        let first = ms(t.elapsed());
        anyhow::ensure!(sbx.from_snapshot(), "the snapshot could not be made (see the log)");
        snode.kill(&sbx.id).await?;
        eprintln!("first create (makes the template snapshot): {first:.0} ms");
        restored = Some((first, time_creates(snode.clone(), "restored").await?));
        snode.shutdown().await;
    }
    let mut without_network = None;
    if args.compare_network && !args.no_snapshots {
        let (bare, _bdir) = start_node(image_root.clone(), true, false).await?;
        let sbx = bare.create(create()).await?;
        bare.kill(&sbx.id).await?;
        without_network = Some(time_creates(bare.clone(), "restored, no network").await?);
        bare.shutdown().await;
    }

    let sbx = node.create(create()).await?;
    let mut round = vec![];
    let mut guest = vec![];
    let tru = ExecRequest { argv: Some(vec!["/bin/true".into()]), ..Default::default() };
    for _ in 0..args.execs {
        let t = Instant::now();
        let status = sbx.exec_status(tru.clone()).await?;
        round.push(ms(t.elapsed()));
        guest.push(status.duration_ms as f64);
    }

    const SIZE: usize = 64 * 1024 * 1024;
    let chunk = Bytes::from(vec![0xa5u8; 1024 * 1024]);
    let mut write = vec![];
    let mut read = vec![];
    for _ in 0..args.transfers {
        let c = chunk.clone();
        let body = futures_util::stream::iter(0..SIZE / chunk.len()).map(move |_| Ok::<_, std::io::Error>(c.clone()));
        let t = Instant::now();
        sbx.write_file("/root/bench.bin", &WriteOptions::default(), body).await?;
        write.push(SIZE as f64 / 1048576.0 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        let (_, mut s) = sbx.read_file("/root/bench.bin").await?;
        let mut n = 0;
        while let Some(c) = s.next().await {
            n += c?.len();
        }
        anyhow::ensure!(n == SIZE, "read {n} bytes");
        read.push(SIZE as f64 / 1048576.0 / t.elapsed().as_secs_f64());
    }
    let (channel_write, channel_read) = transfer::channel_transfers(&sbx, args.transfers).await?;
    node.shutdown().await;

    println!("| measurement | n | min | p50 | p90 | p99 | max | unit |");
    println!("|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    println!("{}", Summary::new(cold).row("node: cold create → first `echo hi` returns", "ms"));
    if let Some((first, times)) = restored {
        println!("{}", Summary::new(vec![first]).row("node: first create of a template (makes its snapshot)", "ms"));
        println!("{}", Summary::new(times).row("node: restored create → first `echo hi` returns", "ms"));
    }
    if let Some(times) = without_network {
        println!("{}", Summary::new(times).row("… the same on a node without sandbox networking", "ms"));
    }
    println!("{}", Summary::new(round).row("`exec /bin/true` round trip", "ms"));
    println!("{}", Summary::new(guest).row("… of which the guest's spawn-to-exit", "ms"));
    println!("{}", Summary::new(write).row("write 64 MiB file", "MiB/s"));
    println!("{}", Summary::new(read).row("read 64 MiB file", "MiB/s"));
    println!("{}", Summary::new(channel_write).row("… write 64 MiB over the agent channel alone (baseline)", "MiB/s"));
    println!("{}", Summary::new(channel_read).row("… read 64 MiB over the agent channel alone (baseline)", "MiB/s"));
    Ok(())
}

/// The `desktop` scenario through the HTTP API, as table rows.
async fn desktop_benchmarks(args: &Args, image_root: &std::path::Path) -> Result<Vec<String>> {
    let bench = api::Bench::start(image_root, true).await?;
    let d = bench.desktop(args.desktop_creates, args.desktop_idle).await?;
    let mut rows = vec![
        Summary::new(vec![d.first_create_ms])
            .row("API: first create of `desktop` (boots it, starts the desktop, saves its snapshot)", "ms"),
        Summary::new(d.to_screenshot_ms).row("API: create `desktop` → first screenshot (PNG) returns", "ms"),
        Summary::new(vec![d.screenshot_kib]).row("… one 1024x768 screenshot", "KiB"),
    ];
    if !d.idle_pss_mib.is_empty() {
        let n = d.idle_pss_mib.len();
        rows.push(
            Summary::new(d.idle_pss_mib)
                .row(&format!("API: VMM memory (PSS) per idle `desktop` sandbox, {n} idle"), "MiB"),
        );
    }
    Ok(rows)
}

/// Creates and bursts with machines made ahead of demand, as table rows: pre-spawned VMMs
/// (2 per shelf, as `lizard server` keeps by default), then a warm pool.
async fn pool_benchmarks(args: &Args, image_root: &std::path::Path) -> Result<Vec<String>> {
    let t = &args.template;
    let mut rows = vec![];
    let spawned = api::Bench::start_with(image_root, true, |c| c.prespawn = 2).await?;
    spawned.creates(t, 1, "API first create (registers the shelf)").await?;
    let times = spawned.pooled_creates(t, args.pool_creates, 2, "API create, pre-spawned VMM").await?;
    rows.push(
        Summary::new(times)
            .row("API: create (snapshot restore into a pre-spawned VMM) → first `echo hi` returns", "ms"),
    );
    if args.burst > 0 {
        spawned.wait_pool(t, 2, Duration::from_secs(120)).await?;
        let burst = spawned.burst(t, args.burst).await?;
        rows.push(Summary::new(burst).row(
            &format!("API: burst of {} concurrent creates, pre-spawned VMMs, each to its first `echo hi`", args.burst),
            "ms",
        ));
    }
    spawned.stop().await;
    if args.warm_pool > 0 {
        let n = args.warm_pool;
        let warm = api::Bench::start_with(image_root, true, |c| {
            c.warm_pool.insert(t.clone(), n);
        })
        .await?;
        let ready = usize::try_from(n)?;
        warm.wait_pool(t, ready, Duration::from_secs(300)).await?;
        let times = warm.pooled_creates(t, args.pool_creates, ready, "API create, warm pool").await?;
        rows.push(
            Summary::new(times)
                .row(&format!("API: create (claimed from a warm pool of {n}) → first `echo hi` returns"), "ms"),
        );
        if args.burst > 0 {
            let (burst, ids) = warm.burst_keep(t, args.burst).await?;
            rows.push(Summary::new(burst).row(
                &format!(
                    "API: burst of {} concurrent creates over a warm pool of {n}, each to its first `echo hi`",
                    args.burst
                ),
                "ms",
            ));
            // The burst's sandboxes still run: the refill competes with them, as it would.
            let refill = warm.wait_pool(t, ready, Duration::from_secs(300)).await?;
            for id in ids {
                warm.kill(&id).await?;
            }
            rows.push(
                Summary::new(vec![refill])
                    .row(&format!("… from the burst's end until the warm pool holds {n} again"), "ms"),
            );
        }
        warm.stop().await;
    }
    Ok(rows)
}

/// The HTTP API benchmarks, as table rows.
async fn api_benchmarks(args: &Args, image_root: &std::path::Path) -> Result<Vec<String>> {
    let t = &args.template;
    let mut rows = vec![];
    let cold = api::Bench::start(image_root, false).await?;
    let cold_times = cold.creates(t, args.api_cold_creates, "API cold create").await?;
    drop(cold);
    let warm = api::Bench::start(image_root, true).await?;
    let first = Instant::now();
    let id = warm.create(t).await?;
    let first = ms(first.elapsed());
    warm.kill(&id).await?;
    let restored = warm.creates(t, args.api_creates, "API restored create").await?;
    rows.push(Summary::new(restored).row("API: create (snapshot restore) → first `echo hi` returns", "ms"));
    if args.tti > 0 {
        rows.extend(tti::rows(&warm, t, args.tti).await);
    }
    if args.e2b_creates > 0 {
        let (e2b, own) = warm.e2b_creates(t, args.e2b_creates).await?;
        rows.push(
            Summary::new(e2b).row("E2B's wire: create (`/v2/sandboxes`) → first `echo hi` (envd Start) returns", "ms"),
        );
        rows.push(Summary::new(own).row("… Lizard's API, each beside one of those (same run, same machine)", "ms"));
    }
    if args.api_joined_creates > 0 {
        let joined = api::Bench::start_joined(image_root).await?;
        let id = joined.create(t).await?; // makes the joined node's template snapshot
        joined.kill(&id).await?;
        let times = joined.creates(t, args.api_joined_creates, "API create on a joined node").await?;
        joined.stop().await;
        rows.push(
            Summary::new(times).row("… the same on a node agent joined over TCP (server → node channel → VM)", "ms"),
        );
    }
    rows.push(Summary::new(cold_times).row("API: create (cold boot) → first `echo hi` returns", "ms"));
    if args.api_transfers > 0 {
        let (write, read) = transfer::api_transfers(&warm, t, args.api_transfers).await?;
        rows.push(Summary::new(write).row("API: write 64 MiB file", "MiB/s"));
        rows.push(Summary::new(read).row("API: read 64 MiB file", "MiB/s"));
    }
    rows.push(Summary::new(vec![first]).row("API: first create of a template (makes its snapshot)", "ms"));
    if args.burst > 0 {
        let burst = warm.burst(t, args.burst).await?;
        rows.push(
            Summary::new(burst)
                .row(&format!("API: burst of {} concurrent creates, each to its first `echo hi`", args.burst), "ms"),
        );
    }
    if args.pool_creates > 0 {
        rows.extend(pool_benchmarks(args, image_root).await?);
    }
    if args.pause_cycles > 1 {
        let p = warm.pause_resume(t, args.pause_mib, args.pause_cycles).await?;
        let mib = args.pause_mib;
        rows.push(
            Summary::new(vec![p.first_pause])
                .row(&format!("API: first pause, {mib} MiB touched (saves the pages it dirtied)"), "ms"),
        );
        rows.push(
            Summary::new(vec![p.first_resume])
                .row(&format!("API: first resume, {mib} MiB touched (applies them)"), "ms"),
        );
        rows.push(Summary::new(p.pause).row(&format!("API: pause, {mib} MiB touched"), "ms"));
        rows.push(Summary::new(p.resume).row(&format!("API: resume, {mib} MiB touched"), "ms"));
        rows.push(Summary::new(vec![p.state_mib]).row("… a paused sandbox's files on disk", "MiB"));
        // The same on a server that keeps paused VMMs (`lizard server`'s default): each
        // resume comes within the keep, so it continues the stopped VMM.
        let kept = api::Bench::start_with(image_root, true, |c| c.keep_paused_vm = Duration::from_secs(60)).await?;
        let k = kept.pause_resume(t, mib, args.pause_cycles).await?;
        kept.stop().await;
        rows.push(Summary::new(vec![k.first_resume]).row(
            &format!("API: first resume, {mib} MiB touched, within `--keep-paused-vm` (continues the kept VMM)"),
            "ms",
        ));
        rows.push(Summary::new(k.pause).row(&format!("API: pause, {mib} MiB touched, VMM kept"), "ms"));
        rows.push(
            Summary::new(k.resume).row(&format!("API: resume, {mib} MiB touched, within `--keep-paused-vm`"), "ms"),
        );
    }
    if args.idle > 0 {
        let window = std::time::Duration::from_secs(args.idle_cpu_window);
        let cost = warm.idle_cost(t, args.idle, window).await?;
        rows.push(
            Summary::new(cost.pss_mib)
                .row(&format!("API: VMM memory (PSS) per idle sandbox, {} idle", args.idle), "MiB"),
        );
        rows.push(Summary::new(cost.cpu_pct).row(
            &format!("API: VMM CPU per idle sandbox, {} idle, over {} s", args.idle, args.idle_cpu_window),
            "% of a core",
        ));
    }
    if args.density_max > 0 {
        let d = warm.density(t, args.density_step, args.density_max, args.density_probes).await?;
        rows.push(Summary::new(d.empty_ms).row("API: density: create → first `echo hi`, empty node", "ms"));
        rows.push(
            Summary::new(d.held_ms)
                .row(&format!("API: density: the same with {} idle sandboxes (the most within 2×)", d.held), "ms"),
        );
        rows.push(
            Summary::new(vec![d.held as f64]).row(&format!("API: density: idle sandboxes held ({})", d.stop), "count"),
        );
    }
    if args.fork_rounds > 0 {
        let forks = warm.forks(t, args.fork_copies, args.fork_rounds).await?;
        rows.push(
            Summary::new(forks).row(&format!("API: fork a running sandbox into {} copies", args.fork_copies), "ms"),
        );
    }
    if args.agent_creates > 0 {
        let (a, cmd) = (&args.agent_template, &args.agent_command);
        let times = warm.agent_versions(a, cmd, args.agent_creates).await?;
        rows.push(
            Summary::new(vec![times.first])
                .row(&format!("API: first create of `{a}` (makes its snapshot) → `{cmd}`"), "ms"),
        );
        rows.push(Summary::new(times.creates).row(&format!("API: create `{a}` → first `{cmd}` returns"), "ms"));
    }
    if args.code_runs > 0 {
        let c = warm.first_run_code(args.code_runs).await?;
        rows.push(
            Summary::new(c.create_to_result).row("API: create `interpreter` → first `runCode` (`1 + 1`) answers", "ms"),
        );
        rows.push(Summary::new(c.run).row("… a later `runCode` (`1 + 1`) in the same sandbox", "ms"));
    }
    if args.e2b_code_runs > 0 {
        let c = warm.e2b_first_chart(args.e2b_code_runs, 0).await?;
        rows.push(
            Summary::new(c.create_to_chart)
                .row("E2B's wire: create `code-interpreter-v1` → its first cell's chart (matplotlib) as PNG", "ms"),
        );
        rows.push(Summary::new(c.run).row("… then `1 + 1` in the same sandbox", "ms"));
    }
    if args.e2b_code_runs > 0 && args.e2b_code_pool > 0 {
        let n = args.e2b_code_pool;
        let pooled = api::Bench::start_with(image_root, true, |c| {
            c.warm_pool.insert("interpreter".into(), u32::try_from(n).unwrap_or(u32::MAX));
        })
        .await?;
        let c = pooled.e2b_first_chart(args.e2b_code_runs, n).await?;
        rows.push(Summary::new(c.create_to_chart).row(
            &format!("E2B's wire: the same, `interpreter` claimed from a warm pool of {n} → first chart's PNG"),
            "ms",
        ));
        pooled.stop().await;
    }
    if args.service_wakeups > 0 {
        let w = warm.service_wakeups(args.service_wakeups).await?;
        rows.push(Summary::new(w.running).row("API: request to a service, its instance running (proxy → app)", "ms"));
        rows.push(
            Summary::new(w.paused).row("… the same request to it paused for idling (resumes the instance first)", "ms"),
        );
    }
    if args.pushes {
        let image = lizard_image::ImageStore::new(image_root)
            .cached_builtin(t)?
            .context("the base template is built (the API benchmarks created sandboxes of it)")?;
        let p = warm.template_pushes(t, &image.rootfs).await?;
        rows.push(Summary::new(vec![p.cold_ms]).row(
            "API: `lizard push` of a 5-step template, cold cache (apt, copy, run, env, run; start command)",
            "ms",
        ));
        let (cached, total) = p.cached;
        rows.push(
            Summary::new(vec![p.one_changed_ms]).row(
                &format!("API: the same push with its last step changed ({cached} of {total} steps cached)"),
                "ms",
            ),
        );
        rows.push(
            Summary::new(vec![p.push_to_sandbox_ms])
                .row("API: push (last step changed) → first sandbox of it answers an exec", "ms"),
        );
        rows.push(Summary::new(vec![p.layer_mib]).row("… the pushed template's own layers on disk", "MiB"));
        rows.push(Summary::new(vec![p.base_mib]).row("… its base's image on disk, for comparison", "MiB"));
    }
    Ok(rows)
}
