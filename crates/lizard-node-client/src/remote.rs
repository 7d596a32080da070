//! [`NodeClient`] for a node on another host: its API (the [`lizard_api::routes::node`]
//! table) over HTTP/1.1 with the node's credential as the bearer token.
//!
//! Byte flows stay streams end to end (exec frames, file contents both ways, the build's
//! context), and a guest port is a connection upgraded after `101`. A node that cannot be
//! reached answers 503 `UNAVAILABLE`; its own errors come back as it sent them.
//!
//! - `channel`: the HTTP client, timeouts, retries, error answers.
//! - `build`: a template build's streamed request and answer.

mod build;
mod channel;

use super::{
    BuildError, BuildTemplate, BuiltTemplate, BuiltinTemplate, ByteStream, FileRead, FrameStream, NodeClient,
    NodeEvent, NodeResult, Tunnel, WriteOptions,
};
use async_trait::async_trait;
use channel::{json, Call, Channel, Payload, SLOW};
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use http_body_util::{BodyExt, StreamBody};
use lizard_api::node_api::{NodeVolumeRequest, VolumeHolder};
use lizard_api::processes::{ListeningPort, ProcessControl, ProcessInfo, SignalRequest, StartProcessRequest};
use lizard_api::routes::node as table;
use lizard_api::templates::BuildEvent;
use lizard_api::{
    ApiError, ArchiveResult, CreateSandboxRequest, ErrorCode, ExecRequest, FileEntry, FileInfo, ForkRequest,
    ProcessResult, SandboxInfo, WriteResult,
};
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

/// A node reached over its API.
#[derive(Clone)]
pub struct RemoteNode {
    channel: Channel,
    address: String,
}

impl RemoteNode {
    /// The node `node_id` at `address` (`http://host:port`), called with `credential`.
    pub fn new(node_id: String, address: String, credential: String) -> RemoteNode {
        RemoteNode { channel: Channel::new(node_id, &address, &credential), address }
    }

    pub fn node_id(&self) -> &str {
        self.channel.node_id()
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    /// A streamed answer's body; breaking off is an I/O error that names the node.
    fn body_of(&self, resp: hyper::Response<hyper::body::Incoming>, what: &'static str) -> ByteStream {
        let node = self.clone();
        resp.into_body().into_data_stream().map_err(move |e| node.broke_off(what, e)).boxed()
    }

    /// Send `call` and stream its answer's body.
    async fn streamed(&self, call: &Call, what: &'static str) -> NodeResult<ByteStream> {
        let resp = self.channel.send(call, NO_BODY).await?;
        Ok(self.body_of(resp, what))
    }

    /// Send `call` and decode its answer as exec frames.
    async fn frames(&self, call: &Call, payload: Payload, what: &'static str) -> NodeResult<FrameStream> {
        let resp = self.channel.send(call, payload).await?;
        let node = self.clone();
        let body = resp.into_body().into_data_stream().map_err(move |e| node.broke_off(what, e));
        let frames = tokio_util::codec::FramedRead::new(
            tokio_util::io::StreamReader::new(body),
            lizard_agent_proto::frame::FrameCodec,
        );
        Ok(frames
            .map_err(|e| match e {
                lizard_agent_proto::frame::FrameError::Io(e) => e,
                other => std::io::Error::new(std::io::ErrorKind::InvalidData, other.to_string()),
            })
            .boxed())
    }

    fn broke_off(&self, what: &str, e: impl std::fmt::Display) -> std::io::Error {
        tracing::warn!(node = %self.node_id(), "{what} broke off: {e}");
        std::io::Error::other(format!("node {} stopped answering", self.node_id()))
    }
}

const NO_BODY: Payload = Payload::Bytes(bytes::Bytes::new());

#[async_trait]
impl NodeClient for RemoteNode {
    /// The node agent forwards its guests' API calls to the server it joined.
    fn forwards_api(&self) -> bool {
        true
    }

    /// Remote nodes post their sandboxes' ends to the server (the cluster events route).
    fn events(&self) -> BoxStream<'static, NodeEvent> {
        futures_util::stream::empty().boxed()
    }

    async fn create_sandbox(&self, req: CreateSandboxRequest) -> NodeResult<SandboxInfo> {
        let call = Call::new(&table::CREATE_SANDBOX, &[]).head_timeout(Some(SLOW));
        self.channel.json(&call, Payload::Bytes(json(&req))).await
    }

    async fn sandbox(&self, id: &str) -> NodeResult<SandboxInfo> {
        self.channel.json(&Call::new(&table::GET_SANDBOX, &[id]), NO_BODY).await
    }

    async fn sandboxes(&self) -> NodeResult<Vec<SandboxInfo>> {
        self.channel.json(&Call::new(&table::LIST_SANDBOXES, &[]), NO_BODY).await
    }

    async fn kill(&self, id: &str) -> NodeResult<()> {
        self.channel.unit(&Call::new(&table::KILL_SANDBOX, &[id]).head_timeout(Some(SLOW)), NO_BODY).await
    }

    async fn set_network(&self, id: &str, policy: &lizard_api::network::NetworkPolicy) -> NodeResult<SandboxInfo> {
        self.channel.json(&Call::new(&table::SET_NETWORK, &[id]), Payload::Bytes(json(policy))).await
    }

    async fn pause(&self, id: &str) -> NodeResult<SandboxInfo> {
        self.channel.json(&Call::new(&table::PAUSE, &[id]).head_timeout(Some(SLOW)), NO_BODY).await
    }

    async fn resume(&self, id: &str) -> NodeResult<SandboxInfo> {
        self.channel.json(&Call::new(&table::RESUME, &[id]).head_timeout(Some(SLOW)), NO_BODY).await
    }

    async fn fork(&self, id: &str, count: u32) -> NodeResult<Vec<SandboxInfo>> {
        let call = Call::new(&table::FORK, &[id]).head_timeout(Some(SLOW));
        self.channel.json(&call, Payload::Bytes(json(&ForkRequest { count }))).await
    }

    async fn exec(&self, id: &str, req: ExecRequest) -> NodeResult<ProcessResult> {
        // The answer comes when the command ends: its own limit, and a margin.
        let limit = req.timeout_ms.map(|ms| Duration::from_millis(ms) + Duration::from_secs(60));
        let call = Call::new(&table::EXEC, &[id]).head_timeout(limit);
        self.channel.json(&call, Payload::Bytes(json(&req))).await
    }

    async fn exec_stream(&self, id: &str, req: ExecRequest) -> NodeResult<FrameStream> {
        let call = Call::new(&table::EXEC, &[id]).param("stream", true);
        self.frames(&call, Payload::Bytes(json(&req)), "an exec stream").await
    }

    async fn read_file(&self, id: &str, path: &str) -> NodeResult<FileRead> {
        let call = Call::new(&table::READ_FILE, &[id]).param("path", path);
        let resp = self.channel.send(&call, NO_BODY).await?;
        let len = resp
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        Ok(FileRead { len, body: self.body_of(resp, "a file read") })
    }

    async fn write_file(&self, id: &str, path: &str, opts: &WriteOptions, body: ByteStream) -> NodeResult<WriteResult> {
        let mut call = Call::new(&table::WRITE_FILE, &[id]).param("path", path).head_timeout(Some(SLOW));
        if let Some(mode) = opts.mode {
            call = call.param("mode", format!("{mode:o}"));
        }
        if let Some(owner) = &opts.owner {
            call = call.param("user", owner);
        }
        if !opts.metadata.is_empty() {
            call = call.param("metadata", serde_json::to_string(&opts.metadata).expect("maps of strings serialize"));
        }
        let body = BodyExt::boxed_unsync(StreamBody::new(body.map_ok(hyper::body::Frame::data)));
        self.channel.json(&call, Payload::Stream(body)).await
    }

    async fn list_dir(&self, id: &str, path: &str) -> NodeResult<Vec<FileEntry>> {
        self.channel.json(&Call::new(&table::LIST_DIR, &[id]).param("path", path), NO_BODY).await
    }

    async fn remove(&self, id: &str, path: &str) -> NodeResult<()> {
        self.channel.unit(&Call::new(&table::REMOVE_FILE, &[id]).param("path", path), NO_BODY).await
    }

    async fn make_dir(&self, id: &str, path: &str, owner: Option<&str>) -> NodeResult<()> {
        let mut call = Call::new(&table::MAKE_DIR, &[id]).param("path", path);
        if let Some(owner) = owner {
            call = call.param("user", owner);
        }
        self.channel.unit(&call, NO_BODY).await
    }

    async fn file_info(&self, id: &str, path: &str) -> NodeResult<FileInfo> {
        self.channel.json(&Call::new(&table::FILE_INFO, &[id]).param("path", path), NO_BODY).await
    }

    async fn rename(&self, id: &str, from: &str, to: &str) -> NodeResult<FileInfo> {
        let call = Call::new(&table::RENAME_FILE, &[id]).param("path", from).param("to", to);
        self.channel.json(&call, NO_BODY).await
    }

    async fn watch(&self, id: &str, path: &str, recursive: bool) -> NodeResult<ByteStream> {
        let call = Call::new(&table::WATCH_DIR, &[id]).param("path", path).param("recursive", recursive);
        self.streamed(&call, "a watch").await
    }

    async fn read_archive(&self, id: &str, path: &str) -> NodeResult<ByteStream> {
        self.streamed(&Call::new(&table::READ_ARCHIVE, &[id]).param("path", path), "an archive read").await
    }

    async fn write_archive(&self, id: &str, path: &str, body: ByteStream) -> NodeResult<ArchiveResult> {
        let call = Call::new(&table::WRITE_ARCHIVE, &[id]).param("path", path).head_timeout(Some(SLOW));
        let body = BodyExt::boxed_unsync(StreamBody::new(body.map_ok(hyper::body::Frame::data)));
        self.channel.json(&call, Payload::Stream(body)).await
    }

    async fn connect_port(&self, id: &str, port: u16) -> NodeResult<Box<dyn Tunnel>> {
        let call = Call::new(&table::CONNECT_PORT, &[id, &port.to_string()]);
        let upgrade = [("connection", "upgrade"), ("upgrade", table::TUNNEL_PROTOCOL)];
        let resp = self.channel.send_with(&call, NO_BODY, &upgrade).await?;
        if resp.status() != hyper::StatusCode::SWITCHING_PROTOCOLS {
            tracing::error!(node = %self.node_id(), status = %resp.status(), "a port tunnel was not upgraded");
            return Err(ApiError::new(ErrorCode::Internal, format!("node {} did not open the tunnel", self.node_id())));
        }
        let upgraded = hyper::upgrade::on(resp).await.map_err(|e| self.channel.unreachable(e))?;
        Ok(Box::new(hyper_util::rt::TokioIo::new(upgraded)))
    }

    async fn start_process(&self, id: &str, req: StartProcessRequest) -> NodeResult<FrameStream> {
        let call = Call::new(&table::START_PROCESS, &[id]);
        self.frames(&call, Payload::Bytes(json(&req)), "a process's output").await
    }

    async fn process_output(&self, id: &str, pid: u32) -> NodeResult<FrameStream> {
        let call = Call::new(&table::PROCESS_OUTPUT, &[id, &pid.to_string()]);
        self.frames(&call, NO_BODY, "a process's output").await
    }

    async fn list_processes(&self, id: &str) -> NodeResult<Vec<ProcessInfo>> {
        self.channel.json(&Call::new(&table::LIST_PROCESSES, &[id]), NO_BODY).await
    }

    async fn control_process(&self, id: &str, pid: u32, control: ProcessControl) -> NodeResult<()> {
        let pid = pid.to_string();
        let args = [id, pid.as_str()];
        let (call, payload) = match control {
            // Input waits while the process does not read it: as long as that takes.
            ProcessControl::Stdin(data) => {
                (Call::new(&table::PROCESS_STDIN, &args).head_timeout(None), Payload::Bytes(data.into()))
            }
            ProcessControl::CloseStdin => (Call::new(&table::CLOSE_PROCESS_STDIN, &args), NO_BODY),
            ProcessControl::Signal(signal) => (
                Call::new(&table::SIGNAL_PROCESS, &args),
                Payload::Bytes(json(&SignalRequest { signal: Some(signal) })),
            ),
            ProcessControl::Resize(size) => (Call::new(&table::RESIZE_PROCESS, &args), Payload::Bytes(json(&size))),
        };
        self.channel.unit(&call, payload).await
    }

    async fn listening_ports(&self, id: &str) -> NodeResult<Vec<ListeningPort>> {
        self.channel.json(&Call::new(&table::LIST_PORTS, &[id]), NO_BODY).await
    }

    async fn wait_for_port(&self, id: &str, port: u16, timeout_ms: u64) -> NodeResult<()> {
        let call = Call::new(&table::WAIT_FOR_PORT, &[id, &port.to_string()])
            .param("timeoutMs", timeout_ms)
            .head_timeout(Some(Duration::from_millis(timeout_ms) + channel::QUICK));
        self.channel.unit(&call, NO_BODY).await
    }

    async fn create_volume(&self, id: &str, size_gb: u32) -> NodeResult<()> {
        let call = Call::new(&table::CREATE_VOLUME, &[id]).head_timeout(Some(SLOW));
        self.channel.unit(&call, Payload::Bytes(json(&NodeVolumeRequest { size_gb }))).await
    }

    async fn delete_volume(&self, id: &str) -> NodeResult<()> {
        self.channel.unit(&Call::new(&table::DELETE_VOLUME, &[id]), NO_BODY).await
    }

    async fn volume_holder(&self, id: &str) -> NodeResult<Option<String>> {
        let holder: VolumeHolder = self.channel.json(&Call::new(&table::VOLUME_HOLDER, &[id]), NO_BODY).await?;
        Ok(holder.sandbox_id)
    }

    /// The built-ins of this release: every node of a cluster runs the same one (the node
    /// serves the same list at `GET /v1/node/templates/builtin`, for operators).
    fn builtin_templates(&self) -> Vec<BuiltinTemplate> {
        lizard_node::http::builtin_templates()
            .into_iter()
            .map(|t| BuiltinTemplate { name: t.name, description: t.description })
            .collect()
    }

    async fn build_template(
        &self,
        build: BuildTemplate,
        events: UnboundedSender<BuildEvent>,
        cancel: CancellationToken,
    ) -> Result<BuiltTemplate, BuildError> {
        build::build(&self.channel, build, events, cancel).await
    }

    async fn delete_template(&self, template_ref: &str) -> NodeResult<()> {
        self.channel.unit(&Call::new(&table::DELETE_TEMPLATE, &[template_ref]).head_timeout(Some(SLOW)), NO_BODY).await
    }

    async fn snapshot_sandbox(&self, id: &str) -> NodeResult<lizard_api::node_api::NodeSandboxSnapshot> {
        self.channel.json(&Call::new(&table::SNAPSHOT_SANDBOX, &[id]).head_timeout(Some(SLOW)), NO_BODY).await
    }

    async fn delete_snapshot(&self, id: &str) -> NodeResult<()> {
        self.channel.unit(&Call::new(&table::DELETE_SNAPSHOT, &[id]), NO_BODY).await
    }
}

/// Builds [`RemoteNode`]s for the server's [`super::Nodes`]: how a replica reaches the
/// nodes that joined.
pub struct HttpConnector;

impl super::NodeConnector for HttpConnector {
    fn connect(&self, node_id: &str, address: &str, credential: String) -> std::sync::Arc<dyn NodeClient> {
        std::sync::Arc::new(RemoteNode::new(node_id.to_owned(), address.to_owned(), credential))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A node over an empty data directory (no VM is booted by these calls), served on
    /// loopback with `credential`.
    async fn served(credential: &str) -> (String, Arc<lizard_node::Node>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let node = lizard_node::Node::start(lizard_node::NodeConfig::new(dir.path())).await.unwrap();
        let app = lizard_node::http::tcp_router(node.clone(), lizard_node::http::Credential::new(credential));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (address, node, dir)
    }

    #[tokio::test]
    async fn the_nodes_errors_come_back_as_it_sent_them() {
        let (address, _node, _dir) = served("cred").await;
        let remote = RemoteNode::new("node_a".into(), address, "cred".into());
        assert_eq!(remote.sandbox("sbx_nope").await.unwrap_err().code, ErrorCode::NotFound);
        assert_eq!(remote.exec("sbx_nope", ExecRequest::default()).await.unwrap_err().code, ErrorCode::NotFound);
        assert!(remote.connect_port("sbx_nope", 80).await.err().map(|e| e.code) == Some(ErrorCode::NotFound));
        assert!(remote.sandboxes().await.unwrap().is_empty());
        assert_eq!(remote.volume_holder("vol_x").await.unwrap(), None);
        assert!(remote.forwards_api());
        assert!(!remote.builtin_templates().is_empty());
    }

    #[tokio::test]
    async fn a_wrong_credential_is_unavailable_and_changes_nothing() {
        let (address, node, _dir) = served("right").await;
        let remote = RemoteNode::new("node_a".into(), address, "wrong".into());
        let e = remote.create_volume("vol_1", 1).await.unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (ErrorCode::Unavailable, "node node_a is not reachable"));
        assert_eq!(remote.sandboxes().await.unwrap_err().code, ErrorCode::Unavailable);
        assert!(!node.config().data_dir.join("volumes").join("vol_1").exists());
        assert!(std::fs::read_dir(node.config().data_dir.join("volumes")).unwrap().next().is_none());
    }

    #[tokio::test]
    async fn a_node_nobody_answers_for_is_unavailable_at_once() {
        // A port that was just free: connecting is refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let remote = RemoteNode::new("node_gone".into(), format!("http://127.0.0.1:{port}"), "c".into());
        let started = std::time::Instant::now();
        let e = remote.sandbox("sbx_1").await.unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (ErrorCode::Unavailable, "node node_gone is not reachable"));
        assert!(!e.message.contains("127.0.0.1"), "no host internals: {e}");
        assert!(started.elapsed() < Duration::from_secs(5), "retries are short: {:?}", started.elapsed());
        let e = remote.create_sandbox(CreateSandboxRequest::default()).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::Unavailable);
    }
}
