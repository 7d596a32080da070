//! `/v1/projects`: list, get by id/slug/name, create, rename, delete (empty-only).
//!
//! A key reaches the projects of its workspaces and the projects its scope lists. It may
//! create projects only in a workspace it sees (a key scoped to projects alone sees no
//! workspace, so it creates none).

use crate::api::project_json;
use crate::auth::{self, Principal};
use crate::error::{ApiJson, ApiPath, ApiQuery, ApiResult, AppError};
use crate::openapi::{Conflict, InvalidArgument, NotFound, Unauthenticated};
use crate::state::ServerState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use lizard_api::ids;
use lizard_api::{CreateProjectRequest, Project, UpdateProjectRequest};
use lizard_store::ProjectRecord;
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListQuery {
    workspace_id: Option<String>,
}

/// The projects the key reaches, of one workspace when `workspaceId` is given.
#[utoipa::path(
    get,
    path = lizard_api::routes::LIST_PROJECTS.path,
    tag = "projects",
    security(("apiKey" = [])),
    params(("workspaceId" = Option<String>, Query, description = "Only this workspace's projects")),
    responses((status = 200, description = "Projects the key reaches", body = Vec<Project>), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn list(
    State(state): State<ServerState>,
    p: Principal,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<Vec<Project>>> {
    if let Some(ws) = &q.workspace_id {
        // A workspace the key sees must exist; for one it does not see, the answer is
        // just the reachable projects in it (often none), which reveals nothing.
        if p.sees_workspace(ws) {
            auth::workspace_for(state.store.as_ref(), &p, ws).await?;
        }
    }
    let all = state.store.list_projects(&p.account_id, q.workspace_id.as_deref()).await?;
    Ok(Json(all.into_iter().filter(|x| p.sees_project(x)).map(project_json).collect()))
}

/// A project the key reaches, by id, slug or name (as the SDK's `project` option).
#[utoipa::path(
    get,
    path = lizard_api::routes::GET_PROJECT.path,
    tag = "projects",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Project id, slug or name")),
    responses((status = 200, description = "The project", body = Project), Unauthenticated, NotFound, Conflict)
)]
pub async fn get(
    State(state): State<ServerState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<Project>> {
    Ok(Json(project_json(auth::resolve_project(state.store.as_ref(), &p, &id).await?)))
}

/// Create a project in a workspace the key sees; its slug is derived from the name.
#[utoipa::path(
    post,
    path = lizard_api::routes::CREATE_PROJECT.path,
    tag = "projects",
    security(("apiKey" = [])),
    request_body = CreateProjectRequest,
    responses((status = 201, description = "Created", body = Project), Unauthenticated, NotFound, Conflict, InvalidArgument)
)]
pub async fn create(
    State(state): State<ServerState>,
    p: Principal,
    ApiJson(req): ApiJson<CreateProjectRequest>,
) -> ApiResult<(StatusCode, Json<Project>)> {
    let name = ids::check_name(&req.name)?;
    let slug = ids::slugify(&name)?;
    let w = auth::workspace_for(state.store.as_ref(), &p, &req.workspace_id).await?;
    let prj = ProjectRecord { id: ids::new_id("prj"), workspace_id: w.id, name, slug, created_at: ids::now_ms() };
    state.store.insert_project(&p.account_id, &prj).await.map_err(|e| match e {
        // Deleted between the check and the insert.
        lizard_store::StoreError::NotFound(_) => {
            AppError::not_found(format!("workspace {} not found", req.workspace_id))
        }
        e => e.into(),
    })?;
    Ok((StatusCode::CREATED, Json(project_json(prj))))
}

/// Rename a project. Its slug stays, so clients pinned to it keep working.
#[utoipa::path(
    patch,
    path = lizard_api::routes::RENAME_PROJECT.path,
    tag = "projects",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Project id, slug or name")),
    request_body = UpdateProjectRequest,
    responses((status = 200, description = "Updated", body = Project), Unauthenticated, NotFound, Conflict, InvalidArgument)
)]
pub async fn update(
    State(state): State<ServerState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<UpdateProjectRequest>,
) -> ApiResult<Json<Project>> {
    let name = ids::check_name(&req.name)?;
    ids::slugify(&name)?;
    let prj = auth::resolve_project(state.store.as_ref(), &p, &id).await?;
    let prj = state.store.rename_project(&p.account_id, &prj.id, &name).await?;
    Ok(Json(project_json(prj)))
}

/// Delete a project; refused (409) while sandboxes or volumes remain in it.
#[utoipa::path(
    delete,
    path = lizard_api::routes::DELETE_PROJECT.path,
    tag = "projects",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Project id, slug or name")),
    responses((status = 204, description = "Deleted"), Unauthenticated, NotFound, Conflict)
)]
pub async fn delete(
    State(state): State<ServerState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    let prj = auth::resolve_project(state.store.as_ref(), &p, &id).await?;
    state.store.delete_project(&p.account_id, &prj.id).await?;
    crate::ops::snapshots::remove_where(&state, &p.account_id, |s| s.project_id == prj.id).await?;
    tracing::info!(project = %prj.id, key = %p.key_id, "project deleted");
    Ok(StatusCode::NO_CONTENT)
}
