//! `/v1/sandboxes`: create, list, get, kill, set the timeout, and run processes and move
//! files inside one — each behind the key's scope. The operations are
//! [`crate::ops::sandboxes`]'s; exec output and file contents are streamed from the
//! sandbox's node ([`lizard_node_client::NodeClient`]) into the response here.

use crate::auth::{self, Principal};
use crate::error::{ApiJson, ApiPath, ApiQuery, ApiResult, AppError};
use crate::openapi::{Conflict, InvalidArgument, NotFound, PaymentRequired, Unauthenticated};
use crate::ops::sandboxes::{self as ops, LiveSandbox, UrlAccess};
use crate::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::{StreamExt, TryStreamExt};
use lizard_api::ids;
use lizard_api::{ExecRequest, NewSandboxRequest, SandboxInfo, SetTimeoutRequest, SignUrlRequest, SignedUrl};
use lizard_store::SandboxFilter;
use serde::Deserialize;

/// The API's view of a sandbox: the node's facts plus the record's.
pub fn sandbox_json(state: &AppState, sandbox: &LiveSandbox) -> SandboxInfo {
    let mut info = sandbox.info.clone();
    // A pushed template's sandbox runs from a build's node template; clients see the name.
    info.template = sandbox.record.template.clone();
    info.project_id = Some(sandbox.record.project_id.clone());
    info.end_at = sandbox.record.timeout_at.map(ids::rfc3339);
    info.domain = Some(state.server.config.sandbox_domain(&state.server.config.region));
    info
}

/// The sandbox behind `id` (running or paused), if the key reaches it; 404 once it ended.
pub async fn running(state: &AppState, p: &Principal, id: &str) -> ApiResult<LiveSandbox> {
    let record = auth::sandbox_for(state.server.store.as_ref(), p, id).await?;
    ops::live(state, record).await
}

/// Boot a sandbox in a project the key reaches.
#[utoipa::path(
    post,
    path = lizard_api::routes::CREATE_SANDBOX.path,
    tag = "sandboxes",
    security(("apiKey" = [])),
    request_body = NewSandboxRequest,
    responses((status = 201, description = "The running sandbox", body = SandboxInfo), Unauthenticated, NotFound, InvalidArgument, PaymentRequired, Conflict)
)]
pub async fn create(
    State(state): State<AppState>,
    p: Principal,
    ApiJson(req): ApiJson<NewSandboxRequest>,
) -> ApiResult<(StatusCode, Json<SandboxInfo>)> {
    let store = state.server.store.as_ref();
    let project = match (&req.project_id, &req.project) {
        (Some(id), _) => auth::project_for(store, &p, id).await?,
        (None, Some(key)) => auth::resolve_project(store, &p, key).await?,
        (None, None) => {
            return Err(AppError::invalid("a project is required: pass project (id, slug or name) or projectId"))
        }
    };
    let urls = UrlAccess::of(&req);
    Ok((StatusCode::CREATED, Json(create_in(&state, &p, project, req, urls).await?)))
}

/// Boot a sandbox of `req` in `project` (one the key reaches), its URLs open to `urls`:
/// what the key reaches checked here (its `lizardToken`, volume and snapshot), the rest
/// in [`ops::create_requested`]. Every create goes through it, Lizard's own and a face's.
pub async fn create_in(
    state: &AppState,
    p: &Principal,
    project: lizard_store::ProjectRecord,
    req: NewSandboxRequest,
    urls: UrlAccess,
) -> ApiResult<SandboxInfo> {
    let store = state.server.store.as_ref();
    if let Some(token) = &req.lizard_token {
        // Only a live key of this account: a sandbox must not carry someone else's key.
        let holder = auth::authenticate(store, token)
            .await
            .map_err(|_| AppError::invalid("lizardToken is not a valid API key"))?;
        if holder.account_id != p.account_id {
            return Err(AppError::invalid("lizardToken is not a valid API key"));
        }
    }
    let volume = match &req.volume_name {
        Some(name) => Some(crate::api::volumes::volume_for(state, p, name, None, Some(&project.id)).await?),
        None => None,
    };
    // A snapshot's id starts its sandbox from the snapshot, on its node, as its template.
    let snapshot = match crate::ops::snapshots::is_snapshot_id(&req.template) {
        true => Some(snapshot_in(state, p, &project.id, &req.template).await?),
        false => None,
    };
    let requested = ops::Requested { account_id: p.account_id.clone(), project, req, volume, snapshot, urls };
    let created = ops::create_requested(state, requested).await?;
    let mut info = sandbox_json(state, &created.sandbox);
    info.access_token = created.access_token;
    Ok(info)
}

/// Snapshot `id` of `project_id`, if the key reaches it; 404 for any other.
pub async fn snapshot_in(
    state: &AppState,
    p: &Principal,
    project_id: &str,
    id: &str,
) -> ApiResult<lizard_store::SnapshotRecord> {
    match state.server.store.get_snapshot(&p.account_id, id).await? {
        Some(s)
            if s.project_id == project_id
                && lizard_store::scope::sees_project(p.scope.as_ref(), &s.workspace_id, &s.project_id) =>
        {
            Ok(s)
        }
        _ => Err(AppError::not_found(format!("snapshot {id} not found in this project"))),
    }
}

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only this project's sandboxes.
    project_id: Option<String>,
    /// Only this workspace's sandboxes.
    workspace_id: Option<String>,
}

/// The running sandboxes the key reaches.
#[utoipa::path(
    get,
    path = lizard_api::routes::LIST_SANDBOXES.path,
    tag = "sandboxes",
    security(("apiKey" = [])),
    params(ListQuery),
    responses((status = 200, description = "Running sandboxes", body = Vec<SandboxInfo>), Unauthenticated, InvalidArgument)
)]
pub async fn list(
    State(state): State<AppState>,
    p: Principal,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<Vec<SandboxInfo>>> {
    let filter = SandboxFilter { workspace_id: q.workspace_id, project_id: q.project_id, include_ended: false };
    let records = state.server.store.list_sandboxes(&p.account_id, p.scope.as_ref(), &filter).await?;
    let live = ops::running_of(&state, records).await;
    Ok(Json(live.iter().map(|s| sandbox_json(&state, s)).collect()))
}

/// One sandbox (`connect`): 404 once it was killed or expired.
#[utoipa::path(
    get,
    path = lizard_api::routes::GET_SANDBOX.path,
    tag = "sandboxes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, description = "The sandbox", body = SandboxInfo), Unauthenticated, NotFound)
)]
pub async fn get(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<SandboxInfo>> {
    let sandbox = running(&state, &p, &id).await?;
    Ok(Json(sandbox_json(&state, &sandbox)))
}

/// Stop a sandbox and delete everything in it.
#[utoipa::path(
    delete,
    path = lizard_api::routes::KILL_SANDBOX.path,
    tag = "sandboxes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 204, description = "Killed"), Unauthenticated, NotFound)
)]
pub async fn kill(State(state): State<AppState>, p: Principal, ApiPath(id): ApiPath<String>) -> ApiResult<StatusCode> {
    let sandbox = running(&state, &p, &id).await?;
    ops::kill(&state, &sandbox, "killed").await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Extend or shorten a sandbox's lifetime, counted from now.
#[utoipa::path(
    post,
    path = lizard_api::routes::SET_TIMEOUT.path,
    tag = "sandboxes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = SetTimeoutRequest,
    responses((status = 200, description = "The sandbox with its new end", body = SandboxInfo), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn set_timeout(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<SetTimeoutRequest>,
) -> ApiResult<Json<SandboxInfo>> {
    let mut sandbox = running(&state, &p, &id).await?;
    sandbox.record = ops::set_timeout(&state, &sandbox, req.timeout_ms).await?;
    Ok(Json(sandbox_json(&state, &sandbox)))
}

/// Replace a running or paused sandbox's outbound network policy (`allowInternetAccess`,
/// `allowOut`, `denyOut`, as at create; omitted fields are their defaults): in force when
/// this answers, for connections already open too; forks made later inherit it.
#[utoipa::path(
    put,
    path = lizard_api::routes::SET_NETWORK.path,
    tag = "sandboxes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = lizard_api::network::NetworkPolicy,
    responses((status = 200, description = "The sandbox", body = SandboxInfo), Unauthenticated, NotFound, InvalidArgument, Conflict)
)]
pub async fn set_network(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<lizard_api::network::NetworkPolicy>,
) -> ApiResult<Json<SandboxInfo>> {
    let sandbox = running(&state, &p, &id).await?;
    ops::set_network(&sandbox, &req).await?;
    Ok(Json(sandbox_json(&state, &sandbox)))
}

/// A URL to one of a sandbox's ports that works without its access token until it
/// expires (a sandbox with public URLs gets its plain host: it needs no proof).
#[utoipa::path(
    post,
    path = lizard_api::routes::SIGN_URL.path,
    tag = "sandboxes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = SignUrlRequest,
    responses((status = 200, description = "The URL's host and query", body = SignedUrl), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn sign_url(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<SignUrlRequest>,
) -> ApiResult<Json<SignedUrl>> {
    let sandbox = running(&state, &p, &id).await?;
    let config = &state.server.config;
    let domain = config.sandbox_domain(&config.region);
    Ok(Json(crate::proxy::signed::mint(state.server.store.as_ref(), &domain, &sandbox.record.id, &req).await?))
}

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ExecQuery {
    /// Stream exec frames (`application/vnd.lizard.frames`) instead of one JSON result.
    #[serde(default)]
    stream: bool,
}

/// Run a command and wait for it (or stream its output). Waiting, its output is
/// collected up to 16 MiB (stdout and stderr together); past that: `OUTPUT_TOO_LARGE`
/// (422) — stream it instead.
#[utoipa::path(
    post,
    path = lizard_api::routes::EXEC.path,
    tag = "sandboxes",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), ExecQuery),
    request_body = ExecRequest,
    responses((status = 200, description = "How the command ended", body = lizard_api::ProcessResult), Unauthenticated, NotFound, InvalidArgument, Conflict)
)]
pub async fn exec(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<ExecQuery>,
    ApiJson(req): ApiJson<ExecRequest>,
) -> ApiResult<Response> {
    crate::limits::check_exec(&req)?;
    let sandbox = running(&state, &p, &id).await?;
    let started = std::time::Instant::now();
    let frames = sandbox.node.exec_stream(sandbox.id(), req).await?;
    let frames = crate::ops::exec::timed(state.server.telemetry.clone(), started, frames);
    if q.stream {
        let body = Body::from_stream(frames.map_ok(|f| f.to_bytes()));
        Ok(([(header::CONTENT_TYPE, lizard_agent_proto::routes::FRAMES_CONTENT_TYPE)], body).into_response())
    } else {
        let answer = crate::ops::exec::collect(&state.server.guest_buffers, sandbox.id(), frames).await?;
        // The answer's memory stays charged until the body is sent.
        let charge = answer.charge;
        let chunk = futures_util::stream::iter([Ok::<_, std::convert::Infallible>(bytes::Bytes::from(answer.json))]);
        let body = Body::from_stream(chunk.map(move |c| {
            let _held = &charge;
            c
        }));
        Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct FileQuery {
    /// Absolute path in the sandbox.
    path: String,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WriteQuery {
    /// Absolute path in the sandbox; parents are created.
    path: String,
    /// Permission bits for a new file, octal (e.g. 755), at most 7777.
    #[param(value_type = Option<String>)]
    mode: Option<lizard_api::FileMode>,
    /// Who the file, and the directories the write creates, belong to: a user name or
    /// uid of the guest (root without one; an unknown name is 422).
    user: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MakeDirQuery {
    /// Absolute path in the sandbox.
    path: String,
    /// Who the directories it creates belong to: a user name or uid of the guest (root
    /// without one).
    user: Option<String>,
}

/// Read a file (streamed bytes).
#[utoipa::path(
    get,
    path = lizard_api::routes::READ_FILE.path,
    tag = "files",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), FileQuery),
    responses((status = 200, description = "The file's bytes", content_type = "application/octet-stream", body = Vec<u8>), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn read_file(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<FileQuery>,
) -> ApiResult<Response> {
    let sandbox = running(&state, &p, &id).await?;
    let file = sandbox.node.read_file(sandbox.id(), &q.path).await?;
    let mut resp = Body::from_stream(file.body).into_response();
    if let Some(len) = file.len {
        resp.headers_mut().insert(header::CONTENT_LENGTH, len.into());
    }
    resp.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/octet-stream"));
    Ok(resp)
}

/// Write a file from the request body (streamed), replacing it atomically.
#[utoipa::path(
    put,
    path = lizard_api::routes::WRITE_FILE.path,
    tag = "files",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), WriteQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 200, description = "Written", body = Object), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn write_file(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<WriteQuery>,
    body: Body,
) -> ApiResult<Json<lizard_api::WriteResult>> {
    let opts = lizard_node_client::WriteOptions {
        mode: q.mode.map(lizard_api::FileMode::bits),
        owner: q.user,
        ..Default::default()
    };
    let sandbox = running(&state, &p, &id).await?;
    let stream = body.into_data_stream().map_err(std::io::Error::other).boxed();
    Ok(Json(sandbox.node.write_file(sandbox.id(), &q.path, &opts, stream).await?))
}

/// Remove a file or a directory (recursively).
#[utoipa::path(
    delete,
    path = lizard_api::routes::REMOVE_FILE.path,
    tag = "files",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), FileQuery),
    responses((status = 204, description = "Removed"), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn remove(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<FileQuery>,
) -> ApiResult<StatusCode> {
    let sandbox = running(&state, &p, &id).await?;
    sandbox.node.remove(sandbox.id(), &q.path).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// List a directory.
#[utoipa::path(
    get,
    path = lizard_api::routes::LIST_DIR.path,
    tag = "files",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), FileQuery),
    responses((status = 200, description = "Entries, sorted by name", body = Vec<Object>), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn list_dir(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<FileQuery>,
) -> ApiResult<Json<Vec<lizard_api::FileEntry>>> {
    let sandbox = running(&state, &p, &id).await?;
    Ok(Json(sandbox.node.list_dir(sandbox.id(), &q.path).await?))
}

/// Create a directory and its parents.
#[utoipa::path(
    post,
    path = lizard_api::routes::MAKE_DIR.path,
    tag = "files",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), MakeDirQuery),
    responses((status = 204, description = "Created"), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn make_dir(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<MakeDirQuery>,
) -> ApiResult<StatusCode> {
    let sandbox = running(&state, &p, &id).await?;
    sandbox.node.make_dir(sandbox.id(), &q.path, q.user.as_deref()).await?;
    Ok(StatusCode::NO_CONTENT)
}
