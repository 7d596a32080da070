//! Sandbox snapshots: a running sandbox saved on its node under an id of its own, which
//! creates in its project start from (see `lizard_node`'s sandbox snapshots).
//!
//! [`super::sql`] implements it.

use super::Result;
use async_trait::async_trait;

/// A snapshot as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRecord {
    pub id: String,
    pub account_id: String,
    pub workspace_id: String,
    pub project_id: String,
    /// The node that holds the save, and the save's id there.
    pub node_id: String,
    pub node_snapshot_id: String,
    /// The sandbox it was last taken of.
    pub source_sandbox_id: String,
    /// That sandbox's template, as its record names it, and its node template.
    pub template: String,
    pub template_ref: Option<String>,
    /// At most one snapshot of a project has a name.
    pub name: Option<String>,
    pub created_at: i64,
}

#[async_trait]
pub trait SnapshotStore: Send + Sync {
    /// Record `snapshot`; with a name that a snapshot of its project has already, that
    /// snapshot takes its save instead (node, save, source, time) and keeps its id. Returns
    /// the record as it now is, and the save it replaced (`(node_id, node_snapshot_id)`),
    /// which the caller deletes.
    async fn put_snapshot(&self, snapshot: &SnapshotRecord) -> Result<(SnapshotRecord, Option<(String, String)>)>;
    /// The account's snapshot `id`.
    async fn get_snapshot(&self, account_id: &str, id: &str) -> Result<Option<SnapshotRecord>>;
    /// The snapshot of `project_id` named `name`.
    async fn snapshot_named(&self, account_id: &str, project_id: &str, name: &str) -> Result<Option<SnapshotRecord>>;
    /// The account's snapshots, oldest first.
    async fn list_snapshots(&self, account_id: &str) -> Result<Vec<SnapshotRecord>>;
    /// Forget the account's snapshot `id`; false when there was none.
    async fn delete_snapshot(&self, account_id: &str, id: &str) -> Result<bool>;
}

/// The columns every query reads, in [`SnapshotRecord`]'s order.
pub(super) const COLUMNS: &str = "id, account_id, workspace_id, project_id, node_id, node_snapshot_id, \
     source_sandbox_id, template, template_ref, name, created_at";
