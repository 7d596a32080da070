//! What every handler and operation shares, and the hooks installed into it: the one
//! through which tenancy deletes reach running sandboxes, and the faces.
//!
//! [`ServerState`] (store, config, reaper hook) is the tenancy core; [`AppState`] adds the
//! [`Nodes`] that run sandboxes. Both are cheap to clone (all `Arc`s). The tenancy routes
//! work for any router state `S` with `impl FromRef<S> for ServerState` (see
//! [`crate::api::routes`]).
//!
//! Faces are other protocols in front of the same operations. A face (E2B's, in the
//! `lizard-e2b-face` crate) adds routes beside `/v1` on the API's listener and answers
//! requests of its own on the sandbox-URL proxy's; it is one more client of
//! [`crate::ops`], never a side door: the same keys, scopes, limits, admission and
//! billing. The server knows no face by name: the process that runs it installs them
//! ([`crate::run::RunOptions::faces`], [`ServerState::with_faces`]), so this crate
//! carries none of a face's protocol.

use crate::blobs::BlobStore;
use crate::builds::Builds;
use crate::config::ServerConfig;
use async_trait::async_trait;
use axum::extract::FromRef;
use axum::extract::Request;
use axum::http::HeaderMap;
use axum::response::Response;
use lizard_node_client::Nodes;
use lizard_store::{SandboxRecord, Store, VolumeRecord};
use std::any::Any;
use std::sync::Arc;
use utoipa_axum::router::OpenApiRouter;

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
    /// The protocols installed in front of the operations (E2B's).
    pub faces: Faces,
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
            faces: Faces::default(),
        }
    }

    /// Install the hook that kills sandboxes removed by a forced workspace delete.
    pub fn with_reaper(mut self, reaper: Arc<dyn SandboxReaper>) -> Self {
        self.reaper = reaper;
        self
    }

    /// Install the faces (none by default).
    pub fn with_faces(mut self, faces: Faces) -> Self {
        self.faces = faces;
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
}

impl AppState {
    /// The state over `nodes`, with pushed files kept under the config's data directory.
    pub fn new(server: ServerState, nodes: Nodes) -> AppState {
        let blobs = BlobStore::new(&server.config.data_dir);
        AppState { server, nodes, builds: Arc::new(Builds::default()), blobs, services: Arc::default() }
    }
}

impl FromRef<AppState> for ServerState {
    fn from_ref(s: &AppState) -> ServerState {
        s.server.clone()
    }
}

/// Where the sandbox-URL proxy stands with a request when it offers it to the faces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyRoute<'a> {
    /// Just arrived: its host not read yet.
    Arrived,
    /// Its host names no sandbox and no service of this region.
    NoHost,
    /// Its host names this sandbox's port.
    Sandbox { id: &'a str, port: u16 },
}

/// A protocol in front of the server's operations.
#[async_trait]
pub trait Face: Any + Send + Sync {
    /// `api` with this face's routes added.
    fn routes(&self, api: OpenApiRouter<AppState>) -> OpenApiRouter<AppState>;

    /// Routes of this face (as matched, `/sandboxes/{id}/fork`) whose `POST` takes an
    /// `Idempotency-Key` (see [`crate::idempotency`]).
    fn idempotent_paths(&self) -> &'static [&'static str] {
        &[]
    }

    /// Whether a request to the sandbox-URL proxy at `route` is this face's. Asked of every
    /// proxied request, up to three times: headers and path only, no I/O.
    fn takes(&self, _req: &Request, _route: ProxyRoute<'_>) -> bool {
        false
    }

    /// Answer a request this face [`takes`](Face::takes).
    async fn answer(&self, state: &AppState, req: Request, route: ProxyRoute<'_>) -> Response;

    /// A request's proof of access to a private sandbox's URLs in this face's own form:
    /// `Some(valid)` when `headers` carry one, for the sandbox `sandbox_id` whose access
    /// token hashes to `access_hash`; `None` when they carry none of this face's.
    fn url_access(&self, _headers: &HeaderMap, _sandbox_id: &str, _access_hash: &[u8]) -> Option<bool> {
        None
    }
}

/// The faces a server has installed (none by default).
#[derive(Clone, Default)]
pub struct Faces(Arc<[Arc<dyn Face>]>);

impl Faces {
    pub fn new(faces: Vec<Arc<dyn Face>>) -> Faces {
        Faces(faces.into())
    }

    /// `api` with every face's routes.
    pub fn routes(&self, api: OpenApiRouter<AppState>) -> OpenApiRouter<AppState> {
        self.0.iter().fold(api, |api, face| face.routes(api))
    }

    pub fn idempotent_paths(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.0.iter().flat_map(|face| face.idempotent_paths().iter().copied())
    }

    /// The answer of the first face that takes a proxy request at `route`, or the request
    /// back when none does.
    pub async fn proxy(&self, state: &AppState, req: Request, route: ProxyRoute<'_>) -> Result<Response, Request> {
        match self.0.iter().find(|face| face.takes(&req, route)) {
            Some(face) => Ok(face.answer(state, req, route).await),
            None => Err(req),
        }
    }

    /// The first face's verdict on a request's proof of access (see [`Face::url_access`]).
    pub fn url_access(&self, headers: &HeaderMap, sandbox_id: &str, access_hash: &[u8]) -> Option<bool> {
        self.0.iter().find_map(|face| face.url_access(headers, sandbox_id, access_hash))
    }

    /// The installed face of type `F`: where a face keeps its own state.
    pub fn get<F: Face>(&self) -> Option<&F> {
        self.0.iter().find_map(|face| (face.as_ref() as &dyn Any).downcast_ref::<F>())
    }
}
