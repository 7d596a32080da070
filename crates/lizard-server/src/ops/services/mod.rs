//! Services (`lizard up`): an app directory run as a persistent, load-balanced set of
//! sandboxes, reached at `{name}.svc.{region}.{domain}` through the sandbox-URL proxy.
//!
//! **A version is a template.** A deploy builds the workspace template
//! `svc-<name>-v<N>` with the template builder: over the service's base template, the
//! uploaded directory copied to `/app`, the spec's `env`, its `build` step as a `run`
//! (inside the build VM, never on the host), and `cmd` as the start command with the
//! app's port as its readiness check — so the layer holds the files and the build's
//! result, and the template snapshot holds the app already running. A crash at start or
//! a port nothing listens on fails the build (`START_NOT_READY`), before any instance.
//!
//! **A rollout** ([`rollout`], one task per deploy or rollback): wait for the build,
//! start `scale.max` instances (sandboxes of the version's template, in the service's
//! project, billed like any sandbox, with private sandbox URLs: only the service's host
//! reaches them), health-check each until `health.graceMs` runs out, then move the
//! traffic — the version becomes live, the previous one's instances drain. A version
//! whose instances never pass is failed with the reason and the app's last output, its
//! instances stopped, and the previous version keeps serving untouched.
//!
//! **The reconciler** ([`reconcile`], on the replica holding the `services` lease)
//! keeps the live version's instances healthy: a check that keeps failing (the process
//! exited, the sandbox died) restarts the instance from the snapshot with backoff, at
//! most [`MAX_RESTARTS`] times before the service is `failing` with the reason and the
//! last log lines; idle instances (no request for `scale.idleAfterMs`, with `idle =
//! pause`) are paused down to `scale.min`; draining ones stop once their requests end.
//!
//! **The proxy** ([`route`]) sends each request to a healthy instance of the live
//! version, round robin; when every instance is paused it resumes one first (one resume
//! per service at a time), so a paused service answers with added latency, never an
//! error.
//!
//! Every change to a service is a revision-checked write of its record
//! ([`modify`]), so the API, rollouts and the reconciler never overwrite each other.

pub mod health;
pub mod logs;
pub mod reconcile;
mod rollout;
pub mod traffic;

use crate::error::{ApiResult, AppError};
use crate::ops::sandboxes::{self, LiveSandbox, NewSandboxSpec};
use crate::ops::templates;
use crate::state::AppState;
use lizard_api::ids;
use lizard_api::services::{
    is_service_name, InstanceState, ServiceError, ServiceInfo, ServiceInstance, ServiceSpec, ServiceStatus,
    ServiceVersion, VersionStatus, MAX_DEPLOY_BYTES, MAX_SERVICE_NAME_LEN,
};
use lizard_api::templates::{ContextEntry, ContextEntryKind};
use lizard_recipe::{Base, Copy, Ready, Recipe, Start, Step};
use lizard_store::{
    InstanceRecord, OnTimeout, ProjectRecord, ServiceBody, ServiceRecord, StoreError, VersionRecord, WorkspaceRecord,
};
use std::collections::BTreeMap;

/// Prefix of service ids.
pub const SERVICE_ID_PREFIX: &str = "svc";
/// Where the app's files go in its instances.
pub const APP_DIR: &str = "/app";
/// Versions whose layers are kept for rollback, the live one included; older ones'
/// templates are deleted (their records stay, marked without a layer).
pub const KEPT_VERSIONS: usize = 3;
/// Restarts of an instance (from its last healthy check) before the service is failing.
pub const MAX_RESTARTS: u32 = 3;
/// The least time the app gets to listen on its port in the build VM.
pub const MIN_READY_S: u32 = 30;
/// Metadata key naming the service on each instance sandbox.
pub const SERVICE_METADATA: &str = "lizard.service";

/// The workspace template holding version `version` of `service`.
pub fn template_name(service: &str, version: u32) -> String {
    format!("{}{service}-v{version}", templates::SERVICE_TEMPLATE_PREFIX)
}

/// `{name}.svc.{region}.{domain}`, with the public proxy's scheme and port
/// ([`crate::config::ServerConfig::public_scheme_and_port`]).
pub fn url(state: &AppState, name: &str) -> String {
    let config = &state.server.config;
    let (scheme, port) = config.public_scheme_and_port();
    format!("{scheme}://{name}.{}{port}", config.service_domain(&config.region))
}

/// The recipe of a version: see the module doc.
pub fn recipe(service: &str, version: u32, spec: &ServiceSpec) -> Recipe {
    let mut steps = vec![
        Step::Copy(Copy { src: ".".into(), dest: format!("{APP_DIR}/"), owner: None }),
        Step::Workdir(APP_DIR.into()),
    ];
    if !spec.env.is_empty() {
        steps.push(Step::Env(spec.env.clone()));
    }
    if let Some(build) = spec.build.as_ref().filter(|b| !b.trim().is_empty()) {
        steps.push(Step::Run(build.clone()));
    }
    // The app's first start is in the build VM, booted cold: it gets at least 30 s.
    let ready_timeout_s =
        u32::try_from(spec.health.grace_ms.div_ceil(1000)).unwrap_or(u32::MAX).clamp(MIN_READY_S, 600);
    Recipe {
        name: template_name(service, version),
        description: format!("service {service}, version {version}"),
        from: Base::Template(spec.template.clone()),
        build: Default::default(),
        sandbox: Default::default(),
        steps,
        env: BTreeMap::new(),
        start: Some(Start { cmd: spec.cmd.clone(), ready: Ready::Port(spec.port), ready_timeout_s }),
    }
}

/// 422 for a name that is not a service name.
pub fn check_name(name: &str) -> ApiResult<()> {
    if is_service_name(name) {
        Ok(())
    } else {
        Err(AppError::invalid(format!(
            "{name:?} is not a service name: 1-{MAX_SERVICE_NAME_LEN} of lower-case letters, digits and '-', \
             starting with a letter"
        )))
    }
}

/// 422 for a spec that breaks a rule, or files past [`MAX_DEPLOY_BYTES`].
fn check_deploy(spec: &ServiceSpec, files: &[ContextEntry]) -> ApiResult<()> {
    spec.validate().map_err(AppError::invalid)?;
    let total: u64 = files.iter().filter(|f| f.kind == ContextEntryKind::File).filter_map(|f| f.size).sum();
    if total > MAX_DEPLOY_BYTES {
        return Err(AppError::invalid(format!(
            "the app directory holds {} MiB; a deploy takes at most {} MiB (leave build output and dependencies \
             out with .lizardignore)",
            total >> 20,
            MAX_DEPLOY_BYTES >> 20
        )));
    }
    Ok(())
}

/// The service as the API shows it.
pub fn info(state: &AppState, s: &ServiceRecord) -> ServiceInfo {
    let mut versions: Vec<ServiceVersion> = s
        .body
        .versions
        .iter()
        .map(|v| ServiceVersion {
            version: v.version,
            status: v.status,
            spec: v.spec.clone(),
            build_id: v.build_id.clone(),
            error: v.error.clone(),
            created_at: ids::rfc3339(v.created_at),
        })
        .collect();
    versions.sort_by_key(|v| std::cmp::Reverse(v.version));
    ServiceInfo {
        service_id: s.id.clone(),
        name: s.name.clone(),
        project_id: s.project_id.clone(),
        workspace_id: s.workspace_id.clone(),
        url: url(state, &s.name),
        status: s.body.status,
        error: s.body.error.clone(),
        live_version: s.body.live_version,
        versions,
        instances: s
            .body
            .instances
            .iter()
            .map(|i| ServiceInstance {
                sandbox_id: i.sandbox_id.clone(),
                version: i.version,
                state: i.state,
                restarts: i.restarts,
            })
            .collect(),
        created_at: ids::rfc3339(s.created_at),
        updated_at: ids::rfc3339(s.updated_at),
    }
}

/// Apply `change` to the newest record of the service `id` and write it, reading again
/// and retrying when another writer moved it on. `None` when the service is gone.
pub(crate) async fn modify<T>(
    state: &AppState,
    name: &str,
    id: &str,
    mut change: impl FnMut(&mut ServiceRecord) -> T,
) -> ApiResult<Option<(ServiceRecord, T)>> {
    let store = state.server.store.as_ref();
    for _ in 0..16 {
        let Some(mut record) = store.service_by_name(name).await?.filter(|s| s.id == id) else { return Ok(None) };
        let out = change(&mut record);
        match store.update_service(&record).await {
            Ok(written) => return Ok(Some((written, out))),
            Err(StoreError::Conflict(_)) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            Err(StoreError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
    Err(AppError::new(lizard_api::ErrorCode::Unavailable, format!("service {name} is changing too often; try again")))
}

/// A version's record, before its build starts.
fn new_version(service: &str, version: u32, spec: &ServiceSpec) -> VersionRecord {
    VersionRecord {
        version,
        status: VersionStatus::Building,
        spec: spec.clone(),
        template: template_name(service, version),
        build_id: None,
        template_ref: None,
        error: None,
        created_at: ids::now_ms(),
    }
}

/// A new service and its first version: checked in full (name, spec, files uploaded,
/// base template), recorded (409 when the name is taken), its build started and its
/// rollout running in the background. A failure before the build started leaves nothing.
pub async fn create(
    state: &AppState,
    account_id: &str,
    workspace: &WorkspaceRecord,
    project: &ProjectRecord,
    name: &str,
    spec: &ServiceSpec,
    files: &[ContextEntry],
) -> ApiResult<ServiceRecord> {
    check_name(name)?;
    check_deploy(spec, files)?;
    crate::billing::require_funds(state.server.store.as_ref(), account_id).await?;
    let checked = templates::check_recipe(state, workspace, recipe(name, 1, spec), files).await?;
    let now = ids::now_ms();
    let record = ServiceRecord {
        id: ids::new_id(SERVICE_ID_PREFIX),
        account_id: account_id.to_owned(),
        workspace_id: workspace.id.clone(),
        project_id: project.id.clone(),
        name: name.to_owned(),
        body: ServiceBody {
            status: ServiceStatus::Deploying,
            error: None,
            live_version: None,
            versions: vec![new_version(name, 1, spec)],
            instances: vec![],
        },
        revision: 0,
        created_at: now,
        updated_at: now,
    };
    state.server.store.insert_service(&record).await.map_err(|e| match e {
        StoreError::Conflict(_) => AppError::conflict(format!("the service name {name} is taken; choose another")),
        other => other.into(),
    })?;
    match start_version(state, &record, 1, workspace, checked).await {
        Ok(record) => Ok(record),
        Err(e) => {
            // Nothing was built: the name is free again.
            let _ = state.server.store.delete_service(&record.id).await;
            Err(e)
        }
    }
}

/// Record the build of `version` and start its rollout.
async fn start_version(
    state: &AppState,
    record: &ServiceRecord,
    version: u32,
    workspace: &WorkspaceRecord,
    checked: templates::CheckedPush,
) -> ApiResult<ServiceRecord> {
    let build = templates::start_build(state, workspace, checked).await?;
    let build_id = build.id.clone();
    let written = modify(state, &record.name, &record.id, |s| {
        if let Some(v) = s.version_mut(version) {
            v.build_id = Some(build_id.clone());
        }
    })
    .await?
    .ok_or_else(|| AppError::not_found(format!("service {} not found", record.name)))?
    .0;
    tracing::info!(service = %record.name, version, build = %build.id, "service version building");
    tokio::spawn(rollout::run(state.clone(), written.clone(), version));
    Ok(written)
}

/// 409 while a version of `s` is building or starting.
fn check_idle(s: &ServiceRecord) -> ApiResult<()> {
    match s.body.versions.iter().find(|v| matches!(v.status, VersionStatus::Building | VersionStatus::Starting)) {
        Some(v) => Err(AppError::conflict(format!(
            "version {} of service {} is still deploying; wait for it to go live or fail",
            v.version, s.name
        ))),
        None => Ok(()),
    }
}

/// A new version of `service`.
pub async fn deploy(
    state: &AppState,
    service: &ServiceRecord,
    spec: &ServiceSpec,
    files: &[ContextEntry],
) -> ApiResult<ServiceRecord> {
    check_deploy(spec, files)?;
    check_idle(service)?;
    crate::billing::require_funds(state.server.store.as_ref(), &service.account_id).await?;
    let workspace = state
        .server
        .store
        .get_workspace(&service.account_id, &service.workspace_id)
        .await?
        .ok_or_else(|| AppError::not_found(format!("workspace {} not found", service.workspace_id)))?;
    let version = service.next_version();
    let checked = templates::check_recipe(state, &workspace, recipe(&service.name, version, spec), files).await?;
    let mut busy = None;
    let (record, _) = modify(state, &service.name, &service.id, |s| {
        busy = check_idle(s).err();
        if busy.is_none() && s.next_version() != version {
            busy = Some(AppError::conflict(format!("service {} changed meanwhile; deploy again", s.name)));
        }
        if busy.is_none() {
            s.body.versions.push(new_version(&s.name, version, spec));
        }
    })
    .await?
    .ok_or_else(|| AppError::not_found(format!("service {} not found", service.name)))?;
    if let Some(e) = busy {
        return Err(e);
    }
    start_version(state, &record, version, &workspace, checked).await.inspect_err(|_| {
        // The build never started: the version's record goes with it.
        let (state, name, id) = (state.clone(), record.name.clone(), record.id.clone());
        tokio::spawn(async move {
            let _ = modify(&state, &name, &id, |s| s.body.versions.retain(|v| v.version != version)).await;
        });
    })
}

/// Go back to an earlier version whose layer is kept (default: the newest retired one):
/// its instances start and take the traffic once healthy, as in a deploy.
pub async fn rollback(state: &AppState, service: &ServiceRecord, to: Option<u32>) -> ApiResult<ServiceRecord> {
    check_idle(service)?;
    let target = match to {
        Some(n) => service.version(n).ok_or_else(|| AppError::not_found(format!("version {n} not found")))?,
        None => service
            .body
            .versions
            .iter()
            .filter(|v| v.status == VersionStatus::Retired && v.template_ref.is_some())
            .max_by_key(|v| v.version)
            .ok_or_else(|| {
                AppError::conflict(format!("service {} has no earlier version to go back to", service.name))
            })?,
    };
    let n = target.version;
    if service.body.live_version == Some(n) {
        return Err(AppError::conflict(format!("version {n} is already live")));
    }
    if target.template_ref.is_none() || target.status == VersionStatus::Failed {
        return Err(AppError::conflict(format!("version {n} cannot be rolled back to: its layer is not kept")));
    }
    let mut busy = None;
    let (record, _) = modify(state, &service.name, &service.id, |s| {
        busy = check_idle(s).err();
        if let (None, Some(v)) = (&busy, s.version_mut(n)) {
            v.status = VersionStatus::Starting;
            v.error = None;
        }
    })
    .await?
    .ok_or_else(|| AppError::not_found(format!("service {} not found", service.name)))?;
    if let Some(e) = busy {
        return Err(e);
    }
    tracing::info!(service = %service.name, version = n, "service rolling back");
    tokio::spawn(rollout::run(state.clone(), record.clone(), n));
    Ok(record)
}

/// `lizard down`: the record goes first (no request or reconcile finds it after), then
/// every instance and every version's template. A rollout in flight finds its service
/// gone and removes what it made.
pub async fn delete(state: &AppState, service: &ServiceRecord) -> ApiResult<()> {
    state.server.store.delete_service(&service.id).await?;
    for i in &service.body.instances {
        stop_instance(state, &i.sandbox_id, "its service was deleted").await;
    }
    for v in &service.body.versions {
        if let Some(b) = &v.build_id {
            if let Ok(Some(build)) = state.server.store.get_build(b).await {
                if !build.status.is_final() {
                    let _ = templates::cancel(state, &build).await;
                }
            }
        }
        delete_version_template(state, service, v).await;
    }
    tracing::info!(service = %service.name, "service deleted");
    Ok(())
}

/// Delete the template that holds `v`'s layer, if it exists.
async fn delete_version_template(state: &AppState, service: &ServiceRecord, v: &VersionRecord) {
    match state.server.store.find_template(&service.workspace_id, &v.template).await {
        Ok(Some(t)) => {
            if let Err(e) = templates::delete(state, &t).await {
                tracing::warn!(service = %service.name, template = %v.template, "cannot delete a version's template: {}", e.0.message);
            }
        }
        Ok(None) => {}
        Err(e) => tracing::warn!(template = %v.template, "cannot look up a version's template: {e}"),
    }
}

/// Start one instance of `version`: a sandbox of its template in the service's project,
/// its own URLs private (an access token nobody holds).
async fn start_instance(state: &AppState, service: &ServiceRecord, version: &VersionRecord) -> ApiResult<LiveSandbox> {
    let store = state.server.store.as_ref();
    let project = store
        .get_project(&service.account_id, &service.project_id)
        .await?
        .ok_or_else(|| AppError::not_found(format!("project {} not found", service.project_id)))?;
    crate::billing::require_funds(store, &service.account_id).await?;
    let timeout_ms = sandboxes::MAX_TIMEOUT_MS;
    let mut unguessable = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut unguessable);
    let spec = NewSandboxSpec {
        account_id: service.account_id.clone(),
        project,
        template: version.template.clone(),
        template_ref: version.template_ref.clone(),
        vcpus: None,
        memory_mib: None,
        env: BTreeMap::new(),
        metadata: BTreeMap::from([
            (SERVICE_METADATA.to_owned(), service.name.clone()),
            ("lizard.version".to_owned(), version.version.to_string()),
        ]),
        allow_internet_access: None,
        allow_out: vec![],
        deny_out: vec![],
        volume: None,
        timeout_ms,
        timeout_at: sandboxes::timeout_end(timeout_ms)?,
        on_timeout: OnTimeout::Kill,
        access: Some(lizard_store::SandboxAccess {
            token_hash: unguessable.to_vec(),
            urls_public: false,
            resume_on_request: false,
        }),
        snapshot: None,
    };
    sandboxes::create(state, spec).await
}

/// A new instance's record.
fn instance(sandbox_id: &str, version: u32, restarts: u32) -> InstanceRecord {
    InstanceRecord {
        sandbox_id: sandbox_id.to_owned(),
        version,
        state: InstanceState::Starting,
        restarts,
        since: ids::now_ms(),
        failures: 0,
    }
}

/// Kill an instance's sandbox and end its record, whatever state it is in.
async fn stop_instance(state: &AppState, sandbox_id: &str, reason: &str) {
    state.services.forget(sandbox_id);
    let Ok(Some(record)) = state.server.store.get_sandbox(sandbox_id).await else { return };
    if !record.is_live() {
        return;
    }
    match sandboxes::live(state, record).await {
        Ok(live) => {
            if let Err(e) = sandboxes::kill(state, &live, reason).await {
                tracing::warn!(sandbox = %sandbox_id, "cannot stop a service instance: {}", e.0.message);
            }
        }
        Err(e) => tracing::debug!(sandbox = %sandbox_id, "service instance already gone: {}", e.0.message),
    }
}

/// The last `bytes` of an instance's app output (the start command's log in the guest).
async fn log_tail(state: &AppState, sandbox_id: &str, bytes: u64) -> Option<String> {
    logs::read_tail(state, sandbox_id, bytes).await.ok().filter(|t| !t.is_empty())
}

/// A service error with `code`.
fn error(code: &str, message: impl Into<String>, log_tail: Option<String>) -> ServiceError {
    ServiceError { code: code.into(), message: message.into(), log_tail }
}

// --- the proxy's side ----------------------------------------------------------------------

/// Where one request to the service `name` goes: a healthy instance of its live version
/// (round robin), resuming a paused one when none runs. 404 for an unknown service, 503
/// while it has no live version or no instance.
pub async fn route(state: &AppState, name: &str) -> ApiResult<(String, u16)> {
    let store = state.server.store.as_ref();
    let unknown = || AppError::not_found(format!("service {name} not found"));
    let service = store.service_by_name(name).await?.ok_or_else(unknown)?;
    let live = service.body.live_version.ok_or_else(|| {
        AppError::new(lizard_api::ErrorCode::Unavailable, format!("service {name} has no live version yet"))
    })?;
    let port = service.version(live).map(|v| v.spec.port).ok_or_else(unknown)?;
    if let Some(id) = pick(state, &service, live, InstanceState::Healthy) {
        return Ok((id, port));
    }
    // Every instance paused (or between checks): resume one, one request at a time.
    let lock = state.services.resume_lock(&service.id);
    let _held = lock.lock().await;
    let service = store.service_by_name(name).await?.filter(|s| s.id == service.id).ok_or_else(unknown)?;
    if let Some(id) = pick(state, &service, live, InstanceState::Healthy) {
        return Ok((id, port));
    }
    if let Some(id) = pick(state, &service, live, InstanceState::Paused) {
        resume_instance(state, &service, &id).await?;
        return Ok((id, port));
    }
    Err(AppError::new(lizard_api::ErrorCode::Unavailable, format!("service {name} has no instance ready; retry soon")))
}

fn pick(state: &AppState, service: &ServiceRecord, live: u32, want: InstanceState) -> Option<String> {
    let ready: Vec<&InstanceRecord> =
        service.body.instances.iter().filter(|i| i.version == live && i.state == want).collect();
    (!ready.is_empty()).then(|| ready[state.services.next_index() % ready.len()].sandbox_id.clone())
}

/// Resume a paused instance and record it healthy (its app ran when it was paused).
async fn resume_instance(state: &AppState, service: &ServiceRecord, sandbox_id: &str) -> ApiResult<()> {
    let begun = std::time::Instant::now();
    let record = state
        .server
        .store
        .get_sandbox(sandbox_id)
        .await?
        .ok_or_else(|| AppError::not_found(format!("instance {sandbox_id} not found")))?;
    let live = sandboxes::live(state, record).await?;
    if live.is_paused() {
        crate::ops::lifecycle::resume(state, &live).await?;
    }
    // Counted as a request from now: the reconciler does not pause it again at once.
    drop(state.services.begin(sandbox_id));
    modify(state, &service.name, &service.id, |s| {
        if let Some(i) = s.body.instances.iter_mut().find(|i| i.sandbox_id == sandbox_id) {
            i.state = InstanceState::Healthy;
            i.since = ids::now_ms();
            i.failures = 0;
        }
    })
    .await?;
    tracing::info!(service = %service.name, sandbox = %sandbox_id, ms = begun.elapsed().as_millis(), "resumed an idle service instance for a request");
    Ok(())
}

/// At start: versions a previous process left building or starting failed ("interrupted"),
/// their instances stopped.
pub async fn fail_interrupted(state: &AppState) {
    let services = match state.server.store.list_services(None).await {
        Ok(s) => s,
        Err(e) => return tracing::warn!("cannot list services: {e}"),
    };
    for s in services {
        let unfinished: Vec<u32> = s
            .body
            .versions
            .iter()
            .filter(|v| matches!(v.status, VersionStatus::Building | VersionStatus::Starting))
            .map(|v| v.version)
            .collect();
        for v in unfinished {
            let failure = error("INTERRUPTED", "the server restarted during the deploy; deploy again", None);
            rollout::fail(state, &s, v, failure).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_is_the_app_over_its_base_with_cmd_as_the_start_command() {
        let mut spec: ServiceSpec =
            serde_json::from_str(r#"{"template":"mine","cmd":"node server.js","port":3000,"build":"npm ci"}"#).unwrap();
        spec.env.insert("NODE_ENV".into(), "production".into());
        let r = recipe("my-app", 7, &spec);
        assert_eq!((r.name.as_str(), &r.from), ("svc-my-app-v7", &Base::Template("mine".into())));
        assert_eq!(
            r.steps,
            [
                Step::Copy(Copy { src: ".".into(), dest: "/app/".into(), owner: None }),
                Step::Workdir("/app".into()),
                Step::Env(spec.env.clone()),
                Step::Run("npm ci".into()),
            ]
        );
        let start = r.start.clone().unwrap();
        assert_eq!(
            (start.cmd.as_str(), &start.ready, start.ready_timeout_s),
            ("node server.js", &Ready::Port(3000), 30)
        );
        r.validate().unwrap();
        // No build step, no env: just the files; a long grace is the app's time to listen.
        spec.build = None;
        spec.env.clear();
        spec.health.grace_ms = 90_000;
        let r = recipe("my-app", 1, &spec);
        assert_eq!(r.steps.len(), 2);
        assert_eq!(r.start.unwrap().ready_timeout_s, 90);
        assert!(template_name("a", 1).starts_with(templates::SERVICE_TEMPLATE_PREFIX));
    }

    #[test]
    fn a_deploy_is_checked_before_anything_runs() {
        let spec: ServiceSpec = serde_json::from_str(r#"{"cmd":"x","port":8000}"#).unwrap();
        let file = |size| ContextEntry {
            path: "f".into(),
            mode: 0o644,
            kind: ContextEntryKind::File,
            sha256: Some("0".repeat(64)),
            size: Some(size),
            target: None,
        };
        assert!(check_deploy(&spec, &[file(1 << 20)]).is_ok());
        let e = check_deploy(&spec, &[file(MAX_DEPLOY_BYTES + 1)]).unwrap_err();
        assert_eq!(e.code(), lizard_api::ErrorCode::InvalidArgument);
        let mut no_port = spec.clone();
        no_port.port = 0;
        assert!(check_deploy(&no_port, &[]).unwrap_err().0.message.starts_with("port:"));
        assert!(check_name("My_App").is_err() && check_name("my-app").is_ok());
    }
}
