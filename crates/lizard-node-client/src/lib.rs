//! One interface to "a node": everything the control plane asks of the host that runs a
//! sandbox goes through [`NodeClient`], so the operations above it do not care whether
//! that node lives in this process ([`LocalNode`], today's single-machine mode) or on
//! another host (an HTTP client, later).
//!
//! The trait is object-safe (the server holds `Arc<dyn NodeClient>`) and speaks only owned
//! types: requests and answers are [`lizard_api`]'s, errors are [`ApiError`]s (a stable
//! code and a message, what a remote node would send back), and the byte flows — exec
//! output, file contents, TCP tunnels to guest ports — are streams the caller drives.
//! [`Nodes`] is the set this server can reach: its in-process node, if any, and remote
//! nodes through a [`NodeConnector`].

pub mod credential;
mod local;
pub mod remote;

pub use credential::ClusterKey;
pub use local::{builtin_templates, LocalNode};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::BoxStream;
use lizard_agent_proto::frame::Frame;
pub use lizard_agent_proto::types::WriteOptions;
use lizard_api::processes::{ListeningPort, ProcessControl, ProcessInfo, StartProcessRequest};
use lizard_api::templates::{BuildEvent, BuildFailure};
pub use lizard_api::templates::{BuildTemplate, BuiltTemplate};
use lizard_api::{
    ApiError, ArchiveResult, CreateSandboxRequest, ErrorCode, ExecRequest, FileEntry, FileInfo, ProcessResult,
    SandboxInfo, WriteResult,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

/// What a node call answers: an [`ApiError`] carries the node's stable code and message.
pub type NodeResult<T> = Result<T, ApiError>;

/// Bytes flowing to or from a guest file.
pub type ByteStream = BoxStream<'static, std::io::Result<Bytes>>;

/// A command's output as exec frames, ending with `Exit` (or `Error`); a background
/// process's begin with `Started`.
pub type FrameStream = BoxStream<'static, std::io::Result<Frame>>;

/// The id of the node that runs inside the server process.
pub const LOCAL_NODE_ID: &str = "node_local";

/// The most copies one fork may ask for (the node's limit).
pub const MAX_FORKS: u32 = lizard_node::MAX_FORKS;

/// A byte pipe to a port inside a guest (the proxy speaks HTTP/1.1 over it).
pub trait Tunnel: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Tunnel for T {}

/// A file read out of a guest: its length when known, and its bytes.
pub struct FileRead {
    pub len: Option<u64>,
    pub body: ByteStream,
}

/// A template built-in to the node (visible to every key, never deleted through the API).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltinTemplate {
    pub name: String,
    pub description: String,
}

/// Why a build did not produce a template.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The build ran and failed (a step, the time limit, the start command, a cancel):
    /// reported in the build's status, not as an HTTP error.
    #[error("{}", .0.message)]
    Failed(BuildFailure),
    /// The node refused the request (an unknown base, a node error).
    #[error("{0}")]
    Refused(ApiError),
}

/// What a node says when one of its sandboxes ends without the control plane asking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeEvent {
    /// Its VM ended by itself (a VMM crash or kill, a guest power-off, lost at a node
    /// restart); `reason` is safe to show its owner.
    Ended { id: String, reason: String },
    /// Its VM stands halted by a disk error (a full node disk: it continues by itself
    /// once there is room), `true`; or runs again, `false`. Billed as paused meanwhile.
    Halted { id: String, halted: bool },
    /// Events were missed: every sandbox the caller tracks must be checked again.
    Lagged,
}

/// A node: the host that runs sandboxes and keeps volume disks. Sandboxes are named by id;
/// a node answers `NOT_FOUND` (with why, when it knows) for one it does not run.
#[async_trait]
pub trait NodeClient: Send + Sync + 'static {
    /// Whether the node forwards guests' API calls to this server (their agents then
    /// serve it at a guest-local URL).
    fn forwards_api(&self) -> bool;

    /// Sandboxes ending by themselves from now on (not those killed on request: whoever
    /// asked records those), until the node stops.
    fn events(&self) -> BoxStream<'static, NodeEvent>;

    /// Boot a sandbox; answers as it runs.
    async fn create_sandbox(&self, req: CreateSandboxRequest) -> NodeResult<SandboxInfo>;
    /// A sandbox the node runs or keeps paused.
    async fn sandbox(&self, id: &str) -> NodeResult<SandboxInfo>;
    /// Every sandbox the node runs or keeps paused.
    async fn sandboxes(&self) -> NodeResult<Vec<SandboxInfo>>;
    /// Stop a sandbox and delete everything in it.
    async fn kill(&self, id: &str) -> NodeResult<()>;
    /// Replace a sandbox's outbound policy in place, running or paused.
    async fn set_network(&self, id: &str, policy: &lizard_api::network::NetworkPolicy) -> NodeResult<SandboxInfo>;
    /// Save a sandbox's memory, processes and files, and stop its VM.
    async fn pause(&self, id: &str) -> NodeResult<SandboxInfo>;
    /// Restore a paused sandbox where it stopped.
    async fn resume(&self, id: &str) -> NodeResult<SandboxInfo>;
    /// Copies of a running sandbox, memory and processes included.
    async fn fork(&self, id: &str, count: u32) -> NodeResult<Vec<SandboxInfo>>;

    /// Run a command to completion and collect its output.
    async fn exec(&self, id: &str, req: ExecRequest) -> NodeResult<ProcessResult>;
    /// Run a command and stream its output.
    async fn exec_stream(&self, id: &str, req: ExecRequest) -> NodeResult<FrameStream>;
    async fn read_file(&self, id: &str, path: &str) -> NodeResult<FileRead>;
    /// Write `body` to a file (parents created, replaced atomically).
    async fn write_file(&self, id: &str, path: &str, opts: &WriteOptions, body: ByteStream) -> NodeResult<WriteResult>;
    async fn list_dir(&self, id: &str, path: &str) -> NodeResult<Vec<FileEntry>>;
    /// Remove a file or a directory tree.
    async fn remove(&self, id: &str, path: &str) -> NodeResult<()>;
    /// Create a directory and its parents (those it creates belong to `owner`).
    async fn make_dir(&self, id: &str, path: &str, owner: Option<&str>) -> NodeResult<()>;
    /// What `lstat` says of a path in the guest.
    async fn file_info(&self, id: &str, path: &str) -> NodeResult<FileInfo>;
    /// Move `from` to `to` in the guest; what is at `to` afterwards.
    async fn rename(&self, id: &str, from: &str, to: &str) -> NodeResult<FileInfo>;
    /// A directory's changes as NDJSON `FsEvent` lines, once the watch is in place; the
    /// stream fails when the sandbox pauses (the guest's watches end with its session).
    async fn watch(&self, id: &str, path: &str, recursive: bool) -> NodeResult<ByteStream>;
    /// A directory of the guest as a tar archive (streamed).
    async fn read_archive(&self, id: &str, path: &str) -> NodeResult<ByteStream>;
    /// Unpack a tar archive into a directory of the guest.
    async fn write_archive(&self, id: &str, path: &str, body: ByteStream) -> NodeResult<ArchiveResult>;
    /// A TCP connection to `port` on the guest's loopback, through its agent.
    async fn connect_port(&self, id: &str, port: u16) -> NodeResult<Box<dyn Tunnel>>;

    /// Start a background process (or a PTY): `Started`, its output, `Exit`. Dropping the
    /// stream leaves the process running.
    async fn start_process(&self, id: &str, req: StartProcessRequest) -> NodeResult<FrameStream>;
    /// Follow a process: `Started`, its kept output, live output, `Exit`.
    async fn process_output(&self, id: &str, pid: u32) -> NodeResult<FrameStream>;
    /// The processes the guest keeps, running or ended.
    async fn list_processes(&self, id: &str) -> NodeResult<Vec<ProcessInfo>>;
    /// Input, end of input, a signal or a resize for a process.
    async fn control_process(&self, id: &str, pid: u32, control: ProcessControl) -> NodeResult<()>;
    /// The TCP ports something listens on in the guest (the platform's own left out).
    async fn listening_ports(&self, id: &str) -> NodeResult<Vec<ListeningPort>>;
    /// Answer once something listens on TCP `port` in the guest; `TIMED_OUT` after
    /// `timeout_ms`.
    async fn wait_for_port(&self, id: &str, port: u16, timeout_ms: u64) -> NodeResult<()>;

    /// Make a volume's disk.
    async fn create_volume(&self, id: &str, size_gb: u32) -> NodeResult<()>;
    /// Delete a volume's disk (refused while a sandbox holds it).
    async fn delete_volume(&self, id: &str) -> NodeResult<()>;
    /// The sandbox that holds a volume's disk now, if any.
    async fn volume_holder(&self, id: &str) -> NodeResult<Option<String>>;

    /// The templates built into the node.
    fn builtin_templates(&self) -> Vec<BuiltinTemplate>;
    /// Build a template in a microVM. Events go to `events` as they happen (the caller
    /// sends the final `Done`); cancelling `cancel` stops the build and leaves nothing
    /// behind.
    async fn build_template(
        &self,
        build: BuildTemplate,
        events: UnboundedSender<BuildEvent>,
        cancel: CancellationToken,
    ) -> Result<BuiltTemplate, BuildError>;
    /// Forget a built template and the layers no other template uses; 409 while a
    /// sandbox uses it.
    async fn delete_template(&self, template_ref: &str) -> NodeResult<()>;

    /// Save running sandbox `id` as a snapshot of this node; a create whose request names
    /// it in `snapshot` starts from it.
    async fn snapshot_sandbox(&self, id: &str) -> NodeResult<lizard_api::node_api::NodeSandboxSnapshot>;
    /// Delete a snapshot (its sandboxes keep what they need).
    async fn delete_snapshot(&self, id: &str) -> NodeResult<()>;
}

/// Builds the client of a remote node (the lead installs `RemoteNode::new` here): an
/// indirection so the node set does not depend on how a node is reached.
pub trait NodeConnector: Send + Sync + 'static {
    /// A client for the node `node_id` at `address` (its API's base URL), calling it with
    /// `credential` as the bearer token.
    fn connect(&self, node_id: &str, address: &str, credential: String) -> Arc<dyn NodeClient>;
}

/// The in-process node, when this server runs one.
#[derive(Clone)]
struct InProcess {
    client: Arc<dyn NodeClient>,
    /// The node itself, for what it says of its own capacity (absent behind a test client).
    node: Option<Arc<lizard_node::Node>>,
}

/// A remote node's client and the address it was built for.
type AddressedClient = (String, Arc<dyn NodeClient>);

/// What reaching remote nodes takes: the cluster key and the connector, and the clients
/// built so far, by node id (rebuilt when the node's address changes).
struct Remote {
    key: ClusterKey,
    /// `None`: this build was given no way to reach nodes (they can still join and
    /// heartbeat; calls to them answer 503).
    connector: Option<Arc<dyn NodeConnector>>,
    clients: Mutex<HashMap<String, AddressedClient>>,
}

/// The nodes this server reaches: the in-process node (if it runs one) and remote nodes,
/// whose clients are built from their store rows (address + a credential recomputed from
/// the cluster key). Cheap to clone.
#[derive(Clone)]
pub struct Nodes {
    local: Option<InProcess>,
    remote: Option<Arc<Remote>>,
}

impl Nodes {
    /// The in-process node behind `node` (any client: tests pass fakes), under
    /// [`LOCAL_NODE_ID`]; `id` must be that id.
    pub fn single(id: impl Into<String>, node: Arc<dyn NodeClient>) -> Nodes {
        debug_assert_eq!(id.into(), LOCAL_NODE_ID);
        Nodes { local: Some(InProcess { client: node, node: None }), remote: None }
    }

    /// The in-process node alone, under [`LOCAL_NODE_ID`] (single-machine mode).
    pub fn local(node: Arc<lizard_node::Node>) -> Nodes {
        let client = Arc::new(LocalNode::new(node.clone()));
        Nodes { local: Some(InProcess { client, node: Some(node) }), remote: None }
    }

    /// No node in this process (`lizard server --no-local-node`): remote nodes only.
    pub fn none() -> Nodes {
        Nodes { local: None, remote: None }
    }

    /// Take remote nodes: check their calls and reach them with credentials derived from
    /// `key`, through `connector`.
    pub fn with_remote(mut self, key: ClusterKey, connector: Option<Arc<dyn NodeConnector>>) -> Nodes {
        self.remote = Some(Arc::new(Remote { key, connector, clients: Mutex::default() }));
        self
    }

    /// The in-process node's client, if this server runs one.
    pub fn local_client(&self) -> Option<&Arc<dyn NodeClient>> {
        self.local.as_ref().map(|l| &l.client)
    }

    /// The in-process `lizard_node::Node`, if this server runs one (not behind a test client).
    pub fn local_node(&self) -> Option<&Arc<lizard_node::Node>> {
        self.local.as_ref().and_then(|l| l.node.as_ref())
    }

    /// The cluster key, when this server reaches remote nodes (to check their calls).
    pub fn cluster_key(&self) -> Option<&ClusterKey> {
        self.remote.as_ref().map(|r| &r.key)
    }

    /// The client of the remote node `node_id` at `address`, or 503 when this server does
    /// not reach remote nodes.
    pub fn remote(&self, node_id: &str, address: &str) -> NodeResult<Arc<dyn NodeClient>> {
        let unreachable =
            || ApiError::new(ErrorCode::Unavailable, format!("node {node_id} is not reachable from this server"));
        let remote = self.remote.as_ref().ok_or_else(unreachable)?;
        let connector = remote.connector.as_ref().ok_or_else(unreachable)?;
        let mut clients = remote.clients.lock().expect("node clients lock poisoned");
        if let Some((at, client)) = clients.get(node_id) {
            if at == address {
                return Ok(client.clone());
            }
        }
        let client = connector.connect(node_id, address, remote.key.credential(node_id));
        clients.insert(node_id.to_owned(), (address.to_owned(), client.clone()));
        Ok(client)
    }
}
