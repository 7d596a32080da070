//! `/v1/services`: deploy (a new service, or a new version of one), list, get, roll back,
//! delete and read the logs of services, behind the key's scope (a service outside it
//! answers 404, like one that does not exist). The operations are
//! [`crate::ops::services`]'s.

use crate::api::templates::NDJSON;
use crate::api::volumes::{project_of, ProjectQuery};
use crate::auth::Principal;
use crate::builds::to_ndjson;
use crate::error::{ApiJson, ApiPath, ApiQuery, ApiResult, AppError};
use crate::openapi::{Conflict, InvalidArgument, NotFound, PaymentRequired, Unauthenticated};
use crate::ops::services as ops;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use futures_util::StreamExt;
use lizard_api::services::{
    CreateServiceRequest, DeployServiceRequest, RollbackRequest, ServiceInfo, ServiceLogLine, MAX_LOG_BYTES,
};
use lizard_store::ServiceRecord;
use serde::Deserialize;

/// The service `name` if the key reaches it; else 404.
async fn service_of(state: &AppState, p: &Principal, name: &str) -> ApiResult<ServiceRecord> {
    match state.server.store.service_by_name(name).await? {
        Some(s)
            if s.account_id == p.account_id
                && lizard_store::scope::sees_project(p.scope.as_ref(), &s.workspace_id, &s.project_id) =>
        {
            Ok(s)
        }
        _ => Err(AppError::not_found(format!("service {name} not found"))),
    }
}

/// A new service: its files uploaded first (as for a template push, in the project's
/// workspace); built and rolled out in the background.
#[utoipa::path(
    post,
    path = lizard_api::routes::CREATE_SERVICE.path,
    tag = "services",
    security(("apiKey" = [])),
    request_body = CreateServiceRequest,
    responses((status = 202, description = "The service, its first version building", body = ServiceInfo), Unauthenticated, NotFound, Conflict, InvalidArgument, PaymentRequired)
)]
pub async fn create(
    State(state): State<AppState>,
    p: Principal,
    ApiJson(req): ApiJson<CreateServiceRequest>,
) -> ApiResult<(StatusCode, Json<ServiceInfo>)> {
    ops::check_name(&req.name)?;
    let project = project_of(&state, &p, req.project.as_deref(), req.project_id.as_deref()).await?;
    let workspace = state
        .server
        .store
        .get_workspace(&p.account_id, &project.workspace_id)
        .await?
        .ok_or_else(|| AppError::not_found(format!("workspace {} not found", project.workspace_id)))?;
    let s = ops::create(&state, &p.account_id, &workspace, &project, &req.name, &req.spec, &req.files).await?;
    tracing::info!(service = %s.name, project = %project.id, key = %p.key_id, "service created");
    Ok((StatusCode::ACCEPTED, Json(ops::info(&state, &s))))
}

/// A new version of a service.
#[utoipa::path(
    post,
    path = lizard_api::routes::DEPLOY_SERVICE.path,
    tag = "services",
    security(("apiKey" = [])),
    params(("name" = String, Path, description = "Service name")),
    request_body = DeployServiceRequest,
    responses((status = 202, description = "The service, the new version building", body = ServiceInfo), Unauthenticated, NotFound, Conflict, InvalidArgument, PaymentRequired)
)]
pub async fn deploy(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<DeployServiceRequest>,
) -> ApiResult<(StatusCode, Json<ServiceInfo>)> {
    let s = service_of(&state, &p, &name).await?;
    let s = ops::deploy(&state, &s, &req.spec, &req.files).await?;
    Ok((StatusCode::ACCEPTED, Json(ops::info(&state, &s))))
}

/// The services the key reaches (of one project when given).
#[utoipa::path(
    get,
    path = lizard_api::routes::LIST_SERVICES.path,
    tag = "services",
    security(("apiKey" = [])),
    params(ProjectQuery),
    responses((status = 200, description = "Services, by name", body = Vec<ServiceInfo>), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn list(
    State(state): State<AppState>,
    p: Principal,
    ApiQuery(q): ApiQuery<ProjectQuery>,
) -> ApiResult<Json<Vec<ServiceInfo>>> {
    let project = match (&q.project, &q.project_id) {
        (None, None) => None,
        _ => Some(project_of(&state, &p, q.project.as_deref(), q.project_id.as_deref()).await?),
    };
    let all = state.server.store.list_services(Some(&p.account_id)).await?;
    Ok(Json(
        all.iter()
            .filter(|s| lizard_store::scope::sees_project(p.scope.as_ref(), &s.workspace_id, &s.project_id))
            .filter(|s| project.as_ref().is_none_or(|x| x.id == s.project_id))
            .map(|s| ops::info(&state, s))
            .collect(),
    ))
}

#[utoipa::path(
    get,
    path = lizard_api::routes::GET_SERVICE.path,
    tag = "services",
    security(("apiKey" = [])),
    params(("name" = String, Path, description = "Service name")),
    responses((status = 200, description = "The service", body = ServiceInfo), Unauthenticated, NotFound)
)]
pub async fn get(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Json<ServiceInfo>> {
    Ok(Json(ops::info(&state, &service_of(&state, &p, &name).await?)))
}

/// Back to an earlier version.
#[utoipa::path(
    post,
    path = lizard_api::routes::ROLLBACK_SERVICE.path,
    tag = "services",
    security(("apiKey" = [])),
    params(("name" = String, Path, description = "Service name")),
    request_body = RollbackRequest,
    responses((status = 200, description = "The service, the target version starting", body = ServiceInfo), Unauthenticated, NotFound, Conflict, InvalidArgument)
)]
pub async fn rollback(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<RollbackRequest>,
) -> ApiResult<Json<ServiceInfo>> {
    let s = service_of(&state, &p, &name).await?;
    Ok(Json(ops::info(&state, &ops::rollback(&state, &s, req.version).await?)))
}

/// `lizard down`: every instance and layer gone, the name free.
#[utoipa::path(
    delete,
    path = lizard_api::routes::DELETE_SERVICE.path,
    tag = "services",
    security(("apiKey" = [])),
    params(("name" = String, Path, description = "Service name")),
    responses((status = 204, description = "Deleted"), Unauthenticated, NotFound, Conflict)
)]
pub async fn delete(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<StatusCode> {
    let s = service_of(&state, &p, &name).await?;
    ops::delete(&state, &s).await?;
    tracing::info!(service = %name, key = %p.key_id, "service deleted");
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LogsQuery {
    /// Bytes of each instance's log to start with (default 65536, at most 1048576).
    tail: Option<u64>,
    /// Keep the stream open and send new output as it comes.
    follow: Option<bool>,
}

/// The instances' output (`cmd`'s stdout and stderr), one `ServiceLogLine` per chunk.
#[utoipa::path(
    get,
    path = lizard_api::routes::SERVICE_LOGS.path,
    tag = "services",
    security(("apiKey" = [])),
    params(("name" = String, Path, description = "Service name"), LogsQuery),
    responses((status = 200, description = "One ServiceLogLine per line", content_type = "application/x-ndjson", body = ServiceLogLine), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn logs(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<LogsQuery>,
) -> ApiResult<Response> {
    let tail = q.tail.unwrap_or(ops::logs::DEFAULT_TAIL_BYTES);
    if tail > MAX_LOG_BYTES {
        return Err(AppError::invalid(format!("tail must be at most {MAX_LOG_BYTES}")));
    }
    let s = service_of(&state, &p, &name).await?;
    let ends = if q.follow == Some(true) { ops::logs::ends(&state, &s).await } else { Vec::new() };
    let head = ops::logs::tails(&state, &s, tail).await;
    let head = futures_util::stream::once(async move { Ok::<_, std::io::Error>(Bytes::from(to_ndjson(&head))) });
    let body = if q.follow == Some(true) {
        let live = ops::logs::follow(state.clone(), s.name.clone(), s.id.clone(), ends)
            .map(|line| Ok::<_, std::io::Error>(Bytes::from(to_ndjson(std::slice::from_ref(&line)))));
        Body::from_stream(head.chain(live))
    } else {
        Body::from_stream(head)
    };
    let mut resp = body.into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(NDJSON));
    Ok(resp)
}
