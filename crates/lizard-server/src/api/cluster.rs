//! `/v1/cluster/…`: what node agents call — join (a join token as the bearer), heartbeat
//! and sandbox-ended events (the node's credential as the bearer). The work is
//! [`crate::cluster::membership`]'s; these handlers only translate HTTP.

use crate::cluster::membership;
use crate::error::{ApiJson, ApiPath, ApiResult};
use crate::openapi::{InvalidArgument, NotFound, Unauthenticated};
use crate::state::AppState;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use lizard_api::cluster::{HeartbeatResponse, JoinRequest, JoinResponse, NodeReport, SandboxEnded, SandboxHalt};

/// The `Authorization: Bearer …` token, if any.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(axum::http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// A node joins with a join token; the answer is its id and credential (shown once) and
/// how often to heartbeat.
#[utoipa::path(
    post,
    path = lizard_api::routes::CLUSTER_JOIN.path,
    tag = "cluster",
    security(("nodeBearer" = [])),
    request_body = JoinRequest,
    responses((status = 200, description = "Joined", body = JoinResponse), Unauthenticated, InvalidArgument)
)]
pub async fn join(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<JoinRequest>,
) -> ApiResult<Json<JoinResponse>> {
    Ok(Json(membership::join(&state, bearer(&headers), req).await?))
}

/// A node's heartbeat: its report now. The answer is its state and the sandboxes it must
/// stop (their records ended).
#[utoipa::path(
    post,
    path = lizard_api::routes::CLUSTER_HEARTBEAT.path,
    tag = "cluster",
    security(("nodeBearer" = [])),
    params(("id" = String, Path, description = "Node id")),
    request_body = NodeReport,
    responses((status = 200, description = "Recorded", body = HeartbeatResponse), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn heartbeat(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiPath(id): ApiPath<String>,
    ApiJson(report): ApiJson<NodeReport>,
) -> ApiResult<Json<HeartbeatResponse>> {
    Ok(Json(membership::heartbeat(&state, &id, bearer(&headers), report).await?))
}

/// Sandboxes that ended by themselves on the node (a VMM crash, a guest power-off).
#[utoipa::path(
    post,
    path = lizard_api::routes::CLUSTER_EVENTS.path,
    tag = "cluster",
    security(("nodeBearer" = [])),
    params(("id" = String, Path, description = "Node id")),
    request_body = Vec<SandboxEnded>,
    responses((status = 204, description = "Recorded"), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn events(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiPath(id): ApiPath<String>,
    ApiJson(ended): ApiJson<Vec<SandboxEnded>>,
) -> ApiResult<StatusCode> {
    membership::events(&state, &id, bearer(&headers), ended).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Sandboxes whose VM a full disk halted on the node, or that run again.
#[utoipa::path(
    post,
    path = lizard_api::routes::CLUSTER_HALTS.path,
    tag = "cluster",
    security(("nodeBearer" = [])),
    params(("id" = String, Path, description = "Node id")),
    request_body = Vec<SandboxHalt>,
    responses((status = 204, description = "Recorded"), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn halts(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiPath(id): ApiPath<String>,
    ApiJson(halts): ApiJson<Vec<SandboxHalt>>,
) -> ApiResult<StatusCode> {
    membership::halts(&state, &id, bearer(&headers), halts).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_from_the_authorization_header() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert("authorization", "Bearer abc".parse().unwrap());
        assert_eq!(bearer(&h), Some("abc"));
        h.insert("authorization", "bearer  abc ".parse().unwrap());
        assert_eq!(bearer(&h), Some("abc"));
        h.insert("authorization", "Basic abc".parse().unwrap());
        assert_eq!(bearer(&h), None);
    }
}
