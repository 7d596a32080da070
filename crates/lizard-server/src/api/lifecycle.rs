//! `/v1/sandboxes/{id}/pause|resume|connect|fork`: a sandbox's life after create.
//!
//! A paused sandbox keeps its record (state `paused`) and its VM's saved state on the
//! node; its timeout becomes the operator's retention for paused sandboxes. A resume gives
//! it its lifetime again, counted from the resume.

use crate::api::sandboxes::{check_timeout, info, node_error, running};
use crate::api::AppState;
use crate::auth::Principal;
use crate::error::{ApiJson, ApiPath, ApiResult, AppError};
use crate::ids;
use crate::openapi::{Conflict, InvalidArgument, NotFound, PaymentRequired, Unauthenticated};
use crate::store::NewSandbox;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use lizard_api::{ForkRequest, SandboxInfo};

/// Pause a sandbox and record it: the timeout reaper and the pause route both end here.
pub async fn pause_sandbox(state: &AppState, id: &str) -> ApiResult<()> {
    state.node.pause(id).await.map_err(node_error)?;
    let store = &state.server.store;
    store.set_sandbox_state(id, "paused").await?;
    let keep_until = ids::now_ms().saturating_add(state.server.config.paused_retention_ms as i64);
    store.set_sandbox_timeout(id, Some(keep_until)).await?;
    Ok(())
}

/// Resume a paused sandbox and record it, with its lifetime counted anew.
pub async fn resume_sandbox(state: &AppState, id: &str, timeout_ms: Option<i64>) -> ApiResult<()> {
    state.node.resume(id).await.map_err(node_error)?;
    let store = &state.server.store;
    store.set_sandbox_state(id, "running").await?;
    store.set_sandbox_timeout(id, Some(lifetime_end(timeout_ms)?)).await?;
    Ok(())
}

/// When a sandbox given the lifetime `timeout_ms` at create ends, counted from now (a
/// resume or a fork starts it again).
fn lifetime_end(timeout_ms: Option<i64>) -> ApiResult<i64> {
    use crate::api::sandboxes::{DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS};
    let lifetime = timeout_ms.map_or(DEFAULT_TIMEOUT_MS, |ms| ms.max(1) as u64);
    check_timeout(lifetime.min(MAX_TIMEOUT_MS))
}

/// The sandbox as the API shows it now.
async fn current(state: &AppState, p: &Principal, id: &str) -> ApiResult<Json<SandboxInfo>> {
    let (sandbox, record) = running(state, p, id).await?;
    Ok(Json(info(state, &sandbox, &record)))
}

/// Pause a sandbox: its vCPUs stop, its memory, processes and files are saved on the
/// node, and its VM process ends (no CPU, no memory). Pausing a paused sandbox does
/// nothing.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/pause",
    tag = "sandboxes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "The paused sandbox", body = SandboxInfo), Unauthenticated, NotFound)
)]
pub async fn pause(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<SandboxInfo>> {
    running(&state, &p, &id).await?;
    pause_sandbox(&state, &id).await?;
    current(&state, &p, &id).await
}

/// Resume a paused sandbox exactly where it stopped. Resuming a running sandbox does
/// nothing.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/resume",
    tag = "sandboxes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "The running sandbox", body = SandboxInfo), Unauthenticated, NotFound, PaymentRequired)
)]
pub async fn resume(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<SandboxInfo>> {
    let (sandbox, record) = running(&state, &p, &id).await?;
    if sandbox.is_paused() {
        crate::billing::require_funds(state.server.store.as_ref(), &record.account_id).await?;
        resume_sandbox(&state, &id, record.timeout_ms).await?;
    }
    current(&state, &p, &id).await
}

/// Connect to a sandbox by id (the SDKs' `connect`): a paused one is resumed first. 404
/// once it was killed or expired.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/connect",
    tag = "sandboxes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "The running sandbox", body = SandboxInfo), Unauthenticated, NotFound, PaymentRequired)
)]
pub async fn connect(state: State<AppState>, p: Principal, id: ApiPath<String>) -> ApiResult<Json<SandboxInfo>> {
    resume(state, p, id).await
}

/// Copies of a running sandbox, processes and memory included, in the same project and
/// with the same lifetime; each has its own identity and its own writes from here on.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/fork",
    tag = "sandboxes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = ForkRequest,
    responses(
        (status = 201, description = "The copies", body = Vec<SandboxInfo>),
        Unauthenticated, NotFound, Conflict, InvalidArgument, PaymentRequired
    )
)]
pub async fn fork(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<ForkRequest>,
) -> ApiResult<(StatusCode, Json<Vec<SandboxInfo>>)> {
    let (_, source) = running(&state, &p, &id).await?;
    if !(1..=lizard_node::MAX_FORKS).contains(&req.count) {
        return Err(AppError::invalid(format!("count must be 1..={}, got {}", lizard_node::MAX_FORKS, req.count)));
    }
    crate::billing::require_funds(state.server.store.as_ref(), &source.account_id).await?;
    let copies = state.node.fork(&id, req.count).await.map_err(node_error)?;
    let store = state.server.store.as_ref();
    let timeout_at = lifetime_end(source.timeout_ms)?;
    let mut out = Vec::with_capacity(copies.len());
    for (i, copy) in copies.iter().enumerate() {
        let record = NewSandbox {
            id: copy.id.clone(),
            project_id: source.project_id.clone(),
            template: source.template.clone(),
            state: "running".into(),
            created_at: ids::now_ms(),
            timeout_at: Some(timeout_at),
            metadata: source.metadata.clone(),
            on_timeout: source.on_timeout.clone(),
            timeout_ms: source.timeout_ms,
            meter: state.server.config.billing.pricing.meter(copy.vcpus, copy.memory_mib),
        };
        if let Err(e) = store.insert_sandbox(&record).await {
            // Nothing may run unrecorded: the copies not yet recorded go.
            for c in &copies[i..] {
                let _ = state.node.kill(&c.id).await;
            }
            return Err(e.into());
        }
        let record = store.get_sandbox(&copy.id).await?.ok_or_else(|| AppError::internal("sandbox record vanished"))?;
        out.push(info(&state, copy, &record));
    }
    Ok((StatusCode::CREATED, Json(out)))
}
