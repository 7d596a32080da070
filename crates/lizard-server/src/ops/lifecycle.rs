//! A sandbox's life after create: pause, resume, fork.
//!
//! A paused sandbox keeps its record (state `paused`) and its VM's saved state on the
//! node; its timeout becomes the operator's retention for paused sandboxes. A resume gives
//! it its lifetime again, counted from the resume; a fork's copies get the source's.

use crate::error::{ApiResult, AppError};
use crate::ops::sandboxes::{lifetime_end, run_to_completion, LiveSandbox};
use crate::placement;
use crate::state::AppState;
use crate::telemetry::Operation;
use lizard_api::ids;
use lizard_node_client::MAX_FORKS;
use lizard_store::{NewSandbox, SandboxState};

/// Pause the sandbox `id` and record it: the pause route, the timeout reaper and the
/// billing pauser all end here.
pub async fn pause(state: &AppState, id: &str) -> ApiResult<()> {
    let node = placement::sandbox_node(state, id).await?;
    state.server.telemetry.timed(Operation::Pause, node.pause(id)).await?;
    let store = &state.server.store;
    store.set_sandbox_state(id, SandboxState::Paused).await?;
    let retention = i64::try_from(state.server.config.paused_retention_ms).unwrap_or(i64::MAX);
    store.set_sandbox_timeout(id, Some(ids::now_ms().saturating_add(retention))).await?;
    Ok(())
}

/// Resume a paused sandbox and record it, with its lifetime counted anew.
pub async fn resume(state: &AppState, sandbox: &LiveSandbox) -> ApiResult<()> {
    state.server.telemetry.timed(Operation::Resume, sandbox.node.resume(sandbox.id())).await?;
    let store = &state.server.store;
    store.set_sandbox_state(sandbox.id(), SandboxState::Running).await?;
    store.set_sandbox_timeout(sandbox.id(), Some(lifetime_end(sandbox.record.timeout_ms)?)).await?;
    Ok(())
}

/// Resume a paused sandbox for a request to it, as a connect would (its access rule says
/// a request wakes it: E2B's `autoResume`); one running already is left as it is.
pub async fn wake(state: &AppState, id: &str) -> ApiResult<()> {
    let store = state.server.store.as_ref();
    let record =
        store.get_sandbox(id).await?.ok_or_else(|| AppError::not_found(format!("sandbox {id} is not running")))?;
    crate::billing::require_funds(store, &record.account_id).await?;
    let sandbox = crate::ops::sandboxes::live(state, record).await?;
    if sandbox.is_paused() {
        resume(state, &sandbox).await?;
    }
    Ok(())
}

/// 422 unless `count` is 1..=[`MAX_FORKS`].
pub fn check_fork_count(count: u32) -> ApiResult<()> {
    if !(1..=MAX_FORKS).contains(&count) {
        return Err(AppError::invalid(format!("count must be 1..={MAX_FORKS}, got {count}")));
    }
    Ok(())
}

/// `count` copies of a running sandbox, processes and memory included, recorded in its
/// project with its lifetime. Nothing runs unrecorded: copies not recorded are killed.
///
/// Runs in its own task (see [`crate::ops::sandboxes::create`]): a client that goes away
/// cannot leave copies running unrecorded.
pub async fn fork(state: &AppState, source: &LiveSandbox, count: u32) -> ApiResult<Vec<LiveSandbox>> {
    check_fork_count(count)?;
    let (state, source) = (state.clone(), source.clone());
    run_to_completion(
        async move { state.server.telemetry.timed(Operation::Fork, fork_now(&state, &source, count)).await },
    )
    .await
}

async fn fork_now(state: &AppState, source: &LiveSandbox, count: u32) -> ApiResult<Vec<LiveSandbox>> {
    let copies = source.node.fork(source.id(), count).await?;
    let store = state.server.store.as_ref();
    let timeout_at = lifetime_end(source.record.timeout_ms)?;
    let mut out = Vec::with_capacity(copies.len());
    for (i, copy) in copies.iter().enumerate() {
        let record = NewSandbox {
            id: copy.sandbox_id.clone(),
            project_id: source.record.project_id.clone(),
            template: source.record.template.clone(),
            state: SandboxState::Running,
            created_at: ids::now_ms(),
            timeout_at: Some(timeout_at),
            metadata: source.record.metadata.clone(),
            on_timeout: source.record.on_timeout,
            timeout_ms: source.record.timeout_ms,
            template_ref: source.record.template_ref.clone(),
            // Copies run where their source runs.
            node_id: source.record.node_id.clone(),
            meter: state.server.config.billing.pricing.meter(copy.vcpus, copy.memory_mib),
        };
        // A private source's copies answer to its token, from before they are recorded.
        let recorded = match store.copy_sandbox_access(source.id(), &copy.sandbox_id).await {
            Ok(()) => store.insert_sandbox(&record).await,
            Err(e) => Err(e),
        };
        if let Err(e) = recorded {
            for c in &copies[i..] {
                let _ = source.node.kill(&c.sandbox_id).await;
            }
            return Err(e.into());
        }
        let record =
            store.get_sandbox(&copy.sandbox_id).await?.ok_or_else(|| AppError::internal("sandbox record vanished"))?;
        out.push(LiveSandbox { record, info: copy.clone(), node: source.node.clone() });
    }
    Ok(out)
}
