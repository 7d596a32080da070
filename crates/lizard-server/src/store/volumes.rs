//! The volume part of the store: nodes (where volumes live) and volumes, with the
//! attachment that enforces one writer per volume.
//!
//! Part of [`super::Store`] (a supertrait), kept apart so the volume rules read in one
//! place. Attachment is a column on the volume, set and cleared atomically: `attached_to`
//! names the sandbox that holds the volume (running or paused), or a
//! [`RESERVATION_PREFIX`] token while a sandbox that asked for it boots. Ending the
//! sandbox ([`super::Store::end_sandbox`]) clears it in the same transaction.

use super::{Result, Scope};
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
