//! E2B's Template SDK: `Template.build` (sync, async and npm) builds through Lizard's own
//! template builder — the same checks, layer cache, build VMs and records as `lizard
//! push` — in the workspace the key reaches.
//!
//! 1. `POST /v3/templates` names the template and its sandboxes' size: the build's id is
//!    minted and kept here until its steps come. The template's E2B id is its name.
//! 2. For each `COPY` step, `GET /templates/{name}/files/{hash}` says whether the server
//!    has its files; if not, the SDK `PUT`s a tar(.gz) of them to the URL answered: that
//!    same path with a one-time upload token (random, kept here an hour; older SDKs send
//!    no key with the upload, as E2B's URL is presigned), or the key. Its files are stored
//!    as a push's are (by SHA-256, bounded like a push's), and the set is kept here by
//!    hash.
//! 3. `POST /v2/templates/{name}/builds/{build}` takes the steps, made a recipe by
//!    [`crate::template_steps`], checked and built as a push is.
//! 4. `GET /templates/{name}/builds/{build}/status?logsOffset=` answers the build's state
//!    and its log: a line per step as it starts (`CACHED` when its layer came from the
//!    cache), and the end.
//!
//! `GET /templates/aliases/{name}` (`Template.exists`), `DELETE /templates/{id}` (a
//! template, or a snapshot) and tags (`POST`/`DELETE /templates/tags`, `GET
//! /templates/{id}/tags`; a build requested as `name:tag` or with `tags` takes them when it
//! is ready: [`ops::tags`]) complete it. What is kept here lives in this process: a
//! restart between steps 1 and 3 answers the build's start with 404, and the SDK's next
//! build starts over. Nothing of a build runs on the host: the server only reads the
//! uploaded archive into stored files ([`crate::template_files`]).

use crate::control::json_body;
use crate::pending::{Requested, UploadGrant};
use crate::template_files::{save_archive, unpack, MAX_UPLOAD};
use crate::template_steps::{self, files_dir};
use crate::{E2bError, E2bResult};
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{delete, get, post};
use axum::Json;
use lizard_api::templates::BuildStatus as LizardStatus;
use lizard_e2b::templates as wire;
use lizard_server::auth::Principal;
use lizard_server::error::AppError;
use lizard_server::ops::templates::{self as ops, BUILD_ID_PREFIX};
use lizard_server::state::AppState;
use lizard_store::WorkspaceRecord;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use utoipa_axum::router::OpenApiRouter;

/// How long a requested build waits for its steps.
const REQUEST_KEPT: Duration = Duration::from_secs(3600);
/// How long an upload URL is good for.
const UPLOAD_URL_KEPT: Duration = Duration::from_secs(3600);
/// How many upload URLs, requested builds and started builds' step origins are kept at
/// once: past it, a request waits (503) or the origins start over.
const KEPT: usize = 4096;

pub fn routes(router: OpenApiRouter<AppState>) -> OpenApiRouter<AppState> {
    router
        .route("/v3/templates", post(request))
        .route(
            "/templates/{id}/files/{hash}",
            get(file_link)
                .put(upload)
                .layer(axum::extract::DefaultBodyLimit::max(usize::try_from(MAX_UPLOAD).unwrap_or(usize::MAX))),
        )
        .route("/v2/templates/{id}/builds/{build}", post(start))
        .route("/templates/{id}/builds/{build}/status", get(status))
        .route("/templates/aliases/{alias}", get(alias))
        .route("/templates/tags", post(assign_tags).delete(remove_tags))
        .route("/templates/{id}/tags", get(list_tags))
        .route("/templates/{id}", delete(remove))
}

/// The workspace an E2B template call is about: the one the key reaches.
async fn workspace(state: &AppState, p: &Principal) -> E2bResult<WorkspaceRecord> {
    ops::target_workspace(state.server.store.as_ref(), p, None, None).await.map_err(|e| {
        if e.code() == lizard_api::ErrorCode::InvalidArgument {
            E2bError(AppError::invalid(
                "this key reaches more than one workspace: use a key scoped to one workspace or project for templates",
            ))
        } else {
            E2bError(e)
        }
    })
}

/// A template's name as E2B gives it (`name`, `name:tag`), checked.
fn template_name(given: &str) -> E2bResult<String> {
    let name = given.split(':').next().unwrap_or(given);
    let ok = (1..=63).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-');
    if !ok {
        return Err(E2bError(AppError::invalid(format!(
            "template name {given:?}: 1 to 63 lower-case letters, digits and '-'"
        ))));
    }
    Ok(name.to_owned())
}

/// A build's id as E2B's SDKs read it, a UUID: a Lizard build id's 16 characters
/// ([`lizard_api::ids::new_id`]) are its 16 bytes, so [`build_id_of`] gives the id back.
pub(crate) fn build_uuid(build_id: &str) -> String {
    match build_id.strip_prefix(BUILD_ID_PREFIX).and_then(|b| b.strip_prefix('_')).filter(|b| b.len() == 16) {
        Some(body) => {
            let h = hex::encode(body.as_bytes());
            format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
        }
        None => build_id.to_owned(),
    }
}

/// The build id a client gave: one [`build_uuid`] made, or a Lizard build id as is.
pub(crate) fn build_id_of(given: &str) -> String {
    let body = hex::decode(given.replace('-', "")).ok().and_then(|b| String::from_utf8(b).ok());
    match body {
        Some(body) if body.len() == 16 && body.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) => {
            format!("{BUILD_ID_PREFIX}_{body}")
        }
        _ => given.to_owned(),
    }
}

/// `POST /v3/templates` → 202: the build's id, before its steps.
async fn request(
    State(state): State<AppState>,
    p: Result<Principal, AppError>,
    bytes: Bytes,
) -> E2bResult<(StatusCode, Json<wire::BuildRequested>)> {
    let p = p?;
    let req: wire::BuildRequest = json_body(&bytes)?;
    let given = req.name.or(req.alias).ok_or_else(|| E2bError(AppError::invalid("a template needs a name")))?;
    let name = template_name(&given)?;
    let mut tags: Vec<String> = ops::tags::split_reference(&given).1.into_iter().map(str::to_owned).collect();
    tags.extend(req.tags);
    tags.sort();
    tags.dedup();
    for tag in &tags {
        ops::tags::check_tag(tag)?;
    }
    if tags.is_empty() {
        tags.push(ops::tags::DEFAULT_TAG.to_owned());
    }
    if ops::is_builtin(&state, &name) {
        return Err(E2bError(AppError::conflict(format!("{name} is a built-in template's name; choose another"))));
    }
    let workspace = workspace(&state, &p).await?;
    let size = lizard_recipe::recipe::SandboxSize { vcpus: req.cpu_count, memory_mib: req.memory_mb };
    let build_id = lizard_api::ids::new_id(BUILD_ID_PREFIX);
    {
        let mut requested = crate::face(&state).pending.requested.lock().expect("e2b builds poisoned");
        requested.retain(|_, r| r.at.elapsed() < REQUEST_KEPT);
        if requested.len() >= KEPT {
            return Err(E2bError(AppError::new(
                lizard_api::ErrorCode::Unavailable,
                "too many builds wait; retry later",
            )));
        }
        let at = Instant::now();
        let kept =
            Requested { account_id: p.account_id.clone(), workspace, name: name.clone(), size, tags: tags.clone(), at };
        requested.insert(build_id.clone(), kept);
    }
    let answer = wire::BuildRequested {
        template_id: name.clone(),
        build_id: build_uuid(&build_id),
        public: false,
        names: vec![name.clone()],
        tags,
        aliases: vec![name],
    };
    Ok((StatusCode::ACCEPTED, Json(answer)))
}

fn check_hash(hash: &str) -> E2bResult<()> {
    if (1..=128).contains(&hash.len()) && hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(E2bError(AppError::invalid(format!("files hash {hash:?} is not hex"))))
    }
}

/// `GET /templates/{id}/files/{hash}` → 201: whether the files are here, else where to
/// `PUT` them (this route) and with which header (the key this request carried).
async fn file_link(
    State(state): State<AppState>,
    p: Result<Principal, AppError>,
    Path((id, hash)): Path<(String, String)>,
    headers: HeaderMap,
) -> E2bResult<(StatusCode, Json<wire::FileUpload>)> {
    let p = p?;
    check_hash(&hash)?;
    let workspace = workspace(&state, &p).await?;
    let known = crate::face(&state)
        .pending
        .files
        .lock()
        .expect("e2b files poisoned")
        .sets
        .get(&(workspace.id.clone(), hash.clone()))
        .cloned();
    let present = match known {
        Some(entries) => {
            let hashes: Vec<String> = entries.iter().filter_map(|e| e.sha256.clone()).collect();
            ops::missing_blobs(&state, &workspace, &hashes).await?.is_empty()
        }
        None => false,
    };
    if present {
        return Ok((StatusCode::CREATED, Json(wire::FileUpload { present, url: None, headers: BTreeMap::new() })));
    }
    let token = hex::encode(rand::random::<[u8; 32]>());
    {
        let mut uploads = crate::face(&state).pending.uploads.lock().expect("e2b uploads poisoned");
        uploads.retain(|_, g| g.until > Instant::now());
        if uploads.len() >= KEPT {
            return Err(E2bError(AppError::new(
                lizard_api::ErrorCode::Unavailable,
                "too many uploads wait; retry later",
            )));
        }
        let until = Instant::now() + UPLOAD_URL_KEPT;
        let grant = UploadGrant { account_id: p.account_id, workspace_id: workspace.id, hash: hash.clone(), until };
        uploads.insert(token.clone(), grant);
    }
    let host = headers.get(axum::http::header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("127.0.0.1");
    let url = format!("http://{host}/templates/{}/files/{hash}?{UPLOAD_TOKEN}={token}", urlencoding::encode(&id));
    Ok((StatusCode::CREATED, Json(wire::FileUpload { present, url: Some(url), headers: BTreeMap::new() })))
}

/// The query parameter of an upload URL's token.
const UPLOAD_TOKEN: &str = "uploadToken";

#[derive(serde::Deserialize)]
struct UploadQuery {
    #[serde(default, rename = "uploadToken")]
    upload_token: Option<String>,
}

/// The workspace an upload goes to: its token's (used up here), else the key's.
async fn upload_workspace(
    state: &AppState,
    p: Result<Principal, AppError>,
    token: Option<&str>,
    hash: &str,
) -> E2bResult<WorkspaceRecord> {
    let Some(token) = token else { return workspace(state, &p?).await };
    let grant = crate::face(state).pending.uploads.lock().expect("e2b uploads poisoned").remove(token);
    let refused = || E2bError(AppError::forbidden("this upload URL is not valid (used, expired, or for other files)"));
    let grant = grant.filter(|g| g.until > Instant::now() && g.hash == hash).ok_or_else(refused)?;
    state.server.store.get_workspace(&grant.account_id, &grant.workspace_id).await?.ok_or_else(refused)
}

/// `PUT /templates/{id}/files/{hash}?uploadToken=` with a tar (gzipped or not) of one
/// `COPY` step's files: each file stored as a pushed one, the set kept under its hash.
async fn upload(
    State(state): State<AppState>,
    p: Result<Principal, AppError>,
    Path((_id, hash)): Path<(String, String)>,
    Query(q): Query<UploadQuery>,
    body: Body,
) -> E2bResult<StatusCode> {
    check_hash(&hash)?;
    let workspace = upload_workspace(&state, p, q.upload_token.as_deref(), &hash).await?;
    // Beside the stored files: the same file system, and nothing else of the host's.
    let scratch = std::fs::create_dir_all(state.blobs.dir())
        .and_then(|()| tempfile::tempdir_in(state.blobs.dir()))
        .map_err(|e| E2bError(AppError::internal(e)))?;
    let archive = scratch.path().join("archive");
    save_archive(body, &archive).await?;
    let (dir, prefix) = (scratch.path().to_owned(), files_dir(&hash));
    let unpacked = tokio::task::spawn_blocking(move || unpack(&archive, &dir, &prefix))
        .await
        .map_err(|e| E2bError(AppError::internal(e)))?
        .map_err(|e| E2bError(AppError::invalid(format!("the uploaded archive: {e}"))))?;
    let mut entries = Vec::with_capacity(unpacked.len());
    for (entry, content) in unpacked {
        if let (Some(sha256), Some(path)) = (&entry.sha256, content) {
            let file = tokio::fs::File::open(&path).await.map_err(|e| E2bError(AppError::internal(e)))?;
            ops::upload_blob(&state, &workspace, sha256, tokio_util::io::ReaderStream::new(file)).await?;
        }
        entries.push(entry);
    }
    crate::face(&state).pending.files.lock().expect("e2b files poisoned").insert((workspace.id, hash), entries);
    Ok(StatusCode::OK)
}

/// `POST /v2/templates/{id}/builds/{build}` → 202: the steps, built as a push is.
async fn start(
    State(state): State<AppState>,
    p: Result<Principal, AppError>,
    Path((id, build)): Path<(String, String)>,
    bytes: Bytes,
) -> E2bResult<StatusCode> {
    let p = p?;
    let build = build_id_of(&build);
    let req: wire::BuildStart = json_body(&bytes)?;
    let requested = {
        let mut all = crate::face(&state).pending.requested.lock().expect("e2b builds poisoned");
        match all.get(&build) {
            Some(r) if r.account_id == p.account_id && r.name == template_name(&id)? => all.remove(&build),
            _ => None,
        }
    };
    let Some(requested) = requested else {
        return Err(E2bError(AppError::not_found(format!("build {build} of template {id} not found"))));
    };
    let nonce = lizard_api::ids::new_id("force");
    let translated = template_steps::recipe(
        &requested.name,
        requested.size,
        &req,
        |t| crate::face(&state).templates.get(t).to_owned(),
        &nonce,
    )
    .map_err(|e| E2bError(AppError::invalid(e)))?;
    // The context: every COPY step's uploaded files, each under its own directory.
    let mut files = Vec::new();
    {
        let sets = crate::face(&state).pending.files.lock().expect("e2b files poisoned");
        for step in req.steps.iter().filter(|s| s.kind == "COPY") {
            let Some(hash) = &step.files_hash else { continue };
            match sets.sets.get(&(requested.workspace.id.clone(), hash.clone())) {
                Some(entries) => files.extend(entries.iter().cloned()),
                None => {
                    return Err(E2bError(AppError::invalid(format!(
                        "the files of COPY {} were not uploaded",
                        step.args.first().map_or("", String::as_str)
                    ))))
                }
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files.dedup_by(|a, b| a.path == b.path);
    let checked = ops::check_recipe(&state, &requested.workspace, translated.recipe, &files).await?;
    let started = ops::start_build_as(&state, &requested.workspace, checked, build.clone(), requested.tags).await?;
    {
        let mut origins = crate::face(&state).pending.origins.lock().expect("e2b origins poisoned");
        if origins.len() >= KEPT {
            origins.clear();
        }
        origins.insert(started.id.clone(), translated.origins);
    }
    tracing::info!(build = %started.id, template = %started.template_name, key = %p.key_id, "E2B template build started");
    Ok(StatusCode::ACCEPTED)
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusQuery {
    #[serde(default)]
    logs_offset: usize,
    #[serde(default)]
    limit: Option<usize>,
}

/// `GET /templates/{id}/builds/{build}/status?logsOffset=&limit=` → the build's state and
/// its log entries from `logsOffset` (at most 100).
async fn status(
    State(state): State<AppState>,
    p: Result<Principal, AppError>,
    Path((id, build)): Path<(String, String)>,
    Query(q): Query<StatusQuery>,
) -> E2bResult<Json<wire::BuildStatus>> {
    let p = p?;
    let store = state.server.store.as_ref();
    let template = ops::find(store, &p, &template_name(&id)?, None).await?;
    let record = ops::find_build(store, &template, &build_id_of(&build)).await?;
    let info = ops::build_info(&record, state.builds.get(&record.id).map(|b| b.hub.progress()));
    let origin = |step: u32| -> Option<String> {
        let origins = crate::face(&state).pending.origins.lock().expect("e2b origins poisoned");
        let index = usize::try_from(step).ok()?.checked_sub(1)?;
        origins.get(&record.id).and_then(|o| o.get(index)).map(u32::to_string)
    };
    let now = lizard_api::ids::rfc3339(lizard_api::ids::now_ms());
    let entry = |message: String, level: &'static str| wire::LogEntry { timestamp: now.clone(), message, level };
    let total = info.steps.len();
    let mut entries: Vec<wire::LogEntry> = info
        .steps
        .iter()
        .filter(|s| s.status != LizardStatus::Queued)
        .map(|s| {
            let cached = if s.cached { " CACHED" } else { "" };
            entry(format!("[{}/{total}] {}{cached}", s.index, s.description), "info")
        })
        .collect();
    let (state_now, reason) = match info.status {
        LizardStatus::Queued | LizardStatus::Running => (wire::BuildState::Building, None),
        LizardStatus::Ready => {
            entries.push(entry(format!("Template {} is ready", record.template_name), "info"));
            (wire::BuildState::Ready, None)
        }
        LizardStatus::Failed | LizardStatus::Cancelled => {
            let failure = info.error.clone();
            let mut message = failure.as_ref().map_or_else(|| "the build failed".to_owned(), |f| f.message.clone());
            if let Some(tail) = failure.as_ref().and_then(|f| f.output_tail.as_deref()).filter(|t| !t.is_empty()) {
                for line in tail.lines() {
                    entries.push(entry(line.to_owned(), "error"));
                }
                message = format!("{message}\n{tail}");
            }
            entries.push(entry(format!("Build failed: {}", message.lines().next().unwrap_or_default()), "error"));
            let step = failure.as_ref().and_then(|f| f.step).and_then(origin);
            (wire::BuildState::Error, Some(wire::BuildReason { message, step }))
        }
    };
    let limit = q.limit.unwrap_or(100).clamp(1, 100);
    let page: Vec<wire::LogEntry> = entries.into_iter().skip(q.logs_offset).take(limit).collect();
    Ok(Json(wire::BuildStatus {
        template_id: template.name.clone(),
        build_id: build_uuid(&record.id),
        status: state_now,
        logs: page.iter().map(|e| e.message.clone()).collect(),
        log_entries: page,
        reason,
    }))
}

/// `GET /templates/aliases/{alias}` → 200 when the key reaches a template of that name
/// (`Template.exists`), else 404.
async fn alias(
    State(state): State<AppState>,
    p: Result<Principal, AppError>,
    Path(alias): Path<String>,
) -> E2bResult<Json<serde_json::Value>> {
    let p = p?;
    let name = template_name(&alias)?;
    let template = ops::find(state.server.store.as_ref(), &p, &name, None).await?;
    Ok(Json(serde_json::json!({"templateID": template.name, "public": false})))
}

/// `DELETE /templates/{id}` → 204: a snapshot (by its id), or a template the key reaches.
async fn remove(
    State(state): State<AppState>,
    p: Result<Principal, AppError>,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    let p = p?;
    if lizard_server::ops::snapshots::is_snapshot_id(&id) {
        return crate::snapshots::remove(&state, &p, &id).await;
    }
    let template = ops::find(state.server.store.as_ref(), &p, &template_name(&id)?, None).await?;
    ops::delete(&state, &template).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /templates/tags` → 201: `tags` now name the build `target` names.
async fn assign_tags(
    State(state): State<AppState>,
    p: Result<Principal, AppError>,
    bytes: Bytes,
) -> E2bResult<(StatusCode, Json<wire::TagsAssigned>)> {
    let p = p?;
    let req: wire::AssignTags = json_body(&bytes)?;
    let (name, tag) = ops::tags::split_reference(&req.target);
    let template = ops::find(state.server.store.as_ref(), &p, &template_name(name)?, None).await?;
    let build_id = ops::tags::assign(&state, &template, tag, &req.tags).await?;
    Ok((StatusCode::CREATED, Json(wire::TagsAssigned { tags: req.tags, build_id: build_uuid(&build_id) })))
}

/// `DELETE /templates/tags` → 204: `tags` no longer name a build of template `name`.
async fn remove_tags(
    State(state): State<AppState>,
    p: Result<Principal, AppError>,
    bytes: Bytes,
) -> E2bResult<StatusCode> {
    let p = p?;
    let req: wire::RemoveTags = json_body(&bytes)?;
    let template = ops::find(state.server.store.as_ref(), &p, &template_name(&req.name)?, None).await?;
    ops::tags::remove(&state, &template, &req.tags).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /templates/{id}/tags` → the template's tags, `default` (its latest build) first.
async fn list_tags(
    State(state): State<AppState>,
    p: Result<Principal, AppError>,
    Path(id): Path<String>,
) -> E2bResult<Json<Vec<wire::TemplateTag>>> {
    let p = p?;
    let template = ops::find(state.server.store.as_ref(), &p, &template_name(&id)?, None).await?;
    let tags = ops::tags::list(&state, &template).await?;
    Ok(Json(
        tags.into_iter()
            .map(|t| wire::TemplateTag {
                tag: t.tag,
                build_id: build_uuid(&t.build_id),
                created_at: lizard_api::ids::rfc3339(t.created_at),
            })
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_id_travels_as_a_uuid_and_comes_back() {
        let id = lizard_api::ids::new_id(BUILD_ID_PREFIX);
        let uuid = build_uuid(&id);
        assert_eq!(uuid.len(), 36);
        assert_eq!(uuid.matches('-').count(), 4);
        assert!(uuid.replace('-', "").bytes().all(|b| b.is_ascii_hexdigit()), "{uuid}");
        assert_eq!(build_id_of(&uuid), id);
        assert_eq!(build_id_of(&id), id, "the plain id is taken too");
        // Anything else is left for the lookup to refuse.
        for other in ["nope", "00000000-0000-0000-0000-000000000000", "bld_short"] {
            assert_eq!(build_id_of(other), other);
            assert_eq!(build_uuid(other), other);
        }
    }
}
