//! A sandbox's record and its VM, kept in step: create, look up, list, kill, set the
//! timeout, open a tunnel to one of its ports, and end the records no node runs.
//!
//! The store records which project a sandbox belongs to (for scope checks, listing and
//! billing); the node owns the VM. A sandbox is live while both agree it runs: a record
//! whose VM is gone (killed, timed out, crashed, lost at a restart) is marked ended and
//! answers 404 with the reason.

use crate::error::{ApiResult, AppError};
use crate::ops::volumes;
use crate::placement;
use crate::state::AppState;
use crate::telemetry::Operation;
use lizard_api::ids;
use lizard_api::{CreateSandboxRequest, NewSandboxRequest, SandboxInfo};
use lizard_node_client::{NodeClient, Tunnel};
use lizard_store::{NewSandbox, OnTimeout, ProjectRecord, SandboxRecord, SandboxState, StoreError, VolumeRecord};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Lifetime of a sandbox created without `timeoutMs`.
pub const DEFAULT_TIMEOUT_MS: u64 = 5 * 60 * 1000;
/// Longest lifetime one call may set.
pub const MAX_TIMEOUT_MS: u64 = 24 * 60 * 60 * 1000;

/// When a sandbox given `ms` to live from now ends; 422 outside 1..=[`MAX_TIMEOUT_MS`].
pub fn timeout_end(ms: u64) -> ApiResult<i64> {
    if ms == 0 || ms > MAX_TIMEOUT_MS {
        return Err(AppError::invalid(format!("timeoutMs must be 1..={MAX_TIMEOUT_MS}, got {ms}")));
    }
    // Bounded by MAX_TIMEOUT_MS just above: the conversion cannot fail.
    let ms = i64::try_from(ms).expect("at most MAX_TIMEOUT_MS");
    Ok(ids::now_ms().saturating_add(ms))
}

/// When a sandbox given the lifetime `timeout_ms` at create ends, counted from now (a
/// resume or a fork starts it again).
pub fn lifetime_end(timeout_ms: Option<i64>) -> ApiResult<i64> {
    let lifetime = timeout_ms.map_or(DEFAULT_TIMEOUT_MS, |ms| ms.max(1).unsigned_abs());
    timeout_end(lifetime.min(MAX_TIMEOUT_MS))
}

/// A sandbox both the store and its node know: its record, the node's view of it, and
/// the node that runs it.
#[derive(Clone)]
pub struct LiveSandbox {
    pub record: SandboxRecord,
    pub info: SandboxInfo,
    pub node: Arc<dyn NodeClient>,
}

impl LiveSandbox {
    pub fn id(&self) -> &str {
        &self.record.id
    }

    pub fn is_paused(&self) -> bool {
        self.info.state == SandboxState::Paused
    }
}

/// The live sandbox behind `record` (running or paused). A record whose VM its node no
/// longer has is ended here, with the node's reason, and answers 404.
pub async fn live(state: &AppState, record: SandboxRecord) -> ApiResult<LiveSandbox> {
    if let Some(reason) = &record.end_reason {
        return Err(AppError::not_found(format!("sandbox {} not found: {reason}", record.id)));
    }
    let node = placement::node_of(state, &record).await?;
    match node.sandbox(&record.id).await {
        Ok(info) => Ok(LiveSandbox { record, info, node }),
        // Only a node that answers "not found" has lost it; a node that cannot be reached
        // (a remote one) leaves the record as it is.
        Err(e) if e.code != lizard_api::ErrorCode::NotFound => Err(e.into()),
        Err(gone) => {
            // Past its timeout, the VM is gone because the reaper killed it: say so even
            // when this lookup comes between the reaper's kill and its own record update.
            let now = ids::now_ms();
            let (reason, message) = match record.timeout_at {
                Some(at) if at <= now => {
                    let why = expiry_reason(record.state);
                    (why.to_owned(), format!("sandbox {} not found: {why}", record.id))
                }
                _ => {
                    // The node says "sandbox <id> not found: <reason>"; the record keeps the reason.
                    let prefix = format!("sandbox {} not found: ", record.id);
                    (gone.message.strip_prefix(&prefix).unwrap_or(&gone.message).to_owned(), gone.message)
                }
            };
            state.server.store.end_sandbox(&record.id, now, &reason).await?;
            Err(AppError::not_found(message))
        }
    }
}

/// Why the reaper ends a sandbox in `state` whose timeout passed.
pub fn expiry_reason(state: SandboxState) -> &'static str {
    if state == SandboxState::Paused {
        "expired while paused"
    } else {
        "timed out"
    }
}

/// The sandboxes among `records` that their nodes run (the others are left as they are).
pub async fn running_of(state: &AppState, records: Vec<SandboxRecord>) -> Vec<LiveSandbox> {
    let mut out = Vec::with_capacity(records.len());
    for record in records {
        let Ok(node) = placement::node_of(state, &record).await else { continue };
        if let Ok(info) = node.sandbox(&record.id).await {
            out.push(LiveSandbox { record, info, node });
        }
    }
    out
}

/// Who may use a new sandbox's URLs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UrlAccess {
    /// It gets an access token (shown once, in the create's answer).
    pub token: bool,
    /// Its URLs answer without the token.
    pub public: bool,
    /// With a token: a request to its URLs resumes it when paused.
    pub resume_on_request: bool,
}

impl UrlAccess {
    /// Lizard's rule: public URLs and no token, or private with one (`publicUrls: false`).
    pub fn of(req: &NewSandboxRequest) -> UrlAccess {
        let private = req.public_urls == Some(false);
        UrlAccess { token: private, public: !private, resume_on_request: false }
    }
}

/// A create as a client asked for it (Lizard's own or a face's), with the records its key
/// was checked to reach.
pub struct Requested {
    pub account_id: String,
    pub project: ProjectRecord,
    /// `lizard_token`, when set, was checked to be a live key of this account.
    pub req: NewSandboxRequest,
    /// The volume `req.volume_name` names.
    pub volume: Option<VolumeRecord>,
    /// The snapshot `req.template` names, when it names one.
    pub snapshot: Option<lizard_store::SnapshotRecord>,
    pub urls: UrlAccess,
}

/// A new sandbox, and its access token when it has one (shown this once).
pub struct Created {
    pub sandbox: LiveSandbox,
    pub access_token: Option<String>,
}

/// Check what `requested` asks (its env, metadata and timeout, the account's funds, a
/// snapshot with a volume), find its template, and [`create`] it.
pub async fn create_requested(state: &AppState, requested: Requested) -> ApiResult<Created> {
    let Requested { account_id, project, req, volume, snapshot, urls } = requested;
    crate::limits::check_env(&req.env)?;
    crate::limits::check_metadata(&req.metadata)?;
    let timeout_ms = req.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
    let timeout_at = timeout_end(timeout_ms)?;
    let mut env = req.env;
    if let Some(token) = &req.lizard_token {
        env.insert("LIZARD_API_KEY".into(), token.clone());
    }
    crate::billing::require_funds(state.server.store.as_ref(), &account_id).await?;
    if snapshot.is_some() && volume.is_some() {
        return Err(AppError::invalid("a sandbox started from a snapshot cannot mount a volume"));
    }
    let (template, template_ref) = match &snapshot {
        Some(s) => (s.template.clone(), s.template_ref.clone()),
        None => {
            let template_ref = crate::ops::templates::node_template_for(state, &project, &req.template).await?;
            (req.template, template_ref)
        }
    };
    let access = urls.token.then(crate::keys::AccessToken::generate);
    let spec = NewSandboxSpec {
        account_id,
        project,
        template,
        template_ref,
        vcpus: req.vcpus,
        memory_mib: req.memory_mib,
        env,
        metadata: req.metadata,
        allow_internet_access: req.allow_internet_access,
        allow_out: req.allow_out,
        deny_out: req.deny_out,
        volume,
        timeout_ms,
        timeout_at,
        on_timeout: req.on_timeout.unwrap_or_default(),
        access: access.as_ref().map(|t| lizard_store::SandboxAccess {
            token_hash: t.hash.to_vec(),
            urls_public: urls.public,
            resume_on_request: urls.resume_on_request,
        }),
        snapshot,
    };
    let sandbox = create(state, spec).await?;
    Ok(Created { sandbox, access_token: access.map(|t| t.plaintext) })
}

/// A sandbox to start, its request checked and authorized.
pub struct NewSandboxSpec {
    pub account_id: String,
    pub project: ProjectRecord,
    /// The template's name, as the client gave it (and the sandbox shows).
    pub template: String,
    /// The node template of a pushed template's build (`None`: `template` is a built-in).
    pub template_ref: Option<String>,
    pub vcpus: Option<u32>,
    pub memory_mib: Option<u32>,
    pub env: BTreeMap<String, String>,
    pub metadata: BTreeMap<String, String>,
    pub allow_internet_access: Option<bool>,
    pub allow_out: Vec<String>,
    pub deny_out: Vec<String>,
    /// The volume to mount at `/workspace` (held for this sandbox alone).
    pub volume: Option<VolumeRecord>,
    /// The lifetime asked for, and its end computed when the request came.
    pub timeout_ms: u64,
    pub timeout_at: i64,
    pub on_timeout: OnTimeout,
    /// Its access token's rule (`None`: no token, public URLs).
    pub access: Option<lizard_store::SandboxAccess>,
    /// The snapshot it starts from (on the snapshot's node), instead of `template`.
    pub snapshot: Option<lizard_store::SnapshotRecord>,
}

/// Boot a sandbox and record it. Its volume is held (reserved in the store) before it
/// boots, so two creates cannot both get it, and it runs on the volume's node. Nothing
/// runs unrecorded: a failed record kills the VM.
///
/// The whole operation runs in its own task, which the caller only awaits: a client that
/// goes away mid-create (its handler dropped) cannot stop it between the boot and the
/// record, so the sandbox ends up recorded and billed, or undone.
pub async fn create(state: &AppState, spec: NewSandboxSpec) -> ApiResult<LiveSandbox> {
    let state = state.clone();
    // Timed inside the task: a client that goes away does not lose the measurement.
    run_to_completion(async move { state.server.telemetry.timed(Operation::Create, create_now(&state, spec)).await })
        .await
}

/// Run `work` in a task of its own and await it: dropping the caller does not cancel it.
pub(crate) async fn run_to_completion<T: Send + 'static>(
    work: impl std::future::Future<Output = ApiResult<T>> + Send + 'static,
) -> ApiResult<T> {
    use tracing::Instrument;
    // The task carries on the request's id and log span (its errors name them).
    let work = crate::request_id::scope(crate::request_id::current(), work).instrument(tracing::Span::current());
    tokio::spawn(work).await.map_err(|e| AppError::internal(format!("an operation's task failed: {e}")))?
}

async fn create_now(state: &AppState, spec: NewSandboxSpec) -> ApiResult<LiveSandbox> {
    let store = state.server.store.as_ref();
    let attachment = match spec.volume {
        Some(v) => Some(volumes::reserve(state, &spec.account_id, v).await?),
        None => None,
    };
    let node_template = spec.template_ref.clone().unwrap_or_else(|| spec.template.clone());
    // A sandbox with a volume runs on the volume's node; any other on the best node with
    // room, the next one when a node answers 503 (its own admission).
    let candidates: Vec<(String, Arc<dyn NodeClient>)> = match (&attachment, &spec.snapshot) {
        (Some(a), _) => vec![(a.volume.node_id.clone(), a.node.clone())],
        // A snapshot's save is on one node.
        (None, Some(s)) => vec![(s.node_id.clone(), placement::node(state, &s.node_id).await?)],
        (None, None) => {
            let want = placement::Want {
                region: state.server.config.region.clone(),
                vcpus: spec.vcpus.unwrap_or(placement::DEFAULT_VCPUS),
                memory_mib: spec.memory_mib.map_or(placement::DEFAULT_MEMORY_MIB, u64::from),
                template: node_template.clone(),
                template_required: spec.template_ref.is_some(),
            };
            placement::place_sandbox(state, &want).await?.into_iter().map(|p| (p.at.node_id, p.node)).collect()
        }
    };
    let request = CreateSandboxRequest {
        template: node_template,
        vcpus: spec.vcpus,
        memory_mib: spec.memory_mib,
        env: spec.env,
        metadata: spec.metadata.clone(),
        allow_internet_access: spec.allow_internet_access,
        allow_out: spec.allow_out,
        deny_out: spec.deny_out,
        volume: attachment.as_ref().map(|a| a.volume.id.clone()),
        snapshot: spec.snapshot.as_ref().map(|s| s.node_snapshot_id.clone()),
    };
    let mut created = Err(AppError::new(lizard_api::ErrorCode::Unavailable, "no node to create the sandbox on"));
    for (node_id, node) in candidates {
        let mut request = request.clone();
        if node.forwards_api() {
            // The guest's own address for this API, forwarded by its agent.
            request
                .env
                .entry("LIZARD_API_URL".into())
                .or_insert_with(|| lizard_agent_proto::routes::FORWARD_GUEST_URL.into());
        }
        match node.create_sandbox(request).await {
            Ok(info) => {
                created = Ok((node_id, node, info));
                break;
            }
            Err(e) if e.code == lizard_api::ErrorCode::Unavailable => {
                tracing::info!(node = %node_id, "node refused a create ({}); trying the next", e.message);
                created = Err(e.into());
            }
            Err(e) => {
                created = Err(e.into());
                break;
            }
        }
    }
    let (node_id, node, info) = match created {
        Ok(created) => created,
        Err(e) => {
            if let Some(a) = &attachment {
                a.release(store).await;
            }
            return Err(e);
        }
    };
    let id = info.sandbox_id.clone();
    let record = NewSandbox {
        id: id.clone(),
        project_id: spec.project.id.clone(),
        template: spec.template,
        state: SandboxState::Running,
        created_at: ids::now_ms(),
        timeout_at: Some(spec.timeout_at),
        metadata: spec.metadata,
        meter: state.server.config.billing.pricing.meter(info.vcpus, info.memory_mib),
        on_timeout: spec.on_timeout,
        timeout_ms: Some(i64::try_from(spec.timeout_ms).unwrap_or(i64::MAX)),
        template_ref: spec.template_ref,
        node_id,
    };
    // Private before recorded: the proxy serves only recorded sandboxes, so a private one
    // is never reachable without its token.
    let mut recorded = match &spec.access {
        Some(access) => store.set_sandbox_access(&id, access).await,
        None => Ok(()),
    };
    if recorded.is_ok() {
        recorded = store.insert_sandbox(&record).await;
    }
    if let (Ok(()), Some(a)) = (&recorded, &attachment) {
        recorded = store.reassign_volume(&a.volume.id, &a.reservation, &id).await;
    }
    if let Err(e) = recorded {
        // The project went away while the VM booted: nothing may run unrecorded.
        let _ = node.kill(&id).await;
        if let Some(a) = &attachment {
            a.release(store).await;
            // Recorded, then the volume's hand-over failed: the record ends with the VM.
            let _ = store.end_sandbox(&id, ids::now_ms(), "its volume was deleted while it booted").await;
            // A forced workspace delete removed the volume's record meanwhile; its disk
            // was still held then, so it goes now.
            if matches!(store.get_volume(&spec.account_id, &a.volume.id).await, Ok(None)) {
                let _ = node.delete_volume(&a.volume.id).await;
            }
        }
        return Err(match e {
            StoreError::NotFound(_) => AppError::not_found(format!("project {} not found", spec.project.id)),
            other => other.into(),
        });
    }
    let record = store.get_sandbox(&id).await?.ok_or_else(|| AppError::internal("sandbox record vanished"))?;
    ended_while_recorded(state, &node, &id).await?;
    Ok(LiveSandbox { record, info, node })
}

/// A VM that died between its boot and its record was reported before the record
/// existed: end the record now (its meter stops) and answer as the node does.
async fn ended_while_recorded(state: &AppState, node: &Arc<dyn NodeClient>, id: &str) -> ApiResult<()> {
    match node.sandbox(id).await {
        Ok(_) => Ok(()),
        Err(gone) => {
            let prefix = format!("sandbox {id} not found: ");
            let reason = gone.message.strip_prefix(&prefix).unwrap_or("its VM stopped").to_owned();
            state.server.store.end_sandbox(id, ids::now_ms(), &reason).await?;
            Err(AppError::from(gone))
        }
    }
}

/// Stop a sandbox, delete everything in it, and end its record with `reason`.
pub async fn kill(state: &AppState, sandbox: &LiveSandbox, reason: &str) -> ApiResult<()> {
    let result = state.server.telemetry.timed(Operation::Kill, sandbox.node.kill(sandbox.id())).await;
    state.server.store.end_sandbox(sandbox.id(), ids::now_ms(), reason).await?;
    Ok(result?)
}

/// Give a sandbox `timeout_ms` to live from now; answers its record with the new end.
pub async fn set_timeout(state: &AppState, sandbox: &LiveSandbox, timeout_ms: u64) -> ApiResult<SandboxRecord> {
    let at = timeout_end(timeout_ms)?;
    let store = state.server.store.as_ref();
    store.set_sandbox_timeout(sandbox.id(), Some(at)).await?;
    store
        .get_sandbox(sandbox.id())
        .await?
        .ok_or_else(|| AppError::not_found(format!("sandbox {} not found", sandbox.id())))
}

/// Replace a running or paused sandbox's outbound policy in place (connections it no
/// longer allows stop at once); a policy that does not parse is refused before the node
/// is asked.
pub async fn set_network(sandbox: &LiveSandbox, policy: &lizard_api::network::NetworkPolicy) -> ApiResult<()> {
    policy.parse().map_err(AppError::invalid)?;
    sandbox.node.set_network(sandbox.id(), policy).await?;
    Ok(())
}

/// A byte pipe to `port` inside the running sandbox `id` (the sandbox-URL proxy): 404 when
/// no node runs it, the node's error when nothing listens there.
pub async fn open_port(state: &AppState, id: &str, port: u16) -> ApiResult<Box<dyn Tunnel>> {
    let node = placement::sandbox_node(state, id).await?;
    node.sandbox(id).await.map_err(|_| AppError::not_found(format!("sandbox {id} is not running")))?;
    Ok(node.connect_port(id, port).await?)
}

/// End the records of live sandboxes of the in-process node that it does not run (at
/// start: a dead process left them; at shutdown: the node killed them) with `reason`.
/// Remote nodes' sandboxes live on whatever this process does.
pub async fn end_unrun(state: &AppState, reason: &str) {
    let store = &state.server.store;
    let Some(local) = state.nodes.local_client() else { return };
    match store.sandboxes_due(i64::MAX).await {
        Ok(live) => {
            for s in live.into_iter().filter(|s| s.node_id == lizard_node_client::LOCAL_NODE_ID) {
                if local.sandbox(&s.id).await.is_err() {
                    let _ = store.end_sandbox(&s.id, ids::now_ms(), reason).await;
                }
            }
        }
        Err(e) => tracing::warn!("cannot list sandbox records: {e}"),
    }
}
