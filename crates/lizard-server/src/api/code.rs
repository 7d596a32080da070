//! `/v1/sandboxes/{id}/code…`: run code in a sandbox's code contexts (the `interpreter`
//! template), and manage the contexts — behind the key's scope, as every sandbox route.
//! The work is [`crate::ops::code`]'s; an execution's events are streamed into the
//! response as NDJSON, one line per event, as the code produces them.

use crate::api::sandboxes::running;
use crate::auth::Principal;
use crate::error::{ApiJson, ApiPath, ApiResult};
use crate::openapi::{CodeServiceUnavailable, InvalidArgument, NotFound, Unauthenticated};
use crate::ops::code as ops;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use lizard_api::code::{CodeContext, CodeEvent, CreateCodeContextRequest, RunCodeRequest};

/// One event as a line of NDJSON.
fn line(event: &CodeEvent) -> Result<bytes::Bytes, std::io::Error> {
    let mut bytes = serde_json::to_vec(event).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    Ok(bytes.into())
}

/// Run code in a context; its output streams back as it happens.
///
/// A context is a `language`'s default one (created at first use; default `python`) or
/// `contextId`. An exception, a timeout (`TimeoutError`: the context is interrupted and
/// keeps its state) or a dead interpreter (`DeadKernelError`: the next execution starts
/// a new one) is an `error` event, not an HTTP error; the last line is always `end`.
#[utoipa::path(
    post,
    path = lizard_api::routes::RUN_CODE.path,
    tag = "code",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = RunCodeRequest,
    responses((status = 200, description = "One CodeEvent per line, ending with `end`", content_type = "application/x-ndjson", body = CodeEvent), Unauthenticated, NotFound, InvalidArgument, CodeServiceUnavailable)
)]
pub async fn run_code(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<RunCodeRequest>,
) -> ApiResult<Response> {
    req.validate().map_err(|e| crate::error::AppError::invalid(e.to_string()))?;
    let sandbox = running(&state, &p, &id).await?;
    let events = ops::run(&state.server.guest_buffers, &sandbox, req).await?;
    let body = Body::from_stream(events.map(|e| line(&e)));
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response())
}

/// The sandbox's code contexts (the default ones included, once used).
#[utoipa::path(
    get,
    path = lizard_api::routes::LIST_CODE_CONTEXTS.path,
    tag = "code",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "Contexts", body = Vec<CodeContext>), Unauthenticated, NotFound, InvalidArgument, CodeServiceUnavailable)
)]
pub async fn list_contexts(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<Vec<CodeContext>>> {
    let sandbox = running(&state, &p, &id).await?;
    Ok(Json(ops::contexts(&sandbox).await?))
}

/// A new context: its own interpreter, state apart from every other context's.
#[utoipa::path(
    post,
    path = lizard_api::routes::CREATE_CODE_CONTEXT.path,
    tag = "code",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = CreateCodeContextRequest,
    responses((status = 201, description = "The context, its interpreter started", body = CodeContext), Unauthenticated, NotFound, InvalidArgument, CodeServiceUnavailable)
)]
pub async fn create_context(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<CreateCodeContextRequest>,
) -> ApiResult<(StatusCode, Json<CodeContext>)> {
    req.validate().map_err(|e| crate::error::AppError::invalid(e.to_string()))?;
    let sandbox = running(&state, &p, &id).await?;
    Ok((StatusCode::CREATED, Json(ops::create_context(&sandbox, &req).await?)))
}

/// End a context's interpreter; its state is gone.
#[utoipa::path(
    delete,
    path = lizard_api::routes::REMOVE_CODE_CONTEXT.path,
    tag = "code",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), ("contextId" = String, Path, description = "Context id")),
    responses((status = 204, description = "Removed"), Unauthenticated, NotFound, InvalidArgument, CodeServiceUnavailable)
)]
pub async fn remove_context(
    State(state): State<AppState>,
    p: Principal,
    ApiPath((id, context_id)): ApiPath<(String, String)>,
) -> ApiResult<StatusCode> {
    let sandbox = running(&state, &p, &id).await?;
    ops::remove_context(&sandbox, &context_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Give a context a new interpreter (same id; variables and counter cleared).
#[utoipa::path(
    post,
    path = lizard_api::routes::RESTART_CODE_CONTEXT.path,
    tag = "code",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), ("contextId" = String, Path, description = "Context id")),
    responses((status = 200, description = "The context", body = CodeContext), Unauthenticated, NotFound, InvalidArgument, CodeServiceUnavailable)
)]
pub async fn restart_context(
    State(state): State<AppState>,
    p: Principal,
    ApiPath((id, context_id)): ApiPath<(String, String)>,
) -> ApiResult<Json<CodeContext>> {
    let sandbox = running(&state, &p, &id).await?;
    Ok(Json(ops::restart_context(&sandbox, &context_id).await?))
}

#[cfg(test)]
mod tests {
    use crate::ops::tests::FakeNode;
    use crate::{open_with_store, ServerConfig, SqlStore};
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use lizard_node_client::{Nodes, LOCAL_NODE_ID};
    use serde_json::{json, Value};
    use std::sync::Arc;
    use tower::ServiceExt;

    async fn call(method: &str, uri: &str, key: Option<&str>, body: Option<Value>) -> (StatusCode, Value) {
        let store = SqlStore::memory().await.unwrap();
        let server = open_with_store(ServerConfig::new("/nonexistent"), Arc::new(store)).await.unwrap();
        let owner = server.initial_key().expect("first start").to_string();
        // A node that runs no sandbox: every lookup is 404.
        let nodes = Nodes::single(LOCAL_NODE_ID, Arc::new(FakeNode::default()));
        let app = crate::build_router(server.app_state(nodes), crate::api::all_routes());
        let mut req = Request::builder().method(method).uri(uri).header("x-api-key", key.unwrap_or(&owner));
        let body = match body {
            Some(v) => {
                req = req.header("content-type", "application/json");
                Body::from(v.to_string())
            }
            None => Body::empty(),
        };
        let resp = app.oneshot(req.body(body).unwrap()).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    #[tokio::test]
    async fn bad_requests_are_refused_with_stable_codes_before_any_sandbox_is_reached() {
        for (body, needle) in [
            (json!({"code": "1", "language": "ruby"}), "python"),
            (json!({"code": "1", "language": "bash", "contextId": "abc"}), "not both"),
            (json!({"code": "1", "timeoutMs": 0}), "timeoutMs"),
            (json!({"code": "1", "contextId": "../etc"}), "contextId"),
            (json!({"code": "1", "envs": {"A B": "x"}}), "env name"),
            (json!({"code": "1", "stream": true}), "unknown field"),
            (json!({}), "code"),
        ] {
            let (s, v) = call("POST", "/v1/sandboxes/sbx1/code", None, Some(body.clone())).await;
            assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {v}");
            assert_eq!(v["code"], "INVALID_ARGUMENT", "{body}: {v}");
            assert!(v["message"].as_str().unwrap().contains(needle), "{body}: {v}");
        }
        let (s, v) = call("POST", "/v1/sandboxes/sbx1/code/contexts", None, Some(json!({"cwd": "rel"}))).await;
        assert_eq!((s, v["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("INVALID_ARGUMENT")), "{v}");
    }

    #[tokio::test]
    async fn unknown_sandboxes_and_bad_keys_are_refused() {
        let (s, v) = call("POST", "/v1/sandboxes/sbxnope/code", None, Some(json!({"code": "1"}))).await;
        assert_eq!((s, v["code"].as_str()), (StatusCode::NOT_FOUND, Some("NOT_FOUND")), "{v}");
        for (method, uri) in [
            ("GET", "/v1/sandboxes/sbxnope/code/contexts"),
            ("DELETE", "/v1/sandboxes/sbxnope/code/contexts/abc"),
            ("POST", "/v1/sandboxes/sbxnope/code/contexts/abc/restart"),
        ] {
            let (s, v) = call(method, uri, None, None).await;
            assert_eq!(s, StatusCode::NOT_FOUND, "{method} {uri}: {v}");
        }
        let (s, v) = call("POST", "/v1/sandboxes/sbxnope/code", Some("lz_wrong"), Some(json!({"code": "1"}))).await;
        assert_eq!((s, v["code"].as_str()), (StatusCode::UNAUTHORIZED, Some("UNAUTHENTICATED")), "{v}");
    }
}
