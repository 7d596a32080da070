//! envd, E2B's in-sandbox API, as Lizard serves it: the requests E2B's SDKs send to the
//! sandbox URL with `E2b-Sandbox-Id` and `E2b-Sandbox-Port: 49983`, answered by the
//! server from the node's process and file operations (no envd runs in the guest).
//!
//! - `GET /health` → 204 while the sandbox runs;
//! - `POST /process.Process/{Start,Connect}`: Connect server streams (JSON codec), one
//!   envelope per event, flushed as it comes, a keepalive every [`KEEPALIVE`]; a dropped
//!   stream leaves the process running, and `Connect-Timeout-Ms` on Start is the
//!   process's lifetime (it is killed then), as envd does;
//! - `POST /process.Process/StreamInput`: a client stream of input (chunked over
//!   HTTP/1.1), passed on message by message;
//! - `POST /process.Process/{List,SendInput,SendSignal,CloseStdin,Update}` and
//!   `POST /filesystem.Filesystem/{Stat,ListDir,MakeDir,Move,Remove}`: unary Connect calls;
//! - `POST /filesystem.Filesystem/WatchDir` (a stream) and the polling watcher
//!   (`CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`): see [`crate::watch`];
//! - `GET|POST /files`: a file's bytes; a multipart or raw upload (gzip-compressed or
//!   not), parents made.
//!
//! A request for any other port (`E2b-Sandbox-Port`) goes to that port in the guest, as
//! through the sandbox's own URL: the code interpreter's 49999, a user's server. When
//! its URLs are private (`allowPublicTraffic: false`) they need its traffic token
//! (`E2B-Traffic-Access-Token`) or its envd token (`X-Access-Token`); the platform's own
//! ports need one always. A paused sandbox made with `autoResume` is resumed by a
//! request that may reach it.
//!
//! A `/files` URL signed with the sandbox's envd token (E2B's `download_url`/`upload_url`)
//! needs no header at all: a live sandbox whose token signs it is looked for (constant-time
//! compares, expiry honoured), and an expired or foreign one is refused.
//!
//! Every other request but `/health` needs the sandbox's envd token in `X-Access-Token`
//! ([`crate::envd_token`]); the user is the one `Authorization: Basic` names (the
//! guest's default without one), and a relative path is taken from that user's home.
//! A sandbox that is gone or paused answers 502 "The sandbox was not found", which the
//! SDKs read as not running.

use crate::envd_token_matches;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use futures_util::{StreamExt, TryStreamExt};
use lizard_agent_proto::frame::FrameKind;
use lizard_api::processes::{ProcessControl, PtySize, StartProcessRequest};
use lizard_api::{ApiError, ErrorCode};
use lizard_e2b::connect::{self, Code};
use lizard_e2b::filesystem as fs;
use lizard_e2b::process::{self as proc, Data, EventMessage};
use lizard_node_client::FrameStream;
use lizard_server::error::AppError;
use lizard_server::ops::sandboxes::{self as ops, LiveSandbox};
use lizard_server::state::AppState;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// The header naming the sandbox a request is for.
pub const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";
/// The header naming the guest port a request is for.
pub const SANDBOX_PORT_HEADER: &str = "e2b-sandbox-port";
/// The envd token's header.
const ACCESS_TOKEN_HEADER: &str = "x-access-token";
/// An upload's `X-Metadata-<key>: <value>` headers are the files' metadata (envd 0.6.2).
const METADATA_HEADER: &str = "x-metadata-";
/// The header a private sandbox's traffic token comes in.
const TRAFFIC_TOKEN_HEADER: &str = lizard_server::proxy::headers::E2B_TRAFFIC_TOKEN_HEADER;
/// How often a stream with nothing else to say sends a keepalive.
const KEEPALIVE: Duration = Duration::from_secs(50);
/// Largest unary request body read.
const MAX_UNARY_BODY: usize = 1 << 20;
/// Most entries a `ListDir` answers (deep listings stop there).
const MAX_LIST_ENTRIES: usize = 10_000;

/// Whether a request to the sandbox-URL listener is E2B's: it names its sandbox by header.
pub fn is_e2b(headers: &HeaderMap) -> bool {
    headers.contains_key(SANDBOX_ID_HEADER)
}

/// Whether a request is a signed `/files` URL of E2B's (which names no sandbox: the
/// signature finds it). Only for a host that names no sandbox: a guest's own `/files`
/// route behind its sandbox's host stays the guest's.
pub fn is_signed_file_url(uri: &axum::http::Uri) -> bool {
    uri.path() == "/files" && uri_query(uri, "signature").is_some()
}

/// The first value of the query parameter `name`, decoded.
fn uri_query(uri: &axum::http::Uri, name: &str) -> Option<String> {
    uri.query()?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == name).then(|| urlencoding::decode(v).map(|v| v.into_owned()).unwrap_or_default())
    })
}

/// Whether a `/files` request carries `token`'s signature for what it asks (see
/// [`lizard_e2b::files`]); an expired one never does.
fn signed_by(method: &Method, uri: &axum::http::Uri, token: &str) -> bool {
    let Some(presented) = uri_query(uri, "signature") else { return false };
    let expiry = match uri_query(uri, "signature_expiration") {
        None => None,
        Some(at) => match at.parse::<u64>() {
            Ok(at) if at >= lizard_server::proxy::signed::now() => Some(at),
            _ => return false,
        },
    };
    let op = if method == Method::GET { "read" } else { "write" };
    let (path, user) = (uri_query(uri, "path").unwrap_or_default(), uri_query(uri, "username").unwrap_or_default());
    let expected = lizard_e2b::files::signature(&path, op, &user, token, expiry);
    use subtle::ConstantTimeEq;
    expected.len() == presented.len() && bool::from(expected.as_bytes().ct_eq(presented.as_bytes()))
}

/// The live sandbox whose envd token signs this header-less `/files` URL, if one does
/// (each live sandbox with a token is tried: the URL names none).
async fn signer(state: &AppState, method: &Method, uri: &axum::http::Uri) -> Result<Option<String>, Failure> {
    let store = state.server.store.as_ref();
    let live = store.sandboxes_due(i64::MAX).await.map_err(store_failure)?;
    for record in live {
        let Some(access) = store.sandbox_access(&record.id).await.map_err(store_failure)? else {
            continue;
        };
        if signed_by(method, uri, &crate::envd_token(&access.token_hash, &record.id)) {
            return Ok(Some(record.id));
        }
    }
    Ok(None)
}

/// Answer a request for envd that names its sandbox by host (`49983-{id}.{domain}`), as
/// one naming it by header.
pub async fn handle_for(state: &AppState, sandbox_id: &str, mut req: Request) -> Response {
    match header::HeaderValue::from_str(sandbox_id) {
        Ok(id) => {
            req.headers_mut().insert(SANDBOX_ID_HEADER, id);
            req.headers_mut().insert(SANDBOX_PORT_HEADER, lizard_e2b::ENVD_PORT.into());
            handle(state, req).await
        }
        Err(_) => not_found_sandbox().into_response(),
    }
}

/// Answer one E2B request to the sandbox URL.
pub async fn handle(state: &AppState, req: Request) -> Response {
    match serve(state, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// Why an envd request failed, in the form its route answers: a Connect error for RPCs,
/// E2B's REST error otherwise.
enum Failure {
    Rpc(connect::Error),
    Rest(StatusCode, String),
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        match self {
            Failure::Rpc(e) => {
                let status = StatusCode::from_u16(e.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                (status, axum::Json(e)).into_response()
            }
            Failure::Rest(status, message) => {
                (status, axum::Json(lizard_e2b::rest::Error { code: status.as_u16(), message })).into_response()
            }
        }
    }
}

fn not_found_sandbox() -> Failure {
    Failure::Rest(StatusCode::BAD_GATEWAY, "The sandbox was not found".into())
}

/// A Lizard error as Connect reports it.
fn rpc_error(e: &ApiError) -> connect::Error {
    let code = match e.code {
        ErrorCode::NotFound => Code::NotFound,
        ErrorCode::InvalidArgument | ErrorCode::OutputTooLarge => Code::InvalidArgument,
        ErrorCode::Conflict => Code::AlreadyExists,
        ErrorCode::Forbidden | ErrorCode::AccountScopeRequired => Code::PermissionDenied,
        ErrorCode::Unauthenticated => Code::Unauthenticated,
        ErrorCode::RateLimited => Code::ResourceExhausted,
        ErrorCode::TimedOut => Code::DeadlineExceeded,
        ErrorCode::Unavailable | ErrorCode::BootFailed | ErrorCode::PortClosed => Code::Unavailable,
        _ => Code::Internal,
    };
    connect::Error::new(code, e.message.clone())
}

fn rpc(e: ApiError) -> Failure {
    Failure::Rpc(rpc_error(&e))
}

fn store_failure(e: lizard_store::StoreError) -> Failure {
    rest(AppError::from(e).0)
}

fn rest(e: ApiError) -> Failure {
    // envd answers a request it cannot serve with 400, which the SDKs raise as an invalid
    // argument (Lizard's code is 422).
    let status = match e.code {
        lizard_api::ErrorCode::InvalidArgument => StatusCode::BAD_REQUEST,
        code => StatusCode::from_u16(code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
    };
    Failure::Rest(status, e.message)
}

/// Who a request runs as (root: `None`), and where its relative paths start; what it
/// writes belongs to that user.
struct Caller {
    user: Option<String>,
}

impl Caller {
    fn of(headers: &HeaderMap) -> Caller {
        let user = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Basic "))
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b.trim()).ok())
            .and_then(|raw| String::from_utf8(raw).ok())
            .map(|pair| pair.split_once(':').map_or(pair.clone(), |(u, _)| u.to_owned()))
            .filter(|u| !u.is_empty());
        Caller { user }
    }

    /// Who what it writes belongs to (root's own writes need no owner).
    fn owner(&self) -> Option<&str> {
        self.user.as_deref().filter(|u| *u != "root")
    }

    /// How its writes are made: its own, with `metadata` (envd's `X-Metadata-*` headers).
    fn write_options(&self, metadata: BTreeMap<String, String>) -> lizard_node_client::WriteOptions {
        lizard_node_client::WriteOptions { mode: None, owner: self.owner().map(str::to_owned), metadata }
    }

    fn home(&self) -> String {
        match self.user.as_deref() {
            None | Some("root") => "/root".into(),
            Some(user) => format!("/home/{user}"),
        }
    }

    /// `path` as the guest's absolute path.
    fn path(&self, path: &str) -> String {
        if path.starts_with('/') {
            path.to_owned()
        } else if path.is_empty() {
            self.home()
        } else {
            format!("{}/{path}", self.home())
        }
    }
}

async fn serve(state: &AppState, req: Request) -> Result<Response, Failure> {
    let headers = req.headers();
    let mut id = headers.get(SANDBOX_ID_HEADER).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    if id.is_empty() {
        let (method, uri) = (req.method().clone(), req.uri().clone());
        id = signer(state, &method, &uri).await?.ok_or_else(|| {
            Failure::Rest(StatusCode::UNAUTHORIZED, "this signed URL is expired or signs no sandbox's file".into())
        })?;
    }
    let headers = req.headers();
    let port = match headers.get(SANDBOX_PORT_HEADER).map(|v| v.to_str().ok().and_then(|p| p.parse::<u16>().ok())) {
        None => lizard_e2b::ENVD_PORT,
        Some(Some(port)) if port != 0 => port,
        Some(_) => return Err(Failure::Rest(StatusCode::BAD_REQUEST, format!("{SANDBOX_PORT_HEADER} is no port"))),
    };
    let store = state.server.store.as_ref();
    let record = store.get_sandbox(&id).await.map_err(store_failure)?.ok_or_else(not_found_sandbox)?;
    let mut sandbox = ops::live(state, record).await.map_err(|_| not_found_sandbox())?;
    let access = store.sandbox_access(&id).await.map_err(store_failure)?;
    let (envd_token, traffic_token) =
        (text(req.headers(), ACCESS_TOKEN_HEADER), text(req.headers(), TRAFFIC_TOKEN_HEADER));
    let granted = access.as_ref().map(|a| {
        let hash = &a.token_hash;
        envd_token_matches(hash, &id, &envd_token)
            || (port != lizard_e2b::ENVD_PORT && crate::traffic_token_matches(hash, &id, &traffic_token))
            || (port == lizard_e2b::ENVD_PORT
                && req.uri().path() == "/files"
                && signed_by(req.method(), req.uri(), &crate::envd_token(hash, &id)))
    });
    if sandbox.is_paused() {
        // A request wakes it only when its rule says so, and only one that may reach it.
        let public_port = port != lizard_e2b::ENVD_PORT && access.as_ref().is_some_and(|a| a.urls_public);
        if !access.as_ref().is_some_and(|a| a.resume_on_request) || !(granted == Some(true) || public_port) {
            return Err(not_found_sandbox());
        }
        lizard_server::ops::lifecycle::wake(state, &id).await.map_err(|e| rest(e.0))?;
        let record = store.get_sandbox(&id).await.map_err(store_failure)?.ok_or_else(not_found_sandbox)?;
        sandbox = ops::live(state, record).await.map_err(|_| not_found_sandbox())?;
    }
    if port == lizard_e2b::ENVD_PORT && req.uri().path() == "/health" {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    if port != lizard_e2b::ENVD_PORT {
        let public = access.as_ref().is_none_or(|a| a.urls_public);
        return match granted {
            // The code interpreter's port: the add-on's protocol, from the code service; to
            // its token, and without one where the create asked for public URLs on a code
            // interpreter (its default is private), as the add-on's port is on E2B; never on
            // another.
            _ if port == lizard_api::code::CODE_SERVICE_PORT
                && (granted == Some(true)
                    || public
                        && access.is_some()
                        && crate::face(state).templates.is_code_interpreter(&sandbox.record.template)) =>
            {
                Ok(crate::code::serve(state, &sandbox, req).await)
            }
            Some(true) => forward(&sandbox, port, req).await,
            // Public URLs' ports are public, but for the platform's own.
            _ if public && !lizard_api::code::is_reserved_guest_port(port) => forward(&sandbox, port, req).await,
            _ => Err(Failure::Rest(
                StatusCode::UNAUTHORIZED,
                format!("port {port} of sandbox {id} needs its traffic access token"),
            )),
        };
    }
    match granted {
        Some(true) => {}
        Some(false) => {
            return Err(Failure::Rest(
                StatusCode::UNAUTHORIZED,
                "missing or wrong X-Access-Token for this sandbox".into(),
            ))
        }
        None => {
            return Err(Failure::Rest(
                StatusCode::UNAUTHORIZED,
                format!("sandbox {id} was not made through E2B's API: its envd has no access token"),
            ))
        }
    }
    let mut caller = Caller::of(req.headers());
    if caller.user.is_none() {
        caller.user = crate::users::default_user(&sandbox).await;
    }
    let path = req.uri().path().to_owned();
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/files") => read_file(&sandbox, &caller, req).await,
        (Method::POST, "/files") => write_files(&sandbox, &caller, req).await,
        (Method::POST, "/process.Process/Start") => start(&sandbox, &caller, req).await,
        (Method::POST, "/process.Process/Connect") => reattach(&sandbox, req).await,
        (Method::POST, "/process.Process/StreamInput") => stream_input(&sandbox, req).await,
        (Method::POST, "/filesystem.Filesystem/WatchDir") => watch_dir(&sandbox, &caller, req).await,
        (Method::POST, rpc_path) => unary(&sandbox, &caller, rpc_path, req).await,
        _ => Err(Failure::Rest(StatusCode::NOT_FOUND, format!("no envd route {path}"))),
    }
}

/// A header's text ("" when absent or not text).
fn text(headers: &HeaderMap, name: &str) -> String {
    headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned()
}

// --- unary calls ----------------------------------------------------------------------

async fn message<T: DeserializeOwned>(req: Request) -> Result<T, Failure> {
    let bytes = axum::body::to_bytes(req.into_body(), MAX_UNARY_BODY)
        .await
        .map_err(|e| Failure::Rpc(connect::Error::new(Code::InvalidArgument, format!("the request body: {e}"))))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| Failure::Rpc(connect::Error::new(Code::InvalidArgument, format!("the request message: {e}"))))
}

fn json<T: Serialize>(value: &T) -> Response {
    ([(header::CONTENT_TYPE, connect::UNARY_CONTENT_TYPE)], axum::Json(value)).into_response()
}

/// The pid a selector names in `sandbox` (by pid, or by the tag it was started with).
fn pid_of(sandbox: &LiveSandbox, selector: &proc::Selector) -> Result<u32, Failure> {
    match selector {
        proc::Selector::Pid(pid) => Ok(*pid),
        proc::Selector::Tag(tag) => crate::tags::pid(sandbox.id(), tag)
            .ok_or_else(|| Failure::Rpc(connect::Error::new(Code::NotFound, format!("no process tagged {tag:?}")))),
    }
}

async fn unary(sandbox: &LiveSandbox, caller: &Caller, path: &str, req: Request) -> Result<Response, Failure> {
    let (node, id) = (&sandbox.node, sandbox.id());
    let control = |pid, control| async move { node.control_process(id, pid, control).await.map_err(rpc) };
    let empty = || json(&serde_json::json!({}));
    match path {
        "/process.Process/List" => {
            let running: Vec<_> =
                node.list_processes(id).await.map_err(rpc)?.into_iter().filter(|p| p.exit_code.is_none()).collect();
            // Ended processes' tags go: the list is where they are seen to end.
            crate::tags::keep_only(id, &running.iter().map(|p| p.pid).collect::<Vec<_>>());
            let processes = running
                .into_iter()
                .map(|p| proc::ProcessInfo {
                    tag: crate::tags::of(id, p.pid),
                    config: proc::ProcessConfig { cmd: p.cmd, ..Default::default() },
                    pid: p.pid,
                })
                .collect();
            Ok(json(&proc::ListResponse { processes }))
        }
        "/process.Process/SendInput" => {
            let r: proc::SendInputRequest = message(req).await?;
            let bytes = match r.input {
                proc::Input::Stdin(b) | proc::Input::Pty(b) => b,
            };
            control(pid_of(sandbox, &r.process)?, ProcessControl::Stdin(bytes)).await?;
            Ok(empty())
        }
        "/process.Process/SendSignal" => {
            let r: proc::SendSignalRequest = message(req).await?;
            let signal = match r.signal.as_str() {
                "SIGNAL_SIGKILL" => "SIGKILL",
                "SIGNAL_SIGTERM" => "SIGTERM",
                other => {
                    return Err(Failure::Rpc(connect::Error::new(
                        Code::InvalidArgument,
                        format!("unknown signal {other}"),
                    )))
                }
            };
            let pid = pid_of(sandbox, &r.process)?;
            // The guest keeps ended processes a while: a signal finds only running ones.
            let running =
                node.list_processes(id).await.map_err(rpc)?.iter().any(|p| p.pid == pid && p.exit_code.is_none());
            if !running {
                return Err(Failure::Rpc(connect::Error::new(Code::NotFound, format!("no running process {pid}"))));
            }
            control(pid, ProcessControl::Signal(signal.into())).await?;
            Ok(empty())
        }
        "/process.Process/CloseStdin" => {
            let r: proc::Selected = message(req).await?;
            control(pid_of(sandbox, &r.process)?, ProcessControl::CloseStdin).await?;
            Ok(empty())
        }
        "/process.Process/Update" => {
            let r: proc::UpdateRequest = message(req).await?;
            if let Some(pty) = r.pty {
                control(pid_of(sandbox, &r.process)?, ProcessControl::Resize(pty_size(pty)?)).await?;
            }
            Ok(empty())
        }
        "/filesystem.Filesystem/Stat" => {
            let r: fs::PathRequest = message(req).await?;
            Ok(json(&fs::EntryResponse { entry: stat(sandbox, &caller.path(&r.path)).await? }))
        }
        "/filesystem.Filesystem/MakeDir" => {
            let r: fs::PathRequest = message(req).await?;
            let path = caller.path(&r.path);
            if node.file_info(id, &path).await.is_ok() {
                return Err(Failure::Rpc(connect::Error::new(Code::AlreadyExists, format!("{path} already exists"))));
            }
            node.make_dir(id, &path, caller.owner()).await.map_err(rpc)?;
            Ok(json(&fs::EntryResponse { entry: stat(sandbox, &path).await? }))
        }
        "/filesystem.Filesystem/Move" => {
            let r: fs::MoveRequest = message(req).await?;
            let info = node.rename(id, &caller.path(&r.source), &caller.path(&r.destination)).await.map_err(rpc)?;
            Ok(json(&fs::EntryResponse { entry: entry(info) }))
        }
        "/filesystem.Filesystem/Remove" => {
            let r: fs::PathRequest = message(req).await?;
            node.remove(id, &caller.path(&r.path)).await.map_err(rpc)?;
            Ok(empty())
        }
        "/filesystem.Filesystem/ListDir" => {
            let r: fs::ListDirRequest = message(req).await?;
            Ok(json(&fs::ListDirResponse { entries: list(sandbox, &caller.path(&r.path), r.depth.max(1)).await? }))
        }
        "/filesystem.Filesystem/CreateWatcher" => {
            let r: fs::WatchRequest = message(req).await?;
            let dir = caller.path(&r.path);
            let watch = node.watch(id, &dir, r.recursive).await.map_err(rpc)?;
            let watcher_id = crate::watch::create(sandbox, watch, dir).map_err(watcher_error)?;
            Ok(json(&fs::CreateWatcherResponse { watcher_id }))
        }
        "/filesystem.Filesystem/GetWatcherEvents" => {
            let r: fs::WatcherRequest = message(req).await?;
            let events = crate::watch::take(sandbox, &r.watcher_id).map_err(watcher_error)?;
            Ok(json(&fs::WatcherEvents { events }))
        }
        "/filesystem.Filesystem/RemoveWatcher" => {
            let r: fs::WatcherRequest = message(req).await?;
            crate::watch::remove(sandbox, &r.watcher_id).map_err(watcher_error)?;
            Ok(empty())
        }
        other => {
            Err(Failure::Rpc(connect::Error::new(Code::Unimplemented, format!("{other} is not served by Lizard"))))
        }
    }
}

fn watcher_error(e: crate::watch::WatcherError) -> Failure {
    use crate::watch::{WatcherError, MAX_WATCHERS};
    Failure::Rpc(match e {
        WatcherError::TooMany => {
            connect::Error::new(Code::ResourceExhausted, format!("this server keeps at most {MAX_WATCHERS} watchers"))
        }
        WatcherError::NotFound => connect::Error::new(Code::NotFound, "no such watcher"),
    })
}

/// `WatchDir`: the directory's events as they happen.
async fn watch_dir(sandbox: &LiveSandbox, caller: &Caller, req: Request) -> Result<Response, Failure> {
    let r: fs::WatchRequest = stream_message(req).await?;
    let dir = caller.path(&r.path);
    let watch = sandbox.node.watch(sandbox.id(), &dir, r.recursive).await.map_err(rpc)?;
    let body = crate::watch::stream(watch, dir, KEEPALIVE).map(Ok::<_, std::io::Error>);
    Ok(([(header::CONTENT_TYPE, connect::STREAM_CONTENT_TYPE)], Body::from_stream(body)).into_response())
}

fn pty_size(pty: proc::Pty) -> Result<PtySize, Failure> {
    let cell = |n: u32| u16::try_from(n).ok().filter(|n| (1..=1000).contains(n));
    match (cell(pty.size.cols), cell(pty.size.rows)) {
        (Some(cols), Some(rows)) => Ok(PtySize { cols, rows }),
        _ => Err(Failure::Rpc(connect::Error::new(Code::InvalidArgument, "a terminal is 1..=1000 columns and rows"))),
    }
}

fn file_type(t: lizard_agent_proto::types::FileType) -> fs::FileType {
    use lizard_agent_proto::types::FileType as T;
    match t {
        T::File => fs::FileType::File,
        T::Dir => fs::FileType::Directory,
        T::Symlink => fs::FileType::Symlink,
        T::Other => fs::FileType::Unspecified,
    }
}

fn entry(info: lizard_agent_proto::types::FileInfo) -> fs::EntryInfo {
    let file_type = file_type(info.file_type);
    fs::EntryInfo {
        name: info.name,
        file_type,
        path: info.path,
        size: info.size,
        mode: info.mode,
        permissions: fs::permissions(file_type, info.mode),
        owner: info.owner,
        group: info.group,
        modified_time: lizard_api::ids::rfc3339(info.mtime_ms),
        symlink_target: info.symlink_target,
        metadata: info.metadata,
    }
}

async fn stat(sandbox: &LiveSandbox, path: &str) -> Result<fs::EntryInfo, Failure> {
    Ok(entry(sandbox.node.file_info(sandbox.id(), path).await.map_err(rpc)?))
}

/// The entries under `path`, `depth` levels down (breadth first, at most
/// [`MAX_LIST_ENTRIES`]).
async fn list(sandbox: &LiveSandbox, path: &str, depth: u32) -> Result<Vec<fs::EntryInfo>, Failure> {
    let (node, id) = (&sandbox.node, sandbox.id());
    let mut out = Vec::new();
    let mut level = vec![path.to_owned()];
    for _ in 0..depth {
        let mut next = Vec::new();
        for dir in level {
            for e in node.list_dir(id, &dir).await.map_err(rpc)? {
                if out.len() >= MAX_LIST_ENTRIES {
                    return Ok(out);
                }
                let file_type = file_type(e.file_type);
                if file_type == fs::FileType::Directory {
                    next.push(e.path.clone());
                }
                out.push(fs::EntryInfo {
                    permissions: fs::permissions(file_type, e.mode),
                    name: e.name,
                    file_type,
                    path: e.path,
                    size: e.size,
                    mode: e.mode,
                    owner: String::new(),
                    group: String::new(),
                    modified_time: lizard_api::ids::rfc3339(e.mtime_ms),
                    symlink_target: None,
                    metadata: e.metadata,
                });
            }
        }
        level = next;
    }
    Ok(out)
}

// --- streams --------------------------------------------------------------------------

/// The one message of a server-stream request (an envelope).
async fn stream_message<T: DeserializeOwned>(req: Request) -> Result<T, Failure> {
    let bytes = axum::body::to_bytes(req.into_body(), MAX_UNARY_BODY)
        .await
        .map_err(|e| Failure::Rpc(connect::Error::new(Code::InvalidArgument, format!("the request body: {e}"))))?;
    let mut buf = bytes::BytesMut::from(&bytes[..]);
    let one = connect::next_message(&mut buf)
        .map_err(|e| Failure::Rpc(connect::Error::new(Code::InvalidArgument, e.to_string())))?
        .ok_or_else(|| Failure::Rpc(connect::Error::new(Code::InvalidArgument, "no request message")))?;
    serde_json::from_slice(&one)
        .map_err(|e| Failure::Rpc(connect::Error::new(Code::InvalidArgument, format!("the request message: {e}"))))
}

/// `StreamInput` (a client stream): the process its first message names gets each later
/// message's input as it arrives; the answer, one empty message, comes when the request
/// ends.
async fn stream_input(sandbox: &LiveSandbox, req: Request) -> Result<Response, Failure> {
    let bad = |m: String| Failure::Rpc(connect::Error::new(Code::InvalidArgument, m));
    let mut body = req.into_body().into_data_stream();
    let mut buf = bytes::BytesMut::new();
    let mut pid = None;
    loop {
        while let Some(message) = connect::next_message(&mut buf).map_err(|e| bad(e.to_string()))? {
            let event: proc::StreamInputEvent =
                serde_json::from_slice(&message).map_err(|e| bad(format!("the request message: {e}")))?;
            match (event, pid) {
                (proc::StreamInputEvent::Start { process }, None) => pid = Some(pid_of(sandbox, &process)?),
                (proc::StreamInputEvent::Data { input }, Some(pid)) => {
                    let bytes = match input {
                        proc::Input::Stdin(b) | proc::Input::Pty(b) => b,
                    };
                    sandbox.node.control_process(sandbox.id(), pid, ProcessControl::Stdin(bytes)).await.map_err(rpc)?;
                }
                (proc::StreamInputEvent::Keepalive {}, _) => {}
                (_, _) => return Err(bad("the stream must start with the process, once".into())),
            }
        }
        match body.next().await {
            Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
            Some(Err(e)) => return Err(bad(format!("the request body: {e}"))),
            None if buf.is_empty() => break,
            None => return Err(bad(connect::EnvelopeError::Truncated.to_string())),
        }
    }
    let mut answer = connect::envelope(&serde_json::json!({})).to_vec();
    answer.extend_from_slice(&connect::end_stream(None));
    Ok(([(header::CONTENT_TYPE, connect::STREAM_CONTENT_TYPE)], answer).into_response())
}

/// `Start`: the process, started as the caller, its events streamed.
async fn start(sandbox: &LiveSandbox, caller: &Caller, req: Request) -> Result<Response, Failure> {
    let lifetime = req
        .headers()
        .get(connect::TIMEOUT_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis);
    let r: proc::StartRequest = stream_message(req).await?;
    let pty = r.pty.map(pty_size).transpose()?;
    let argv = std::iter::once(r.process.cmd).chain(r.process.args).collect();
    let start = StartProcessRequest {
        argv: Some(argv),
        // Without one: the template's directory, else the caller's home (as envd's
        // default workdir).
        cwd: Some(match r.process.cwd.as_deref().filter(|c| !c.is_empty()) {
            Some(cwd) => caller.path(cwd),
            None => sandbox.info.workdir.clone().unwrap_or_else(|| caller.home()),
        }),
        env: r.process.envs,
        user: caller.user.clone(),
        pty,
        cmd: None,
    };
    let frames = sandbox.node.start_process(sandbox.id(), start).await.map_err(rpc)?;
    // Older SDKs send no flag and expect stdin open, as envd before 0.3.0 kept it.
    let after_start =
        AfterStart { sandbox: sandbox.clone(), close_stdin: r.stdin == Some(false), lifetime, tag: r.tag };
    Ok(streamed(frames, pty.is_some(), Some(after_start)))
}

/// `Connect`: a running process's events, from what the guest kept of its output.
async fn reattach(sandbox: &LiveSandbox, req: Request) -> Result<Response, Failure> {
    let r: proc::Selected = stream_message(req).await?;
    let pid = pid_of(sandbox, &r.process)?;
    let pty = sandbox
        .node
        .list_processes(sandbox.id())
        .await
        .map_err(rpc)?
        .into_iter()
        .find(|p| p.pid == pid)
        .is_some_and(|p| p.pty);
    let frames = sandbox.node.process_output(sandbox.id(), pid).await.map_err(rpc)?;
    Ok(streamed(frames, pty, None))
}

/// What follows a Start's `start` event: stdin closed unless asked open, and the kill at
/// the end of its lifetime.
struct AfterStart {
    sandbox: LiveSandbox,
    close_stdin: bool,
    lifetime: Option<Duration>,
    tag: Option<String>,
}

impl AfterStart {
    fn begin(self, pid: u32) {
        let AfterStart { sandbox, close_stdin, lifetime, tag } = self;
        if let Some(tag) = tag {
            if !crate::tags::remember(sandbox.id(), &tag, pid) {
                tracing::warn!(id = %sandbox.id(), %tag, "process tag not kept: this server keeps as many as it may");
            }
        }
        tokio::spawn(async move {
            if close_stdin {
                let _ = sandbox.node.control_process(sandbox.id(), pid, ProcessControl::CloseStdin).await;
            }
            if let Some(lifetime) = lifetime {
                tokio::time::sleep(lifetime).await;
                let running = sandbox
                    .node
                    .list_processes(sandbox.id())
                    .await
                    .is_ok_and(|all| all.iter().any(|p| p.pid == pid && p.exit_code.is_none()));
                if running {
                    let kill = ProcessControl::Signal("SIGKILL".into());
                    let _ = sandbox.node.control_process(sandbox.id(), pid, kill).await;
                }
            }
        });
    }
}

/// One event of a stream, from one of the node's frames (None: nothing to send).
fn event(kind: FrameKind, data: &Bytes, pty: bool) -> Result<Option<EventMessage>, connect::Error> {
    let bad = |e: serde_json::Error| connect::Error::new(Code::Internal, format!("a frame from the node: {e}"));
    Ok(match kind {
        FrameKind::Started => {
            let info: lizard_api::processes::ProcessInfo = serde_json::from_slice(data).map_err(bad)?;
            Some(EventMessage::start(info.pid))
        }
        FrameKind::Stdout if pty => Some(EventMessage::data(Data::Pty(data.to_vec()))),
        FrameKind::Stdout => Some(EventMessage::data(Data::Stdout(data.to_vec()))),
        FrameKind::Stderr => Some(EventMessage::data(Data::Stderr(data.to_vec()))),
        FrameKind::Exit => {
            let exit: lizard_agent_proto::types::ExitStatus = serde_json::from_slice(data).map_err(bad)?;
            let code = if exit.signal.is_some() { None } else { Some(exit.exit_code) };
            Some(EventMessage::end(code, exit.signal))
        }
        FrameKind::Error => {
            let e: lizard_agent_proto::types::AgentError = serde_json::from_slice(data).map_err(bad)?;
            return Err(connect::Error::new(Code::InvalidArgument, e.message));
        }
        _ => None,
    })
}

/// A Connect stream of the process's events, each envelope flushed as it comes, a
/// keepalive when nothing else came for [`KEEPALIVE`], and the end-stream envelope last.
/// The client going away stops only the stream.
fn streamed(frames: FrameStream, pty: bool, mut after_start: Option<AfterStart>) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        let mut frames = frames;
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + KEEPALIVE, KEEPALIVE);
        let mut failure = None;
        loop {
            let envelope = tokio::select! {
                frame = frames.next() => match frame {
                    None => break,
                    Some(Err(e)) => {
                        failure = Some(connect::Error::new(Code::Unavailable, format!("the process's output broke off: {e}")));
                        break;
                    }
                    Some(Ok(frame)) => match event(frame.kind, &frame.data, pty) {
                        Ok(Some(message)) => {
                            if let (lizard_e2b::process::Event::Start { pid }, Some(after)) = (&message.event, after_start.take()) {
                                after.begin(*pid);
                            }
                            ticks.reset();
                            connect::envelope(&message)
                        }
                        Ok(None) => continue,
                        Err(e) => {
                            failure = Some(e);
                            break;
                        }
                    },
                },
                _ = ticks.tick() => connect::envelope(&EventMessage::keepalive()),
            };
            if tx.send(envelope).await.is_err() {
                return;
            }
        }
        let _ = tx.send(connect::end_stream(failure.as_ref())).await;
    });
    let body =
        futures_util::stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx)) },
        );
    ([(header::CONTENT_TYPE, connect::STREAM_CONTENT_TYPE)], Body::from_stream(body)).into_response()
}

// --- files ----------------------------------------------------------------------------

/// `GET /files?path=`: the file's bytes.
async fn read_file(sandbox: &LiveSandbox, caller: &Caller, req: Request) -> Result<Response, Failure> {
    let caller = Caller { user: uri_query(req.uri(), "username").filter(|u| !u.is_empty()).or(caller.user.clone()) };
    let path = caller.path(&uri_query(req.uri(), "path").unwrap_or_default());
    let read = sandbox.node.read_file(sandbox.id(), &path).await.map_err(rest)?;
    let mut response = Body::from_stream(read.body).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/octet-stream"));
    if let Some(len) = read.len {
        response.headers_mut().insert(header::CONTENT_LENGTH, len.into());
    }
    Ok(response)
}

#[derive(Serialize)]
struct Written {
    name: String,
    path: String,
    #[serde(rename = "type")]
    file_type: &'static str,
    /// The metadata the upload gave the file.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    metadata: BTreeMap<String, String>,
}

fn written(path: String, opts: &lizard_node_client::WriteOptions) -> Written {
    let name = path.rsplit('/').next().unwrap_or_default().to_owned();
    Written { name, path, file_type: "file", metadata: opts.metadata.clone() }
}

/// `POST /files`: each multipart `file` part to the path its filename names (or the
/// query's `path` for one), or a raw body to the query's `path`; parents are made.
async fn write_files(sandbox: &LiveSandbox, caller: &Caller, req: Request) -> Result<Response, Failure> {
    let caller = Caller { user: uri_query(req.uri(), "username").filter(|u| !u.is_empty()).or(caller.user.clone()) };
    let in_query = uri_query(req.uri(), "path").filter(|p| !p.is_empty());
    let (node, id) = (&sandbox.node, sandbox.id());
    // The same metadata on every file of the upload, as envd keeps it: keys lowercased
    // already (header names arrive so).
    let metadata: BTreeMap<String, String> = req
        .headers()
        .iter()
        .filter_map(|(name, value)| Some((name.as_str().strip_prefix(METADATA_HEADER)?, value.to_str().ok()?)))
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect();
    let opts = caller.write_options(metadata);
    let multipart = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("multipart/form-data"));
    let mut done = Vec::new();
    if multipart {
        let boundary = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| multer::parse_boundary(v).ok())
            .ok_or_else(|| Failure::Rest(StatusCode::BAD_REQUEST, "a multipart upload without its boundary".into()))?;
        let bad = |e: multer::Error| Failure::Rest(StatusCode::BAD_REQUEST, format!("the multipart upload: {e}"));
        let mut form = multer::Multipart::new(req.into_body().into_data_stream(), boundary);
        while let Some(field) = form.next_field().await.map_err(bad)? {
            let target = match (&in_query, field.file_name()) {
                (Some(path), _) => path.clone(),
                (None, Some(name)) if !name.is_empty() => name.to_owned(),
                _ => return Err(Failure::Rest(StatusCode::BAD_REQUEST, "a file part names no path".into())),
            };
            let path = caller.path(&target);
            let body = field.map_err(std::io::Error::other).boxed();
            node.write_file(id, &path, &opts, body).await.map_err(rest)?;
            done.push(written(path, &opts));
        }
    } else {
        let Some(target) = in_query else {
            return Err(Failure::Rest(StatusCode::BAD_REQUEST, "an upload names its path in the query".into()));
        };
        let gzip =
            req.headers().get(header::CONTENT_ENCODING).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
        let path = caller.path(&target);
        let raw = req.into_body().into_data_stream().map_err(std::io::Error::other);
        // Decompressed as it streams: never collected, bounded by the guest's disk alone.
        let body = if gzip {
            let inflated = async_compression::tokio::bufread::GzipDecoder::new(tokio_util::io::StreamReader::new(raw));
            tokio_util::io::ReaderStream::new(inflated).boxed()
        } else {
            raw.boxed()
        };
        node.write_file(id, &path, &opts, body).await.map_err(rest)?;
        done.push(written(path, &opts));
    }
    if done.is_empty() {
        return Err(Failure::Rest(StatusCode::BAD_REQUEST, "the upload holds no file".into()));
    }
    Ok(axum::Json(done).into_response())
}

/// A request for `port` inside the sandbox, as its own URL would pass it: E2B's routing
/// headers and tokens removed with the platform's credentials.
async fn forward(sandbox: &LiveSandbox, port: u16, mut req: Request) -> Result<Response, Failure> {
    for name in [SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER, TRAFFIC_TOKEN_HEADER, ACCESS_TOKEN_HEADER] {
        req.headers_mut().remove(name);
    }
    let host = req.headers().get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    lizard_server::proxy::guest::for_the_guest(&mut req, &host);
    let tunnel = match sandbox.node.connect_port(sandbox.id(), port).await {
        Ok(t) => t,
        Err(e) if e.code == ErrorCode::PortClosed => {
            return Err(Failure::Rest(
                StatusCode::BAD_GATEWAY,
                format!("The sandbox is running but port {port} is not open"),
            ))
        }
        Err(e) => return Err(rest(e)),
    };
    lizard_server::proxy::guest::exchange(tunnel, req, port).await.map_err(|e| rest(e.0))
}
