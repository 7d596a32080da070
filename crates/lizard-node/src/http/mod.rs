//! The node's HTTP API: the sandbox routes of [`lizard_api::routes::node`], without
//! tenancy. The router is built from that table, so the node serves exactly the paths and
//! methods the clients take from it.
//!
//! Local mode serves [`router`] on a Unix socket readable only by its owner; a node agent
//! serves [`tcp_router`] on TCP, where every route but `/health` needs the node's
//! credential as a bearer token.
//!
//! - this file: the router, error answers, the sandbox routes.
//! - [`auth`]: the bearer-credential check of the TCP router.
//! - `volumes`, `templates`: volume disks, built-in templates and template deletes.
//! - `build`: template builds, streamed, cancelled with their connection.
//! - `processes`: background processes, terminals and port waits.
//! - `tunnel`: a guest port by HTTP upgrade.

pub mod auth;
mod build;
mod processes;
mod templates;
mod tunnel;
mod volumes;

pub use auth::Credential;
pub use templates::builtin_templates;

/// Remove what an earlier process serving this API on `data_dir` left behind (files of
/// builds it was receiving); call before serving.
pub fn sweep_leftovers(data_dir: &std::path::Path) {
    build::sweep(data_dir);
}

use crate::{Node, NodeError, Sandbox};
use axum::body::Body;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::handler::Handler;
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter};
use axum::{Json, Router};
use futures_util::TryStreamExt;
use lizard_api::routes::{self, node as table, Route};
use lizard_api::{ApiError, CreateSandboxRequest, ErrorCode, ExecRequest, FileMode, ProcessResult, SandboxInfo};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::Arc;

/// An error answer: `{code, message}` with the code's status.
pub struct AppError(pub ApiError);

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

/// The node's router: every route of [`lizard_api::routes::node::ALL`], each with its
/// handler; unknown paths and methods answer `{code, message}` too.
pub fn router(node: Arc<Node>) -> Router {
    Router::new()
        .route(table::HEALTH.path, serve(&table::HEALTH, || async { "ok" }))
        .route(table::CREATE_SANDBOX.path, serve(&table::CREATE_SANDBOX, create))
        .route(table::LIST_SANDBOXES.path, serve(&table::LIST_SANDBOXES, list))
        .route(table::GET_SANDBOX.path, serve(&table::GET_SANDBOX, get_one))
        .route(table::KILL_SANDBOX.path, serve(&table::KILL_SANDBOX, kill))
        .route(table::SET_NETWORK.path, serve(&table::SET_NETWORK, set_network))
        .route(table::PAUSE.path, serve(&table::PAUSE, pause))
        .route(table::RESUME.path, serve(&table::RESUME, resume))
        .route(table::CONNECT.path, serve(&table::CONNECT, resume))
        .route(table::FORK.path, serve(&table::FORK, fork))
        .route(table::EXEC.path, serve(&table::EXEC, exec))
        .route(table::READ_FILE.path, serve(&table::READ_FILE, read_file))
        .route(table::WRITE_FILE.path, serve(&table::WRITE_FILE, write_file))
        .route(table::REMOVE_FILE.path, serve(&table::REMOVE_FILE, remove))
        .route(table::LIST_DIR.path, serve(&table::LIST_DIR, list_dir))
        .route(table::MAKE_DIR.path, serve(&table::MAKE_DIR, make_dir))
        .route(table::FILE_INFO.path, serve(&table::FILE_INFO, file_info))
        .route(table::RENAME_FILE.path, serve(&table::RENAME_FILE, rename))
        .route(table::WATCH_DIR.path, serve(&table::WATCH_DIR, watch))
        .route(table::READ_ARCHIVE.path, serve(&table::READ_ARCHIVE, read_archive))
        .route(table::WRITE_ARCHIVE.path, serve(&table::WRITE_ARCHIVE, write_archive))
        .route(table::START_PROCESS.path, serve(&table::START_PROCESS, processes::start))
        .route(table::LIST_PROCESSES.path, serve(&table::LIST_PROCESSES, processes::list))
        .route(table::PROCESS_OUTPUT.path, serve(&table::PROCESS_OUTPUT, processes::output))
        .route(table::PROCESS_STDIN.path, serve(&table::PROCESS_STDIN, processes::stdin))
        .route(table::CLOSE_PROCESS_STDIN.path, serve(&table::CLOSE_PROCESS_STDIN, processes::close_stdin))
        .route(table::SIGNAL_PROCESS.path, serve(&table::SIGNAL_PROCESS, processes::signal))
        .route(table::RESIZE_PROCESS.path, serve(&table::RESIZE_PROCESS, processes::resize))
        .route(table::LIST_PORTS.path, serve(&table::LIST_PORTS, processes::ports))
        .route(table::WAIT_FOR_PORT.path, serve(&table::WAIT_FOR_PORT, processes::wait_for_port))
        .route(table::CREATE_VOLUME.path, serve(&table::CREATE_VOLUME, volumes::create))
        .route(table::DELETE_VOLUME.path, serve(&table::DELETE_VOLUME, volumes::delete))
        .route(table::VOLUME_HOLDER.path, serve(&table::VOLUME_HOLDER, volumes::holder))
        .route(table::BUILD_TEMPLATE.path, serve(&table::BUILD_TEMPLATE, build::build))
        .route(table::BUILTIN_TEMPLATES.path, serve(&table::BUILTIN_TEMPLATES, templates::builtin))
        .route(table::DELETE_TEMPLATE.path, serve(&table::DELETE_TEMPLATE, templates::delete))
        .route(table::CONNECT_PORT.path, serve(&table::CONNECT_PORT, tunnel::connect))
        .route(table::SNAPSHOT_SANDBOX.path, serve(&table::SNAPSHOT_SANDBOX, snapshot))
        .route(table::DELETE_SNAPSHOT.path, serve(&table::DELETE_SNAPSHOT, delete_snapshot))
        .fallback(no_route)
        .with_state(node)
}

/// [`router`] for TCP: every route but `/health` answers 401 `UNAUTHENTICATED` unless
/// the request carries `credential` as its bearer token.
pub fn tcp_router(node: Arc<Node>, credential: Credential) -> Router {
    router(node).layer(axum::middleware::from_fn_with_state(credential, auth::require_credential))
}

/// `handler` on `route`'s method.
fn serve<H, T>(route: &Route, handler: H) -> axum::routing::MethodRouter<Arc<Node>>
where
    H: Handler<T, Arc<Node>>,
    T: 'static,
{
    let filter = match route.method {
        routes::Method::Get => MethodFilter::GET,
        routes::Method::Post => MethodFilter::POST,
        routes::Method::Put => MethodFilter::PUT,
        routes::Method::Patch => MethodFilter::PATCH,
        routes::Method::Delete => MethodFilter::DELETE,
    };
    on(filter, handler)
}

async fn no_route() -> AppError {
    AppError(ApiError::new(ErrorCode::NotFound, "no such route"))
}

/// Query parameters with a `{code, message}` answer (axum's own rejection is plain text).
pub struct NodeQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for NodeQuery<T> {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::try_from_uri(&parts.uri).map(|q| NodeQuery(q.0)).map_err(|e| {
            AppError(ApiError::new(ErrorCode::InvalidArgument, format!("invalid query: {}", e.body_text())))
        })
    }
}

/// Parse a JSON body with our error shape (axum's own rejection is plain text).
pub fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes)
        .map_err(|e| AppError(ApiError::new(ErrorCode::InvalidArgument, format!("invalid request body: {e}"))))
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

async fn set_network(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<SandboxInfo>> {
    let policy: lizard_api::network::NetworkPolicy = parse_json(&body)?;
    node.set_network_policy(&id, policy).await?;
    Ok(Json(node.get(&id)?.info()))
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

async fn snapshot(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<lizard_api::node_api::NodeSandboxSnapshot>)> {
    Ok((StatusCode::CREATED, Json(node.snapshot_sandbox(&id).await?)))
}

async fn delete_snapshot(State(node): State<Arc<Node>>, Path(id): Path<String>) -> Result<StatusCode> {
    node.delete_sandbox_snapshot(&id).await?;
    Ok(StatusCode::NO_CONTENT)
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
    NodeQuery(q): NodeQuery<ExecQuery>,
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

/// `?path=` of the file routes.
#[derive(Deserialize)]
struct PathQuery {
    path: String,
}

/// `?path=&mode=&user=` of a write (and `?path=&user=` of a mkdir): the mode in octal,
/// the owner a user name or uid, as on the control plane.
#[derive(Deserialize)]
struct WriteQuery {
    path: String,
    #[serde(default)]
    mode: Option<FileMode>,
    #[serde(default)]
    user: Option<String>,
    /// The file's metadata, a JSON object of strings.
    #[serde(default, deserialize_with = "json_object")]
    metadata: BTreeMap<String, String>,
}

/// A query parameter holding a JSON object of strings.
fn json_object<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<BTreeMap<String, String>, D::Error> {
    let text = String::deserialize(d)?;
    serde_json::from_str(&text).map_err(|e| serde::de::Error::custom(format!("a JSON object of strings: {e}")))
}

async fn read_file(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    NodeQuery(q): NodeQuery<PathQuery>,
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
    NodeQuery(q): NodeQuery<WriteQuery>,
    body: Body,
) -> Result<Json<lizard_api::WriteResult>> {
    let sandbox = node.get(&id)?;
    let stream = body.into_data_stream().map_err(std::io::Error::other);
    let opts =
        lizard_agent_client::WriteOptions { mode: q.mode.map(FileMode::bits), owner: q.user, metadata: q.metadata };
    Ok(Json(sandbox.write_file(&q.path, &opts, stream).await?))
}

async fn remove(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    NodeQuery(q): NodeQuery<PathQuery>,
) -> Result<StatusCode> {
    node.get(&id)?.remove(&q.path).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_dir(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    NodeQuery(q): NodeQuery<PathQuery>,
) -> Result<Json<Vec<lizard_api::FileEntry>>> {
    Ok(Json(node.get(&id)?.list_dir(&q.path).await?))
}

async fn make_dir(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    NodeQuery(q): NodeQuery<WriteQuery>,
) -> Result<StatusCode> {
    node.get(&id)?.make_dir(&q.path, q.user.as_deref()).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn file_info(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    NodeQuery(q): NodeQuery<PathQuery>,
) -> Result<Json<lizard_api::FileInfo>> {
    Ok(Json(node.get(&id)?.file_info(&q.path).await?))
}

/// `?path=&to=` of a rename.
#[derive(Deserialize)]
struct RenameQuery {
    path: String,
    to: String,
}

async fn rename(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    NodeQuery(q): NodeQuery<RenameQuery>,
) -> Result<Json<lizard_api::FileInfo>> {
    Ok(Json(node.get(&id)?.rename(&q.path, &q.to).await?))
}

/// `?path=&recursive=` of a watch.
#[derive(Deserialize)]
struct WatchQuery {
    path: String,
    #[serde(default)]
    recursive: bool,
}

async fn watch(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    NodeQuery(q): NodeQuery<WatchQuery>,
) -> Result<Response> {
    let lines = node.get(&id)?.watch(&q.path, q.recursive).await?;
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(lines)).into_response())
}

async fn read_archive(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    NodeQuery(q): NodeQuery<PathQuery>,
) -> Result<Response> {
    let tar = node.get(&id)?.read_archive(&q.path).await?;
    Ok(([(header::CONTENT_TYPE, "application/x-tar")], Body::from_stream(tar)).into_response())
}

async fn write_archive(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    NodeQuery(q): NodeQuery<PathQuery>,
    body: Body,
) -> Result<Json<lizard_api::ArchiveResult>> {
    let stream = body.into_data_stream().map_err(std::io::Error::other);
    Ok(Json(node.get(&id)?.write_archive(&q.path, stream).await?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request;
    use tower::ServiceExt;

    /// A node over an empty data directory: no VM is booted by these requests.
    async fn node_router() -> (Router, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let node = Node::start(crate::NodeConfig::new(dir.path())).await.unwrap();
        (router(node), dir)
    }

    async fn answer(router: &Router, method: &str, uri: &str, body: &str) -> (StatusCode, serde_json::Value) {
        let req = Request::builder().method(method).uri(uri).body(Body::from(body.to_string())).unwrap();
        let resp = router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
    }

    #[tokio::test]
    async fn serves_every_route_of_the_node_table_and_nothing_else() {
        let (router, _dir) = node_router().await;
        for r in table::ALL {
            // `to` is a rename's; the other routes ignore it.
            let uri = format!("{}?path=/x&to=/y", r.uri(&vec!["nope"; r.params().count()]));
            let (status, body) = answer(&router, r.method.as_str(), &uri, "{}").await;
            assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{r:?}");
            assert_ne!(body["message"], "no such route", "{r:?}");
            if r.params().count() > 0 && !table::NODE_ONLY.contains(r) {
                assert_eq!((status, &body["code"]), (StatusCode::NOT_FOUND, &serde_json::json!("NOT_FOUND")), "{r:?}");
            }
        }
        let (status, body) = answer(&router, "GET", "/v1/nothing-here", "").await;
        assert_eq!((status, body["code"].as_str()), (StatusCode::NOT_FOUND, Some("NOT_FOUND")));
        assert_eq!(answer(&router, "PATCH", "/v1/sandboxes", "").await.0, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(answer(&router, "POST", "/v1/sandboxes/x/timeout", "{}").await.1["message"], "no such route");
        // A tunnel to a sandbox the node does not run is an answer, not an upgrade.
        let req = Request::builder()
            .uri(table::CONNECT_PORT.uri(&["nope", "8080"]))
            .header("connection", "upgrade")
            .header("upgrade", lizard_api::routes::node::TUNNEL_PROTOCOL)
            .body(Body::empty())
            .unwrap();
        assert_eq!(router.clone().oneshot(req).await.unwrap().status(), StatusCode::NOT_FOUND);
        let (status, body) = answer(&router, "GET", &table::VOLUME_HOLDER.uri(&["vol_x"]), "").await;
        assert_eq!((status, body), (StatusCode::OK, serde_json::json!({})));
    }

    #[tokio::test]
    async fn on_tcp_every_route_but_health_needs_the_credential() {
        let dir = tempfile::tempdir().unwrap();
        let node = Node::start(crate::NodeConfig::new(dir.path())).await.unwrap();
        let router = tcp_router(node, Credential::new("s3cret"));
        let send = |uri: &str, auth: Option<&str>| {
            let mut req = Request::builder().uri(uri);
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            router.clone().oneshot(req.body(Body::empty()).unwrap())
        };
        assert_eq!(send(table::HEALTH.path, None).await.unwrap().status(), StatusCode::OK);
        for auth in [None, Some("Bearer wrong"), Some("s3cret")] {
            for uri in [table::LIST_SANDBOXES.path, "/v1/nothing-here"] {
                let resp = send(uri, auth).await.unwrap();
                assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{uri} {auth:?}");
                let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
                let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                assert_eq!(body["code"], "UNAUTHENTICATED");
            }
        }
        assert_eq!(send(table::LIST_SANDBOXES.path, Some("Bearer s3cret")).await.unwrap().status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn a_file_mode_is_octal_permission_bits() {
        let (router, _dir) = node_router().await;
        for bad in ["999", "10000", "-1", "0x1ff", "rwx"] {
            let (status, body) =
                answer(&router, "PUT", &format!("/v1/sandboxes/nope/files?path=/a&mode={bad}"), "").await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {body}");
            assert_eq!(body["code"], "INVALID_ARGUMENT", "{bad}");
            assert!(body["message"].as_str().unwrap().contains("mode must be octal permission bits"), "{body}");
        }
        // A valid mode gets as far as looking the sandbox up.
        let (status, body) = answer(&router, "PUT", "/v1/sandboxes/nope/files?path=/a&mode=0755", "").await;
        assert_eq!((status, body["code"].as_str()), (StatusCode::NOT_FOUND, Some("NOT_FOUND")));
    }
}
