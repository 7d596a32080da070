//! E2B's control plane: create, connect (resuming a paused sandbox), get, set the
//! timeout, pause and kill — each the same operation as its `/v1` route, behind the
//! same key and scope, answered in E2B's shapes and exact success codes.
//!
//! Which project an E2B create lands in: the one its key reaches, when it reaches
//! exactly one; else the project its `metadata` names under [`PROJECT_METADATA`]; else
//! it is refused, saying so.

use crate::{envd_token, traffic_token, E2bError, E2bResult};
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::routing::{get, post, put};
use axum::Json;
use lizard_api::{NewSandboxRequest, OnTimeout, SandboxState};
use lizard_e2b::rest;
use lizard_server::api::sandboxes::{create_in, running};
use lizard_server::auth::{self, Principal};
use lizard_server::error::AppError;
use lizard_server::ops::lifecycle;
use lizard_server::ops::sandboxes::UrlAccess;
use lizard_server::ops::sandboxes::{self as ops, LiveSandbox};
use lizard_server::state::AppState;
use lizard_store::{ProjectRecord, SandboxAccess};
use utoipa_axum::router::OpenApiRouter;

/// The metadata key naming a create's project (id, slug or name) for a key that reaches
/// several.
pub const PROJECT_METADATA: &str = "lizardProject";

/// The routes that honour `Idempotency-Key` (E2B's Python SDK sends one when asked, and
/// retries a create on 502/503): a retry answers the first answer again.
pub const IDEMPOTENT_PATHS: [&str; 3] = ["/v2/sandboxes", "/sandboxes", "/sandboxes/{id}/fork"];

/// What E2B's `clientID` (deprecated, still required by its parser) holds.
const CLIENT_ID: &str = "lizard";

/// The control plane's routes, added to the API's.
pub fn routes(router: OpenApiRouter<AppState>) -> OpenApiRouter<AppState> {
    router
        .route("/v2/sandboxes", post(create).get(list))
        // Older 2.x SDKs create here, and connect by a timeout (refused while paused),
        // then a resume, then reading the token off the sandbox's details.
        .route("/sandboxes", post(create))
        .route("/sandboxes/{id}", get(info).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/resume", post(resume))
        .route("/sandboxes/{id}/fork", post(fork).layer(axum::middleware::map_response(crate::no_retry)))
        .route("/sandboxes/{id}/metrics", get(metrics))
        .route("/sandboxes/{id}/network", put(update_network))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/connect", post(connect))
}

/// The JSON body, or the error saying why not.
pub(super) fn json_body<T: serde::de::DeserializeOwned>(bytes: &Bytes) -> E2bResult<T> {
    serde_json::from_slice(bytes).map_err(|e| E2bError(AppError::invalid(format!("the request body: {e}"))))
}

/// [`json_body`], where an empty body means every field's default.
pub(super) fn body<T: serde::de::DeserializeOwned + Default>(bytes: &Bytes) -> E2bResult<T> {
    if bytes.is_empty() {
        return Ok(T::default());
    }
    json_body(bytes)
}

async fn project(state: &AppState, p: &Principal, new: &rest::NewSandbox) -> E2bResult<ProjectRecord> {
    if let Some(named) = new.metadata.get(PROJECT_METADATA) {
        return Ok(auth::resolve_project(state.server.store.as_ref(), p, named).await?);
    }
    lizard_server::api::volumes::project_of(state, p, None, None).await.map_err(|_| {
        E2bError(AppError::invalid(format!(
            "this key reaches more than one project (or none): name the sandbox's project in its metadata as \
             {PROJECT_METADATA} (id, slug or name), or use a key scoped to one project"
        )))
    })
}

/// A sandbox's access rule (a sandbox made through E2B always has one).
async fn access_of(state: &AppState, id: &str) -> E2bResult<Option<SandboxAccess>> {
    Ok(state.server.store.sandbox_access(id).await?)
}

/// The suffix of the sandbox's hosts: `{port}-{id}.{domain}` (and Lizard's
/// `{id}-{port}.{domain}`) reach its ports through the sandbox-URL listener. E2B's SDKs
/// make `https://{port}-{id}.{domain}` of it (envd's address without `E2B_SANDBOX_URL`,
/// the desktop's stream URL): with a TLS listener on a port other than 443 the domain
/// carries that port, so those URLs reach it as they are.
fn domain(state: &AppState) -> String {
    let config = &state.server.config;
    let port = match config.public_proxy_tls_port {
        Some(_) => config.public_scheme_and_port().1,
        None => String::new(),
    };
    format!("{}{port}", config.sandbox_domain(&config.region))
}

/// The create, connect and fork answer: the envd token, and the traffic token when its
/// URLs are private.
fn answer(state: &AppState, template: &str, id: &str, access: Option<&SandboxAccess>) -> rest::Sandbox {
    rest::Sandbox {
        template_id: template.to_owned(),
        sandbox_id: id.to_owned(),
        client_id: CLIENT_ID.to_owned(),
        envd_version: lizard_e2b::ENVD_VERSION.to_owned(),
        envd_access_token: access.map(|a| envd_token(&a.token_hash, id)),
        traffic_access_token: access.filter(|a| !a.urls_public).map(|a| traffic_token(&a.token_hash, id)),
        domain: Some(domain(state)),
    }
}

/// `POST /v2/sandboxes` → 201.
async fn create(
    State(state): State<AppState>,
    p: Result<Principal, AppError>,
    bytes: Bytes,
) -> E2bResult<(StatusCode, Json<rest::Sandbox>)> {
    let p = p?;
    let new: rest::NewSandbox = json_body(&bytes)?;
    let network = new.network.clone().unwrap_or_default();
    let policy = policy_of(&network, new.allow_internet_access)?;
    let project = project(&state, &p, &new).await?;
    let secs = new.timeout.unwrap_or(rest::DEFAULT_TIMEOUT_SECS);
    // A snapshot (by id or name) is started from; any other name is a template, mapped.
    let (template, runs) = match crate::snapshots::named_by(&state, &p, &project, &new.template_id).await? {
        Some(snapshot) => (snapshot.id, snapshot.template),
        None => {
            let template = crate::face(&state).templates.get(&new.template_id).to_owned();
            (template.clone(), template)
        }
    };
    // A code interpreter's port runs code: its sandbox's URLs are private unless asked
    // otherwise (the add-on sends the traffic token on every call once it has one).
    let code_interpreter = crate::face(&state).templates.is_code_interpreter(&runs);
    let req = NewSandboxRequest {
        template,
        timeout_ms: Some(secs.saturating_mul(1000)),
        on_timeout: Some(if new.auto_pause { OnTimeout::Pause } else { OnTimeout::Kill }),
        env: new.env_vars,
        metadata: new.metadata,
        allow_internet_access: policy.allow_internet_access,
        allow_out: policy.allow_out,
        deny_out: policy.deny_out,
        ..Default::default()
    };
    // Always a token (envd's and the traffic token derive from it); URLs public unless
    // asked otherwise, as E2B's are, but for a code interpreter's.
    let urls = UrlAccess {
        token: true,
        public: network.allow_public_traffic.unwrap_or(!code_interpreter),
        resume_on_request: new.auto_resume.is_some_and(|a| a.enabled),
    };
    let info = create_in(&state, &p, project, req, urls).await?;
    // The rule just stored, from the token the create answered (no read back).
    let access = info.access_token.as_deref().map(|token| SandboxAccess {
        token_hash: lizard_server::keys::hash(token).to_vec(),
        urls_public: urls.public,
        resume_on_request: urls.resume_on_request,
    });
    Ok((StatusCode::CREATED, Json(answer(&state, &info.template, &info.sandbox_id, access.as_ref()))))
}

/// Lizard's policy for an E2B `network` (and the create's `allow_internet_access`), or
/// the error naming what it asks that Lizard does not serve.
fn policy_of(network: &rest::Network, internet: Option<bool>) -> E2bResult<lizard_api::network::NetworkPolicy> {
    if let Some(field) = network.unserved() {
        return Err(E2bError(AppError::invalid(format!("network.{field} is not served by Lizard"))));
    }
    crate::network::policy(internet.or(network.allow_internet_access), &network.allow_out, &network.deny_out)
        .map_err(|e| E2bError(AppError::invalid(format!("network: {e}"))))
}

/// `PUT /sandboxes/{id}/network` → 204: the egress lists replaced whole (what the body
/// omits is cleared), running or paused. Who may use its URLs is set at create only.
async fn update_network(
    State(state): State<AppState>,
    p: Result<Principal, AppError>,
    Path(id): Path<String>,
    bytes: Bytes,
) -> E2bResult<StatusCode> {
    let p = p?;
    let network: rest::Network = body(&bytes)?;
    if network.allow_public_traffic.is_some() {
        return Err(E2bError(AppError::invalid("network.allowPublicTraffic is set at create only")));
    }
    let policy = policy_of(&network, None)?;
    let sandbox = running(&state, &p, &id).await?;
    ops::set_network(&sandbox, &policy).await?;
    Ok(StatusCode::NO_CONTENT)
}

fn detail(state: &AppState, sandbox: &LiveSandbox, access: Option<&SandboxAccess>) -> rest::SandboxDetail {
    let info = &sandbox.info;
    rest::SandboxDetail {
        template_id: sandbox.record.template.clone(),
        sandbox_id: sandbox.id().to_owned(),
        client_id: CLIENT_ID.to_owned(),
        started_at: info.started_at.clone(),
        end_at: sandbox.record.timeout_at.map(lizard_api::ids::rfc3339).unwrap_or_else(|| info.started_at.clone()),
        envd_version: lizard_e2b::ENVD_VERSION.to_owned(),
        cpu_count: info.vcpus,
        memory_mb: info.memory_mib,
        disk_size_mb: 0,
        state: if info.state == SandboxState::Paused { rest::State::Paused } else { rest::State::Running },
        metadata: info.metadata.clone(),
        envd_access_token: access.map(|a| envd_token(&a.token_hash, sandbox.id())),
        domain: Some(domain(state)),
        lifecycle: Some(rest::Lifecycle {
            auto_resume: access.is_some_and(|a| a.resume_on_request),
            on_timeout: if sandbox.record.on_timeout == OnTimeout::Pause { "pause" } else { "kill" }.into(),
        }),
    }
}

/// `GET /sandboxes/{id}` → 200.
async fn info(
    State(state): State<AppState>,
    p: Result<Principal, AppError>,
    Path(id): Path<String>,
) -> E2bResult<Json<rest::SandboxDetail>> {
    let sandbox = running(&state, &p?, &id).await?;
    Ok(Json(detail(&state, &sandbox, access_of(&state, &id).await?.as_ref())))
}

/// `DELETE /sandboxes/{id}` → 204.
async fn kill(
    State(state): State<AppState>,
    p: Result<Principal, AppError>,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    let sandbox = running(&state, &p?, &id).await?;
    ops::kill(&state, &sandbox, "killed").await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/timeout` `{"timeout": seconds}` → 204: the sandbox ends that
/// long from now (sooner or later than before); 409 while it is paused (connect resumes
/// it, as E2B's older SDKs rely on).
async fn set_timeout(
    State(state): State<AppState>,
    p: Result<Principal, AppError>,
    Path(id): Path<String>,
    bytes: Bytes,
) -> E2bResult<StatusCode> {
    let sandbox = running(&state, &p?, &id).await?;
    if sandbox.is_paused() {
        return Err(E2bError(AppError::conflict(format!("sandbox {id} is paused: connect to resume it"))));
    }
    let req: rest::SetTimeout = json_body(&bytes)?;
    ops::set_timeout(&state, &sandbox, req.timeout.saturating_mul(1000)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/pause` → 204; 409 when it is paused already.
async fn pause(
    State(state): State<AppState>,
    p: Result<Principal, AppError>,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    let sandbox = running(&state, &p?, &id).await?;
    if sandbox.is_paused() {
        return Err(E2bError(AppError::conflict(format!("sandbox {id} is already paused"))));
    }
    lifecycle::pause(&state, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v2/sandboxes/{id}/connect` `{"timeout"?: seconds}`: 200 for a running sandbox,
/// whose end it only ever moves later; 201 for a paused one, resumed.
async fn connect(
    State(state): State<AppState>,
    p: Result<Principal, AppError>,
    Path(id): Path<String>,
    bytes: Bytes,
) -> E2bResult<(StatusCode, Json<rest::Sandbox>)> {
    let p = p?;
    let req: rest::Connect = body(&bytes)?;
    let sandbox = running(&state, &p, &id).await?;
    let status = if sandbox.is_paused() {
        lizard_server::billing::require_funds(state.server.store.as_ref(), &sandbox.record.account_id).await?;
        lifecycle::resume(&state, &sandbox).await?;
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let wanted = req.timeout.unwrap_or(rest::DEFAULT_TIMEOUT_SECS).saturating_mul(1000);
    let later = ops::timeout_end(wanted)?;
    if sandbox.record.timeout_at.is_some_and(|at| at < later) {
        ops::set_timeout(&state, &sandbox, wanted).await?;
    }
    let access = access_of(&state, &id).await?;
    Ok((status, Json(answer(&state, &sandbox.record.template, &id, access.as_ref()))))
}

/// `POST /sandboxes/{id}/resume` `{"timeout"?: seconds}` (older SDKs) → 201 with the
/// sandbox resumed and its timeout set; 409 when it runs.
async fn resume(
    State(state): State<AppState>,
    p: Result<Principal, AppError>,
    Path(id): Path<String>,
    bytes: Bytes,
) -> E2bResult<(StatusCode, Json<rest::Sandbox>)> {
    let req: rest::Connect = body(&bytes)?;
    let sandbox = running(&state, &p?, &id).await?;
    if !sandbox.is_paused() {
        return Err(E2bError(AppError::conflict(format!("sandbox {id} is running"))));
    }
    lizard_server::billing::require_funds(state.server.store.as_ref(), &sandbox.record.account_id).await?;
    lifecycle::resume(&state, &sandbox).await?;
    let wanted = req.timeout.unwrap_or(rest::DEFAULT_TIMEOUT_SECS).saturating_mul(1000);
    ops::set_timeout(&state, &sandbox, wanted).await?;
    let access = access_of(&state, &id).await?;
    Ok((StatusCode::CREATED, Json(answer(&state, &sandbox.record.template, &id, access.as_ref()))))
}

/// `GET /v2/sandboxes`: the sandboxes the key reaches, oldest first (or newest with
/// `order=desc`), filtered by state, template and metadata, a page at a time (`limit`,
/// at most 100; the next page's token in `x-next-token`, absent on the last).
async fn list(
    State(state): State<AppState>,
    p: Result<Principal, AppError>,
    RawQuery(query): RawQuery,
) -> E2bResult<axum::response::Response> {
    let p = p?;
    let q = rest::ListQuery::parse(query.as_deref().unwrap_or(""));
    let filter = lizard_store::SandboxFilter::default();
    let records = state.server.store.list_sandboxes(&p.account_id, p.scope.as_ref(), &filter).await?;
    let mut live = ops::running_of(&state, records).await;
    if q.descending {
        live.reverse();
    }
    let wanted = |s: &LiveSandbox| {
        let state_name = if s.is_paused() { "paused" } else { "running" };
        (q.states.is_empty() || q.states.iter().any(|w| w == state_name))
            && q.template.as_ref().is_none_or(|t| *t == s.record.template)
            && q.metadata.iter().all(|(k, v)| s.info.metadata.get(k) == Some(v))
    };
    let matching: Vec<rest::SandboxDetail> =
        live.iter().filter(|s| wanted(s)).map(|s| detail(&state, s, None)).collect();
    paged(matching, q.next_token.as_deref(), q.limit)
}

/// One page of `items` as E2B's lists answer: from `next_token` (an offset this function
/// gave out), at most `limit` (≤ [`rest::MAX_PAGE`]), and the next page's token in
/// `x-next-token` unless this is the last.
pub(super) fn paged<T: serde::Serialize>(
    items: Vec<T>,
    next_token: Option<&str>,
    limit: Option<usize>,
) -> E2bResult<axum::response::Response> {
    use axum::response::IntoResponse;
    let start = match next_token {
        Some(token) => {
            token.parse::<usize>().map_err(|_| E2bError(AppError::invalid(format!("bad nextToken {token:?}"))))?
        }
        None => 0,
    };
    let limit = limit.unwrap_or(rest::MAX_PAGE).clamp(1, rest::MAX_PAGE);
    let total = items.len();
    let page: Vec<T> = items.into_iter().skip(start).take(limit).collect();
    let mut response = Json(page).into_response();
    if start + limit < total {
        if let Ok(next) = axum::http::HeaderValue::from_str(&(start + limit).to_string()) {
            response.headers_mut().insert(rest::NEXT_TOKEN_HEADER, next);
        }
    }
    Ok(response)
}

/// `POST /sandboxes/{id}/fork` `{"count"?: n (1), "timeout"?: seconds}` → 201 with one
/// result per copy: running copies of the sandbox, processes and memory included, each
/// with its own envd token, recorded in its project.
async fn fork(
    State(state): State<AppState>,
    p: Result<Principal, AppError>,
    Path(id): Path<String>,
    bytes: Bytes,
) -> E2bResult<(StatusCode, Json<Vec<rest::ForkResult>>)> {
    let req: rest::Fork = body(&bytes)?;
    let source = running(&state, &p?, &id).await?;
    if source.is_paused() {
        return Err(E2bError(AppError::conflict(format!("sandbox {id} is paused: connect to resume it first"))));
    }
    lizard_server::billing::require_funds(state.server.store.as_ref(), &source.record.account_id).await?;
    let copies = lifecycle::fork(&state, &source, req.count.unwrap_or(1)).await?;
    let mut results = Vec::with_capacity(copies.len());
    for copy in copies {
        if let Some(secs) = req.timeout {
            ops::set_timeout(&state, &copy, secs.saturating_mul(1000)).await?;
        }
        let access = access_of(&state, copy.id()).await?;
        let sandbox = answer(&state, &copy.record.template, copy.id(), access.as_ref());
        results.push(rest::ForkResult { sandbox: Some(sandbox), error: None });
    }
    Ok((StatusCode::CREATED, Json(results)))
}

/// `GET /sandboxes/{id}/metrics` → 200 with one sample taken now in the guest (CPU busy
/// over 0.2 s, memory, root disk); none for a paused sandbox. `start`/`end` are not read:
/// Lizard keeps no history of them.
async fn metrics(
    State(state): State<AppState>,
    p: Result<Principal, AppError>,
    Path(id): Path<String>,
) -> E2bResult<Json<Vec<rest::Metric>>> {
    let sandbox = running(&state, &p?, &id).await?;
    if sandbox.is_paused() {
        return Ok(Json(Vec::new()));
    }
    let req = lizard_api::ExecRequest {
        cmd: Some(rest::METRICS_SCRIPT.to_owned()),
        user: Some("root".into()),
        ..Default::default()
    };
    let out = sandbox.node.exec(&id, req).await.map_err(|e| E2bError(e.into()))?;
    let now = lizard_api::ids::now_ms();
    let sample = rest::Metric::parse(&out.stdout, lizard_api::ids::rfc3339(now), now).ok_or_else(|| {
        tracing::warn!(%id, stdout = %out.stdout, stderr = %out.stderr, "the guest's metrics did not read");
        E2bError(AppError::new(lizard_api::ErrorCode::Unavailable, "the sandbox's metrics could not be read"))
    })?;
    Ok(Json(vec![sample]))
}
