//! E2B's snapshots: `create_snapshot` saves a running sandbox (it runs on), `Sandbox.create`
//! starts new sandboxes from it by its id or its name as the template, `list_snapshots`
//! and `delete_snapshot` (`DELETE /templates/{id}`, routed with templates') — the operations of
//! [`lizard_server::ops::snapshots`]. A snapshot belongs to its source's project.
//!
//! Snapshots keep memory and processes; a disk-only snapshot (`memory: false`) is refused
//! with 400, as E2B does where the option is not enabled.

use crate::control::{body, paged};
use crate::{E2bError, E2bResult};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Json;
use lizard_e2b::rest;
use lizard_server::api::sandboxes::running;
use lizard_server::auth::Principal;
use lizard_server::error::AppError;
use lizard_server::ops::snapshots;
use lizard_server::state::AppState;
use lizard_store::{ProjectRecord, SnapshotRecord};
use utoipa_axum::router::OpenApiRouter;

pub fn routes(router: OpenApiRouter<AppState>) -> OpenApiRouter<AppState> {
    router
        .route("/sandboxes/{id}/snapshots", post(take).layer(axum::middleware::map_response(crate::no_retry)))
        .route("/snapshots", get(list))
}

fn info(s: &SnapshotRecord) -> rest::SnapshotInfo {
    rest::SnapshotInfo { snapshot_id: s.id.clone(), names: s.name.iter().cloned().collect() }
}

/// The snapshot an E2B create's `templateID` names in `project`: by id, or by name.
pub(super) async fn named_by(
    state: &AppState,
    p: &Principal,
    project: &ProjectRecord,
    template_id: &str,
) -> E2bResult<Option<SnapshotRecord>> {
    if snapshots::is_snapshot_id(template_id) {
        let found = lizard_server::api::sandboxes::snapshot_in(state, p, &project.id, template_id).await?;
        return Ok(Some(found));
    }
    Ok(state.server.store.snapshot_named(&p.account_id, &project.id, template_id).await?)
}

/// `POST /sandboxes/{id}/snapshots` `{"name"?, "memory"?}` → 201.
async fn take(
    State(state): State<AppState>,
    p: Result<Principal, AppError>,
    Path(id): Path<String>,
    bytes: Bytes,
) -> E2bResult<(StatusCode, Json<rest::SnapshotInfo>)> {
    let req: rest::NewSnapshot = body(&bytes)?;
    if req.memory == Some(false) {
        return Err(E2bError(AppError::invalid(
            "disk-only snapshots are not served by Lizard: take a full snapshot (memory and processes too)",
        )));
    }
    let sandbox = running(&state, &p?, &id).await?;
    let taken = snapshots::take(&state, &sandbox, req.name).await?;
    Ok((StatusCode::CREATED, Json(info(&taken))))
}

/// `GET /snapshots?sandboxID=&name=&limit=&nextToken=` → the snapshots of the projects
/// the key reaches, oldest first, a page at a time.
async fn list(
    State(state): State<AppState>,
    p: Result<Principal, AppError>,
    Query(q): Query<rest::SnapshotQuery>,
) -> E2bResult<axum::response::Response> {
    let p = p?;
    let all = state.server.store.list_snapshots(&p.account_id).await?;
    let wanted = |s: &SnapshotRecord| {
        lizard_store::scope::sees_project(p.scope.as_ref(), &s.workspace_id, &s.project_id)
            && q.sandbox_id.as_ref().is_none_or(|id| *id == s.source_sandbox_id)
            && q.name.as_ref().is_none_or(|n| Some(n) == s.name.as_ref() || *n == s.id)
    };
    let matching: Vec<rest::SnapshotInfo> = all.iter().filter(|s| wanted(s)).map(info).collect();
    paged(matching, q.next_token.as_deref(), q.limit)
}

/// `DELETE /templates/{id}` of a snapshot (see [`crate::templates`]) → 204: one the key
/// reaches, by its id.
pub(super) async fn remove(state: &AppState, p: &Principal, id: &str) -> E2bResult<StatusCode> {
    let not_found = || E2bError(AppError::not_found(format!("template {id} not found")));
    let snapshot = state.server.store.get_snapshot(&p.account_id, id).await?.ok_or_else(not_found)?;
    if !lizard_store::scope::sees_project(p.scope.as_ref(), &snapshot.workspace_id, &snapshot.project_id) {
        return Err(not_found());
    }
    snapshots::delete(state, &snapshot).await?;
    Ok(StatusCode::NO_CONTENT)
}
