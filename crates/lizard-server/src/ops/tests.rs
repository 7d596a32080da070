//! The operations over a fake node (no VM, no root): what the timeout reaper, the billing
//! pauser and a lookup do to the store and ask of the node.

use super::{hooks, lifecycle, node_events, sandboxes, timeouts};
use crate::billing::SandboxPauser;
use crate::state::{AppState, ServerState};
use crate::ServerConfig;
use async_trait::async_trait;
use lizard_api::templates::{BuildEvent, BuildFailure, BuildStatus, BuildStepInfo, OutputStream};
use lizard_api::{
    ApiError, ArchiveResult, CreateSandboxRequest, ErrorCode, ExecRequest, FileEntry, FileInfo, ProcessResult,
    SandboxInfo, WriteResult,
};
use lizard_node_client::{
    BuildError, BuildTemplate, BuiltTemplate, BuiltinTemplate, ByteStream, FileRead, FrameStream, NodeClient,
    NodeEvent, NodeResult, Nodes, Tunnel, LOCAL_NODE_ID,
};
use lizard_store::fixture::seeded_store;
use lizard_store::{NewSandbox, OnTimeout, SandboxState};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

/// How the fake node's next builds end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum BuildOutcome {
    /// Every step runs (or is cached, when a build of the same recipe succeeded before).
    #[default]
    Succeed,
    /// The last step exits non-zero.
    FailLastStep,
    /// Runs until cancelled.
    UntilCancelled,
}

/// A node that runs the sandboxes it is told about, and records what it is asked.
#[derive(Default)]
pub(crate) struct FakeNode {
    sandboxes: Mutex<BTreeMap<String, SandboxState>>,
    calls: Mutex<Vec<String>>,
    pub(super) outcome: Mutex<BuildOutcome>,
    /// Subscribers to [`NodeClient::events`].
    events: Mutex<Vec<UnboundedSender<NodeEvent>>>,
    /// Creates are refused 503 (its own admission) while set.
    pub(crate) full: Mutex<bool>,
}

impl FakeNode {
    fn running(&self, id: &str) {
        self.sandboxes.lock().unwrap().insert(id.into(), SandboxState::Running);
    }

    /// Its VM dies by itself: gone from the node, and reported.
    fn crash(&self, id: &str) {
        self.sandboxes.lock().unwrap().remove(id);
        for tx in self.events.lock().unwrap().iter() {
            let _ = tx.send(NodeEvent::Ended { id: id.into(), reason: "its VM stopped unexpectedly".into() });
        }
    }

    pub(crate) fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn info(&self, id: &str) -> NodeResult<SandboxInfo> {
        let state = *self
            .sandboxes
            .lock()
            .unwrap()
            .get(id)
            .ok_or_else(|| ApiError::new(ErrorCode::NotFound, format!("sandbox {id} not found: its VM died")))?;
        Ok(SandboxInfo {
            sandbox_id: id.into(),
            template: "base".into(),
            state,
            vcpus: 1,
            memory_mib: 512,
            started_at: "2026-01-01T00:00:00Z".into(),
            metadata: BTreeMap::new(),
            project_id: None,
            end_at: None,
            domain: None,
            workdir: None,
            access_token: None,
        })
    }

    fn set(&self, call: &str, id: &str, state: Option<SandboxState>) -> NodeResult<SandboxInfo> {
        self.calls.lock().unwrap().push(format!("{call} {id}"));
        let info = self.info(id)?;
        match state {
            Some(s) => {
                self.sandboxes.lock().unwrap().insert(id.into(), s);
            }
            None => {
                self.sandboxes.lock().unwrap().remove(id);
            }
        }
        Ok(info)
    }
}

fn not_here<T>() -> NodeResult<T> {
    Err(ApiError::new(ErrorCode::Internal, "not used by these tests"))
}

#[async_trait]
impl NodeClient for FakeNode {
    fn forwards_api(&self) -> bool {
        false
    }
    fn events(&self) -> futures_util::stream::BoxStream<'static, NodeEvent> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.events.lock().unwrap().push(tx);
        futures_util::StreamExt::boxed(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|e| (e, rx))
        }))
    }
    async fn create_sandbox(&self, _: CreateSandboxRequest) -> NodeResult<SandboxInfo> {
        if *self.full.lock().unwrap() {
            return Err(ApiError::new(ErrorCode::Unavailable, "this node cannot take a sandbox now"));
        }
        let id = lizard_api::ids::new_id("sbx");
        self.running(&id);
        self.calls.lock().unwrap().push(format!("create {id}"));
        self.info(&id)
    }
    async fn sandbox(&self, id: &str) -> NodeResult<SandboxInfo> {
        self.info(id)
    }
    async fn sandboxes(&self) -> NodeResult<Vec<SandboxInfo>> {
        not_here()
    }
    async fn kill(&self, id: &str) -> NodeResult<()> {
        self.set("kill", id, None).map(drop)
    }
    async fn set_network(&self, _: &str, _: &lizard_api::network::NetworkPolicy) -> NodeResult<SandboxInfo> {
        not_here()
    }
    async fn pause(&self, id: &str) -> NodeResult<SandboxInfo> {
        self.set("pause", id, Some(SandboxState::Paused))
    }
    async fn resume(&self, id: &str) -> NodeResult<SandboxInfo> {
        self.set("resume", id, Some(SandboxState::Running))
    }
    async fn fork(&self, _: &str, _: u32) -> NodeResult<Vec<SandboxInfo>> {
        not_here()
    }
    async fn exec(&self, _: &str, _: ExecRequest) -> NodeResult<ProcessResult> {
        not_here()
    }
    async fn exec_stream(&self, _: &str, _: ExecRequest) -> NodeResult<FrameStream> {
        not_here()
    }
    async fn read_file(&self, _: &str, _: &str) -> NodeResult<FileRead> {
        not_here()
    }
    async fn write_file(
        &self,
        _: &str,
        _: &str,
        _: &lizard_node_client::WriteOptions,
        _: ByteStream,
    ) -> NodeResult<WriteResult> {
        not_here()
    }
    async fn list_dir(&self, _: &str, _: &str) -> NodeResult<Vec<FileEntry>> {
        not_here()
    }
    async fn remove(&self, _: &str, _: &str) -> NodeResult<()> {
        not_here()
    }
    async fn make_dir(&self, _: &str, _: &str, _: Option<&str>) -> NodeResult<()> {
        not_here()
    }
    async fn file_info(&self, _: &str, _: &str) -> NodeResult<FileInfo> {
        not_here()
    }
    async fn rename(&self, _: &str, _: &str, _: &str) -> NodeResult<FileInfo> {
        not_here()
    }
    async fn watch(&self, _: &str, _: &str, _: bool) -> NodeResult<ByteStream> {
        not_here()
    }
    async fn read_archive(&self, _: &str, _: &str) -> NodeResult<ByteStream> {
        not_here()
    }
    async fn write_archive(&self, _: &str, _: &str, _: ByteStream) -> NodeResult<ArchiveResult> {
        not_here()
    }
    async fn connect_port(&self, _: &str, _: u16) -> NodeResult<Box<dyn Tunnel>> {
        not_here()
    }
    async fn start_process(&self, _: &str, _: lizard_api::processes::StartProcessRequest) -> NodeResult<FrameStream> {
        not_here()
    }
    async fn process_output(&self, _: &str, _: u32) -> NodeResult<FrameStream> {
        not_here()
    }
    async fn list_processes(&self, _: &str) -> NodeResult<Vec<lizard_api::processes::ProcessInfo>> {
        not_here()
    }
    async fn control_process(&self, _: &str, _: u32, _: lizard_api::processes::ProcessControl) -> NodeResult<()> {
        not_here()
    }
    async fn listening_ports(&self, _: &str) -> NodeResult<Vec<lizard_api::processes::ListeningPort>> {
        not_here()
    }
    async fn wait_for_port(&self, _: &str, _: u16, _: u64) -> NodeResult<()> {
        not_here()
    }
    async fn create_volume(&self, _: &str, _: u32) -> NodeResult<()> {
        not_here()
    }
    async fn delete_volume(&self, _: &str) -> NodeResult<()> {
        not_here()
    }
    async fn snapshot_sandbox(&self, _: &str) -> NodeResult<lizard_api::node_api::NodeSandboxSnapshot> {
        not_here()
    }
    async fn delete_snapshot(&self, _: &str) -> NodeResult<()> {
        not_here()
    }
    async fn volume_holder(&self, _: &str) -> NodeResult<Option<String>> {
        Ok(None)
    }
    fn builtin_templates(&self) -> Vec<BuiltinTemplate> {
        vec![BuiltinTemplate { name: "base".into(), description: "the base".into() }]
    }
    async fn build_template(
        &self,
        build: BuildTemplate,
        events: UnboundedSender<BuildEvent>,
        cancel: CancellationToken,
    ) -> Result<BuiltTemplate, BuildError> {
        self.calls.lock().unwrap().push(format!("build {} from {}", build.template_ref, build.base_ref));
        let outcome = *self.outcome.lock().unwrap();
        let total = u32::try_from(build.recipe.steps.len()).unwrap();
        let mut steps = Vec::new();
        for (i, step) in build.recipe.steps.iter().enumerate() {
            let index = u32::try_from(i + 1).unwrap();
            let description = step.summary();
            let _ = events.send(BuildEvent::Step { index, total, description: description.clone(), cached: false });
            let _ = events.send(BuildEvent::Output { stream: OutputStream::Stdout, data: format!("step {index}\n") });
            if index == total && outcome == BuildOutcome::FailLastStep {
                return Err(BuildError::Failed(BuildFailure {
                    code: "STEP_FAILED".into(),
                    message: format!("step {index} ({description}) exited with status 1"),
                    step: Some(index),
                    output_tail: Some(format!("step {index}\n")),
                }));
            }
            if index == total && outcome == BuildOutcome::UntilCancelled {
                cancel.cancelled().await;
                return Err(BuildError::Failed(BuildFailure {
                    code: "CANCELLED".into(),
                    message: "the build was cancelled".into(),
                    step: Some(index),
                    output_tail: None,
                }));
            }
            let _ = events.send(BuildEvent::StepDone { index, duration_ms: 1 });
            steps.push(BuildStepInfo {
                index,
                description,
                cached: false,
                status: BuildStatus::Ready,
                duration_ms: Some(1),
            });
        }
        Ok(BuiltTemplate { template_ref: build.template_ref, steps, layer_bytes: 4096 })
    }
    async fn delete_template(&self, template_ref: &str) -> NodeResult<()> {
        self.calls.lock().unwrap().push(format!("delete_template {template_ref}"));
        Ok(())
    }
}

/// A store with one account, workspace and project, over `node`.
async fn app(node: Arc<FakeNode>) -> AppState {
    app_in(node, &[("ws", "prj")], "/nonexistent").await
}

/// A store with these `(workspace, project)` pairs and data directory, over `node`.
pub(super) async fn app_in(node: Arc<FakeNode>, projects: &[(&str, &str)], data_dir: &str) -> AppState {
    let store: Arc<dyn lizard_store::Store> = Arc::new(seeded_store("acc", projects).await);
    let nodes = Nodes::single(LOCAL_NODE_ID, node);
    let server = ServerState::new(store.clone(), ServerConfig::new(data_dir))
        .with_reaper(Arc::new(hooks::NodeReaper { nodes: nodes.clone(), store }));
    AppState::new(server, nodes)
}

/// Record a running sandbox that timed out long ago.
async fn record(state: &AppState, node: &FakeNode, id: &str, on_timeout: OnTimeout) {
    node.running(id);
    let s = NewSandbox {
        id: id.into(),
        project_id: "prj".into(),
        template: "base".into(),
        state: SandboxState::Running,
        created_at: 0,
        timeout_at: Some(1),
        metadata: BTreeMap::new(),
        meter: state.server.config.billing.pricing.meter(1, 512),
        on_timeout,
        timeout_ms: Some(1_000),
        template_ref: None,
        node_id: "node_local".into(),
    };
    state.server.store.insert_sandbox(&s).await.unwrap();
}

#[tokio::test]
async fn the_reaper_pauses_or_kills_through_the_node_and_records_it() {
    let node = Arc::new(FakeNode::default());
    let state = app(node.clone()).await;
    record(&state, &node, "sb_pause", OnTimeout::Pause).await;
    record(&state, &node, "sb_kill", OnTimeout::Kill).await;
    timeouts::reap_once(&state).await;
    let mut calls = node.calls();
    calls.sort();
    assert_eq!(calls, ["kill sb_kill", "pause sb_pause"]);
    let store = &state.server.store;
    let paused = store.get_sandbox("sb_pause").await.unwrap().unwrap();
    assert_eq!((paused.state, paused.ended_at), (SandboxState::Paused, None));
    assert!(paused.timeout_at.unwrap() > lizard_api::ids::now_ms(), "kept for the paused retention");
    let killed = store.get_sandbox("sb_kill").await.unwrap().unwrap();
    assert_eq!(killed.end_reason.as_deref(), Some("timed out"));
    // Nothing more is due: the paused one waits out its retention.
    timeouts::reap_once(&state).await;
    assert_eq!(node.calls().len(), 2);
}

#[tokio::test]
async fn the_billing_pauser_and_a_resume_go_through_the_same_operations() {
    let node = Arc::new(FakeNode::default());
    let state = app(node.clone()).await;
    record(&state, &node, "sb", OnTimeout::Kill).await;
    hooks::BillingPauser(state.clone()).pause("sb").await.unwrap();
    let store = &state.server.store;
    assert_eq!(store.get_sandbox("sb").await.unwrap().unwrap().state, SandboxState::Paused);
    let live = sandboxes::live(&state, store.get_sandbox("sb").await.unwrap().unwrap()).await.unwrap();
    assert!(live.is_paused());
    lifecycle::resume(&state, &live).await.unwrap();
    assert_eq!(store.get_sandbox("sb").await.unwrap().unwrap().state, SandboxState::Running);
    assert_eq!(node.calls(), ["pause sb", "resume sb"]);
    assert!(hooks::BillingPauser(state.clone()).pause("gone").await.is_err(), "unknown to the node");
}

#[tokio::test]
async fn a_record_whose_vm_is_gone_ends_with_the_nodes_reason() {
    let node = Arc::new(FakeNode::default());
    let state = app(node.clone()).await;
    record(&state, &node, "sb", OnTimeout::Kill).await;
    // Not timed out: past its timeout, a lookup says so instead of the node's reason.
    state.server.store.set_sandbox_timeout("sb", None).await.unwrap();
    node.sandboxes.lock().unwrap().clear();
    let r = state.server.store.get_sandbox("sb").await.unwrap().unwrap();
    let e = sandboxes::live(&state, r).await.err().expect("gone");
    assert_eq!(e.code(), ErrorCode::NotFound);
    let ended = state.server.store.get_sandbox("sb").await.unwrap().unwrap();
    assert_eq!(ended.end_reason.as_deref(), Some("its VM died"), "the reason, not the node's whole message");
    // Later lookups answer from the record, without asking the node.
    let e = sandboxes::live(&state, ended).await.err().expect("ended");
    assert!(e.0.message.contains("its VM died"), "{}", e.0.message);
}

#[tokio::test]
async fn a_vm_that_dies_ends_its_record_and_meter_at_once() {
    let node = Arc::new(FakeNode::default());
    let state = app(node.clone()).await;
    let followers = node_events::follow(&state);
    record(&state, &node, "sb", OnTimeout::Kill).await;
    state.server.store.set_sandbox_timeout("sb", None).await.unwrap();
    let before = lizard_api::ids::now_ms();
    node.crash("sb");
    let store = &state.server.store;
    let ended = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        loop {
            let r = store.get_sandbox("sb").await.unwrap().unwrap();
            if r.ended_at.is_some() {
                return r;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the record ends without any call touching it");
    assert_eq!(ended.state, SandboxState::Ended, "a record no longer says running once it ended");
    assert_eq!(ended.end_reason.as_deref(), Some("its VM stopped unexpectedly"));
    assert!(ended.ended_at.unwrap() >= before && ended.ended_at.unwrap() <= lizard_api::ids::now_ms());
    assert!(node.calls().is_empty(), "nothing asked of the node");
    followers.iter().for_each(|f| f.abort());
}
