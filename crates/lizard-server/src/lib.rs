//! Lizard's control plane: accounts, workspaces, projects, scoped API keys, sandboxes,
//! volumes, pushed templates and billing, behind an authenticated HTTP API.
//!
//! ```text
//!  client ──X-API-Key──▶ router ── Principal extractor (auth) ──▶ handler (api::*)
//!                                        HTTP only: extract, authorize, call, map │
//!                                                                                 ▼
//!  timeout reaper, billing pauser ──────────────────────────────▶ operations (ops::*)
//!                                                                  │            │
//!                                    Arc<dyn Store> (lizard_store) ◀┘            ▼
//!                      placement ──▶ Nodes ──▶ Arc<dyn NodeClient> (lizard_node_client)
//!                                                 ├─ LocalNode: the in-process lizard_node
//!                                                 └─ remote nodes, by their store rows,
//!                                                    through a NodeConnector
//! ```
//!
//! The state (`lizard_store`) and the node client (`lizard_node_client`) are crates of
//! their own below this one. Layers here, each importing only those below it (no circles,
//! `scripts/check-module-cycles.py`): `keys`, `request_id`, `telemetry` (the process's
//! Prometheus metrics) → `error`, `limits` → `billing` → `config` → `guard` (per-key rate
//! and concurrency), `guest_buffers` (guest-sized data held at once) → `key_index` (every
//! key's hash), `connections` (listener limits); `blobs` (pushed files by hash), `builds`
//! (template builds in flight) → `state` → `auth`, `placement` → `front_door` (request
//! id, per-key limits), `idempotency` → `ops` → `cluster` (join tokens, node calls, the
//! operator's node view, node-lease expiry, leader leases) → `openapi` (response docs),
//! `api`, `proxy`, `scrape` (the operator's `/metrics` listener) → `run`, with [`open`],
//! [`Server`] and the router builders at the root.
//!
//! Every API request passes [`front_door::front_door`] (an `X-Request-Id`, a log span,
//! the key's rate limit) and [`idempotency::layer`] (the `Idempotency-Key` of creates and
//! execs) before its handler; listeners cap connections and slow clients
//! ([`connections`]).
//!
//! Start with [`open`]: it opens `<data_dir>/lizard.db`, applies migrations and, on the
//! very first start only, creates the owner account and an unscoped key, which
//! [`Server::initial_key`] hands over once (the caller prints `LIZARD_API_KEY=<key>`;
//! only its hash is stored, so no later start can show it again).
//!
//! **Building on this crate** (sandbox routes, the port proxy, the CLI):
//! - state: [`ServerState`] (store, config, [`SandboxReaper`] hook), or a state of your own
//!   with `impl FromRef<YourState> for ServerState`; [`AppState`] adds the
//!   [`lizard_node_client::Nodes`] ([`Server::app_state`] builds it with the reaper
//!   installed);
//! - routes: [`api::routes`] gives the documented tenancy routes as a
//!   [`utoipa_axum::router::OpenApiRouter`]; merge yours (documented with
//!   `#[utoipa::path]`) into it and pass the result to [`build_router`], which adds
//!   `/health`, `/openapi.json` and JSON fallbacks;
//! - authorization: the [`auth::Principal`] extractor, [`auth::require_account_scope`],
//!   [`auth::resolve_project`] / [`auth::project_for`] for a sandbox's project and
//!   [`auth::sandbox_for`] for a sandbox;
//! - the store's sandbox records: [`lizard_store::Store::insert_sandbox`] and friends;
//! - billing: [`billing`] (prices, the metering task, the 402 guard [`billing::require_funds`]
//!   for anything that starts or resumes a sandbox) over the store's ledger and meters
//!   ([`lizard_store::BillingStore`]); every recorded sandbox carries a
//!   [`lizard_store::MeterSpec`].

#![forbid(unsafe_code)]

pub mod api;
pub mod auth;
pub mod billing;
pub mod blobs;
pub mod builds;
pub mod cluster;
pub mod config;
pub mod connections;
pub mod error;
pub mod front_door;
pub mod guard;
pub mod guest_buffers;
pub mod idempotency;
pub mod key_index;
pub mod keys;
pub mod limits;
pub mod openapi;
pub mod ops;
pub mod placement;
pub mod proxy;
pub mod request_id;
pub mod run;
pub mod scrape;
pub mod shared_blobs;
pub mod state;
pub mod telemetry;

pub use auth::{require_account_scope, Principal};
pub use config::ServerConfig;
pub use error::{ApiResult, AppError};
pub use lizard_store::scope::Scope;
pub use lizard_store::{sql::SqlStore, Store, StoreError};
pub use state::{AppState, NoReaper, SandboxReaper, ServerState};

use axum::extract::FromRef;
use axum::{Extension, Json, Router};
use std::sync::Arc;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The store failed to open, migrate or bootstrap.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Binding or serving failed.
    #[error("{context}: {cause}")]
    Io { context: String, cause: std::io::Error },
}

/// An opened control plane, ready to serve.
pub struct Server {
    state: ServerState,
    initial_key: Option<String>,
}

/// Open the store in `config.data_dir`, migrate it, and bootstrap the owner account on
/// first start.
pub async fn open(config: ServerConfig) -> Result<Server, ServerError> {
    let database = config.database.as_ref().map(|d| d.expose());
    let store = lizard_store::open_store(database, &config.data_dir).await?;
    open_with_store(config, store).await
}

/// [`open`] on a given store (another backend, or an in-memory one in tests).
pub async fn open_with_store(config: ServerConfig, store: Arc<dyn Store>) -> Result<Server, ServerError> {
    let initial_key = bootstrap(store.as_ref(), &config).await?;
    let granted = store.grant_signup_credits(config.billing.signup_credit_nanos, lizard_api::ids::now_ms()).await?;
    if granted > 0 {
        tracing::info!(accounts = granted, "granted signup credits");
    }
    Ok(Server { state: ServerState::new(store, config), initial_key })
}

/// Create the owner account and its first, unscoped key if the store has no account.
/// Returns the key's plaintext when it did.
async fn bootstrap(store: &dyn Store, config: &ServerConfig) -> Result<Option<String>, StoreError> {
    let now = lizard_api::ids::now_ms();
    let account = lizard_store::AccountRecord {
        id: lizard_api::ids::new_id("acc"),
        email: config.owner_email.clone(),
        plan: config.owner_plan.clone(),
        created_at: now,
    };
    let new = keys::generate();
    let key = lizard_store::KeyRecord {
        id: lizard_api::ids::new_id("key"),
        account_id: account.id.clone(),
        name: "owner".into(),
        prefix: new.prefix,
        hash: new.hash.to_vec(),
        scope: None,
        created_at: now,
        revoked_at: None,
    };
    if store.bootstrap(&account, &key).await? {
        tracing::info!(account = %account.id, key = %key.id, "first start: created the owner account and an unscoped key");
        Ok(Some(new.plaintext))
    } else {
        Ok(None)
    }
}

impl Server {
    pub fn state(&self) -> &ServerState {
        &self.state
    }

    /// Install the faces served besides `/v1` ([`state::Face`]).
    pub fn with_faces(mut self, faces: state::Faces) -> Server {
        self.state = self.state.with_faces(faces);
        self
    }

    /// The owner's unscoped key, on the first start only (then print
    /// `LIZARD_API_KEY=<key>`); `None` on every later start.
    pub fn initial_key(&self) -> Option<&str> {
        self.initial_key.as_deref()
    }

    /// The state of the full API over `nodes`, with the hook that kills the sandboxes of
    /// a forced workspace delete installed.
    pub fn app_state(&self, nodes: lizard_node_client::Nodes) -> AppState {
        let reaper = ops::hooks::NodeReaper { nodes: nodes.clone(), store: self.state.store.clone() };
        let server = self.state.clone().with_reaper(Arc::new(reaper));
        AppState::new(server, nodes)
    }

    /// The tenancy API alone.
    pub fn router(&self) -> Router {
        router(self.state.clone())
    }

    /// Bind `config.listen`.
    pub async fn bind(&self) -> Result<tokio::net::TcpListener, ServerError> {
        let addr = self.state.config.listen;
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|cause| ServerError::Io { context: format!("bind {addr}"), cause })
    }
}

/// Serve `router` on `listener` until `shutdown` resolves, within the default
/// [`config::TrafficLimits`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    serve_within(listener, router, shutdown, &config::TrafficLimits::default()).await
}

/// Serve `router` on `listener` until `shutdown` resolves: at most
/// `limits.max_connections` at once, request heads within `limits.header_read`.
pub async fn serve_within(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    limits: &config::TrafficLimits,
) -> Result<(), ServerError> {
    connections::serve(listener, router, shutdown, limits).await;
    Ok(())
}

/// The tenancy API with `/health` and `/openapi.json`.
pub fn router(state: ServerState) -> Router {
    build_router(state, api::routes())
}

/// The finished router from documented routes: adds `/health`, `/openapi.json` (the
/// document of everything in `api`), and `{code, message}` answers for unknown routes
/// and methods.
pub fn build_router<S>(state: S, api: OpenApiRouter<S>) -> Router
where
    S: Clone + Send + Sync + 'static,
    ServerState: FromRef<S>,
{
    let (routes, doc) = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(system::health))
        .routes(routes!(system::openapi_json))
        .merge(api)
        .split_for_parts();
    let mut doc = doc;
    openapi::add_rate_limited(&mut doc);
    let server = ServerState::from_ref(&state);
    routes
        .fallback(error::no_route)
        .method_not_allowed_fallback(error::no_route)
        .layer(Extension(Arc::new(doc)))
        .layer(axum::middleware::from_fn_with_state(server.clone(), idempotency::layer))
        .layer(axum::middleware::from_fn_with_state(server, front_door::front_door))
        .with_state(state)
}

/// Build the OpenAPI document of `api` (plus `/health` and `/openapi.json`) without
/// serving it.
pub fn openapi_document<S>(api: OpenApiRouter<S>) -> utoipa::openapi::OpenApi
where
    S: Clone + Send + Sync + 'static,
{
    let mut doc = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(system::health))
        .routes(routes!(system::openapi_json))
        .merge(api)
        .into_openapi();
    openapi::add_rate_limited(&mut doc);
    doc
}

/// Unauthenticated routes.
mod system {
    use super::*;

    /// Liveness: 200 `ok` while the server runs. No key needed.
    #[utoipa::path(get, path = lizard_api::routes::HEALTH.path, tag = "system", responses((status = 200, description = "Alive", body = String)))]
    pub async fn health() -> &'static str {
        "ok"
    }

    /// This document. No key needed.
    #[utoipa::path(get, path = lizard_api::routes::OPENAPI.path, tag = "system", responses((status = 200, description = "The OpenAPI 3.1 document")))]
    pub async fn openapi_json(Extension(doc): Extension<Arc<utoipa::openapi::OpenApi>>) -> Json<serde_json::Value> {
        Json(serde_json::to_value(&*doc).unwrap_or_default())
    }
}
