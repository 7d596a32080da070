//! `/v1/workspaces`: list, create, find by id/slug/name, set its volume quota, delete
//! (empty-only unless `force`).
//!
//! A scoped key sees only the workspaces its scope lists, cannot create one (a new
//! workspace is outside every existing scope: 403), cannot set a quota (its own would be
//! the one it raised: 403), and may delete one it sees.

use crate::api::workspace_json;
use crate::auth::{self, Principal};
use crate::error::{ApiJson, ApiPath, ApiQuery, ApiResult};
use crate::openapi::{AccountScopeRequired, Conflict, Forbidden, InvalidArgument, NotFound, Unauthenticated};
use crate::state::ServerState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use lizard_api::ids;
use lizard_api::{CreateWorkspaceRequest, UpdateWorkspaceRequest, Workspace};
use lizard_store::WorkspaceRecord;
use serde::Deserialize;

/// The workspaces the key sees, oldest first.
#[utoipa::path(
    get,
    path = lizard_api::routes::LIST_WORKSPACES.path,
    tag = "workspaces",
    security(("apiKey" = [])),
    responses((status = 200, description = "Workspaces the key sees", body = Vec<Workspace>), Unauthenticated)
)]
pub async fn list(State(state): State<ServerState>, p: Principal) -> ApiResult<Json<Vec<Workspace>>> {
    let all = state.store.list_workspaces(&p.account_id).await?;
    Ok(Json(all.into_iter().filter(|w| p.sees_workspace(&w.id)).map(workspace_json).collect()))
}

/// Create a workspace; its slug is derived from the name. Unscoped keys only.
#[utoipa::path(
    post,
    path = lizard_api::routes::CREATE_WORKSPACE.path,
    tag = "workspaces",
    security(("apiKey" = [])),
    request_body = CreateWorkspaceRequest,
    responses(
        (status = 201, description = "Created", body = Workspace),
        Unauthenticated, Forbidden, Conflict, InvalidArgument
    )
)]
pub async fn create(
    State(state): State<ServerState>,
    p: Principal,
    ApiJson(req): ApiJson<CreateWorkspaceRequest>,
) -> ApiResult<(StatusCode, Json<Workspace>)> {
    auth::require_unscoped(&p, "create workspaces (a new workspace would be outside its scope)")?;
    let name = ids::check_name(&req.name)?;
    let w = WorkspaceRecord {
        id: ids::new_id("ws"),
        account_id: p.account_id.clone(),
        slug: ids::slugify(&name)?,
        name,
        created_at: ids::now_ms(),
        volume_quota_gb: None,
    };
    state.store.insert_workspace(&w).await?;
    Ok((StatusCode::CREATED, Json(workspace_json(w))))
}

/// Find a workspace the key sees by id, slug or name.
#[utoipa::path(
    get,
    path = lizard_api::routes::FIND_WORKSPACE.path,
    tag = "workspaces",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Workspace id, slug or name")),
    responses((status = 200, description = "The workspace", body = Workspace), Unauthenticated, NotFound, Conflict)
)]
pub async fn find(
    State(state): State<ServerState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<Workspace>> {
    Ok(Json(workspace_json(auth::resolve_workspace(state.store.as_ref(), &p, &id).await?)))
}

/// Set a workspace's volume quota (`null` lifts it). Unscoped keys only.
#[utoipa::path(
    patch,
    path = lizard_api::routes::UPDATE_WORKSPACE.path,
    tag = "workspaces",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Workspace id, slug or name")),
    request_body = UpdateWorkspaceRequest,
    responses(
        (status = 200, description = "The workspace", body = Workspace),
        Unauthenticated, AccountScopeRequired, NotFound, Conflict, InvalidArgument
    )
)]
pub async fn update(
    State(state): State<ServerState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<UpdateWorkspaceRequest>,
) -> ApiResult<Json<Workspace>> {
    auth::require_account_scope(&p)?;
    let w = auth::resolve_workspace(state.store.as_ref(), &p, &id).await?;
    let w = state.store.set_workspace_volume_quota(&p.account_id, &w.id, req.volume_quota_gb).await?;
    tracing::info!(workspace = %w.id, quota_gb = ?w.volume_quota_gb, key = %p.key_id, "workspace volume quota set");
    Ok(Json(workspace_json(w)))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteQuery {
    #[serde(default)]
    force: bool,
}

/// Delete a workspace. Refused (409) while any project, sandbox or volume remains;
/// `force=true` deletes everything in it, irreversibly, and kills its running sandboxes.
#[utoipa::path(
    delete,
    path = lizard_api::routes::DELETE_WORKSPACE.path,
    tag = "workspaces",
    security(("apiKey" = [])),
    params(
        ("id" = String, Path, description = "Workspace id"),
        ("force" = Option<bool>, Query, description = "Delete everything inside too (default false)")
    ),
    responses((status = 204, description = "Deleted"), Unauthenticated, NotFound, Conflict, InvalidArgument)
)]
pub async fn delete(
    State(state): State<ServerState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<DeleteQuery>,
) -> ApiResult<StatusCode> {
    let w = auth::workspace_for(state.store.as_ref(), &p, &id).await?;
    let removed = state.store.delete_workspace(&p.account_id, &w.id, q.force).await?;
    if !removed.live_sandboxes.is_empty() {
        state.reaper.reap(removed.live_sandboxes).await;
    }
    if !removed.volumes.is_empty() {
        state.reaper.remove_volumes(removed.volumes).await;
    }
    crate::ops::snapshots::remove_where(&state, &p.account_id, |s| s.workspace_id == w.id).await?;
    if !removed.template_refs.is_empty() {
        state.reaper.remove_templates(removed.template_refs).await;
    }
    tracing::info!(workspace = %w.id, force = q.force, key = %p.key_id, "workspace deleted");
    Ok(StatusCode::NO_CONTENT)
}
