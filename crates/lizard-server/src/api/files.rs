//! File routes beyond read/write/list (those are in [`super::sandboxes`]): what is at a
//! path, renames, directory watches and directories as tar archives. Each passes the
//! guest agent's answer through: the watch's NDJSON lines and the archive's bytes stream.

use super::sandboxes::running;
use crate::auth::Principal;
use crate::error::{ApiPath, ApiQuery, ApiResult};
use crate::openapi::{InvalidArgument, NotFound, Unauthenticated};
use crate::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::{StreamExt, TryStreamExt};
use lizard_api::{ArchiveResult, ErrorCode, FileExists, FileInfo, FsEvent};
use serde::Deserialize;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PathQuery {
    /// Absolute path in the sandbox.
    path: String,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RenameQuery {
    /// Absolute path of what moves.
    path: String,
    /// Absolute path it moves to (a file there is replaced).
    to: String,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WatchQuery {
    /// Absolute path of a directory.
    path: String,
    /// Watch every directory under it too (new ones included).
    #[serde(default)]
    recursive: bool,
}

/// What is at a path (`lstat`: a link is described, with its target).
#[utoipa::path(
    get,
    path = lizard_api::routes::FILE_INFO.path,
    tag = "files",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), PathQuery),
    responses((status = 200, description = "The path's type, size, mode, owner, mtime and link target", body = FileInfo), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn info(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> ApiResult<Json<FileInfo>> {
    let sandbox = running(&state, &p, &id).await?;
    Ok(Json(sandbox.node.file_info(sandbox.id(), &q.path).await?))
}

/// Whether anything is at a path.
#[utoipa::path(
    get,
    path = lizard_api::routes::FILE_EXISTS.path,
    tag = "files",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), PathQuery),
    responses((status = 200, description = "Whether the path exists (a dangling link does)", body = FileExists), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn exists(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> ApiResult<Json<FileExists>> {
    let sandbox = running(&state, &p, &id).await?;
    // The sandbox was found above: a NOT_FOUND now is the path's.
    let exists = match sandbox.node.file_info(sandbox.id(), &q.path).await {
        Ok(_) => true,
        Err(e) if e.code == ErrorCode::NotFound => false,
        Err(e) => return Err(e.into()),
    };
    Ok(Json(FileExists { exists }))
}

/// Move a file or directory (`rename(2)`: a file at the target is replaced).
#[utoipa::path(
    post,
    path = lizard_api::routes::RENAME_FILE.path,
    tag = "files",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), RenameQuery),
    responses((status = 200, description = "What is at the new path", body = FileInfo), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn rename(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<RenameQuery>,
) -> ApiResult<Json<FileInfo>> {
    let sandbox = running(&state, &p, &id).await?;
    Ok(Json(sandbox.node.rename(sandbox.id(), &q.path, &q.to).await?))
}

/// Follow a directory's changes: one `FsEvent` per line as they happen (blank lines keep
/// an idle stream checked), until the client closes it. The answer starts once the watch
/// is in place. The stream ends when the sandbox pauses; watch again after the resume.
#[utoipa::path(
    get,
    path = lizard_api::routes::WATCH_DIR.path,
    tag = "files",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), WatchQuery),
    responses((status = 200, description = "One FsEvent per line (create, write, remove, rename, overflow)", content_type = "application/x-ndjson", body = FsEvent), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn watch(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<WatchQuery>,
) -> ApiResult<Response> {
    let sandbox = running(&state, &p, &id).await?;
    let lines = sandbox.node.watch(sandbox.id(), &q.path, q.recursive).await?;
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(lines)).into_response())
}

/// A directory's tree as a tar archive (streamed; links stored as links).
#[utoipa::path(
    get,
    path = lizard_api::routes::READ_ARCHIVE.path,
    tag = "files",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), PathQuery),
    responses((status = 200, description = "A tar archive of the directory", content_type = "application/octet-stream", body = Vec<u8>), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn read_archive(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> ApiResult<Response> {
    let sandbox = running(&state, &p, &id).await?;
    let tar = sandbox.node.read_archive(sandbox.id(), &q.path).await?;
    Ok(([(header::CONTENT_TYPE, "application/x-tar")], Body::from_stream(tar)).into_response())
}

/// Unpack a tar archive (the body) into a directory, created with its parents: many files
/// in one call. An entry that would land outside the directory (absolute, `..`, through
/// a link) is refused with `INVALID_ARGUMENT`.
#[utoipa::path(
    put,
    path = lizard_api::routes::WRITE_ARCHIVE.path,
    tag = "files",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Sandbox id"), PathQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 200, description = "Unpacked", body = ArchiveResult), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn write_archive(
    State(state): State<AppState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
    body: Body,
) -> ApiResult<Json<ArchiveResult>> {
    let sandbox = running(&state, &p, &id).await?;
    let stream = body.into_data_stream().map_err(std::io::Error::other).boxed();
    Ok(Json(sandbox.node.write_archive(sandbox.id(), &q.path, stream).await?))
}
