//! One interface to "a node": everything the control plane asks of the host that runs a
//! sandbox goes through [`NodeClient`], so the operations above it do not care whether
//! that node lives in this process ([`LocalNode`], today's single-machine mode) or on
//! another host (an HTTP client, later).
//!
//! The trait is object-safe (the server holds `Arc<dyn NodeClient>`) and speaks only owned
//! types: requests and answers are [`lizard_api`]'s, errors are [`ApiError`]s (a stable
//! code and a message, what a remote node would send back), and the byte flows — exec
//! output, file contents, TCP tunnels to guest ports — are streams the caller drives.
//! [`Nodes`] is the set this server can reach, by node id.

mod local;
pub mod remote;

pub use local::LocalNode;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::BoxStream;
use lizard_agent_proto::frame::Frame;
use lizard_api::templates::{BuildEvent, BuildFailure};
pub use lizard_api::templates::{BuildTemplate, BuiltTemplate};
use lizard_api::{
    ApiError, CreateSandboxRequest, ErrorCode, ExecRequest, FileEntry, ProcessResult, SandboxInfo, WriteResult,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

/// What a node call answers: an [`ApiError`] carries the node's stable code and message.
pub type NodeResult<T> = Result<T, ApiError>;

/// Bytes flowing to or from a guest file.
pub type ByteStream = BoxStream<'static, std::io::Result<Bytes>>;

/// A command's output as exec frames, ending with `Exit` (or `Error`).
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
    async fn write_file(&self, id: &str, path: &str, mode: Option<u32>, body: ByteStream) -> NodeResult<WriteResult>;
    async fn list_dir(&self, id: &str, path: &str) -> NodeResult<Vec<FileEntry>>;
    /// Remove a file or a directory tree.
    async fn remove(&self, id: &str, path: &str) -> NodeResult<()>;
    /// Create a directory and its parents.
    async fn make_dir(&self, id: &str, path: &str) -> NodeResult<()>;
    /// A TCP connection to `port` on the guest's loopback, through its agent.
    async fn connect_port(&self, id: &str, port: u16) -> NodeResult<Box<dyn Tunnel>>;

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
}

/// The nodes this server reaches, by id, and the one new sandboxes without a volume go
/// to. Cheap to clone.
#[derive(Clone)]
pub struct Nodes {
    home: String,
    by_id: Arc<BTreeMap<String, Arc<dyn NodeClient>>>,
}

impl Nodes {
    /// One node, under `id`.
    pub fn single(id: impl Into<String>, node: Arc<dyn NodeClient>) -> Nodes {
        let id = id.into();
        Nodes { home: id.clone(), by_id: Arc::new(BTreeMap::from([(id, node)])) }
    }

    /// The in-process node alone, under [`LOCAL_NODE_ID`] (single-machine mode).
    pub fn local(node: Arc<lizard_node::Node>) -> Nodes {
        Nodes::single(LOCAL_NODE_ID, Arc::new(LocalNode::new(node)))
    }

    /// The id of the node new sandboxes without a volume go to.
    pub fn home_id(&self) -> &str {
        &self.home
    }

    /// The node new sandboxes without a volume go to.
    pub fn home(&self) -> Arc<dyn NodeClient> {
        self.by_id.get(&self.home).cloned().expect("the home node is one of the nodes (set at construction)")
    }

    /// The node `node_id`, or 503 for one this server cannot reach.
    pub fn get(&self, node_id: &str) -> NodeResult<Arc<dyn NodeClient>> {
        self.by_id.get(node_id).cloned().ok_or_else(|| {
            ApiError::new(ErrorCode::Unavailable, format!("node {node_id} is not reachable from this server"))
        })
    }

    /// Every node, by id.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Arc<dyn NodeClient>)> {
        self.by_id.iter().map(|(id, n)| (id.as_str(), n))
    }
}
