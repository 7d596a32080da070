//! Code execution in a sandbox: the control plane's side of the `interpreter` template's
//! code service.
//!
//! The service listens on guest loopback, [`CODE_SERVICE_PORT`]; each call opens a tunnel
//! to it through the sandbox's node (the one the sandbox-URL proxy uses, which refuses
//! that port to the public), speaks one HTTP/1.1 request over it and closes it. An
//! execution's answer is read line by line as the guest writes it, each line parsed as a
//! [`CodeEvent`] (so the API's schema holds whatever the guest sends) and handed on at
//! once. The stream always ends with [`CodeEvent::End`]: when the guest stops answering,
//! or passes the execution's timeout by more than [`DEADLINE_GRACE`], an error event
//! says so first.
//!
//! Any process listening on that port answers, so what it sends is bounded: a line may
//! carry at most [`MAX_LINE_BYTES`] (a result's base64 image included), and what a call
//! buffers is charged to the sandbox's and the server's [`GuestBuffers`]; past either,
//! the execution ends with an error event that says so.
//!
//! The guest's own errors (`{code, message}`) keep their code when it is the caller's
//! (`NOT_FOUND` for an unknown context, `INVALID_ARGUMENT`); anything else becomes
//! `CODE_SERVICE_UNAVAILABLE`, its detail logged, not shown.

use crate::error::{ApiResult, AppError};
use crate::guest_buffers::{Charge, Exhausted, GuestBuffers};
use crate::ops::sandboxes::LiveSandbox;
use axum::body::Body;
use axum::http::{header, Method, Request};
use futures_util::stream::{self, BoxStream};
use futures_util::{StreamExt, TryStreamExt};
use hyper_util::rt::TokioIo;
use lizard_api::code::{CodeContext, CodeEvent, CreateCodeContextRequest, RunCodeRequest, CODE_SERVICE_PORT};
use lizard_api::{ApiError, ErrorCode};
use lizard_node_client::Tunnel;
use serde::de::DeserializeOwned;
use std::collections::VecDeque;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::codec::{Decoder, FramedRead, LinesCodec, LinesCodecError};
use tokio_util::io::StreamReader;

/// An execution's events, as the guest produced them; always ends with `End`.
pub type CodeEvents = BoxStream<'static, CodeEvent>;

/// How long past its own timeout an execution may take to end (the service interrupts
/// it at the timeout, and restarts a context that ignores the interrupt).
pub const DEADLINE_GRACE: Duration = Duration::from_secs(60);
/// Bound on a context call (creating one starts an interpreter: seconds under TCG).
const CALL_TIMEOUT: Duration = Duration::from_secs(180);
/// Largest line of an execution (a result's base64 image included): 4 MiB.
const MAX_LINE_BYTES: usize = 4 << 20;
/// Largest non-streamed answer read from the service.
const MAX_ANSWER_BYTES: usize = 1024 * 1024;

/// Run code in the sandbox: its events, streamed as the code runs.
pub async fn run(buffers: &GuestBuffers, sandbox: &LiveSandbox, req: RunCodeRequest) -> ApiResult<CodeEvents> {
    req.validate().map_err(|e| AppError::invalid(e.to_string()))?;
    let deadline = Instant::now() + Duration::from_millis(req.timeout_ms()) + DEADLINE_GRACE;
    let tunnel = connect(sandbox).await?;
    run_over(tunnel, &req, deadline, buffers.charge(sandbox.id())).await
}

/// The sandbox's code contexts.
pub async fn contexts(sandbox: &LiveSandbox) -> ApiResult<Vec<CodeContext>> {
    call(connect(sandbox).await?, Method::GET, "/contexts", None).await
}

/// A new context (its interpreter started).
pub async fn create_context(sandbox: &LiveSandbox, req: &CreateCodeContextRequest) -> ApiResult<CodeContext> {
    req.validate().map_err(|e| AppError::invalid(e.to_string()))?;
    let body = serde_json::to_vec(req).map_err(AppError::internal)?;
    call(connect(sandbox).await?, Method::POST, "/contexts", Some(body)).await
}

/// End a context's interpreter and forget it.
pub async fn remove_context(sandbox: &LiveSandbox, context_id: &str) -> ApiResult<()> {
    lizard_api::code::check_context_id(context_id).map_err(|e| AppError::invalid(e.to_string()))?;
    let path = format!("/contexts/{context_id}");
    let answer = request(connect(sandbox).await?, Method::DELETE, &path, None).await?;
    drop(answer);
    Ok(())
}

/// Give a context a new interpreter: same id, state cleared.
pub async fn restart_context(sandbox: &LiveSandbox, context_id: &str) -> ApiResult<CodeContext> {
    lizard_api::code::check_context_id(context_id).map_err(|e| AppError::invalid(e.to_string()))?;
    let path = format!("/contexts/{context_id}/restart");
    call(connect(sandbox).await?, Method::POST, &path, None).await
}

fn unavailable(message: impl Into<String>) -> AppError {
    AppError::new(ErrorCode::CodeServiceUnavailable, message)
}

async fn connect(sandbox: &LiveSandbox) -> ApiResult<Box<dyn Tunnel>> {
    if sandbox.is_paused() {
        return Err(AppError::conflict(format!("sandbox {} is paused: resume it to run code", sandbox.id())));
    }
    sandbox.node.connect_port(sandbox.id(), CODE_SERVICE_PORT).await.map_err(|e| match e.code {
        ErrorCode::PortClosed => unavailable(format!(
            "sandbox {} runs no code service: run code in a sandbox of the interpreter template (or one built from it)",
            sandbox.id()
        )),
        _ => AppError::from(e),
    })
}

/// Execution over an open tunnel (the unit under test: no node needed).
async fn run_over(
    tunnel: Box<dyn Tunnel>,
    req: &RunCodeRequest,
    deadline: Instant,
    charge: Charge,
) -> ApiResult<CodeEvents> {
    let body = serde_json::to_vec(req).map_err(AppError::internal)?;
    let answer = request(tunnel, Method::POST, "/execute", Some(body)).await?;
    let bytes = Body::new(answer.into_body()).into_data_stream().map_err(std::io::Error::other);
    let decoder = ChargedLines { lines: LinesCodec::new_with_max_length(MAX_LINE_BYTES), charge };
    let lines = FramedRead::new(StreamReader::new(bytes), decoder);
    let reading = Reading { lines: Box::pin(lines), deadline, queued: VecDeque::new(), ended: false };
    Ok(stream::unfold(reading, Reading::next).boxed())
}

type Lines = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<String, LineError>> + Send>>;

/// Lines whose buffer (and the line copied out of it) are charged as they grow: each
/// decode charges what the read buffer holds, so the charge follows the longest line
/// being read and shrinks once it is handed on.
struct ChargedLines {
    lines: LinesCodec,
    charge: Charge,
}

#[derive(Debug, thiserror::Error)]
enum LineError {
    #[error("an output line passed {} MiB, the most one event may carry", MAX_LINE_BYTES >> 20)]
    TooLong,
    #[error(transparent)]
    Exhausted(#[from] Exhausted),
    #[error("the connection to the code service broke during the execution")]
    Read(#[from] std::io::Error),
}

impl From<LinesCodecError> for LineError {
    fn from(e: LinesCodecError) -> Self {
        match e {
            LinesCodecError::MaxLineLengthExceeded => LineError::TooLong,
            LinesCodecError::Io(e) => LineError::Read(e),
        }
    }
}

impl Decoder for ChargedLines {
    type Item = String;
    type Error = LineError;

    fn decode(&mut self, src: &mut bytes::BytesMut) -> Result<Option<String>, LineError> {
        self.charge.hold(src.capacity() + src.len())?;
        Ok(self.lines.decode(src)?)
    }

    fn decode_eof(&mut self, src: &mut bytes::BytesMut) -> Result<Option<String>, LineError> {
        self.charge.hold(src.capacity() + src.len())?;
        Ok(self.lines.decode_eof(src)?)
    }
}

/// The state of an execution's stream.
struct Reading {
    lines: Lines,
    deadline: Instant,
    queued: VecDeque<CodeEvent>,
    ended: bool,
}

impl Reading {
    async fn next(mut self) -> Option<(CodeEvent, Self)> {
        loop {
            if let Some(event) = self.queued.pop_front() {
                return Some((event, self));
            }
            if self.ended {
                return None;
            }
            match tokio::time::timeout_at(self.deadline, self.lines.next()).await {
                Ok(Some(Ok(line))) if line.trim().is_empty() => {}
                Ok(Some(Ok(line))) => match serde_json::from_str::<CodeEvent>(&line) {
                    Ok(event) => {
                        self.ended = matches!(event, CodeEvent::End { .. });
                        return Some((event, self));
                    }
                    Err(e) => tracing::warn!("code service: a line that is no event ({e}), skipped"),
                },
                Ok(Some(Err(e))) => {
                    tracing::warn!("code service: reading an execution failed: {e:?}");
                    self.broken(&e.to_string());
                }
                Ok(None) => self.broken("the code service ended the execution without its end"),
                Err(_) => self.broken("the code service did not end the execution within its timeout"),
            }
        }
    }

    fn broken(&mut self, why: &str) {
        self.ended = true;
        self.queued.push_back(CodeEvent::Error {
            name: "CodeServiceError".into(),
            value: format!("{why}; the context may have lost its state"),
            traceback: String::new(),
        });
        self.queued.push_back(CodeEvent::End { execution_count: None });
    }
}

/// A non-streamed call: its JSON answer.
async fn call<T: DeserializeOwned>(
    tunnel: Box<dyn Tunnel>,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
) -> ApiResult<T> {
    let work = async {
        let answer = request(tunnel, method, path, body).await?;
        let bytes = axum::body::to_bytes(Body::new(answer.into_body()), MAX_ANSWER_BYTES)
            .await
            .map_err(|e| unavailable(format!("the code service's answer could not be read: {e}")))?;
        serde_json::from_slice(&bytes).map_err(|e| {
            tracing::warn!("code service: {path}: unreadable answer: {e}");
            unavailable("the code service gave an answer this server cannot read")
        })
    };
    tokio::time::timeout(CALL_TIMEOUT, work)
        .await
        .map_err(|_| unavailable(format!("the code service did not answer within {} s", CALL_TIMEOUT.as_secs())))?
}

/// One HTTP/1.1 request to the service over `tunnel`: a success answer, or the error
/// the caller sees.
async fn request(
    tunnel: Box<dyn Tunnel>,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
) -> ApiResult<hyper::Response<hyper::body::Incoming>> {
    let closed = |e: hyper::Error| {
        tracing::warn!("code service: {path}: {e}");
        unavailable("the code service did not answer")
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tunnel)).await.map_err(closed)?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!("code service connection: {e}");
        }
    });
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, format!("127.0.0.1:{CODE_SERVICE_PORT}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.map_or_else(Body::empty, Body::from))
        .map_err(AppError::internal)?;
    let answer = sender.send_request(req).await.map_err(closed)?;
    if answer.status().is_success() {
        return Ok(answer);
    }
    let status = answer.status();
    let bytes = axum::body::to_bytes(Body::new(answer.into_body()), MAX_ANSWER_BYTES).await.unwrap_or_default();
    let error: Option<ApiError> = serde_json::from_slice(&bytes).ok();
    Err(match error {
        Some(e) if matches!(e.code, ErrorCode::NotFound | ErrorCode::InvalidArgument) => AppError(e),
        other => {
            tracing::warn!("code service: {path}: {status}: {other:?}");
            unavailable(format!("the code service failed ({status})"))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use hyper::server::conn::http1;
    use hyper::service::service_fn;
    use std::convert::Infallible;

    /// A tunnel to a fake code service that answers every request with `status` and
    /// `body` (sent in one piece per line, then the connection closes).
    fn fake_service(status: u16, body: &'static str) -> Box<dyn Tunnel> {
        let (client, server) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<hyper::body::Incoming>| async move {
                assert_eq!(req.headers()[header::HOST], "127.0.0.1:49999");
                let lines = body.split_inclusive('\n').map(|l| Ok::<_, Infallible>(hyper::body::Bytes::from(l)));
                let resp = hyper::Response::builder()
                    .status(status)
                    .body(Body::from_stream(stream::iter(lines.collect::<Vec<_>>())))
                    .expect("a response");
                Ok::<_, Infallible>(resp)
            });
            let _ = http1::Builder::new().serve_connection(TokioIo::new(server), service).await;
        });
        Box::new(client)
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    async fn events(tunnel: Box<dyn Tunnel>, deadline: Instant) -> Vec<CodeEvent> {
        let req = RunCodeRequest { code: "x + 1".into(), ..Default::default() };
        let buffers = GuestBuffers::new(64 << 20);
        run_over(tunnel, &req, deadline, buffers.charge("s")).await.expect("the execution starts").collect().await
    }

    #[tokio::test]
    async fn events_pass_through_in_order_and_end() {
        let body = concat!(
            "{\"type\":\"stdout\",\"text\":\"a\\n\"}\n",
            "\n",
            "{\"type\":\"result\",\"data\":{\"text/plain\":\"42\"},\"isMainResult\":true}\n",
            "{\"type\":\"end\",\"executionCount\":2}\n",
            "{\"type\":\"stdout\",\"text\":\"after the end: dropped\"}\n",
        );
        let got = events(fake_service(200, body), later()).await;
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[0], CodeEvent::Stdout { text: "a\n".into() });
        assert!(matches!(&got[1], CodeEvent::Result { is_main_result: true, data } if data["text/plain"] == "42"));
        assert_eq!(got[2], CodeEvent::End { execution_count: Some(2) });
    }

    #[tokio::test]
    async fn a_stream_without_its_end_ends_with_an_error() {
        let body = "{\"type\":\"stderr\",\"text\":\"x\"}\nnot json\n";
        let got = events(fake_service(200, body), later()).await;
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[0], CodeEvent::Stderr { text: "x".into() });
        assert!(matches!(&got[1], CodeEvent::Error { name, value, .. }
            if name == "CodeServiceError" && value.contains("without its end")));
        assert_eq!(got[2], CodeEvent::End { execution_count: None });
    }

    /// A stdout event whose text is `len` bytes, as one line.
    fn long_line(len: usize) -> &'static str {
        Box::leak(format!("{{\"type\":\"stdout\",\"text\":\"{}\"}}\n", "x".repeat(len)).into_boxed_str())
    }

    #[tokio::test]
    async fn a_line_past_the_cap_ends_the_execution_without_being_held() {
        let body: &'static str = Box::leak(format!("{}{}", long_line(10), long_line(MAX_LINE_BYTES)).into_boxed_str());
        let buffers = GuestBuffers::new(64 << 20);
        let req = RunCodeRequest { code: "1".into(), ..Default::default() };
        let events = run_over(fake_service(200, body), &req, later(), buffers.charge("s")).await.unwrap();
        let got: Vec<CodeEvent> = events.collect().await;
        assert_eq!(got.len(), 3, "{:?}", &got[1..]);
        assert!(matches!(&got[1], CodeEvent::Error { value, .. } if value.contains("passed 4 MiB")), "{:?}", got[1]);
        assert_eq!(buffers.held_kib(), 0, "an ended execution holds nothing");
    }

    #[tokio::test]
    async fn a_line_past_the_sandboxs_share_ends_the_execution() {
        // A 1 MiB line, where the sandbox's share is 256 KiB of a 1 MiB server total.
        let buffers = GuestBuffers::new(1 << 20);
        let req = RunCodeRequest { code: "1".into(), ..Default::default() };
        let events = run_over(fake_service(200, long_line(1 << 20)), &req, later(), buffers.charge("s")).await.unwrap();
        let got: Vec<CodeEvent> = events.collect().await;
        assert!(matches!(&got[0], CodeEvent::Error { value, .. } if value.contains("for one sandbox")), "{got:?}");
        assert_eq!(got.len(), 2);
        // A small execution of the same sandbox runs after it.
        let small = "{\"type\":\"end\",\"executionCount\":1}\n";
        let events = run_over(fake_service(200, small), &req, later(), buffers.charge("s")).await.unwrap();
        assert_eq!(events.collect::<Vec<_>>().await, [CodeEvent::End { execution_count: Some(1) }]);
    }

    #[tokio::test]
    async fn a_silent_service_is_cut_off_at_the_deadline() {
        // The service answers its headers, then never writes nor closes.
        let (client, server) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            let service = service_fn(|_req: Request<hyper::body::Incoming>| async {
                let never = stream::pending::<Result<hyper::body::Bytes, Infallible>>();
                Ok::<_, Infallible>(hyper::Response::new(Body::from_stream(never)))
            });
            let _ = http1::Builder::new().serve_connection(TokioIo::new(server), service).await;
        });
        let got = events(Box::new(client), Instant::now() + Duration::from_millis(200)).await;
        assert!(matches!(&got[0], CodeEvent::Error { value, .. } if value.contains("within its timeout")), "{got:?}");
        assert_eq!(got.len(), 2);
    }

    #[tokio::test]
    async fn the_guests_errors_keep_the_callers_codes_and_hide_the_rest() {
        let req = RunCodeRequest { code: "1".into(), ..Default::default() };
        let not_found = r#"{"code":"NOT_FOUND","message":"code context abc not found"}"#;
        let buffers = GuestBuffers::new(64 << 20);
        let e =
            run_over(fake_service(404, not_found), &req, later(), buffers.charge("s")).await.err().expect("refused");
        assert_eq!((e.code(), e.0.message.as_str()), (ErrorCode::NotFound, "code context abc not found"));
        let internal = r#"{"code":"INTERNAL","message":"Traceback at /opt/lizard/code/code_server.py"}"#;
        let e = run_over(fake_service(500, internal), &req, later(), buffers.charge("s")).await.err().expect("refused");
        assert_eq!(e.code(), ErrorCode::CodeServiceUnavailable);
        assert!(!e.0.message.contains("/opt"), "the guest's detail is logged, not answered: {e}");
        let e = call::<CodeContext>(fake_service(200, "[1, 2]"), Method::GET, "/contexts", None).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::CodeServiceUnavailable);
        let listed = r#"[{"id":"ab12","language":"javascript","cwd":"/home/user"}]"#;
        let got: Vec<CodeContext> = call(fake_service(200, listed), Method::GET, "/contexts", None).await.unwrap();
        assert_eq!(got[0].language, lizard_api::code::CodeLanguage::Javascript);
    }

    #[tokio::test]
    async fn a_closed_service_is_unavailable() {
        let (client, server) = tokio::io::duplex(64);
        drop(server);
        let e = call::<Vec<CodeContext>>(Box::new(client), Method::GET, "/contexts", None).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::CodeServiceUnavailable);
        assert_eq!(StatusCode::from_u16(e.code().status()).unwrap(), StatusCode::BAD_GATEWAY);
    }
}
