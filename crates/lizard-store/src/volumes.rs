//! The volume part of the store: nodes (where volumes live) and volumes, with the
//! attachment that enforces one writer per volume.
//!
//! Part of [`super::Store`] (a supertrait), kept apart so the volume rules read in one
//! place. Attachment is a column on the volume, set and cleared atomically: `attached_to`
//! names the sandbox that holds the volume (running or paused), or a
//! [`RESERVATION_PREFIX`] token while a sandbox that asked for it boots. Ending the
//! sandbox ([`super::Store::end_sandbox`]) clears it in the same transaction.

use super::{Result, Scope, StoreError};
use async_trait::async_trait;

/// `attached_to` of a volume whose sandbox is still being created.
pub const RESERVATION_PREFIX: &str = "creating:";

/// A node: a host that runs sandboxes and keeps volume disks, in one region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    pub id: String,
    pub region: String,
    pub created_at: i64,
}

/// A node with how many volumes live on it (for placement).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLoad {
    pub node: NodeRecord,
    pub volumes: u64,
}

/// A volume to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewVolume {
    pub id: String,
    pub project_id: String,
    pub name: String,
    pub size_gb: u32,
    pub node_id: String,
    pub region: String,
    pub created_at: i64,
    /// What its storage costs a second (its meter runs from `created_at` to its delete).
    pub nanos_per_sec: i64,
    /// GiB of volumes its account may hold, all workspaces together.
    pub account_quota_gb: u32,
}

/// The quota of a new volume's project's ($1) workspace, and the GiB of volumes its
/// account and that workspace hold: read in the volume's write transaction,
/// so that creates at once cannot pass a quota together. (One text for both engines.)
pub(super) const QUOTA_USE: &str = "SELECT w.volume_quota_gb, \
     (SELECT CAST(COALESCE(SUM(v.size_gb), 0) AS BIGINT) FROM volumes v JOIN projects vp ON vp.id = v.project_id \
      JOIN workspaces vw ON vw.id = vp.workspace_id WHERE vw.account_id = w.account_id) AS account_used, \
     (SELECT CAST(COALESCE(SUM(v.size_gb), 0) AS BIGINT) FROM volumes v JOIN projects vp ON vp.id = v.project_id \
      WHERE vp.workspace_id = w.id) AS workspace_used \
     FROM projects p JOIN workspaces w ON w.id = p.workspace_id WHERE p.id = $1";

/// Refuse a volume of `size_gb` that its account's or its workspace's quota has no
/// room for, saying which quota, how much is used and what is left.
/// The quota column as it is read (None: no quota of its own).
pub(super) fn quota_gb(column: Option<i64>) -> Option<u32> {
    column.map(|q| u32::try_from(q).unwrap_or(u32::MAX))
}

pub(super) fn check_quota(size_gb: u32, account: (u32, i64), workspace: Option<(u32, i64)>) -> Result<()> {
    let over = |whose: &str, (quota, used): (u32, i64)| {
        let left = (i64::from(quota) - used).max(0);
        (used + i64::from(size_gb) > i64::from(quota)).then(|| {
            StoreError::OverQuota(format!(
                "a volume of {size_gb} GiB does not fit the {whose}'s volume quota of {quota} GiB: {used} GiB in use, {left} GiB left"
            ))
        })
    };
    match workspace.and_then(|w| over("workspace", w)).or_else(|| over("account", account)) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// A recorded volume, with where it lives in the tenancy tree (for scope checks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRecord {
    pub id: String,
    pub account_id: String,
    pub workspace_id: String,
    pub project_id: String,
    pub name: String,
    pub size_gb: u32,
    pub node_id: String,
    pub region: String,
    pub created_at: i64,
    /// The sandbox that holds it, or a reservation while one is created.
    pub attached_to: Option<String>,
}

#[async_trait]
pub trait VolumeStore: Send + Sync {
    /// Insert a node or update its region.
    async fn upsert_node(&self, node: &NodeRecord) -> Result<()>;

    /// Every node with its volume count, oldest first.
    async fn node_loads(&self) -> Result<Vec<NodeLoad>>;

    /// Conflict when the project already has a volume of this name; NotFound when the
    /// project is gone.
    async fn insert_volume(&self, volume: &NewVolume) -> Result<()>;

    /// A volume of the account by id.
    async fn get_volume(&self, account_id: &str, volume_id: &str) -> Result<Option<VolumeRecord>>;

    /// A volume of the account by project and name.
    async fn find_volume(&self, account_id: &str, project_id: &str, name: &str) -> Result<Option<VolumeRecord>>;

    /// The account's volumes (of one project when given) that `scope` reaches, oldest
    /// first.
    async fn list_volumes(
        &self,
        account_id: &str,
        scope: Option<&Scope>,
        project_id: Option<&str>,
    ) -> Result<Vec<VolumeRecord>>;

    /// Delete a volume's record; atomically refuse (Conflict, naming the holder) while it
    /// is attached. NotFound when it is not the account's.
    async fn delete_volume(&self, account_id: &str, volume_id: &str) -> Result<VolumeRecord>;

    /// Attach a volume to `holder` unless something holds it: Conflict naming the holder.
    async fn attach_volume(&self, volume_id: &str, holder: &str) -> Result<()>;

    /// Hand an attachment from `from` (a reservation) to `to` (the sandbox); NotFound
    /// when `from` no longer holds it.
    async fn reassign_volume(&self, volume_id: &str, from: &str, to: &str) -> Result<()>;

    /// Detach a volume if `holder` holds it.
    async fn release_volume(&self, volume_id: &str, holder: &str) -> Result<()>;

    /// Clear attachments no live sandbox backs: reservations of creates a crashed
    /// process never finished, and holders that ended or no longer exist. Returns how
    /// many it cleared.
    async fn release_stale_attachments(&self) -> Result<u64>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_name_the_one_that_refuses() {
        assert!(check_quota(10, (20, 10), None).is_ok());
        let e = check_quota(11, (20, 10), None).unwrap_err().to_string();
        assert!(e.contains("account's volume quota of 20 GiB: 10 GiB in use, 10 GiB left"), "{e}");
        let e = check_quota(3, (20, 0), Some((5, 3))).unwrap_err().to_string();
        assert!(e.contains("workspace's volume quota of 5 GiB: 3 GiB in use, 2 GiB left"), "{e}");
        // A workspace quota above the account's leaves the account's in force.
        let e = check_quota(8, (20, 15), Some((50, 0))).unwrap_err().to_string();
        assert!(e.contains("account's"), "{e}");
        assert!(matches!(check_quota(1, (0, 0), None), Err(StoreError::OverQuota(_))));
    }
}
