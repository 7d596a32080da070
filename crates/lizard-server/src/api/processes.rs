//! `/v1/sandboxes/{id}/processes…`, `…/pty` and `…/ports/{port}/wait`: background
//! processes, terminals and port waits inside a sandbox, behind the key's scope as every
//! sandbox route. The guest's agent keeps the processes ([`lizard_api::processes`]); these
//! handlers pass frames and controls through the sandbox's node.
//!
//! The PTY WebSocket bridges one terminal process to a browser or `lizard sandbox shell`:
//! binary messages are the terminal's bytes both ways, text messages JSON
//! ([`PtyClientMessage`] in, [`PtyServerMessage`] out).

use crate::api::sandboxes::running;
use crate::auth::Principal;
use crate::error::{ApiJson, ApiPath, ApiQuery, ApiResult, AppError};
use crate::openapi::{Conflict, InvalidArgument, NotFound, TimedOut, Unauthenticated};
use crate::state::AppState;
use axum::body::{Body, Bytes};
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt, TryStreamExt};
use lizard_agent_proto::frame::FrameKind;
use lizard_api::processes::{
    ListeningPort, ProcessControl, ProcessInfo, PtyClientMessage, PtyServerMessage, PtySize, SignalRequest,
    StartProcessRequest, PTY_PROTOCOL,
};
use lizard_api::{ApiError, ErrorCode};
use lizard_node_client::{FrameStream, NodeClient};
use serde::Deserialize;
use std::sync::Arc;

/// A terminal's size when the request names none.
const DEFAULT_PTY_SIZE: PtySize = PtySize { cols: 80, rows: 24 };

/// How long a PTY socket the server closes waits for the client's Close.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

fn frames_response(frames: FrameStream) -> Response {
    let body = Body::from_stream(frames.map_ok(|f| f.to_bytes()));
    ([(header::CONTENT_TYPE, lizard_agent_proto::routes::FRAMES_CONTENT_TYPE)], body).into_response()
}

fn check_start(req: &StartProcessRequest) -> ApiResult<()> {
    let as_exec = lizard_api::ExecRequest {
        cmd: req.cmd.clone(),
        argv: req.argv.clone(),
        cwd: req.cwd.clone(),
        env: req.env.clone(),
        user: req.user.clone(),
        ..Default::default()
    };
    crate::limits::check_exec(&as_exec)
}

/// Start a process that outlives the request (on a pseudo-terminal with `pty`).
///
/// The answer streams exec frames as it runs: `Started` (its `ProcessInfo`, with the pid)
/// first, then its output, then `Exit`. Closing the answer leaves the process running;
/// `GET …/processes/{pid}/output` reattaches.
#[utoipa::path(
    post,
    path = lizard_api::routes::START_PROCESS.path,
    tag = "processes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = StartProcessRequest,
    responses((status = 200, description = "Exec frames: Started, Stdout/Stderr, Exit", content_type = "application/vnd.lizard.frames", body = Vec<u8>), Unauthenticated, NotFound, InvalidArgument, Conflict)
)]
pub async fn start(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<StartProcessRequest>,
) -> ApiResult<Response> {
    check_start(&req)?;
    let sandbox = running(&state, &p, &id).await?;
    Ok(frames_response(sandbox.node.start_process(sandbox.id(), req).await?))
}

/// The processes the sandbox keeps: running ones and the most recent ended ones.
#[utoipa::path(
    get,
    path = lizard_api::routes::LIST_PROCESSES.path,
    tag = "processes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "Processes, oldest first", body = Vec<ProcessInfo>), Unauthenticated, NotFound)
)]
pub async fn list(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<Vec<ProcessInfo>>> {
    let sandbox = running(&state, &p, &id).await?;
    Ok(Json(sandbox.node.list_processes(sandbox.id()).await?))
}

/// Reattach to a process: `Started`, the output it kept (its newest 1 MiB), live output,
/// then `Exit` (at once for an ended process).
#[utoipa::path(
    get,
    path = lizard_api::routes::PROCESS_OUTPUT.path,
    tag = "processes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = u32, Path, description = "Process id in the sandbox")),
    responses((status = 200, description = "Exec frames: Started, Stdout/Stderr, Exit", content_type = "application/vnd.lizard.frames", body = Vec<u8>), Unauthenticated, NotFound, InvalidArgument, Conflict)
)]
pub async fn output(
    State(state): State<AppState>,
    p: Principal,
    ApiPath((id, pid)): ApiPath<(String, u32)>,
) -> ApiResult<Response> {
    let sandbox = running(&state, &p, &id).await?;
    Ok(frames_response(sandbox.node.process_output(sandbox.id(), pid).await?))
}

async fn control(
    state: &AppState,
    p: &Principal,
    id: &str,
    pid: u32,
    control: ProcessControl,
) -> ApiResult<StatusCode> {
    let sandbox = running(state, p, id).await?;
    sandbox.node.control_process(sandbox.id(), pid, control).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Write the body to a process's stdin (a PTY's keyboard). Waits while the process does
/// not read; 409 once its stdin is closed.
#[utoipa::path(
    post,
    path = lizard_api::routes::PROCESS_STDIN.path,
    tag = "processes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = u32, Path, description = "Process id in the sandbox")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 204, description = "Written"), Unauthenticated, NotFound, InvalidArgument, Conflict)
)]
pub async fn stdin(
    State(state): State<AppState>,
    p: Principal,
    ApiPath((id, pid)): ApiPath<(String, u32)>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    control(&state, &p, &id, pid, ProcessControl::Stdin(body.to_vec())).await
}

/// Close a process's stdin (a PTY gets `^D`).
#[utoipa::path(
    delete,
    path = lizard_api::routes::CLOSE_PROCESS_STDIN.path,
    tag = "processes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = u32, Path, description = "Process id in the sandbox")),
    responses((status = 204, description = "Closed"), Unauthenticated, NotFound, InvalidArgument, Conflict)
)]
pub async fn close_stdin(
    State(state): State<AppState>,
    p: Principal,
    ApiPath((id, pid)): ApiPath<(String, u32)>,
) -> ApiResult<StatusCode> {
    control(&state, &p, &id, pid, ProcessControl::CloseStdin).await
}

/// Send a signal to a process's group (default `SIGKILL`); nothing for an ended one.
#[utoipa::path(
    post,
    path = lizard_api::routes::SIGNAL_PROCESS.path,
    tag = "processes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = u32, Path, description = "Process id in the sandbox")),
    request_body = SignalRequest,
    responses((status = 204, description = "Sent"), Unauthenticated, NotFound, InvalidArgument, Conflict)
)]
pub async fn signal(
    State(state): State<AppState>,
    p: Principal,
    ApiPath((id, pid)): ApiPath<(String, u32)>,
    ApiJson(req): ApiJson<SignalRequest>,
) -> ApiResult<StatusCode> {
    control(&state, &p, &id, pid, ProcessControl::Signal(req.signal().to_string())).await
}

/// Resize a PTY process's terminal (its programs get `SIGWINCH`); 409 without a PTY.
#[utoipa::path(
    post,
    path = lizard_api::routes::RESIZE_PROCESS.path,
    tag = "processes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = u32, Path, description = "Process id in the sandbox")),
    request_body = PtySize,
    responses((status = 204, description = "Resized"), Unauthenticated, NotFound, InvalidArgument, Conflict)
)]
pub async fn resize(
    State(state): State<AppState>,
    p: Principal,
    ApiPath((id, pid)): ApiPath<(String, u32)>,
    ApiJson(size): ApiJson<PtySize>,
) -> ApiResult<StatusCode> {
    control(&state, &p, &id, pid, ProcessControl::Resize(size)).await
}

/// The TCP ports something listens on in the sandbox, by port: each with its address and,
/// where the guest's agent found it, the process holding it. The platform's own guest
/// ports are left out (no sandbox URL reaches them); a paused sandbox answers 409.
#[utoipa::path(
    get,
    path = lizard_api::routes::LIST_PORTS.path,
    tag = "processes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "Listening TCP ports", body = Vec<ListeningPort>), Unauthenticated, NotFound, Conflict)
)]
pub async fn ports(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<Vec<ListeningPort>>> {
    let sandbox = running(&state, &p, &id).await?;
    Ok(Json(sandbox.node.listening_ports(sandbox.id()).await?))
}

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WaitQuery {
    /// How long to wait, in milliseconds (default 60000, at most 600000).
    timeout_ms: Option<u64>,
}

/// Wait until something listens on a TCP port in the sandbox (on any address): 204 then,
/// 408 `TIMED_OUT` when nothing did within `timeoutMs`. The guest's agent watches its
/// socket table; nothing connects to the port.
#[utoipa::path(
    get,
    path = lizard_api::routes::WAIT_FOR_PORT.path,
    tag = "processes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), ("port" = u16, Path, description = "TCP port in the sandbox"), WaitQuery),
    responses((status = 204, description = "Something listens on the port"), Unauthenticated, NotFound, InvalidArgument, TimedOut)
)]
pub async fn wait_for_port(
    State(state): State<AppState>,
    p: Principal,
    ApiPath((id, port)): ApiPath<(String, String)>,
    ApiQuery(q): ApiQuery<WaitQuery>,
) -> ApiResult<StatusCode> {
    let sandbox = running(&state, &p, &id).await?;
    let (port, timeout_ms) = lizard_api::processes::port_wait_args(&port, q.timeout_ms).map_err(AppError)?;
    sandbox.node.wait_for_port(sandbox.id(), port, timeout_ms).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PtyQuery {
    /// Columns (default 80).
    cols: Option<u16>,
    /// Rows (default 24).
    rows: Option<u16>,
    /// A shell command to run instead of the login shell.
    cmd: Option<String>,
    cwd: Option<String>,
    user: Option<String>,
    /// Reattach to this PTY process instead of starting one.
    pid: Option<u32>,
    /// `true`: closing the socket leaves the process running for a later `?pid=` (the
    /// console's terminal, which a reload or a second tab reattaches); without it closing
    /// hangs the terminal up.
    detach: Option<bool>,
}

/// A terminal in the sandbox, as a WebSocket (subprotocol `lizard.pty`; the key may be a
/// second subprotocol `lizard.key.<key>`). Binary messages carry the terminal's bytes
/// both ways; text messages are JSON: `{"type":"resize","cols":…,"rows":…}` from the
/// client, `started` (with the pid), `exit` (with the exit code) or `error` from the
/// server. A client that closes the socket hangs the terminal up (`SIGHUP`) unless it
/// asked for `?detach=true`; when the server closes it first (the sandbox paused or
/// stopped answering) the process runs on and `?pid=` reattaches.
#[utoipa::path(
    get,
    path = lizard_api::routes::PTY.path,
    tag = "processes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), PtyQuery),
    responses((status = 101, description = "Switching to the WebSocket protocol"), Unauthenticated, NotFound, InvalidArgument, Conflict)
)]
pub async fn pty(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<PtyQuery>,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    let sandbox = running(&state, &p, &id).await?;
    let upgrade =
        upgrade.map_err(|e| AppError::invalid(format!("a WebSocket upgrade is required: {}", e.body_text())))?;
    let frames = match q.pid {
        Some(pid) => sandbox.node.process_output(sandbox.id(), pid).await?,
        None => {
            let size = PtySize {
                cols: q.cols.unwrap_or(DEFAULT_PTY_SIZE.cols),
                rows: q.rows.unwrap_or(DEFAULT_PTY_SIZE.rows),
            };
            let req = StartProcessRequest {
                cmd: Some(q.cmd.unwrap_or_else(|| lizard_api::processes::DEFAULT_SHELL.to_string())),
                cwd: q.cwd,
                user: q.user,
                pty: Some(size),
                ..Default::default()
            };
            check_start(&req)?;
            sandbox.node.start_process(sandbox.id(), req).await?
        }
    };
    let node = sandbox.node.clone();
    let id = sandbox.id().to_string();
    let hang_up_on_close = !q.detach.unwrap_or(false);
    Ok(upgrade.protocols([PTY_PROTOCOL]).on_upgrade(move |socket| bridge(socket, frames, node, id, hang_up_on_close)))
}

/// How a PTY WebSocket ended.
enum Ended {
    /// The process ended (`exit` was sent).
    Exited,
    /// The stream from the sandbox broke off (an `error` was sent); the process may run on.
    BrokeOff,
    /// The client closed the socket or went away.
    ClientLeft,
}

fn text(message: &PtyServerMessage) -> Message {
    Message::Text(serde_json::to_string(message).unwrap_or_default().into())
}

/// Pass the terminal's output to the socket and the socket's input to the terminal until
/// one side ends; a client that leaves hangs the terminal up when `hang_up_on_close`.
async fn bridge(
    socket: WebSocket,
    mut frames: FrameStream,
    node: Arc<dyn NodeClient>,
    id: String,
    hang_up_on_close: bool,
) {
    let (mut out, mut input) = socket.split();
    let pid = match frames.next().await {
        Some(Ok(f)) if f.kind == FrameKind::Started => {
            serde_json::from_slice::<ProcessInfo>(&f.data).ok().map(|i| i.pid)
        }
        _ => None,
    };
    let Some(pid) = pid else {
        let e = PtyServerMessage::Error { code: ErrorCode::Unavailable, message: "the terminal did not start".into() };
        let _ = out.send(text(&e)).await;
        close(out, input).await;
        return;
    };
    if out.send(text(&PtyServerMessage::Started { pid })).await.is_err() {
        if hang_up_on_close {
            hang_up(node.as_ref(), &id, pid).await;
        }
        return;
    }
    let screen = async {
        while let Some(frame) = frames.next().await {
            let message = match frame {
                Ok(f) if matches!(f.kind, FrameKind::Stdout | FrameKind::Stderr) => Message::Binary(f.data),
                Ok(f) if f.kind == FrameKind::Exit => {
                    let exit_code =
                        serde_json::from_slice::<lizard_api::ExitStatus>(&f.data).map_or(-1, |s| s.exit_code);
                    let _ = out.send(text(&PtyServerMessage::Exit { exit_code })).await;
                    return Ended::Exited;
                }
                Ok(f) => {
                    let e = serde_json::from_slice::<ApiError>(&f.data)
                        .unwrap_or_else(|_| ApiError::new(ErrorCode::Unavailable, "the sandbox stopped answering"));
                    let _ = out.send(text(&PtyServerMessage::Error { code: e.code, message: e.message })).await;
                    return Ended::BrokeOff;
                }
                Err(_) => break,
            };
            if out.send(message).await.is_err() {
                return Ended::ClientLeft;
            }
        }
        let message = "the sandbox stopped answering; the process may still run".to_string();
        let _ = out.send(text(&PtyServerMessage::Error { code: ErrorCode::Unavailable, message })).await;
        Ended::BrokeOff
    };
    let keyboard = async {
        while let Some(Ok(message)) = input.next().await {
            let control = match message {
                Message::Binary(bytes) => ProcessControl::Stdin(bytes.to_vec()),
                Message::Text(t) => match serde_json::from_str::<PtyClientMessage>(&t) {
                    Ok(PtyClientMessage::Resize { cols, rows }) => ProcessControl::Resize(PtySize { cols, rows }),
                    Err(e) => {
                        tracing::debug!(%id, "a PTY client sent an unknown message: {e}");
                        continue;
                    }
                },
                Message::Close(_) => break,
                Message::Ping(_) | Message::Pong(_) => continue,
            };
            if let Err(e) = node.control_process(&id, pid, control).await {
                tracing::debug!(%id, pid, "PTY input refused: {e}");
            }
        }
        Ended::ClientLeft
    };
    let ended = tokio::select! {
        ended = screen => ended,
        ended = keyboard => ended,
    };
    match ended {
        Ended::ClientLeft if hang_up_on_close => hang_up(node.as_ref(), &id, pid).await,
        Ended::ClientLeft => {}
        Ended::Exited | Ended::BrokeOff => close(out, input).await,
    }
}

/// End the socket from the server's side with the closing handshake: send Close, then read
/// (and drop) what the client still sends until its Close, within [`CLOSE_WAIT`]. Dropping
/// the connection with the client's bytes unread (a resize sent as it opened) makes the
/// kernel reset it, and a browser then loses what it had not read yet (the exit message,
/// the Close) and reports 1006.
async fn close(mut out: SplitSink<WebSocket, Message>, mut input: SplitStream<WebSocket>) {
    if out.send(Message::Close(Some(CloseFrame { code: 1000, reason: "".into() }))).await.is_err() {
        return;
    }
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        while let Some(Ok(message)) = input.next().await {
            if matches!(message, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
}

/// The client went away: hang the terminal up, as closing a terminal window does.
async fn hang_up(node: &dyn NodeClient, id: &str, pid: u32) {
    if let Err(e) = node.control_process(id, pid, ProcessControl::Signal("SIGHUP".into())).await {
        tracing::debug!(%id, pid, "hanging up a PTY: {e}");
    }
}
