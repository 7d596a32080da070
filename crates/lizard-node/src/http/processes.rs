//! Background processes, terminals and port waits in a sandbox (the node's side of
//! `/v1/sandboxes/{id}/processes…` and `…/ports/{port}/wait`).

use super::{parse_json, AppError, NodeQuery, Result};
use crate::{Node, ProcessFrameStream};
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::TryStreamExt;
use lizard_api::processes::{ListeningPort, ProcessControl, ProcessInfo, PtySize, SignalRequest, StartProcessRequest};
use lizard_api::{ApiError, ErrorCode};
use serde::Deserialize;
use std::sync::Arc;

/// A process's frames as the response body.
pub fn frames_response(frames: ProcessFrameStream) -> Response {
    let body = Body::from_stream(frames.map_ok(|f| f.to_bytes()));
    ([(header::CONTENT_TYPE, lizard_agent_proto::routes::FRAMES_CONTENT_TYPE)], body).into_response()
}

/// A number from the path, checked after the sandbox (an unknown sandbox is 404 first).
fn number<T: std::str::FromStr>(what: &str, raw: &str) -> Result<T> {
    raw.parse().map_err(|_| {
        AppError(ApiError::new(ErrorCode::InvalidArgument, format!("{what} must be a number, not {raw:?}")))
    })
}

pub async fn start(State(node): State<Arc<Node>>, Path(id): Path<String>, body: Bytes) -> Result<Response> {
    let sandbox = node.get(&id)?;
    let req: StartProcessRequest = parse_json(&body)?;
    Ok(frames_response(sandbox.start_process(req).await?))
}

pub async fn list(State(node): State<Arc<Node>>, Path(id): Path<String>) -> Result<Json<Vec<ProcessInfo>>> {
    Ok(Json(node.get(&id)?.list_processes().await?))
}

pub async fn ports(State(node): State<Arc<Node>>, Path(id): Path<String>) -> Result<Json<Vec<ListeningPort>>> {
    Ok(Json(node.get(&id)?.listening_ports().await?))
}

pub async fn output(State(node): State<Arc<Node>>, Path((id, pid)): Path<(String, String)>) -> Result<Response> {
    let sandbox = node.get(&id)?;
    Ok(frames_response(sandbox.process_output(number("pid", &pid)?).await?))
}

async fn control(node: &Node, id: &str, pid: &str, control: ProcessControl) -> Result<StatusCode> {
    let sandbox = node.get(id)?;
    sandbox.control_process(number("pid", pid)?, control).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn stdin(
    State(node): State<Arc<Node>>,
    Path((id, pid)): Path<(String, String)>,
    body: Bytes,
) -> Result<StatusCode> {
    control(&node, &id, &pid, ProcessControl::Stdin(body.to_vec())).await
}

pub async fn close_stdin(State(node): State<Arc<Node>>, Path((id, pid)): Path<(String, String)>) -> Result<StatusCode> {
    control(&node, &id, &pid, ProcessControl::CloseStdin).await
}

pub async fn signal(
    State(node): State<Arc<Node>>,
    Path((id, pid)): Path<(String, String)>,
    body: Bytes,
) -> Result<StatusCode> {
    node.get(&id)?;
    let req: SignalRequest = parse_json(&body)?;
    control(&node, &id, &pid, ProcessControl::Signal(req.signal().to_string())).await
}

pub async fn resize(
    State(node): State<Arc<Node>>,
    Path((id, pid)): Path<(String, String)>,
    body: Bytes,
) -> Result<StatusCode> {
    node.get(&id)?;
    let size: PtySize = parse_json(&body)?;
    control(&node, &id, &pid, ProcessControl::Resize(size)).await
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WaitQuery {
    timeout_ms: Option<u64>,
}

pub async fn wait_for_port(
    State(node): State<Arc<Node>>,
    Path((id, port)): Path<(String, String)>,
    query: Result<NodeQuery<WaitQuery>>,
) -> Result<StatusCode> {
    let sandbox = node.get(&id)?;
    let NodeQuery(q) = query?;
    let (port, timeout_ms) = lizard_api::processes::port_wait_args(&port, q.timeout_ms).map_err(AppError)?;
    sandbox.wait_for_port(port, timeout_ms).await?;
    Ok(StatusCode::NO_CONTENT)
}
