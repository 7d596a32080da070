//! `lizard`: the command-line face of Lizard.
//!
//! Two modes for `lizard sandbox …`:
//! - **local** (no `LIZARD_API_URL`): the local node daemon on `<data-dir>/node.sock`,
//!   started (`lizard node run`) when it is not running, so sandboxes outlive the CLI
//!   invocation that created them;
//! - **server** (`LIZARD_API_URL=http://HOST:PORT`): a Lizard server over HTTP/1.1,
//!   authenticated with `X-API-Key: $LIZARD_API_KEY`.
//!
//! The tenancy commands (`whoami`, `workspace`, `project`, `key`, `region`, `volume`) and
//! the template commands (`push`, `template`) exist in server mode only. `lizard server` runs the server itself.
//! `lizard node join` runs this machine as a node of a cluster (the `lizard-node-agent`
//! crate); `lizard node list|get|drain|undrain|token` are the operator's view of one.

pub mod billing;
pub mod client;
pub mod follow;
#[cfg(feature = "node")]
pub mod local;
pub mod node;
pub mod output;
pub mod push;
pub mod sandbox;
#[cfg(feature = "node")]
pub mod server;
pub mod services;
pub mod shell;
pub mod templates;
pub mod tenancy;
#[cfg(feature = "node")]
pub mod tls;
#[cfg(feature = "node")]
pub mod traffic;
pub mod workspace_args;

use anyhow::{anyhow, Result};
use clap::{Parser, Subcommand};
use client::{ApiClient, Endpoint};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(name = "lizard", version, about = "Lizard: microVM sandboxes for AI agents")]
#[command(after_help = "\
Modes: without LIZARD_API_URL, `lizard sandbox …` drives the local node (started on demand).
With LIZARD_API_URL=http://HOST:PORT (and LIZARD_API_KEY), every command talks to that Lizard
server; whoami, workspace, project, key, region, volume, push, template, billing, metrics and the
operator's node commands need one (`lizard billing credit` excepted: it opens <data-dir>/lizard.db).")]
pub struct Cli {
    /// Where images and sandboxes live [default: /var/lib/lizard as root, else $XDG_DATA_HOME/lizard]
    #[arg(long, global = true, env = "LIZARD_DATA_DIR", help_heading = "Global options")]
    pub data_dir: Option<PathBuf>,
    /// Talk to this Lizard server instead of the local node (http:// only; terminate TLS in front of the server)
    #[arg(long, global = true, env = "LIZARD_API_URL", value_name = "URL", help_heading = "Global options")]
    pub api_url: Option<String>,
    /// API key for the server (sent as X-API-Key)
    #[arg(
        long,
        global = true,
        env = "LIZARD_API_KEY",
        hide_env_values = true,
        value_name = "KEY",
        help_heading = "Global options"
    )]
    pub api_key: Option<String>,
    /// Print machine-readable JSON instead of human-readable text.
    #[arg(long, global = true, help_heading = "Global options")]
    pub json: bool,
    /// How log lines on stderr look: `text` for people, `json` (one object a line: time,
    /// level, message, fields and spans, e.g. a request's id) for a log collector.
    #[arg(
        long,
        global = true,
        env = "LIZARD_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text,
        help_heading = "Global options"
    )]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// This machine's node (local mode, or a cluster's node) and a cluster's nodes (operator).
    #[command(subcommand)]
    Node(node::NodeCmd),
    /// Guest images: kernel, initramfs, template disks.
    #[cfg(feature = "node")]
    #[command(subcommand)]
    Images(ImagesCmd),
    /// Create and drive sandboxes (local node, or the server at LIZARD_API_URL).
    #[command(subcommand)]
    Sandbox(sandbox::SandboxCmd),
    /// Run a Lizard server (control plane + node) until SIGTERM/SIGINT.
    #[cfg(feature = "node")]
    Server(Box<server::ServerArgs>),
    /// Certificates for the sandbox-URL listener's TLS mode: a local CA and a wildcard
    /// certificate (`lizard tls init`).
    #[cfg(feature = "node")]
    #[command(subcommand)]
    Tls(tls::TlsCmd),
    /// Show who the API key belongs to (a scoped key sees only its identity and scopes).
    Whoami,
    /// Workspaces: the unit of isolation between the users of one account.
    #[command(subcommand)]
    Workspace(tenancy::WorkspaceCmd),
    /// Projects: what sandboxes and volumes live in and are billed to.
    #[command(subcommand)]
    Project(tenancy::ProjectCmd),
    /// API keys, optionally scoped to workspaces and projects.
    #[command(subcommand, visible_alias = "api-key")]
    Key(tenancy::KeyCmd),
    /// Regions sandboxes and volumes can be placed in.
    #[command(subcommand)]
    Region(tenancy::RegionCmd),
    /// Volumes: disks that outlive sandboxes.
    #[command(subcommand)]
    Volume(tenancy::VolumeCmd),
    /// Build a template from a directory (lizard.template.toml or a Dockerfile) on the server.
    Push(push::PushArgs),
    /// Templates: the built-ins and your workspaces' pushed ones, and their builds.
    #[command(subcommand)]
    Template(templates::TemplateCmd),
    /// Deploy this directory as a persistent service (writes lizard.toml on the first run).
    Up(services::UpArgs),
    /// Services deployed with `lizard up`: list, status, logs, rollback, down.
    #[command(subcommand, visible_alias = "service")]
    Services(services::ServicesCmd),
    /// The account's balance, ledger and spend (unscoped keys); operator credits.
    #[command(subcommand)]
    Billing(billing::BillingCmd),
    /// Usage per workspace and project within the key's scope (sandbox-seconds, cost, running).
    Metrics(billing::MetricsArgs),
}

#[cfg(feature = "node")]
#[derive(Subcommand, Debug)]
pub enum ImagesCmd {
    /// Build (or verify the cache of) the kernel, initramfs and built-in templates ahead of
    /// time (a built-in's steps run in a build VM, shown step by step).
    Build {
        /// Templates to build [default: all]
        templates: Vec<String>,
        /// Boxed: the node's options dwarf the other variants.
        #[command(flatten)]
        node: Box<local::NodeOpts>,
    },
    /// List the templates this build knows.
    List,
    /// Delete cached images this build no longer uses (older recipes' templates and
    /// Debian roots); images being built are left alone.
    Prune,
}

/// `--log-format`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Log to stderr in `format`, filtered by `LIZARD_LOG` (default: warnings, and the
/// server's, node agent's and CLI's own info lines).
fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("LIZARD_LOG")
        .unwrap_or_else(|_| "warn,lizard_cli=info,lizard_server=info,lizard_node_agent=info".into());
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
        LogFormat::Json => logs.json().with_current_span(true).with_span_list(true).init(),
    }
}

/// The client for server mode: `None` without an API URL (local mode). An URL without a
/// key is an error, as is any URL but `http://`.
pub fn server_client(api_url: Option<&str>, api_key: Option<&str>) -> Result<Option<ApiClient>> {
    let Some(url) = api_url.map(str::trim).filter(|u| !u.is_empty()) else { return Ok(None) };
    let endpoint = Endpoint::parse_url(url)?;
    let key = api_key.map(str::trim).filter(|k| !k.is_empty()).ok_or_else(|| {
        anyhow!("no API key: server mode (LIZARD_API_URL={url}) needs one; set LIZARD_API_KEY or pass --api-key")
    })?;
    Ok(Some(ApiClient { endpoint, api_key: Some(key.to_string()) }))
}

/// What a command needs to know besides its own arguments.
pub struct Ctx {
    pub data_dir: PathBuf,
    pub api_url: Option<String>,
    pub api_key: Option<String>,
    pub json: bool,
}

impl Ctx {
    fn server(&self) -> Result<Option<ApiClient>> {
        server_client(self.api_url.as_deref(), self.api_key.as_deref())
    }

    /// The server, for commands that exist only in server mode.
    fn require_server(&self, what: &str) -> Result<ApiClient> {
        self.server()?.ok_or_else(|| {
            anyhow!(
                "`lizard {what}` talks to a Lizard server: set LIZARD_API_URL (e.g. http://127.0.0.1:7171) and \
                 LIZARD_API_KEY, or pass --api-url and --api-key"
            )
        })
    }

    /// The server in server mode, else the local node (started if need be).
    async fn sandbox_api(&self, cmd: Option<&sandbox::SandboxCmd>) -> Result<ApiClient> {
        match self.server()? {
            Some(api) => Ok(api),
            None => {
                if let Some(cmd) = cmd {
                    sandbox::check_local(cmd)?;
                }
                #[cfg(feature = "node")]
                return local::connect(&self.data_dir).await;
                #[cfg(not(feature = "node"))]
                Err(anyhow!("this `lizard` is the API client only: set LIZARD_API_URL and LIZARD_API_KEY"))
            }
        }
    }
}

#[cfg(feature = "node")]
fn default_data_dir() -> PathBuf {
    lizard_node::default_data_dir()
}

/// The API-client build has no data of its own.
#[cfg(not(feature = "node"))]
fn default_data_dir() -> PathBuf {
    PathBuf::from("/var/lib/lizard")
}

/// The `lizard` binary.
pub fn main() {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    match rt.block_on(run(cli)) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}

/// Run one command; `Ok(code)` is the process's exit status.
pub async fn run(cli: Cli) -> Result<i32> {
    let ctx = Ctx {
        data_dir: cli.data_dir.clone().unwrap_or_else(default_data_dir),
        api_url: cli.api_url,
        api_key: cli.api_key,
        json: cli.json,
    };
    match cli.command {
        Command::Node(cmd) => node::run(&ctx, cmd).await.map(|_| 0),
        #[cfg(feature = "node")]
        Command::Images(ImagesCmd::List) => {
            for t in lizard_image::ImageStore::template_names() {
                println!("{t}");
            }
            Ok(0)
        }
        #[cfg(feature = "node")]
        Command::Images(ImagesCmd::Prune) => {
            let store = lizard_image::ImageStore::new(&ctx.data_dir);
            let removed = tokio::task::spawn_blocking(move || store.prune()).await??;
            for dir in &removed {
                println!("removed {}", dir.display());
            }
            println!("{} image directories removed", removed.len());
            Ok(0)
        }
        #[cfg(feature = "node")]
        Command::Images(ImagesCmd::Build { templates, node }) => {
            local::build_images(ctx.data_dir, templates, *node).await.map(|_| 0)
        }
        Command::Sandbox(cmd @ (sandbox::SandboxCmd::Exec(_) | sandbox::SandboxCmd::Shell(_))) => {
            // `exec` and `shell` exit with the command's status; Lizard's own failures are 125.
            let result = async {
                let api = ctx.sandbox_api(None).await?;
                match cmd {
                    sandbox::SandboxCmd::Shell(args) => shell::shell(&api, args).await,
                    sandbox::SandboxCmd::Exec(args) => sandbox::exec(&api, args).await,
                    _ => unreachable!("matched above"),
                }
            }
            .await;
            Ok(result.unwrap_or_else(|e| {
                eprintln!("error: {e:#}");
                125
            }))
        }
        Command::Sandbox(cmd) => {
            let api = ctx.sandbox_api(Some(&cmd)).await?;
            sandbox::run(&api, cmd, ctx.json).await.map(|_| 0)
        }
        #[cfg(feature = "node")]
        Command::Server(args) => server::run(&ctx.data_dir, *args).await.map(|_| 0),
        #[cfg(feature = "node")]
        Command::Tls(cmd) => tls::run(&ctx.data_dir, cmd).map(|_| 0),
        Command::Whoami => tenancy::whoami(&ctx.require_server("whoami")?, ctx.json).await.map(|_| 0),
        Command::Workspace(cmd) => {
            tenancy::workspace(&ctx.require_server("workspace")?, cmd, ctx.json).await.map(|_| 0)
        }
        Command::Project(cmd) => tenancy::project(&ctx.require_server("project")?, cmd, ctx.json).await.map(|_| 0),
        Command::Key(cmd) => tenancy::key(&ctx.require_server("key")?, cmd, ctx.json).await.map(|_| 0),
        Command::Region(cmd) => tenancy::region(&ctx.require_server("region")?, cmd, ctx.json).await.map(|_| 0),
        Command::Volume(cmd) => tenancy::volume(&ctx.require_server("volume")?, cmd, ctx.json).await.map(|_| 0),
        Command::Push(args) => push::push(&ctx.require_server("push")?, args, ctx.json).await,
        Command::Template(cmd) => templates::run(&ctx.require_server("template")?, cmd, ctx.json).await,
        Command::Up(args) => services::up(&ctx.require_server("up")?, args, ctx.json).await,
        Command::Services(cmd) => services::run(&ctx.require_server("services")?, cmd, ctx.json).await,
        #[cfg(feature = "node")]
        Command::Billing(cmd @ billing::BillingCmd::Credit { .. }) => {
            billing::credit(&ctx.data_dir, cmd, ctx.json).await.map(|_| 0)
        }
        Command::Billing(cmd) => billing::run(&ctx.require_server("billing")?, cmd, ctx.json).await.map(|_| 0),
        Command::Metrics(args) => billing::metrics(&ctx.require_server("metrics")?, args, ctx.json).await.map(|_| 0),
    }
}
