//! `/v1/templates`: upload a pushed directory's files, push a recipe (built in the
//! background), list and get templates, follow or cancel a build, delete a template —
//! behind the key's scope. The operations are [`crate::ops::templates`]'s.
//!
//! Which workspace: `workspace` (id, slug or name) or `project` (its workspace), in the
//! query, or in the body of a push; a key that reaches one workspace may leave both out.
//! Reading a template by name without them looks in every workspace the key reaches. A
//! template of a workspace the key does not reach answers 404, like one that does not
//! exist; built-ins are visible to every key.

use crate::auth::Principal;
use crate::builds::{from_ndjson, to_ndjson};
use crate::error::{ApiJson, ApiPath, ApiQuery, ApiResult, AppError};
use crate::openapi::{Conflict, Forbidden, InvalidArgument, NotFound, Unauthenticated};
use crate::ops::templates as ops;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use futures_util::StreamExt;
use lizard_api::templates::{
    BuildEvent, MissingBlobs, MissingBlobsRequest, PushTemplateRequest, TemplateBuildInfo, TemplateInfo,
};
use lizard_store::{BuildRecord, TemplateRecord, WorkspaceRecord};
use serde::Deserialize;

/// Largest push request (its manifest: about 200 bytes a path, up to the context's
/// 100 000 entries).
pub const MAX_PUSH_BYTES: usize = 32 << 20;

/// The NDJSON media type of a build's event stream.
pub const NDJSON: &str = "application/x-ndjson";

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WorkspaceQuery {
    /// The workspace by id, slug or name.
    workspace: Option<String>,
    /// A project (id, slug or name): its workspace.
    project: Option<String>,
}

impl WorkspaceQuery {
    fn given(&self) -> bool {
        self.workspace.is_some() || self.project.is_some()
    }
}

async fn workspace_of(state: &AppState, p: &Principal, q: &WorkspaceQuery) -> ApiResult<WorkspaceRecord> {
    ops::target_workspace(state.server.store.as_ref(), p, q.workspace.as_deref(), q.project.as_deref()).await
}

/// The template `name` the key reaches (in the query's workspace when given).
async fn template_of(state: &AppState, p: &Principal, name: &str, q: &WorkspaceQuery) -> ApiResult<TemplateRecord> {
    let workspace = match q.given() {
        true => Some(workspace_of(state, p, q).await?),
        false => None,
    };
    ops::find(state.server.store.as_ref(), p, name, workspace.as_ref()).await
}

async fn build_of(
    state: &AppState,
    p: &Principal,
    name: &str,
    build_id: &str,
    q: &WorkspaceQuery,
) -> ApiResult<BuildRecord> {
    let template = template_of(state, p, name, q).await?;
    ops::find_build(state.server.store.as_ref(), &template, build_id).await
}

fn info(state: &AppState, build: &BuildRecord) -> TemplateBuildInfo {
    ops::build_info(build, state.builds.get(&build.id).map(|b| b.hub.progress()))
}

/// Which of these file contents the workspace has not uploaded yet.
#[utoipa::path(
    post,
    path = lizard_api::routes::MISSING_TEMPLATE_BLOBS.path,
    tag = "templates",
    security(("apiKey" = [])),
    params(WorkspaceQuery),
    request_body = MissingBlobsRequest,
    responses((status = 200, description = "The hashes to upload", body = MissingBlobs), Unauthenticated, NotFound, Conflict, InvalidArgument)
)]
pub async fn missing_blobs(
    State(state): State<AppState>,
    p: Principal,
    ApiQuery(q): ApiQuery<WorkspaceQuery>,
    ApiJson(req): ApiJson<MissingBlobsRequest>,
) -> ApiResult<Json<MissingBlobs>> {
    let workspace = workspace_of(&state, &p, &q).await?;
    let missing = ops::missing_blobs(&state, &workspace, &req.sha256).await?;
    Ok(Json(MissingBlobs { missing }))
}

/// Upload one file of a pushed directory; its SHA-256 must be the path's.
#[utoipa::path(
    put,
    path = lizard_api::routes::UPLOAD_TEMPLATE_BLOB.path,
    tag = "templates",
    security(("apiKey" = [])),
    params(("sha256" = String, Path, description = "SHA-256 of the content, hex"), WorkspaceQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 204, description = "Stored"), Unauthenticated, NotFound, Conflict, InvalidArgument)
)]
pub async fn upload_blob(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(sha256): ApiPath<String>,
    ApiQuery(q): ApiQuery<WorkspaceQuery>,
    body: Body,
) -> ApiResult<StatusCode> {
    let workspace = workspace_of(&state, &p, &q).await?;
    let stream = body.into_data_stream().map(|chunk| chunk.map_err(|e| e.to_string()));
    ops::upload_blob(&state, &workspace, &sha256, Box::pin(stream)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Build a template from a recipe and the uploaded directory; the build runs in the
/// background (follow it at `…/builds/{buildId}/events`).
#[utoipa::path(
    post,
    path = lizard_api::routes::PUSH_TEMPLATE.path,
    tag = "templates",
    security(("apiKey" = [])),
    request_body = PushTemplateRequest,
    responses((status = 202, description = "The build, queued", body = TemplateBuildInfo), Unauthenticated, NotFound, Conflict, InvalidArgument)
)]
pub async fn push(
    State(state): State<AppState>,
    p: Principal,
    ApiJson(req): ApiJson<PushTemplateRequest>,
) -> ApiResult<(StatusCode, Json<TemplateBuildInfo>)> {
    let workspace =
        ops::target_workspace(state.server.store.as_ref(), &p, req.workspace.as_deref(), req.project.as_deref())
            .await?;
    let build = ops::push(&state, &workspace, &req).await?;
    tracing::info!(build = %build.id, template = %build.template_name, key = %p.key_id, "template pushed");
    Ok((StatusCode::ACCEPTED, Json(info(&state, &build))))
}

/// The built-in templates and those of the key's workspaces (of one when given).
#[utoipa::path(
    get,
    path = lizard_api::routes::LIST_TEMPLATES.path,
    tag = "templates",
    security(("apiKey" = [])),
    params(WorkspaceQuery),
    responses((status = 200, description = "Built-ins first, then by workspace and name", body = Vec<TemplateInfo>), Unauthenticated, NotFound, Conflict, InvalidArgument)
)]
pub async fn list(
    State(state): State<AppState>,
    p: Principal,
    ApiQuery(q): ApiQuery<WorkspaceQuery>,
) -> ApiResult<Json<Vec<TemplateInfo>>> {
    let store = state.server.store.as_ref();
    let workspaces: Vec<String> = match q.given() {
        true => vec![workspace_of(&state, &p, &q).await?.id],
        false => ops::visible_workspaces(store, &p).await?.into_iter().map(|w| w.id).collect(),
    };
    let mut out: Vec<TemplateInfo> = ops::builtins(&state).iter().map(ops::builtin_info).collect();
    let own = store.list_templates(&p.account_id).await?;
    out.extend(own.iter().filter(|t| workspaces.contains(&t.workspace_id)).map(ops::template_info));
    Ok(Json(out))
}

/// One template: a built-in, or one of the key's workspaces'.
#[utoipa::path(
    get,
    path = lizard_api::routes::GET_TEMPLATE.path,
    tag = "templates",
    security(("apiKey" = [])),
    params(("name" = String, Path, description = "Template name"), WorkspaceQuery),
    responses((status = 200, description = "The template", body = TemplateInfo), Unauthenticated, NotFound, Conflict, InvalidArgument)
)]
pub async fn get(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<WorkspaceQuery>,
) -> ApiResult<Json<TemplateInfo>> {
    if let Some(b) = ops::builtins(&state).iter().find(|b| b.name == name) {
        return Ok(Json(ops::builtin_info(b)));
    }
    Ok(Json(ops::template_info(&template_of(&state, &p, &name, &q).await?)))
}

/// Delete a pushed template and its builds; 409 while a sandbox runs from it or a build
/// of it runs, 403 for a built-in.
#[utoipa::path(
    delete,
    path = lizard_api::routes::DELETE_TEMPLATE.path,
    tag = "templates",
    security(("apiKey" = [])),
    params(("name" = String, Path, description = "Template name"), WorkspaceQuery),
    responses((status = 204, description = "Deleted"), Unauthenticated, Forbidden, NotFound, Conflict, InvalidArgument)
)]
pub async fn delete(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<WorkspaceQuery>,
) -> ApiResult<StatusCode> {
    if ops::is_builtin(&state, &name) {
        return Err(AppError::forbidden(format!("{name} is a built-in template; it cannot be deleted")));
    }
    let template = template_of(&state, &p, &name, &q).await?;
    ops::delete(&state, &template).await?;
    tracing::info!(template = %template.id, name = %name, key = %p.key_id, "template deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// A build: its status, steps (cached or not), failure and output tail.
#[utoipa::path(
    get,
    path = lizard_api::routes::GET_TEMPLATE_BUILD.path,
    tag = "templates",
    security(("apiKey" = [])),
    params(("name" = String, Path, description = "Template name"), ("buildId" = String, Path, description = "Build id"), WorkspaceQuery),
    responses((status = 200, description = "The build", body = TemplateBuildInfo), Unauthenticated, NotFound, Conflict, InvalidArgument)
)]
pub async fn get_build(
    State(state): State<AppState>,
    p: Principal,
    ApiPath((name, build_id)): ApiPath<(String, String)>,
    ApiQuery(q): ApiQuery<WorkspaceQuery>,
) -> ApiResult<Json<TemplateBuildInfo>> {
    let build = build_of(&state, &p, &name, &build_id, &q).await?;
    Ok(Json(info(&state, &build)))
}

/// A build's events as NDJSON, from the first, following the build until `done`.
#[utoipa::path(
    get,
    path = lizard_api::routes::TEMPLATE_BUILD_EVENTS.path,
    tag = "templates",
    security(("apiKey" = [])),
    params(("name" = String, Path, description = "Template name"), ("buildId" = String, Path, description = "Build id"), WorkspaceQuery),
    responses((status = 200, description = "One BuildEvent per line, ending with `done`", content_type = "application/x-ndjson", body = BuildEvent), Unauthenticated, NotFound, Conflict, InvalidArgument)
)]
pub async fn events(
    State(state): State<AppState>,
    p: Principal,
    ApiPath((name, build_id)): ApiPath<(String, String)>,
    ApiQuery(q): ApiQuery<WorkspaceQuery>,
) -> ApiResult<Response> {
    let build = build_of(&state, &p, &name, &build_id, &q).await?;
    let body = match state.builds.get(&build.id) {
        Some(running) => {
            let (replay, live) = running.hub.follow();
            let head =
                futures_util::stream::once(async move { Ok::<_, std::io::Error>(Bytes::from(to_ndjson(&replay))) });
            match live {
                Some(rx) => {
                    let tail = futures_util::stream::unfold(Some(rx), |rx| async move {
                        let mut rx = rx?;
                        loop {
                            match rx.recv().await {
                                Ok(event) => {
                                    let done = matches!(event, BuildEvent::Done { .. });
                                    let line = Bytes::from(to_ndjson(std::slice::from_ref(&event)));
                                    return Some((Ok::<_, std::io::Error>(line), (!done).then_some(rx)));
                                }
                                // A slow follower skips what it could not keep up with.
                                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                            }
                        }
                    });
                    Body::from_stream(head.chain(tail))
                }
                None => Body::from_stream(head),
            }
        }
        None => {
            // It may have ended since its record was read (its end is recorded before it
            // leaves the builds in flight): read the record again.
            let build =
                if build.status.is_final() { build } else { build_of(&state, &p, &name, &build_id, &q).await? };
            let mut events = from_ndjson(&build.events);
            if !events.iter().any(|e| matches!(e, BuildEvent::Done { .. })) {
                // Ended without a stream (a previous process's build): its end alone.
                events.push(BuildEvent::Done { status: build.status, error: build.error.clone() });
            }
            Body::from(to_ndjson(&events))
        }
    };
    let mut resp = body.into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(NDJSON));
    Ok(resp)
}

/// Cancel a queued or running build; nothing of it is left behind.
#[utoipa::path(
    delete,
    path = lizard_api::routes::CANCEL_TEMPLATE_BUILD.path,
    tag = "templates",
    security(("apiKey" = [])),
    params(("name" = String, Path, description = "Template name"), ("buildId" = String, Path, description = "Build id"), WorkspaceQuery),
    responses((status = 204, description = "Cancelling"), Unauthenticated, NotFound, Conflict, InvalidArgument)
)]
pub async fn cancel(
    State(state): State<AppState>,
    p: Principal,
    ApiPath((name, build_id)): ApiPath<(String, String)>,
    ApiQuery(q): ApiQuery<WorkspaceQuery>,
) -> ApiResult<StatusCode> {
    let build = build_of(&state, &p, &name, &build_id, &q).await?;
    ops::cancel(&state, &build).await?;
    tracing::info!(build = %build.id, key = %p.key_id, "template build cancelled");
    Ok(StatusCode::NO_CONTENT)
}
