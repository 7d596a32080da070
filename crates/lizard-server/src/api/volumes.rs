//! `/v1/volumes`: create, list, get and delete volumes, behind the key's scope (a volume
//! outside it answers 404, like one that does not exist).
//!
//! The operations (record and disk kept in step) are [`crate::ops::volumes`]'s.
//!
//! Which project: `project` (id, slug or name) or `projectId`, in the body of a create
//! and in the query otherwise. A key that reaches exactly one project may leave it out.
//! A volume id (`vol_…`) needs no project; a name does. Listing without a project lists
//! every volume the key reaches.

use crate::auth::{self, Principal};
use crate::error::{ApiJson, ApiPath, ApiQuery, ApiResult, AppError};
use crate::openapi::{Conflict, InvalidArgument, NotFound, PaymentRequired, QuotaExceeded, Unauthenticated};
use crate::ops::volumes as ops;
use crate::state::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use lizard_api::ids;
use lizard_api::{CreateVolumeRequest, Volume, DEFAULT_VOLUME_SIZE_GB, MAX_VOLUME_SIZE_GB};
use lizard_store::{ProjectRecord, VolumeRecord};
use serde::Deserialize;

pub(crate) fn volume_json(v: VolumeRecord) -> Volume {
    Volume {
        id: v.id,
        name: v.name,
        project_id: v.project_id,
        workspace_id: Some(v.workspace_id),
        size_gb: v.size_gb,
        region: v.region,
        created_at: ids::rfc3339(v.created_at),
        attached_to: v.attached_to.filter(|h| !h.starts_with(lizard_store::volumes::RESERVATION_PREFIX)),
    }
}

/// The project named by `project`/`projectId`, or the only one the key reaches.
pub async fn project_of(
    state: &AppState,
    p: &Principal,
    project: Option<&str>,
    project_id: Option<&str>,
) -> ApiResult<ProjectRecord> {
    let store = state.server.store.as_ref();
    match (project_id, project) {
        (Some(id), _) => auth::project_for(store, p, id).await,
        (None, Some(key)) => auth::resolve_project(store, p, key).await,
        (None, None) => {
            let mut visible: Vec<ProjectRecord> =
                store.list_projects(&p.account_id, None).await?.into_iter().filter(|x| p.sees_project(x)).collect();
            if visible.len() == 1 {
                Ok(visible.remove(0))
            } else {
                Err(AppError::invalid("a project is required: pass project (id, slug or name) or projectId"))
            }
        }
    }
}

/// The volume `name_or_id` names, if the key reaches it; else 404.
pub async fn volume_for(
    state: &AppState,
    p: &Principal,
    name_or_id: &str,
    project: Option<&str>,
    project_id: Option<&str>,
) -> ApiResult<VolumeRecord> {
    let store = state.server.store.as_ref();
    let not_found = || AppError::not_found(format!("volume {name_or_id} not found"));
    let found = if ops::is_id(name_or_id) {
        let v = store.get_volume(&p.account_id, name_or_id).await?;
        if project.is_some() || project_id.is_some() {
            let prj = project_of(state, p, project, project_id).await?;
            v.filter(|v| v.project_id == prj.id)
        } else {
            v
        }
    } else {
        let prj = project_of(state, p, project, project_id).await?;
        store.find_volume(&p.account_id, &prj.id, name_or_id).await?
    };
    match found {
        Some(v) if lizard_store::scope::sees_project(p.scope.as_ref(), &v.workspace_id, &v.project_id) => Ok(v),
        _ => Err(not_found()),
    }
}

/// Create a volume in a project the key reaches; 409 when the name is taken there.
#[utoipa::path(
    post,
    path = lizard_api::routes::CREATE_VOLUME.path,
    tag = "volumes",
    security(("apiKey" = [])),
    request_body = CreateVolumeRequest,
    responses((status = 201, description = "The new volume", body = Volume), Unauthenticated, NotFound, Conflict, InvalidArgument, PaymentRequired, QuotaExceeded)
)]
pub async fn create(
    State(state): State<AppState>,
    p: Principal,
    ApiJson(req): ApiJson<CreateVolumeRequest>,
) -> ApiResult<(StatusCode, Json<Volume>)> {
    ops::check_name(&req.name)?;
    let size_gb = req.size_gb.unwrap_or(DEFAULT_VOLUME_SIZE_GB);
    if !(1..=MAX_VOLUME_SIZE_GB).contains(&size_gb) {
        return Err(AppError::invalid(format!("sizeGb must be 1..={MAX_VOLUME_SIZE_GB}, got {size_gb}")));
    }
    let project = project_of(&state, &p, req.project.as_deref(), req.project_id.as_deref()).await?;
    let v = ops::create(&state, &p.account_id, &project, &req.name, size_gb, req.region.as_deref()).await?;
    tracing::info!(volume = %v.id, project = %project.id, size_gb, key = %p.key_id, "volume created");
    Ok((StatusCode::CREATED, Json(volume_json(v))))
}

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ProjectQuery {
    /// The project by id, slug or name.
    pub(crate) project: Option<String>,
    /// The project's exact id.
    pub(crate) project_id: Option<String>,
}

/// The volumes the key reaches (of one project when given).
#[utoipa::path(
    get,
    path = lizard_api::routes::LIST_VOLUMES.path,
    tag = "volumes",
    security(("apiKey" = [])),
    params(ProjectQuery),
    responses((status = 200, description = "Volumes, oldest first", body = Vec<Volume>), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn list(
    State(state): State<AppState>,
    p: Principal,
    ApiQuery(q): ApiQuery<ProjectQuery>,
) -> ApiResult<Json<Vec<Volume>>> {
    let project = match (&q.project, &q.project_id) {
        (None, None) => None,
        _ => Some(project_of(&state, &p, q.project.as_deref(), q.project_id.as_deref()).await?),
    };
    let list = state
        .server
        .store
        .list_volumes(&p.account_id, p.scope.as_ref(), project.as_ref().map(|x| x.id.as_str()))
        .await?;
    Ok(Json(list.into_iter().map(volume_json).collect()))
}

/// One volume, by name (in a project) or id.
#[utoipa::path(
    get,
    path = lizard_api::routes::GET_VOLUME.path,
    tag = "volumes",
    security(("apiKey" = [])),
    params(("nameOrId" = String, Path, description = "Volume name or id"), ProjectQuery),
    responses((status = 200, description = "The volume", body = Volume), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn get(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(name_or_id): ApiPath<String>,
    ApiQuery(q): ApiQuery<ProjectQuery>,
) -> ApiResult<Json<Volume>> {
    let v = volume_for(&state, &p, &name_or_id, q.project.as_deref(), q.project_id.as_deref()).await?;
    Ok(Json(volume_json(v)))
}

/// Delete a volume and its disk; 409 while a running or paused sandbox has it.
#[utoipa::path(
    delete,
    path = lizard_api::routes::DELETE_VOLUME.path,
    tag = "volumes",
    security(("apiKey" = [])),
    params(("nameOrId" = String, Path, description = "Volume name or id"), ProjectQuery),
    responses((status = 204, description = "Deleted"), Unauthenticated, NotFound, Conflict, InvalidArgument)
)]
pub async fn delete(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(name_or_id): ApiPath<String>,
    ApiQuery(q): ApiQuery<ProjectQuery>,
) -> ApiResult<StatusCode> {
    let v = volume_for(&state, &p, &name_or_id, q.project.as_deref(), q.project_id.as_deref()).await?;
    ops::delete(&state, &p.account_id, &v).await?;
    tracing::info!(volume = %v.id, key = %p.key_id, "volume deleted");
    Ok(StatusCode::NO_CONTENT)
}
