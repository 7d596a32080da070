//! `lizard server`: the control plane and its node in one process.

use crate::local::{shutdown_signal, NodeOpts};
use anyhow::Result;
use clap::Args;
use lizard_node::NodeConfig;
use lizard_server::run::RunOptions;
use lizard_server::ServerConfig;
use std::net::SocketAddr;
use std::path::Path;

#[derive(Args, Debug, Clone)]
#[command(after_help = "\
Keeps its database in <data-dir>/lizard.db and its sandboxes under <data-dir>/server (apart from
the local node's, so both can run on one machine; guest images in <data-dir>/images are shared).
On the very first start it prints LIZARD_API_KEY=<key>, the owner's unscoped key: store it, it
is never shown again. The API is plain HTTP: put TLS in front of it for anything but loopback.")]
pub struct ServerArgs {
    /// Address the API listens on [default: 127.0.0.1:7171]
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Address the public sandbox-URL proxy listens on ({id}-{port}.sandbox.{region}.{domain}).
    /// `*.localhost` names resolve to loopback, so the default works on a laptop as is.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7172")]
    pub proxy_listen: SocketAddr,
    /// Run without the sandbox-URL proxy.
    #[arg(long)]
    pub no_proxy: bool,
    /// The region this server places sandboxes in [default: local]
    #[arg(long, value_name = "R")]
    pub region: Option<String>,
    /// Public sandbox hosts are {id}-{port}.sandbox.{region}.{domain} [default: lizard.localhost]
    #[arg(long, value_name = "D")]
    pub domain: Option<String>,
    #[command(flatten)]
    pub node: NodeOpts,
}

/// What `lizard server` runs, from its flags and the data directory.
pub fn options(data_dir: &Path, args: &ServerArgs) -> RunOptions {
    let mut server = ServerConfig::new(data_dir);
    if let Some(l) = args.listen {
        server.listen = l;
    }
    if let Some(r) = &args.region {
        server.region = r.clone();
    }
    if let Some(d) = &args.domain {
        server.domain = d.clone();
    }
    let mut node = NodeConfig::new(data_dir.join("server"));
    node.image_root = data_dir.to_path_buf();
    args.node.apply(&mut node);
    RunOptions { server, node, proxy_listen: (!args.no_proxy).then_some(args.proxy_listen) }
}

pub async fn run(data_dir: &Path, args: ServerArgs) -> Result<()> {
    std::fs::create_dir_all(data_dir)
        .map_err(|e| anyhow::anyhow!("create the data directory {}: {e}", data_dir.display()))?;
    let opts = options(data_dir, &args);
    let shutdown = shutdown_signal()?;
    lizard_server::run::run(opts, shutdown).await?;
    Ok(())
}
