//! `lizard node …`: this machine's node (`run` for local mode, `join` for a cluster) and
//! the operator's view of a cluster's nodes and join tokens (over the server's operator
//! routes; an unscoped key of the owner account).

use crate::client::{empty, json_body, ApiClient, Call};
use crate::output::{print_fields, print_json, Table};
use crate::Ctx;
use anyhow::Result;
use clap::Subcommand;
use lizard_api::cluster::{CreateNodeTokenRequest, NodeInfo, NodeToken};
use lizard_api::routes;

#[derive(Subcommand, Debug)]
pub enum NodeCmd {
    /// Serve the node API on <data-dir>/node.sock until SIGTERM/SIGINT (kills its sandboxes on exit).
    #[cfg(feature = "node")]
    Run(crate::local::RunArgs),
    /// Run this machine as a node of the cluster at --server until SIGTERM/SIGINT: join once
    /// (kept in <data-dir>/node.json), heartbeat, serve the node API on --listen.
    #[cfg(feature = "node")]
    Join(JoinArgs),
    /// The cluster's nodes: region, state, capacity, load, last heartbeat (operator).
    List,
    /// One node (operator).
    Get { id: String },
    /// No new sandboxes on NODE; what runs or is paused there stays until it ends (operator).
    Drain { id: String },
    /// Let NODE take new sandboxes again (operator).
    Undrain { id: String },
    /// Forget NODE: its credential is refused from now on. Only once no sandbox runs or
    /// is paused there and no volume lives there: drain it first (operator).
    Remove { id: String },
    /// Join tokens: what a node joins the cluster with (operator).
    #[command(subcommand)]
    Token(TokenCmd),
}

#[derive(Subcommand, Debug)]
pub enum TokenCmd {
    /// Make a join token (shown once), good for one join unless --uses says more, until it
    /// expires or is revoked.
    Create {
        /// How long it may be used to join (e.g. 30m, 7d) [default: 1h]
        #[arg(long, value_name = "DURATION")]
        ttl: Option<humantime::Duration>,
        /// How many nodes may join with it [default: 1]
        #[arg(long, value_name = "N")]
        uses: Option<u32>,
    },
    List,
    /// Revoke a join token (nodes that joined with it stay).
    Revoke {
        id: String,
    },
}

/// `lizard node join`.
#[cfg(feature = "node")]
#[derive(clap::Args, Debug)]
#[command(after_help = "\
The node API is plain HTTP behind the node's credential (a bearer token both ways): keep it on
a private network. A restart with the same data directory reuses <data-dir>/node.json and does
not join again; it must serve at the address it joined with (the servers know it by that) and
is refused otherwise. Delete that file (with the node stopped and its sandboxes gone) to join anew.")]
pub struct JoinArgs {
    /// The control plane (one replica or the load balancer in front of them).
    #[arg(long, value_name = "URL", env = "LIZARD_SERVER_URL")]
    pub server: String,
    /// A join token from `lizard node token create`; needed only for the first start.
    #[arg(long, value_name = "TOKEN", env = "LIZARD_NODE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The region this node serves (sent at the first join).
    #[arg(long, value_name = "R", default_value = "local")]
    pub region: String,
    /// Where the node API listens.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7180")]
    pub listen: std::net::SocketAddr,
    /// The node API's URL as the servers reach it (http://10.0.0.5:7180) [default: http://<listen>;
    /// required when --listen is 0.0.0.0]
    #[arg(long, value_name = "URL")]
    pub advertise: Option<String>,
    #[command(flatten)]
    pub node: crate::local::NodeOpts,
}

pub async fn run(ctx: &Ctx, cmd: NodeCmd) -> Result<()> {
    match cmd {
        #[cfg(feature = "node")]
        NodeCmd::Run(args) => crate::local::run_node(ctx.data_dir.clone(), args).await,
        #[cfg(feature = "node")]
        NodeCmd::Join(args) => join(ctx, args).await,
        NodeCmd::List => {
            let nodes: Vec<NodeInfo> =
                ctx.require_server("node list")?.json(&Call::new(&routes::LIST_NODES, &[]), empty()).await?;
            if ctx.json {
                return print_json(&nodes);
            }
            node_table(&nodes).print();
            Ok(())
        }
        NodeCmd::Get { id } => show(ctx, &ctx.require_server("node get")?, &routes::GET_NODE, &id).await,
        NodeCmd::Drain { id } => show(ctx, &ctx.require_server("node drain")?, &routes::DRAIN_NODE, &id).await,
        NodeCmd::Undrain { id } => show(ctx, &ctx.require_server("node undrain")?, &routes::UNDRAIN_NODE, &id).await,
        NodeCmd::Remove { id } => {
            ctx.require_server("node remove")?.send(&Call::new(&routes::REMOVE_NODE, &[&id]), empty()).await?;
            if !ctx.json {
                println!("removed {id}");
            }
            Ok(())
        }
        NodeCmd::Token(cmd) => token(ctx, &ctx.require_server("node token")?, cmd).await,
    }
}

#[cfg(feature = "node")]
async fn join(ctx: &Ctx, args: JoinArgs) -> Result<()> {
    let mut node = lizard_node::NodeConfig::new(&ctx.data_dir);
    args.node.apply(&mut node);
    let config = lizard_node_agent::AgentConfig {
        node,
        server: args.server,
        token: args.token.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty()),
        region: args.region,
        listen: args.listen,
        advertise: args.advertise,
    };
    let shutdown = crate::local::shutdown_signal()?;
    anyhow::Context::context(lizard_node_agent::run(config, shutdown).await, "lizard node join")?;
    Ok(())
}

async fn show(ctx: &Ctx, api: &ApiClient, route: &routes::Route, id: &str) -> Result<()> {
    let node: NodeInfo = api.json(&Call::new(route, &[id]), empty()).await?;
    if ctx.json {
        return print_json(&node);
    }
    print_fields(&node_fields(&node));
    Ok(())
}

fn state(node: &NodeInfo) -> &'static str {
    match node.state {
        lizard_api::cluster::NodeState::Up => "up",
        lizard_api::cluster::NodeState::Draining => "draining",
        lizard_api::cluster::NodeState::Down => "down",
    }
}

fn node_table(nodes: &[NodeInfo]) -> Table {
    let mut t = Table::new(&["ID", "REGION", "STATE", "VCPUS", "MEMORY_MIB", "SANDBOXES", "ADDRESS", "LAST_HEARTBEAT"]);
    for n in nodes {
        t.row(vec![
            n.id.clone(),
            n.region.clone(),
            state(n).into(),
            format!("{}/{}", n.usage.vcpus, n.capacity.vcpus),
            format!("{}/{}", n.usage.memory_mib, n.capacity.memory_mib),
            n.usage.sandboxes.to_string(),
            n.address.clone().unwrap_or_else(|| "in-process".into()),
            n.last_heartbeat.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    t
}

fn node_fields(n: &NodeInfo) -> Vec<(&'static str, String)> {
    vec![
        ("id", n.id.clone()),
        ("region", n.region.clone()),
        ("state", state(n).into()),
        ("address", n.address.clone().unwrap_or_else(|| "in-process".into())),
        ("vcpus", format!("{} of {}", n.usage.vcpus, n.capacity.vcpus)),
        ("memory_mib", format!("{} of {}", n.usage.memory_mib, n.capacity.memory_mib)),
        ("disk_free_gib", n.capacity.disk_gib.to_string()),
        ("sandboxes", n.usage.sandboxes.to_string()),
        ("templates", if n.templates.is_empty() { "none".into() } else { n.templates.join(", ") }),
        ("last_heartbeat", n.last_heartbeat.clone().unwrap_or_default()),
        ("joined", n.joined_at.clone()),
    ]
}

async fn token(ctx: &Ctx, api: &ApiClient, cmd: TokenCmd) -> Result<()> {
    match cmd {
        TokenCmd::Create { ttl, uses } => {
            let ttl_secs = ttl.map(|d| std::time::Duration::from(d).as_secs().max(1));
            let req = CreateNodeTokenRequest { ttl_secs, uses };
            let t: NodeToken = api.json(&Call::new(&routes::CREATE_NODE_TOKEN, &[]), json_body(&req)).await?;
            if ctx.json {
                return print_json(&t);
            }
            print_fields(&[
                ("id", t.id.clone()),
                ("token", t.token.clone().unwrap_or_default()),
                ("expires", t.expires_at.clone().unwrap_or_else(|| "never (until revoked)".into())),
                ("uses", t.uses_left.map_or_else(|| "any number".into(), |n| n.to_string())),
            ]);
            eprintln!("The token is shown this once: `lizard node join --token …` on each node machine.");
        }
        TokenCmd::List => {
            let tokens: Vec<NodeToken> = api.json(&Call::new(&routes::LIST_NODE_TOKENS, &[]), empty()).await?;
            if ctx.json {
                return print_json(&tokens);
            }
            let mut t = Table::new(&["ID", "CREATED", "EXPIRES", "USES LEFT"]);
            for k in tokens {
                let uses = k.uses_left.map_or_else(|| "any".into(), |n| n.to_string());
                t.row(vec![k.id, k.created_at, k.expires_at.unwrap_or_else(|| "never".into()), uses]);
            }
            t.print();
        }
        TokenCmd::Revoke { id } => {
            api.send(&Call::new(&routes::REVOKE_NODE_TOKEN, &[&id]), empty()).await?;
            if !ctx.json {
                println!("revoked {id}");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lizard_api::cluster::{NodeCapacity, NodeState, NodeUsage};

    #[test]
    fn the_node_list_shows_load_against_capacity() {
        let node = NodeInfo {
            id: "node_1".into(),
            region: "eu-1".into(),
            address: Some("http://10.0.0.5:7180".into()),
            state: NodeState::Draining,
            capacity: NodeCapacity { vcpus: 16, memory_mib: 32_000, disk_gib: 100 },
            usage: NodeUsage { vcpus: 2, memory_mib: 1024, sandboxes: 3 },
            templates: vec!["base".into()],
            last_heartbeat: Some("2026-12-01T12:00:00Z".into()),
            joined_at: "2026-12-01T11:00:00Z".into(),
        };
        let local = NodeInfo { id: "node_local".into(), address: None, last_heartbeat: None, ..node.clone() };
        let out = node_table(&[node, local]).render();
        let lines: Vec<_> = out.lines().collect();
        assert!(lines[1].starts_with("node_1      eu-1    draining  2/16   1024/32000  3"), "{out}");
        assert!(lines[1].ends_with("http://10.0.0.5:7180  2026-12-01T12:00:00Z"), "{out}");
        assert!(lines[2].ends_with("in-process            -"), "{out}");
    }
}
