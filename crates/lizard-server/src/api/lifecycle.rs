//! `/v1/sandboxes/{id}/pause|resume|connect|fork`: a sandbox's life after create, over
//! [`crate::ops::lifecycle`].

use crate::api::sandboxes::{running, sandbox_json};
use crate::auth::Principal;
use crate::error::{ApiJson, ApiPath, ApiResult};
use crate::openapi::{Conflict, InvalidArgument, NotFound, PaymentRequired, Unauthenticated};
use crate::ops::lifecycle as ops;
use crate::state::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use lizard_api::{ForkRequest, SandboxInfo};

/// The sandbox as the API shows it now.
async fn current(state: &AppState, p: &Principal, id: &str) -> ApiResult<Json<SandboxInfo>> {
    let sandbox = running(state, p, id).await?;
    Ok(Json(sandbox_json(state, &sandbox)))
}

/// Pause a sandbox: its vCPUs stop, its memory, processes and files are saved on the
/// node, and its VM process ends (no CPU, no memory). Pausing a paused sandbox does
/// nothing.
#[utoipa::path(
    post,
    path = lizard_api::routes::PAUSE.path,
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
    ops::pause(&state, &id).await?;
    current(&state, &p, &id).await
}

/// Resume a paused sandbox exactly where it stopped. Resuming a running sandbox does
/// nothing.
#[utoipa::path(
    post,
    path = lizard_api::routes::RESUME.path,
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
    let sandbox = running(&state, &p, &id).await?;
    if sandbox.is_paused() {
        crate::billing::require_funds(state.server.store.as_ref(), &sandbox.record.account_id).await?;
        ops::resume(&state, &sandbox).await?;
    }
    current(&state, &p, &id).await
}

/// Connect to a sandbox by id (the SDKs' `connect`): a paused one is resumed first. 404
/// once it was killed or expired.
#[utoipa::path(
    post,
    path = lizard_api::routes::CONNECT.path,
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
    path = lizard_api::routes::FORK.path,
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
    let source = running(&state, &p, &id).await?;
    ops::check_fork_count(req.count)?;
    crate::billing::require_funds(state.server.store.as_ref(), &source.record.account_id).await?;
    let copies = ops::fork(&state, &source, req.count).await?;
    Ok((StatusCode::CREATED, Json(copies.iter().map(|c| sandbox_json(&state, c)).collect())))
}
