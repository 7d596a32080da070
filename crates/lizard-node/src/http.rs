//! The node's HTTP API: the sandbox routes of [`lizard_api::paths`], without tenancy.
//!
//! Local mode serves this on a Unix socket readable only by its owner. The control plane
//! serves the same operations behind authentication.

use crate::{Node, NodeError, Sandbox};
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::TryStreamExt;
use lizard_api::{CreateSandboxRequest, ExecRequest, ProcessResult, SandboxInfo};
use serde::Deserialize;
use std::sync::Arc;

/// An error answer: `{code, message}` with the code's status.
pub struct AppError(pub lizard_api::ApiError);

impl From<NodeError> for AppError {
    fn from(e: NodeError) -> Self {
        AppError(e.to_api())
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(self.0)).into_response()
    }
}

pub type Result<T, E = AppError> = std::result::Result<T, E>;

pub fn router(node: Arc<Node>) -> Router {
    Router::new()
        .route(lizard_api::paths::HEALTH, get(|| async { "ok" }))
        .route("/v1/sandboxes", post(create).get(list))
        .route("/v1/sandboxes/{id}", get(get_one).delete(kill))
        .route("/v1/sandboxes/{id}/pause", post(pause))
        .route("/v1/sandboxes/{id}/resume", post(resume))
        .route("/v1/sandboxes/{id}/connect", post(resume))
        .route("/v1/sandboxes/{id}/fork", post(fork))
        .route("/v1/sandboxes/{id}/exec", post(exec))
        .route("/v1/sandboxes/{id}/files", get(read_file).put(write_file).delete(remove))
        .route("/v1/sandboxes/{id}/files/list", get(list_dir))
        .route("/v1/sandboxes/{id}/files/mkdir", post(make_dir))
        .with_state(node)
}

/// Parse a JSON body with our error shape (axum's own rejection is plain text).
pub fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| {
        AppError(lizard_api::ApiError::new(
            lizard_api::ErrorCode::InvalidArgument,
            format!("invalid request body: {e}"),
        ))
    })
}

async fn create(State(node): State<Arc<Node>>, body: axum::body::Bytes) -> Result<(StatusCode, Json<SandboxInfo>)> {
    let req: CreateSandboxRequest = parse_json(&body)?;
    let sandbox = node.create(req).await?;
    Ok((StatusCode::CREATED, Json(sandbox.info())))
}

async fn list(State(node): State<Arc<Node>>) -> Json<Vec<SandboxInfo>> {
    Json(node.list())
}

async fn get_one(State(node): State<Arc<Node>>, Path(id): Path<String>) -> Result<Json<SandboxInfo>> {
    Ok(Json(node.get(&id)?.info()))
}

async fn kill(State(node): State<Arc<Node>>, Path(id): Path<String>) -> Result<StatusCode> {
    node.kill(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn pause(State(node): State<Arc<Node>>, Path(id): Path<String>) -> Result<Json<SandboxInfo>> {
    Ok(Json(node.pause(&id).await?.info()))
}

async fn resume(State(node): State<Arc<Node>>, Path(id): Path<String>) -> Result<Json<SandboxInfo>> {
    Ok(Json(node.resume(&id).await?.info()))
}

async fn fork(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<Vec<SandboxInfo>>)> {
    let req: lizard_api::ForkRequest = parse_json(&body)?;
    let copies = node.fork(&id, req.count).await?;
    Ok((StatusCode::CREATED, Json(copies.iter().map(|s| s.info()).collect())))
}

#[derive(Deserialize)]
struct ExecQuery {
    #[serde(default)]
    stream: bool,
}

/// Buffered: a [`ProcessResult`]. `?stream=true`: exec frames as the command runs.
async fn exec(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    Query(q): Query<ExecQuery>,
    body: axum::body::Bytes,
) -> Result<Response> {
    let req: ExecRequest = parse_json(&body)?;
    exec_response(&node.get(&id)?, req, q.stream).await
}

/// Run `req` and answer with a [`ProcessResult`], or with exec frames as the command
/// runs when `stream` (shared with the control plane's route).
pub async fn exec_response(sandbox: &Arc<Sandbox>, req: ExecRequest, stream: bool) -> Result<Response> {
    if stream {
        let frames = sandbox.exec_frames(req).await?;
        let body = Body::from_stream(frames.map_ok(|f| f.to_bytes()));
        Ok(([(header::CONTENT_TYPE, lizard_agent_proto::routes::FRAMES_CONTENT_TYPE)], body).into_response())
    } else {
        let r: ProcessResult = sandbox.exec_collect(req).await?;
        Ok(Json(r).into_response())
    }
}

#[derive(Deserialize)]
struct PathQuery {
    path: String,
    #[serde(default)]
    mode: Option<u32>,
}

async fn read_file(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> Result<Response> {
    let sandbox = node.get(&id)?;
    read_file_response(&sandbox, &q.path).await
}

/// Stream a file out of the sandbox as the response body, with its length when known.
pub async fn read_file_response(sandbox: &Sandbox, path: &str) -> Result<Response> {
    let (len, stream) = sandbox.read_file(path).await?;
    let mut resp = Body::from_stream(stream).into_response();
    if let Some(len) = len {
        resp.headers_mut().insert(header::CONTENT_LENGTH, len.into());
    }
    resp.headers_mut().insert(header::CONTENT_TYPE, "application/octet-stream".parse().expect("valid"));
    Ok(resp)
}

async fn write_file(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    body: Body,
) -> Result<Json<lizard_api::WriteResult>> {
    let sandbox = node.get(&id)?;
    let stream = body.into_data_stream().map_err(std::io::Error::other);
    Ok(Json(sandbox.write_file(&q.path, q.mode, stream).await?))
}

async fn remove(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> Result<StatusCode> {
    node.get(&id)?.remove(&q.path).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_dir(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> Result<Json<Vec<lizard_api::FileEntry>>> {
    Ok(Json(node.get(&id)?.list_dir(&q.path).await?))
}

async fn make_dir(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> Result<StatusCode> {
    node.get(&id)?.make_dir(&q.path).await?;
    Ok(StatusCode::NO_CONTENT)
}
