//! `/v1/nodes` and `/v1/node-tokens`: the operator's view of the nodes (list, get, drain,
//! undrain) and join tokens (mint, list, revoke). Operator only: an unscoped key of the
//! owner account; any other key is answered 403. The work is
//! [`crate::cluster::operator`]'s; these handlers only translate HTTP.

use crate::auth::Principal;
use crate::cluster::operator as ops;
use crate::error::{ApiJson, ApiPath, ApiResult};
use crate::openapi::{Conflict, Forbidden, InvalidArgument, NotFound, Unauthenticated};
use crate::state::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use lizard_api::cluster::{CreateNodeTokenRequest, NodeInfo, NodeToken};

/// Every node: region, address, state, capacity, load, last heartbeat.
#[utoipa::path(
    get,
    path = lizard_api::routes::LIST_NODES.path,
    tag = "nodes",
    security(("apiKey" = [])),
    responses((status = 200, description = "Nodes, oldest first", body = Vec<NodeInfo>), Unauthenticated, Forbidden)
)]
pub async fn list(State(state): State<AppState>, p: Principal) -> ApiResult<Json<Vec<NodeInfo>>> {
    ops::require_operator(&state, &p).await?;
    Ok(Json(ops::list(&state).await?))
}

#[utoipa::path(
    get,
    path = lizard_api::routes::GET_NODE.path,
    tag = "nodes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Node id")),
    responses((status = 200, description = "The node", body = NodeInfo), Unauthenticated, Forbidden, NotFound)
)]
pub async fn get(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<NodeInfo>> {
    ops::require_operator(&state, &p).await?;
    Ok(Json(ops::get(&state, &id).await?))
}

/// No new sandboxes on the node; what runs or is paused there stays until it ends.
#[utoipa::path(
    post,
    path = lizard_api::routes::DRAIN_NODE.path,
    tag = "nodes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Node id")),
    responses((status = 200, description = "The node, draining", body = NodeInfo), Unauthenticated, Forbidden, NotFound)
)]
pub async fn drain(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<NodeInfo>> {
    ops::require_operator(&state, &p).await?;
    Ok(Json(ops::set_draining(&state, &id, true).await?))
}

/// The node takes new sandboxes again (409 while it is down).
#[utoipa::path(
    post,
    path = lizard_api::routes::UNDRAIN_NODE.path,
    tag = "nodes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Node id")),
    responses((status = 200, description = "The node, up", body = NodeInfo), Unauthenticated, Forbidden, NotFound, Conflict)
)]
pub async fn undrain(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<NodeInfo>> {
    ops::require_operator(&state, &p).await?;
    Ok(Json(ops::set_draining(&state, &id, false).await?))
}

/// Mint a join token (`lzn_…`, in this answer only), reusable by any number of nodes
/// until it expires or is revoked.
#[utoipa::path(
    post,
    path = lizard_api::routes::CREATE_NODE_TOKEN.path,
    tag = "nodes",
    security(("apiKey" = [])),
    request_body = CreateNodeTokenRequest,
    responses((status = 201, description = "Created; `token` is shown this once", body = NodeToken), Unauthenticated, Forbidden, InvalidArgument)
)]
pub async fn create_token(
    State(state): State<AppState>,
    p: Principal,
    ApiJson(req): ApiJson<CreateNodeTokenRequest>,
) -> ApiResult<(StatusCode, Json<NodeToken>)> {
    ops::require_operator(&state, &p).await?;
    Ok((StatusCode::CREATED, Json(ops::create_token(&state, req).await?)))
}

/// Join tokens that may still be used (never their plaintext).
#[utoipa::path(
    get,
    path = lizard_api::routes::LIST_NODE_TOKENS.path,
    tag = "nodes",
    security(("apiKey" = [])),
    responses((status = 200, description = "Join tokens, oldest first", body = Vec<NodeToken>), Unauthenticated, Forbidden)
)]
pub async fn list_tokens(State(state): State<AppState>, p: Principal) -> ApiResult<Json<Vec<NodeToken>>> {
    ops::require_operator(&state, &p).await?;
    Ok(Json(ops::list_tokens(&state).await?))
}

/// Remove a node: its credential is refused from then on. Only a node with no live
/// sandbox and no volume on it (409 says what holds it), never the in-process one.
#[utoipa::path(
    delete,
    path = lizard_api::routes::REMOVE_NODE.path,
    tag = "nodes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Node id")),
    responses((status = 204, description = "Removed"), Unauthenticated, Forbidden, NotFound, Conflict)
)]
pub async fn remove(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    ops::require_operator(&state, &p).await?;
    ops::remove(&state, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Revoke a join token: no node joins with it any more (joined nodes stay).
#[utoipa::path(
    delete,
    path = lizard_api::routes::REVOKE_NODE_TOKEN.path,
    tag = "nodes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Join token id")),
    responses((status = 204, description = "Revoked"), Unauthenticated, Forbidden, NotFound)
)]
pub async fn revoke_token(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    ops::require_operator(&state, &p).await?;
    ops::revoke_token(&state, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}
