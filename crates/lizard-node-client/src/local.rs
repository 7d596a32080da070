//! [`NodeClient`] for the node that runs inside this process: calls on
//! `Arc<lizard_node::Node>`, errors mapped with [`lizard_node::NodeError::to_api`].

use super::{
    BuildError, BuildTemplate, BuiltTemplate, BuiltinTemplate, ByteStream, FileRead, FrameStream, NodeClient,
    NodeEvent, NodeResult, Tunnel, WriteOptions,
};
use async_trait::async_trait;
use futures_util::StreamExt;
use lizard_api::processes::{ListeningPort, ProcessControl, ProcessInfo, StartProcessRequest};
use lizard_api::templates::BuildEvent;
use lizard_api::{
    ArchiveResult, CreateSandboxRequest, ExecRequest, FileEntry, FileInfo, ProcessResult, SandboxInfo, WriteResult,
};
use lizard_node::{EndReason, Node, NodeError};
use std::sync::Arc;

/// The in-process node.
#[derive(Clone)]
pub struct LocalNode(Arc<Node>);

impl LocalNode {
    pub fn new(node: Arc<Node>) -> LocalNode {
        LocalNode(node)
    }

    /// The node itself (to shut it down with the process).
    pub fn node(&self) -> &Arc<Node> {
        &self.0
    }
}

/// The templates built into every node of this build (the image store's recipes).
pub fn builtin_templates() -> Vec<BuiltinTemplate> {
    lizard_image::ImageStore::template_names()
        .into_iter()
        .map(|name| BuiltinTemplate {
            name: name.to_owned(),
            description: lizard_image::ImageStore::builtin_recipe(name).map(|r| r.description).unwrap_or_default(),
        })
        .collect()
}

fn api(e: NodeError) -> lizard_api::ApiError {
    e.to_api()
}

#[async_trait]
impl NodeClient for LocalNode {
    fn forwards_api(&self) -> bool {
        self.0.config().api_forward.is_some()
    }

    fn events(&self) -> futures_util::stream::BoxStream<'static, NodeEvent> {
        use tokio::sync::broadcast::error::RecvError;
        let ends = futures_util::stream::unfold(self.0.ended_sandboxes(), |mut ends| async move {
            loop {
                let event = match ends.recv().await {
                    Ok((_, EndReason::Killed)) => continue,
                    Ok((id, reason)) => NodeEvent::Ended { id, reason: reason.to_string() },
                    Err(RecvError::Lagged(_)) => NodeEvent::Lagged,
                    Err(RecvError::Closed) => return None,
                };
                return Some((event, ends));
            }
        });
        let halts = futures_util::stream::unfold(self.0.halted_sandboxes(), |mut halts| async move {
            let event = match halts.recv().await {
                Ok((id, halted)) => NodeEvent::Halted { id, halted },
                Err(RecvError::Lagged(_)) => NodeEvent::Lagged,
                Err(RecvError::Closed) => return None,
            };
            Some((event, halts))
        });
        futures_util::stream::select(ends, halts).boxed()
    }

    async fn create_sandbox(&self, req: CreateSandboxRequest) -> NodeResult<SandboxInfo> {
        Ok(self.0.create(req).await.map_err(api)?.info())
    }

    async fn sandbox(&self, id: &str) -> NodeResult<SandboxInfo> {
        Ok(self.0.get(id).map_err(api)?.info())
    }

    async fn sandboxes(&self) -> NodeResult<Vec<SandboxInfo>> {
        Ok(self.0.list())
    }

    async fn kill(&self, id: &str) -> NodeResult<()> {
        self.0.kill(id).await.map_err(api)
    }

    async fn set_network(&self, id: &str, policy: &lizard_api::network::NetworkPolicy) -> NodeResult<SandboxInfo> {
        self.0.set_network_policy(id, policy.clone()).await.map_err(api)?;
        Ok(self.0.get(id).map_err(api)?.info())
    }

    async fn pause(&self, id: &str) -> NodeResult<SandboxInfo> {
        Ok(self.0.pause(id).await.map_err(api)?.info())
    }

    async fn resume(&self, id: &str) -> NodeResult<SandboxInfo> {
        Ok(self.0.resume(id).await.map_err(api)?.info())
    }

    async fn fork(&self, id: &str, count: u32) -> NodeResult<Vec<SandboxInfo>> {
        Ok(self.0.fork(id, count).await.map_err(api)?.iter().map(|s| s.info()).collect())
    }

    async fn exec(&self, id: &str, req: ExecRequest) -> NodeResult<ProcessResult> {
        self.0.get(id).map_err(api)?.exec_collect(req).await.map_err(api)
    }

    async fn exec_stream(&self, id: &str, req: ExecRequest) -> NodeResult<FrameStream> {
        let sandbox = self.0.get(id).map_err(api)?;
        Ok(sandbox.exec_frames(req).await.map_err(api)?.boxed())
    }

    async fn read_file(&self, id: &str, path: &str) -> NodeResult<FileRead> {
        let (len, body) = self.0.get(id).map_err(api)?.read_file(path).await.map_err(api)?;
        Ok(FileRead { len, body })
    }

    async fn write_file(&self, id: &str, path: &str, opts: &WriteOptions, body: ByteStream) -> NodeResult<WriteResult> {
        self.0.get(id).map_err(api)?.write_file(path, opts, body).await.map_err(api)
    }

    async fn list_dir(&self, id: &str, path: &str) -> NodeResult<Vec<FileEntry>> {
        self.0.get(id).map_err(api)?.list_dir(path).await.map_err(api)
    }

    async fn remove(&self, id: &str, path: &str) -> NodeResult<()> {
        self.0.get(id).map_err(api)?.remove(path).await.map_err(api)
    }

    async fn make_dir(&self, id: &str, path: &str, owner: Option<&str>) -> NodeResult<()> {
        self.0.get(id).map_err(api)?.make_dir(path, owner).await.map_err(api)
    }

    async fn file_info(&self, id: &str, path: &str) -> NodeResult<FileInfo> {
        self.0.get(id).map_err(api)?.file_info(path).await.map_err(api)
    }

    async fn rename(&self, id: &str, from: &str, to: &str) -> NodeResult<FileInfo> {
        self.0.get(id).map_err(api)?.rename(from, to).await.map_err(api)
    }

    async fn watch(&self, id: &str, path: &str, recursive: bool) -> NodeResult<ByteStream> {
        self.0.get(id).map_err(api)?.watch(path, recursive).await.map_err(api)
    }

    async fn read_archive(&self, id: &str, path: &str) -> NodeResult<ByteStream> {
        self.0.get(id).map_err(api)?.read_archive(path).await.map_err(api)
    }

    async fn write_archive(&self, id: &str, path: &str, body: ByteStream) -> NodeResult<ArchiveResult> {
        self.0.get(id).map_err(api)?.write_archive(path, body).await.map_err(api)
    }

    async fn connect_port(&self, id: &str, port: u16) -> NodeResult<Box<dyn Tunnel>> {
        let tunnel = self.0.get(id).map_err(api)?.connect_port(port).await.map_err(api)?;
        Ok(Box::new(tunnel))
    }

    async fn start_process(&self, id: &str, req: StartProcessRequest) -> NodeResult<FrameStream> {
        let sandbox = self.0.get(id).map_err(api)?;
        sandbox.start_process(req).await.map_err(api)
    }

    async fn process_output(&self, id: &str, pid: u32) -> NodeResult<FrameStream> {
        let sandbox = self.0.get(id).map_err(api)?;
        sandbox.process_output(pid).await.map_err(api)
    }

    async fn list_processes(&self, id: &str) -> NodeResult<Vec<ProcessInfo>> {
        self.0.get(id).map_err(api)?.list_processes().await.map_err(api)
    }

    async fn control_process(&self, id: &str, pid: u32, control: ProcessControl) -> NodeResult<()> {
        self.0.get(id).map_err(api)?.control_process(pid, control).await.map_err(api)
    }

    async fn listening_ports(&self, id: &str) -> NodeResult<Vec<ListeningPort>> {
        self.0.get(id).map_err(api)?.listening_ports().await.map_err(api)
    }

    async fn wait_for_port(&self, id: &str, port: u16, timeout_ms: u64) -> NodeResult<()> {
        self.0.get(id).map_err(api)?.wait_for_port(port, timeout_ms).await.map_err(api)
    }

    async fn create_volume(&self, id: &str, size_gb: u32) -> NodeResult<()> {
        self.0.create_volume(id, size_gb).await.map_err(api)
    }

    async fn delete_volume(&self, id: &str) -> NodeResult<()> {
        self.0.delete_volume(id).map_err(api)
    }

    async fn volume_holder(&self, id: &str) -> NodeResult<Option<String>> {
        Ok(self.0.volume_holder(id))
    }

    fn builtin_templates(&self) -> Vec<BuiltinTemplate> {
        builtin_templates()
    }

    async fn build_template(
        &self,
        build: BuildTemplate,
        events: tokio::sync::mpsc::UnboundedSender<BuildEvent>,
        cancel: tokio_util::sync::CancellationToken,
    ) -> Result<BuiltTemplate, BuildError> {
        match self.0.build_template(build, events, cancel).await {
            Ok(built) => Ok(built),
            // A failure of the build itself (a step, the time limit, the start command, a
            // cancel) is the build's status; the node's own failures are logged by
            // `to_api` and answered without their cause.
            Err(e) => Err(match e.build_failure() {
                Some(failure) => BuildError::Failed(failure),
                None => BuildError::Refused(e.to_api()),
            }),
        }
    }

    async fn delete_template(&self, template_ref: &str) -> NodeResult<()> {
        self.0.delete_template(template_ref).await.map_err(api)
    }

    async fn snapshot_sandbox(&self, id: &str) -> NodeResult<lizard_api::node_api::NodeSandboxSnapshot> {
        self.0.snapshot_sandbox(id).await.map_err(api)
    }

    async fn delete_snapshot(&self, id: &str) -> NodeResult<()> {
        self.0.delete_sandbox_snapshot(id).await.map_err(api)
    }
}
