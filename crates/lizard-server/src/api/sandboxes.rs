//! `/v1/sandboxes`: create, list, get, kill, set the timeout, and run processes and move
//! files inside one — each behind the key's scope.
//!
//! The store records which project a sandbox belongs to (for scope checks, listing and
//! billing); the node owns the VM. A sandbox is visible while both agree it runs: a record
//! whose VM is gone (killed, timed out, crashed, lost at a restart) is marked ended and
//! answers 404 with the reason.

use crate::api::AppState;
use crate::auth::{self, Principal};
use crate::error::{ApiJson, ApiPath, ApiQuery, ApiResult, AppError};
use crate::ids;
use crate::openapi::{InvalidArgument, NotFound, PaymentRequired, Unauthenticated};
use crate::store::{NewSandbox, SandboxFilter, SandboxRecord, StoreError};
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use futures_util::TryStreamExt;
use lizard_api::{CreateSandboxRequest, ExecRequest, NewSandboxRequest, SandboxInfo, SetTimeoutRequest};
use lizard_node::{Node, Sandbox};
use serde::Deserialize;
use std::sync::Arc;

/// Lifetime of a sandbox created without `timeoutMs`.
pub const DEFAULT_TIMEOUT_MS: u64 = 5 * 60 * 1000;
/// Longest lifetime one call may set.
pub const MAX_TIMEOUT_MS: u64 = 24 * 60 * 60 * 1000;

pub(crate) fn check_timeout(ms: u64) -> ApiResult<i64> {
    if ms == 0 || ms > MAX_TIMEOUT_MS {
        return Err(AppError::invalid(format!("timeoutMs must be 1..={MAX_TIMEOUT_MS}, got {ms}")));
    }
    Ok(ids::now_ms() + ms as i64)
}

pub(crate) fn node_error(e: lizard_node::NodeError) -> AppError {
    AppError(e.to_api())
}

/// The API's view of a sandbox: the node's facts plus the record's.
pub(crate) fn info(state: &AppState, sandbox: &Sandbox, record: &SandboxRecord) -> SandboxInfo {
    let mut info = sandbox.info();
    info.project_id = Some(record.project_id.clone());
    info.end_at = record.timeout_at.map(ids::rfc3339);
    info.domain = Some(state.server.config.sandbox_domain(&state.server.config.region));
    info
}

/// The sandbox behind `id` (running or paused), if the key reaches it. A record whose VM
/// the node no longer has is ended here, with the node's reason.
pub(crate) async fn running(state: &AppState, p: &Principal, id: &str) -> ApiResult<(Arc<Sandbox>, SandboxRecord)> {
    let record = auth::sandbox_for(state.server.store.as_ref(), p, id).await?;
    if let Some(reason) = &record.end_reason {
        return Err(AppError::not_found(format!("sandbox {id} not found: {reason}")));
    }
    match state.node.get(id) {
        Ok(s) => Ok((s, record)),
        Err(e) => {
            let why = e.to_string();
            state.server.store.end_sandbox(id, ids::now_ms(), &why).await?;
            Err(AppError::not_found(why))
        }
    }
}

/// Boot a sandbox in a project the key reaches.
#[utoipa::path(
    post,
    path = "/v1/sandboxes",
    tag = "sandboxes",
    security(("apiKey" = [])),
    request_body = NewSandboxRequest,
    responses((status = 201, description = "The running sandbox", body = SandboxInfo), Unauthenticated, NotFound, InvalidArgument, PaymentRequired)
)]
pub async fn create(
    State(state): State<AppState>,
    p: Principal,
    ApiJson(req): ApiJson<NewSandboxRequest>,
) -> ApiResult<(StatusCode, Json<SandboxInfo>)> {
    let store = state.server.store.as_ref();
    let project = match (&req.project_id, &req.project) {
        (Some(id), _) => auth::project_for(store, &p, id).await?,
        (None, Some(key)) => auth::resolve_project(store, &p, key).await?,
        (None, None) => {
            return Err(AppError::invalid("a project is required: pass project (id, slug or name) or projectId"))
        }
    };
    let timeout_ms = req.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
    let timeout_at = check_timeout(timeout_ms)?;
    let mut env = req.env;
    if let Some(token) = &req.lizard_token {
        // Only a live key of this account: a sandbox must not carry someone else's key.
        let holder = auth::authenticate(store, token)
            .await
            .map_err(|_| AppError::invalid("lizardToken is not a valid API key"))?;
        if holder.account_id != p.account_id {
            return Err(AppError::invalid("lizardToken is not a valid API key"));
        }
        env.insert("LIZARD_API_KEY".into(), token.clone());
    }
    crate::billing::require_funds(store, &p.account_id).await?;
    if state.node.config().api_forward.is_some() {
        // The guest's own address for this API, forwarded by its agent.
        env.entry("LIZARD_API_URL".into()).or_insert_with(|| lizard_agent_proto::routes::FORWARD_GUEST_URL.into());
    }
    // A volume is held (reserved in the store) before its sandbox boots, so two creates
    // cannot both get it; the sandbox runs on the volume's node.
    let attachment = match &req.volume_name {
        Some(name) => Some(crate::api::volume_attach::reserve(&state, &p, &project, name).await?),
        None => None,
    };
    let node = match &attachment {
        Some(a) => a.node.clone(),
        None => state.node.clone(),
    };
    let created = node
        .create(CreateSandboxRequest {
            template: req.template.clone(),
            vcpus: req.vcpus,
            memory_mib: req.memory_mib,
            env,
            metadata: req.metadata.clone(),
            allow_internet_access: req.allow_internet_access,
            allow_out: req.allow_out.clone(),
            deny_out: req.deny_out.clone(),
            volume: attachment.as_ref().map(|a| a.volume.id.clone()),
        })
        .await;
    let sandbox = match created {
        Ok(s) => s,
        Err(e) => {
            if let Some(a) = &attachment {
                a.release(store).await;
            }
            return Err(node_error(e));
        }
    };
    let record = NewSandbox {
        id: sandbox.id.clone(),
        project_id: project.id.clone(),
        template: req.template,
        state: "running".into(),
        created_at: ids::now_ms(),
        timeout_at: Some(timeout_at),
        metadata: req.metadata,
        meter: state.server.config.billing.pricing.meter(sandbox.vcpus, sandbox.memory_mib),
        on_timeout: on_timeout_name(req.on_timeout.unwrap_or_default()).into(),
        timeout_ms: Some(timeout_ms as i64),
    };
    let mut recorded = store.insert_sandbox(&record).await;
    if let (Ok(()), Some(a)) = (&recorded, &attachment) {
        recorded = store.reassign_volume(&a.volume.id, &a.reservation, &sandbox.id).await;
    }
    if let Err(e) = recorded {
        // The project went away while the VM booted: nothing may run unrecorded.
        let _ = node.kill(&sandbox.id).await;
        if let Some(a) = &attachment {
            a.release(store).await;
            // Recorded, then the volume's hand-over failed: the record ends with the VM.
            let _ = store.end_sandbox(&sandbox.id, ids::now_ms(), "its volume was deleted while it booted").await;
            // A forced workspace delete removed the volume's record meanwhile; its disk
            // was still held then, so it goes now.
            if matches!(store.get_volume(&p.account_id, &a.volume.id).await, Ok(None)) {
                let _ = node.delete_volume(&a.volume.id);
            }
        }
        return Err(match e {
            StoreError::NotFound(_) => AppError::not_found(format!("project {} not found", project.id)),
            other => other.into(),
        });
    }
    let record = store.get_sandbox(&sandbox.id).await?.ok_or_else(|| AppError::internal("sandbox record vanished"))?;
    Ok((StatusCode::CREATED, Json(info(&state, &sandbox, &record))))
}

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only this project's sandboxes.
    project_id: Option<String>,
    /// Only this workspace's sandboxes.
    workspace_id: Option<String>,
}

/// The running sandboxes the key reaches.
#[utoipa::path(
    get,
    path = "/v1/sandboxes",
    tag = "sandboxes",
    security(("apiKey" = [])),
    params(ListQuery),
    responses((status = 200, description = "Running sandboxes", body = Vec<SandboxInfo>), Unauthenticated, InvalidArgument)
)]
pub async fn list(
    State(state): State<AppState>,
    p: Principal,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<Vec<SandboxInfo>>> {
    let filter = SandboxFilter { workspace_id: q.workspace_id, project_id: q.project_id, include_ended: false };
    let records = state.server.store.list_sandboxes(&p.account_id, p.scope.as_ref(), &filter).await?;
    Ok(Json(records.iter().filter_map(|r| state.node.get(&r.id).ok().map(|s| info(&state, &s, r))).collect()))
}

/// One sandbox (`connect`): 404 once it was killed or expired.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}",
    tag = "sandboxes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "The sandbox", body = SandboxInfo), Unauthenticated, NotFound)
)]
pub async fn get(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<SandboxInfo>> {
    let (sandbox, record) = running(&state, &p, &id).await?;
    Ok(Json(info(&state, &sandbox, &record)))
}

/// Stop a sandbox and delete everything in it.
#[utoipa::path(
    delete,
    path = "/v1/sandboxes/{id}",
    tag = "sandboxes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 204, description = "Killed"), Unauthenticated, NotFound)
)]
pub async fn kill(State(state): State<AppState>, p: Principal, ApiPath(id): ApiPath<String>) -> ApiResult<StatusCode> {
    let (sandbox, _) = running(&state, &p, &id).await?;
    let result = state.node.kill(&sandbox.id).await;
    state.server.store.end_sandbox(&id, ids::now_ms(), "killed").await?;
    result.map_err(node_error)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Extend or shorten a sandbox's lifetime, counted from now.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/timeout",
    tag = "sandboxes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = SetTimeoutRequest,
    responses((status = 200, description = "The sandbox with its new end", body = SandboxInfo), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn set_timeout(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<SetTimeoutRequest>,
) -> ApiResult<Json<SandboxInfo>> {
    let (sandbox, _) = running(&state, &p, &id).await?;
    let at = check_timeout(req.timeout_ms)?;
    state.server.store.set_sandbox_timeout(&id, Some(at)).await?;
    let record = auth::sandbox_for(state.server.store.as_ref(), &p, &id).await?;
    Ok(Json(info(&state, &sandbox, &record)))
}

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ExecQuery {
    /// Stream exec frames (`application/vnd.lizard.frames`) instead of one JSON result.
    #[serde(default)]
    stream: bool,
}

/// Run a command and wait for it (or stream its output).
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/exec",
    tag = "sandboxes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), ExecQuery),
    request_body = ExecRequest,
    responses((status = 200, description = "How the command ended", body = lizard_api::ProcessResult), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn exec(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<ExecQuery>,
    ApiJson(req): ApiJson<ExecRequest>,
) -> ApiResult<Response> {
    let (sandbox, _) = running(&state, &p, &id).await?;
    lizard_node::http::exec_response(&sandbox, req, q.stream).await.map_err(|e| AppError(e.0))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct FileQuery {
    /// Absolute path in the sandbox.
    path: String,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WriteQuery {
    /// Absolute path in the sandbox; parents are created.
    path: String,
    /// Permission bits for a new file, octal (e.g. 755), at most 7777.
    #[param(value_type = Option<String>)]
    mode: Option<lizard_api::FileMode>,
}

/// Read a file (streamed bytes).
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/files",
    tag = "files",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), FileQuery),
    responses((status = 200, description = "The file's bytes", content_type = "application/octet-stream", body = Vec<u8>), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn read_file(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<FileQuery>,
) -> ApiResult<Response> {
    let (sandbox, _) = running(&state, &p, &id).await?;
    lizard_node::http::read_file_response(&sandbox, &q.path).await.map_err(|e| AppError(e.0))
}

/// Write a file from the request body (streamed), replacing it atomically.
#[utoipa::path(
    put,
    path = "/v1/sandboxes/{id}/files",
    tag = "files",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), WriteQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 200, description = "Written", body = Object), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn write_file(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<WriteQuery>,
    body: Body,
) -> ApiResult<Json<lizard_api::WriteResult>> {
    let mode = q.mode.map(lizard_api::FileMode::bits);
    let (sandbox, _) = running(&state, &p, &id).await?;
    let stream = body.into_data_stream().map_err(std::io::Error::other);
    Ok(Json(sandbox.write_file(&q.path, mode, stream).await.map_err(node_error)?))
}

/// Remove a file or a directory (recursively).
#[utoipa::path(
    delete,
    path = "/v1/sandboxes/{id}/files",
    tag = "files",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), FileQuery),
    responses((status = 204, description = "Removed"), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn remove(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<FileQuery>,
) -> ApiResult<StatusCode> {
    let (sandbox, _) = running(&state, &p, &id).await?;
    sandbox.remove(&q.path).await.map_err(node_error)?;
    Ok(StatusCode::NO_CONTENT)
}

/// List a directory.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/files/list",
    tag = "files",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), FileQuery),
    responses((status = 200, description = "Entries, sorted by name", body = Vec<Object>), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn list_dir(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<FileQuery>,
) -> ApiResult<Json<Vec<lizard_api::FileEntry>>> {
    let (sandbox, _) = running(&state, &p, &id).await?;
    Ok(Json(sandbox.list_dir(&q.path).await.map_err(node_error)?))
}

/// Create a directory and its parents.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/files/mkdir",
    tag = "files",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), FileQuery),
    responses((status = 204, description = "Created"), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn make_dir(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<FileQuery>,
) -> ApiResult<StatusCode> {
    let (sandbox, _) = running(&state, &p, &id).await?;
    sandbox.make_dir(&q.path).await.map_err(node_error)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Kills the VMs of sandboxes removed by a forced workspace delete, and ends timed-out ones.
pub struct NodeReaper(pub Arc<Node>);

#[async_trait::async_trait]
impl crate::state::SandboxReaper for NodeReaper {
    async fn reap(&self, sandboxes: Vec<SandboxRecord>) {
        for s in sandboxes {
            if let Err(e) = self.0.kill(&s.id).await {
                tracing::debug!(id = %s.id, "reap: {e}");
            }
        }
    }

    async fn remove_volumes(&self, volumes: Vec<crate::store::VolumeRecord>) {
        for v in volumes {
            if v.node_id != crate::placement::LOCAL_NODE_ID {
                tracing::warn!(volume = %v.id, node = %v.node_id, "volume disk on another node left in place");
                continue;
            }
            if let Err(e) = self.0.delete_volume(&v.id) {
                tracing::warn!(volume = %v.id, "cannot delete the disk of a removed volume: {e}");
            }
        }
    }
}

pub(crate) fn on_timeout_name(o: lizard_api::OnTimeout) -> &'static str {
    match o {
        lizard_api::OnTimeout::Kill => "kill",
        lizard_api::OnTimeout::Pause => "pause",
    }
}

/// Kill sandboxes whose timeout passed — or pause those created with `onTimeout: pause`
/// — once a second, until the process ends. A paused sandbox's timeout is the operator's
/// retention; past it, it is killed.
pub async fn reap_expired(state: AppState) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        let due = match state.server.store.sandboxes_due(ids::now_ms()).await {
            Ok(due) => due,
            Err(e) => {
                tracing::warn!("timeout reaper: {e}");
                continue;
            }
        };
        for s in due {
            if s.on_timeout == "pause" && s.state == "running" {
                tracing::info!(id = %s.id, "sandbox timed out: pausing it");
                match crate::api::lifecycle::pause_sandbox(&state, &s.id).await {
                    Ok(_) => continue,
                    Err(e) => tracing::warn!(id = %s.id, "pause at timeout failed, killing: {}", e.0.message),
                }
            }
            let why = if s.state == "paused" { "expired while paused" } else { "timed out" };
            tracing::info!(id = %s.id, "sandbox {why}");
            let _ = state.node.kill(&s.id).await;
            if let Err(e) = state.server.store.end_sandbox(&s.id, ids::now_ms(), why).await {
                tracing::warn!(id = %s.id, "timeout reaper: {e}");
            }
        }
    }
}
