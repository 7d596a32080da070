//! Sandbox snapshots: take one of a running sandbox (it runs on), list, delete; creates
//! start from one in [`super::sandboxes::create`] ([`NewSandboxSpec::snapshot`]).
//!
//! A snapshot's save lives on the node of its source, so its sandboxes start there. A
//! named snapshot taken again keeps its id and gets the new save; the old save is deleted
//! (sandboxes started from it keep what they need).
//!
//! [`NewSandboxSpec::snapshot`]: super::sandboxes::NewSandboxSpec::snapshot

use super::sandboxes::LiveSandbox;
use crate::error::{ApiResult, AppError};
use crate::placement;
use crate::state::AppState;
use lizard_api::ids;
use lizard_node_client::Nodes;
use lizard_store::{SnapshotRecord, Store};

/// The prefix of snapshot ids (`snp_…`): a template name never has an underscore, so a
/// create's template that starts with it names a snapshot.
pub const ID_PREFIX: &str = "snp";

/// Whether a create's `template` is a snapshot's id.
pub fn is_snapshot_id(template: &str) -> bool {
    template.strip_prefix(ID_PREFIX).is_some_and(|rest| rest.starts_with('_'))
}

/// Save running `sandbox` as a snapshot of its project, under `name` if given.
pub async fn take(state: &AppState, sandbox: &LiveSandbox, name: Option<String>) -> ApiResult<SnapshotRecord> {
    if sandbox.is_paused() {
        return Err(AppError::conflict(format!("sandbox {} is paused: resume it first", sandbox.id())));
    }
    if let Some(name) = &name {
        ids::check_name(name).map_err(|e| AppError::invalid(format!("the snapshot's name: {e}")))?;
    }
    let saved = sandbox.node.snapshot_sandbox(sandbox.id()).await?;
    let record = &sandbox.record;
    let new = SnapshotRecord {
        id: ids::new_id(ID_PREFIX),
        account_id: record.account_id.clone(),
        workspace_id: record.workspace_id.clone(),
        project_id: record.project_id.clone(),
        node_id: record.node_id.clone(),
        node_snapshot_id: saved.id.clone(),
        source_sandbox_id: record.id.clone(),
        template: record.template.clone(),
        template_ref: record.template_ref.clone(),
        name,
        created_at: ids::now_ms(),
    };
    let (kept, replaced) = match state.server.store.put_snapshot(&new).await {
        Ok(put) => put,
        Err(e) => {
            // Nothing may stay saved unrecorded.
            let _ = sandbox.node.delete_snapshot(&saved.id).await;
            return Err(e.into());
        }
    };
    if let Some((node_id, node_snapshot_id)) = replaced {
        delete_save(state.server.store.as_ref(), &state.nodes, &node_id, &node_snapshot_id).await;
    }
    tracing::info!(snapshot = %kept.id, sandbox = %record.id, "snapshot taken");
    Ok(kept)
}

/// Forget `snapshot` and delete its save.
pub async fn delete(state: &AppState, snapshot: &SnapshotRecord) -> ApiResult<()> {
    if !state.server.store.delete_snapshot(&snapshot.account_id, &snapshot.id).await? {
        return Err(AppError::not_found(format!("snapshot {} not found", snapshot.id)));
    }
    delete_save(state.server.store.as_ref(), &state.nodes, &snapshot.node_id, &snapshot.node_snapshot_id).await;
    Ok(())
}

/// Have the reaper forget the account's snapshots that `gone` picks (those of a deleted
/// project or workspace) and delete their saves.
pub async fn remove_where(
    state: &crate::state::ServerState,
    account_id: &str,
    gone: impl Fn(&SnapshotRecord) -> bool,
) -> ApiResult<()> {
    let snapshots: Vec<_> = state.store.list_snapshots(account_id).await?.into_iter().filter(|s| gone(s)).collect();
    if !snapshots.is_empty() {
        state.reaper.remove_snapshots(snapshots).await;
    }
    Ok(())
}

/// Forget snapshots whose project went (a forced workspace delete, a project delete), and
/// delete their saves.
pub async fn remove_all(store: &dyn Store, nodes: &Nodes, snapshots: Vec<SnapshotRecord>) {
    for s in snapshots {
        match store.delete_snapshot(&s.account_id, &s.id).await {
            Ok(_) => delete_save(store, nodes, &s.node_id, &s.node_snapshot_id).await,
            Err(e) => tracing::warn!(snapshot = %s.id, "a removed project's snapshot was not forgotten: {e}"),
        }
    }
}

/// Delete a save no record names any more. A failure (its node unreachable) is logged:
/// the save only costs that node disk.
async fn delete_save(store: &dyn Store, nodes: &Nodes, node_id: &str, node_snapshot_id: &str) {
    let deleted = match placement::resolve(store, nodes, node_id).await {
        Ok(node) => node.delete_snapshot(node_snapshot_id).await.map_err(AppError::from),
        Err(e) => Err(e),
    };
    match deleted {
        Ok(()) => {}
        Err(e) if e.code() == lizard_api::ErrorCode::NotFound => {}
        Err(e) => tracing::warn!(node = node_id, save = node_snapshot_id, "a snapshot's save was not deleted: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::is_snapshot_id;

    #[test]
    fn only_a_snapshot_id_is_one() {
        assert!(is_snapshot_id("snp_0a1b"));
        for other in ["base", "snp", "snpx", "snp-x", "interpreter", "code-interpreter-v1"] {
            assert!(!is_snapshot_id(other), "{other}");
        }
    }
}
