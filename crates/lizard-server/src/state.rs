//! What every handler and operation shares, and the hook through which tenancy deletes
//! reach running sandboxes.
//!
//! [`ServerState`] (store, config, reaper hook) is the tenancy core; [`AppState`] adds the
//! [`Nodes`] that run sandboxes. Both are cheap to clone (all `Arc`s). The tenancy routes
//! work for any router state `S` with `impl FromRef<S> for ServerState` (see
//! [`crate::api::routes`]).

use crate::blobs::BlobStore;
use crate::builds::Builds;
use crate::config::ServerConfig;
use async_trait::async_trait;
use axum::extract::FromRef;
use lizard_node_client::Nodes;
use lizard_store::{SandboxRecord, Store, VolumeRecord};
use std::sync::Arc;

/// Kills the VMs of sandboxes whose records a tenancy delete removed
/// (`DELETE /v1/workspaces/{id}?force=true`).
///
/// The store deletes the rows first, atomically, and returns the live ones; the reaper is
/// then told to stop them. Rows first means no new sandbox can be recorded in a deleted
/// project (its insert fails, and the sandbox routes must kill what they started), so
/// nothing escapes the sweep. A reaper must not fail the delete: it logs what it could not
/// kill, the node's own cleanup being the backstop.
#[async_trait]
pub trait SandboxReaper: Send + Sync + 'static {
    async fn reap(&self, sandboxes: Vec<SandboxRecord>);

    /// Delete the disks of volumes whose records the delete removed (called after
    /// [`SandboxReaper::reap`], so their sandboxes are gone).
    async fn remove_volumes(&self, volumes: Vec<VolumeRecord>) {
        if !volumes.is_empty() {
            tracing::warn!(count = volumes.len(), "no sandbox reaper installed; volume disks left on their nodes");
        }
    }

    /// Forget the snapshots of removed projects and delete their saves (called before
    /// [`SandboxReaper::remove_templates`]: a node keeps a template its snapshots need).
    async fn remove_snapshots(&self, snapshots: Vec<lizard_store::SnapshotRecord>) {
        if !snapshots.is_empty() {
            tracing::warn!(count = snapshots.len(), "no sandbox reaper installed; snapshots left in place");
        }
    }

    /// Delete the node templates of templates whose records the delete removed (called
    /// after [`SandboxReaper::reap`], so no sandbox runs from them).
    async fn remove_templates(&self, template_refs: Vec<String>) {
        if !template_refs.is_empty() {
            tracing::warn!(count = template_refs.len(), "no sandbox reaper installed; node templates left in place");
        }
    }
}

/// The default until the sandbox routes install theirs: nothing runs, nothing to kill.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoReaper;

#[async_trait]
impl SandboxReaper for NoReaper {
    async fn reap(&self, sandboxes: Vec<SandboxRecord>) {
        if !sandboxes.is_empty() {
            tracing::warn!(
                count = sandboxes.len(),
                "no sandbox reaper installed; live sandboxes removed from the store only"
            );
        }
    }
}

/// Shared by every handler.
#[derive(Clone)]
pub struct ServerState {
    pub store: Arc<dyn Store>,
    pub config: Arc<ServerConfig>,
    pub reaper: Arc<dyn SandboxReaper>,
    /// Each key's request rate and requests in flight.
    pub guard: Arc<crate::guard::Guard>,
    /// Every key's hash: which presented keys are worth a store read.
    pub key_index: Arc<crate::key_index::KeyIndex>,
    /// This process's Prometheus metrics.
    pub telemetry: Arc<crate::telemetry::Telemetry>,
    /// What calls hold of guests' data.
    pub guest_buffers: Arc<crate::guest_buffers::GuestBuffers>,
}

impl ServerState {
    pub fn new(store: Arc<dyn Store>, config: ServerConfig) -> Self {
        let guard = Arc::new(crate::guard::Guard::new(config.traffic.clone()));
        let telemetry = Arc::new(crate::telemetry::Telemetry::new());
        let guest_buffers = Arc::new(crate::guest_buffers::GuestBuffers::new(config.traffic.guest_buffer_bytes));
        ServerState {
            store,
            config: Arc::new(config),
            reaper: Arc::new(NoReaper),
            guard,
            key_index: Arc::default(),
            telemetry,
            guest_buffers,
        }
    }

    /// Install the hook that kills sandboxes removed by a forced workspace delete.
    pub fn with_reaper(mut self, reaper: Arc<dyn SandboxReaper>) -> Self {
        self.reaper = reaper;
        self
    }
}

/// The tenancy core plus the nodes that run the sandboxes: what the sandbox, volume and
/// template operations, their routes, the proxy and the background jobs share.
#[derive(Clone)]
pub struct AppState {
    pub server: ServerState,
    pub nodes: Nodes,
    /// Template builds in flight.
    pub builds: Arc<Builds>,
    /// Pushed files, by content hash.
    pub blobs: BlobStore,
    /// Services' traffic as this process's proxy sees it.
    pub services: Arc<crate::ops::services::traffic::Traffic>,
    /// E2B template builds between their calls.
    pub e2b: Arc<crate::e2b::pending::Pending>,
}

impl AppState {
    /// The state over `nodes`, with pushed files kept under the config's data directory.
    pub fn new(server: ServerState, nodes: Nodes) -> AppState {
        let blobs = BlobStore::new(&server.config.data_dir);
        AppState {
            server,
            nodes,
            builds: Arc::new(Builds::default()),
            blobs,
            services: Arc::default(),
            e2b: Arc::default(),
        }
    }
}

impl FromRef<AppState> for ServerState {
    fn from_ref(s: &AppState) -> ServerState {
        s.server.clone()
    }
}
