//! The node agent (`lizard node join`): one machine's node in a Lizard cluster.
//!
//! It runs a [`lizard_node::Node`], serves its API on TCP (every route but `/health`
//! behind the node's credential), joins the control plane once with an operator's join
//! token (then keeps `node.json` in its data directory, so a restart just heartbeats),
//! heartbeats its [`lizard_api::cluster::NodeReport`], kills what the server says has
//! ended, posts sandboxes that end by themselves, and forwards its guests' API calls to
//! the server. SIGTERM kills its running sandboxes (paused ones stay on disk); after a
//! SIGKILL the next start takes its VMs back ([`Node::start`]) and reports them.
//!
//! Modules, from the top down:
//! - this file: [`AgentConfig`] and [`run`] (start, join, serve, stop).
//! - `heartbeat`: the heartbeat loop and acting on its answer.
//! - `events`: sandbox ends, queued and posted until accepted.
//! - `report`: what the node says of itself.
//! - `server_api`: the calls to the control plane.
//! - `state`: `node.json`, who this node is.
//! - `backoff`: waits between failed calls, and a quiet log while they fail.

mod backoff;
mod events;
mod heartbeat;
pub mod report;
pub mod server_api;
pub mod state;

use lizard_api::cluster::{JoinRequest, SandboxEnded};
use lizard_node::{Node, NodeConfig};
use server_api::{CallError, ServerApi};
use state::NodeState;
use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long requests in flight may take to finish at shutdown.
const DRAIN: Duration = Duration::from_secs(10);
/// How long the goodbye (the last ends and heartbeat) may take at shutdown.
const GOODBYE: Duration = Duration::from_secs(5);

/// What `lizard node join` runs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The node itself (its data directory holds `node.json`); `api_forward` is set to
    /// the server's address unless given.
    pub node: NodeConfig,
    /// The control plane, `http://host:port`.
    pub server: String,
    /// The join token; needed only when the data directory has no `node.json`.
    pub token: Option<String>,
    /// The region the node serves (sent at join).
    pub region: String,
    /// Where the node API listens.
    pub listen: SocketAddr,
    /// The node API's base URL as the servers reach it [default: `http://<listen>`].
    pub advertise: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("--server {0:?} is not an http://HOST:PORT URL")]
    BadServer(String),
    #[error("cannot resolve the server's address {0}: {1}")]
    Resolve(String, String),
    #[error("--advertise is needed when --listen is {0}: the servers must be told where to reach this node")]
    NoAdvertise(SocketAddr),
    #[error("{0}: this node has not joined yet; pass --token (an operator makes one with `lizard node token create`)")]
    NoToken(String),
    #[error(transparent)]
    State(#[from] state::StateError),
    #[error("create the data directory {0}: {1}")]
    DataDir(String, std::io::Error),
    #[error("start the node: {0}")]
    Node(lizard_node::NodeError),
    #[error("listen on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
    #[error("join: {0}")]
    Join(CallError),
    #[error("the server no longer takes this node ({0}): it was removed; remove node.json and join again with a new token to come back")]
    Removed(String),
    #[error("serve the node API: {0}")]
    Serve(std::io::Error),
}

impl From<lizard_node::NodeError> for AgentError {
    fn from(e: lizard_node::NodeError) -> Self {
        AgentError::Node(e)
    }
}

/// The base URL the servers reach the node API at.
pub fn advertised(listen: SocketAddr, advertise: Option<&str>) -> Result<String, AgentError> {
    match advertise {
        Some(a) => Ok(a.trim_end_matches('/').to_owned()),
        None if listen.ip().is_unspecified() => Err(AgentError::NoAdvertise(listen)),
        None => Ok(format!("http://{listen}")),
    }
}

/// The server's `host:port` for guests' API forwarding.
async fn server_addr(server: &str) -> Result<SocketAddr, AgentError> {
    let url = reqwest::Url::parse(server).map_err(|_| AgentError::BadServer(server.to_owned()))?;
    if url.scheme() != "http" {
        return Err(AgentError::BadServer(server.to_owned()));
    }
    let host = url.host_str().ok_or_else(|| AgentError::BadServer(server.to_owned()))?;
    let port = url.port_or_known_default().unwrap_or(80);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let mut addrs = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| AgentError::Resolve(format!("{host}:{port}"), e.to_string()))?;
    addrs.next().ok_or_else(|| AgentError::Resolve(format!("{host}:{port}"), "no address".into()))
}

/// Run the node agent until `shutdown` resolves.
pub async fn run(
    mut config: AgentConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AgentError> {
    let data_dir = config.node.data_dir.clone();
    std::fs::create_dir_all(&data_dir).map_err(|e| AgentError::DataDir(data_dir.display().to_string(), e))?;
    let address = advertised(config.listen, config.advertise.as_deref())?;
    if config.node.api_forward.is_none() {
        config.node.api_forward = Some(server_addr(&config.server).await?);
    }
    let kept = NodeState::load(&data_dir, &config.server)?;
    if let Some(kept) = &kept {
        kept.check_address(&data_dir, &address)?;
    }
    if kept.is_none() && config.token.is_none() {
        return Err(AgentError::NoToken(NodeState::path(&data_dir).display().to_string()));
    }
    let node = Node::start(config.node.clone()).await?;
    lizard_node::http::sweep_leftovers(&node.config().data_dir);
    let stop = CancellationToken::new();
    let stopping = stop.clone();
    tokio::spawn(async move {
        shutdown.await;
        stopping.cancel();
    });
    let served = serve(&node, &config, kept, address, &stop).await;
    if let Err(e) = &served {
        tracing::error!("{e}");
    }
    stop.cancel();
    goodbye(&node, &config, served.as_ref().ok()).await;
    served.map(|_| ())
}

/// Join (when not yet), serve, heartbeat and post events until `stop`; the node's state.
async fn serve(
    node: &Arc<Node>,
    config: &AgentConfig,
    kept: Option<NodeState>,
    address: String,
    stop: &CancellationToken,
) -> Result<NodeState, AgentError> {
    let listener =
        tokio::net::TcpListener::bind(config.listen).await.map_err(|e| AgentError::Listen(config.listen, e))?;
    let api = ServerApi::new(&config.server);
    let state = match kept {
        Some(state) => {
            tracing::info!(node = %state.node_id, "rejoining the cluster at {} (node.json)", config.server);
            state
        }
        None => join(node, config, &api, address.clone(), stop).await?,
    };
    tracing::info!(node = %state.node_id, "node API on {} (as {address})", config.listen);
    let app = lizard_node::http::tcp_router(node.clone(), lizard_node::http::Credential::new(&state.credential));
    let removed = Arc::new(std::sync::OnceLock::new());
    heartbeat::run_spawned(node.clone(), api.clone(), state.clone(), stop.clone(), removed.clone());
    events::spawn(node, api, state.clone(), stop.clone());
    // Tunnels and exec streams are interactive: no Nagle delay on their small writes.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let until = stop.clone();
    let mut server = tokio::spawn(
        axum::serve(listener, app).with_graceful_shutdown(async move { until.cancelled().await }).into_future(),
    );
    tokio::select! {
        ended = &mut server => {
            ended.map_err(|e| AgentError::Serve(std::io::Error::other(e)))?.map_err(AgentError::Serve)?;
        }
        () = stop.cancelled() => {
            // Requests in flight may finish; a long stream (an exec, a tunnel, a build)
            // does not hold the stop up for more than the drain.
            if tokio::time::timeout(DRAIN, &mut server).await.is_err() {
                tracing::info!("requests still in flight after {} s: closing them", DRAIN.as_secs());
                server.abort();
            }
        }
    }
    match removed.get() {
        Some(why) => Err(AgentError::Removed(why.clone())),
        None => Ok(state),
    }
}

/// Join with the token, retrying while the server cannot be reached; keep the answer.
async fn join(
    node: &Arc<Node>,
    config: &AgentConfig,
    api: &ServerApi,
    address: String,
    stop: &CancellationToken,
) -> Result<NodeState, AgentError> {
    let token = config.token.as_deref().unwrap_or_default();
    let mut backoff = backoff::Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    loop {
        let req =
            JoinRequest { region: config.region.clone(), address: address.clone(), report: report::of_node(node) };
        match api.join(token, &req).await {
            Ok(joined) => {
                let state = NodeState {
                    node_id: joined.node_id,
                    credential: joined.credential,
                    server: config.server.clone(),
                    heartbeat_ms: joined.heartbeat_ms,
                    address: Some(address.clone()),
                };
                state.save(&config.node.data_dir)?;
                tracing::info!(node = %state.node_id, region = %config.region, "joined the cluster at {}", config.server);
                return Ok(state);
            }
            Err(e) if e.is_transient() => {
                let (wait, log) = backoff.failed();
                if log {
                    tracing::warn!("join failed (trying again): {e}");
                }
                tokio::select! {
                    () = stop.cancelled() => return Err(AgentError::Join(e)),
                    () = tokio::time::sleep(wait) => {}
                }
            }
            Err(e) => return Err(AgentError::Join(e)),
        }
    }
}

/// Kill the running sandboxes (paused ones stay for the next start), then tell the server
/// which ended and what is still held, briefly.
async fn goodbye(node: &Arc<Node>, config: &AgentConfig, state: Option<&NodeState>) {
    let running: Vec<String> = node
        .list()
        .into_iter()
        .filter(|s| s.state == lizard_api::SandboxState::Running)
        .map(|s| s.sandbox_id)
        .collect();
    tracing::info!(running = running.len(), "node stopping: killing its running sandboxes");
    node.shutdown().await;
    let Some(state) = state else { return };
    let api = ServerApi::new(&config.server);
    let ended: Vec<SandboxEnded> = running
        .into_iter()
        .map(|sandbox_id| SandboxEnded { sandbox_id, reason: "its node shut down".into() })
        .collect();
    let tell = async {
        if !ended.is_empty() {
            if let Err(e) = api.events(&state.node_id, &state.credential, &ended).await {
                tracing::warn!("the server was not told of the sandboxes ended at shutdown: {e}");
            }
        }
        if let Err(e) = api.heartbeat(&state.node_id, &state.credential, &report::of_node(node)).await {
            tracing::debug!("last heartbeat: {e}");
        }
    };
    let _ = tokio::time::timeout(GOODBYE, tell).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_advertised_address_is_given_or_the_listen_address() {
        let any: SocketAddr = "0.0.0.0:7180".parse().unwrap();
        assert!(matches!(advertised(any, None), Err(AgentError::NoAdvertise(_))));
        assert_eq!(advertised(any, Some("http://10.0.0.5:7180/")).unwrap(), "http://10.0.0.5:7180");
        assert_eq!(advertised("127.0.0.1:7180".parse().unwrap(), None).unwrap(), "http://127.0.0.1:7180");
    }

    #[tokio::test]
    async fn the_server_address_is_resolved_for_api_forwarding() {
        assert_eq!(server_addr("http://127.0.0.1:7171").await.unwrap(), "127.0.0.1:7171".parse().unwrap());
        assert_eq!(server_addr("http://[::1]:9/").await.unwrap(), "[::1]:9".parse().unwrap());
        assert_eq!(server_addr("http://localhost").await.unwrap().port(), 80);
        for bad in ["https://x:1", "api:7171", "nope"] {
            assert!(matches!(server_addr(bad).await, Err(AgentError::BadServer(_))), "{bad}");
        }
    }
}
