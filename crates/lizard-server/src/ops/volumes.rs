//! Volumes: create and delete one (record and disk kept in step), and hold one for a
//! sandbox being created (one writer at a time).
//!
//! The record comes first, the disk second: a create records the volume, then has its
//! node make the disk (and removes the record if that fails); a delete removes the record
//! (refused while a sandbox holds the volume), then the disk.
//!
//! The store holds the truth about attachments (`volumes.attached_to`): a sandbox create
//! first reserves the volume under a one-off token, boots the sandbox on the volume's
//! node, then hands the attachment to the sandbox's id. Ending the sandbox (kill,
//! timeout, loss) clears it.

use crate::error::{ApiResult, AppError};
use crate::placement;
use crate::state::AppState;
use lizard_api::ids;
use lizard_node_client::NodeClient;
use lizard_store::volumes::RESERVATION_PREFIX;
use lizard_store::{NewVolume, ProjectRecord, Store, StoreError, VolumeRecord};
use std::sync::Arc;

/// Prefix of volume ids; names may not start with it.
pub const ID_PREFIX: &str = "vol";

/// 1..=63 of `[A-Za-z0-9._-]`, starting with a letter or digit, never `vol_…` (that
/// would read as an id).
pub fn check_name(name: &str) -> ApiResult<()> {
    let ok = (1..=63).contains(&name.len())
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !name.starts_with(&format!("{ID_PREFIX}_"));
    if ok {
        Ok(())
    } else {
        Err(AppError::invalid(format!(
            "volume name must be 1..=63 of [A-Za-z0-9._-], start with a letter or digit and not with {ID_PREFIX}_; got {name:?}"
        )))
    }
}

/// Whether `name_or_id` is a volume id rather than a name.
pub fn is_id(name_or_id: &str) -> bool {
    name_or_id.starts_with(&format!("{ID_PREFIX}_"))
}

/// Record a volume of `size_gb` in `project` on a node of `region` (any when `None`),
/// then have that node make its disk. 409 when the name is taken in the project; 403 when
/// the account's or the workspace's volume quota has no room for it; 402 at
/// zero balance, as for a sandbox's create (a volume accrues from its create; existing
/// ones keep their data and accrue on, as a paused sandbox's saved state does).
pub async fn create(
    state: &AppState,
    account_id: &str,
    project: &ProjectRecord,
    name: &str,
    size_gb: u32,
    region: Option<&str>,
) -> ApiResult<VolumeRecord> {
    let store = state.server.store.as_ref();
    crate::billing::require_funds(store, account_id).await?;
    let placed = placement::place_volume(state, region).await?;
    let new = NewVolume {
        id: ids::new_id(ID_PREFIX),
        project_id: project.id.clone(),
        name: name.to_string(),
        size_gb,
        node_id: placed.at.node_id,
        region: placed.at.region,
        created_at: ids::now_ms(),
        nanos_per_sec: state.server.config.billing.pricing.volume_rate(size_gb),
        account_quota_gb: state.server.config.traffic.volume_gb_per_account,
    };
    store.insert_volume(&new).await.map_err(|e| match e {
        StoreError::NotFound(_) => AppError::not_found(format!("project {} not found", project.id)),
        other => other.into(),
    })?;
    if let Err(e) = placed.node.create_volume(&new.id, size_gb).await {
        // Nothing may stay recorded without its disk.
        let _ = store.delete_volume(account_id, &new.id).await;
        return Err(e.into());
    }
    store.get_volume(account_id, &new.id).await?.ok_or_else(|| AppError::internal("volume record vanished"))
}

/// Delete a volume's record, then its disk; 409 while a running or paused sandbox has it.
pub async fn delete(state: &AppState, account_id: &str, volume: &VolumeRecord) -> ApiResult<()> {
    let node = placement::node(state, &volume.node_id).await?;
    // The node refuses too while one of its sandboxes holds the disk: checked first, so
    // a record is never removed while its disk is in use.
    if let Some(holder) = node.volume_holder(&volume.id).await? {
        return Err(AppError::conflict(format!("volume {} is in use by sandbox {holder}", volume.name)));
    }
    let store = state.server.store.as_ref();
    let removed = match store.delete_volume(account_id, &volume.id).await {
        Err(StoreError::Conflict(msg)) => {
            if !end_dead_holder(state, account_id, &volume.id, node.as_ref()).await? {
                return Err(AppError::conflict(msg));
            }
            store.delete_volume(account_id, &volume.id).await?
        }
        other => other?,
    };
    if let Err(e) = node.delete_volume(&removed.id).await {
        tracing::warn!(volume = %removed.id, "volume record deleted but its disk remains: {}", e.message);
    }
    Ok(())
}

/// A volume reserved for a sandbox that is being created, on the node that has its disk.
pub struct Reserved {
    pub volume: VolumeRecord,
    pub reservation: String,
    pub node: Arc<dyn NodeClient>,
}

impl Reserved {
    /// Give the volume up (the create failed).
    pub async fn release(&self, store: &dyn Store) {
        if let Err(e) = store.release_volume(&self.volume.id, &self.reservation).await {
            tracing::warn!(volume = %self.volume.id, "cannot release a reservation: {e}");
        }
    }
}

/// Reserve `volume` for a new sandbox: 409 naming the sandbox that holds it.
pub async fn reserve(state: &AppState, account_id: &str, volume: VolumeRecord) -> ApiResult<Reserved> {
    let node = placement::node(state, &volume.node_id).await?;
    let reservation = format!("{RESERVATION_PREFIX}{}", ids::new_id("r"));
    let store = state.server.store.as_ref();
    match store.attach_volume(&volume.id, &reservation).await {
        Ok(()) => {}
        Err(StoreError::Conflict(msg)) => {
            if !end_dead_holder(state, account_id, &volume.id, node.as_ref()).await? {
                return Err(AppError::conflict(msg));
            }
            store.attach_volume(&volume.id, &reservation).await?;
        }
        Err(e) => return Err(e.into()),
    }
    Ok(Reserved { volume, reservation, node })
}

/// The holder of a volume may be a sandbox whose VM is gone while its record was not yet
/// ended (a crash the node noticed, nobody asked about since): end that record, which
/// lets the volume go. True when it did.
async fn end_dead_holder(
    state: &AppState,
    account_id: &str,
    volume_id: &str,
    node: &dyn NodeClient,
) -> ApiResult<bool> {
    let store = state.server.store.as_ref();
    let holder = store.get_volume(account_id, volume_id).await?.and_then(|v| v.attached_to);
    let Some(h) = holder.filter(|h| !h.starts_with(RESERVATION_PREFIX)) else { return Ok(false) };
    match node.sandbox(&h).await {
        Ok(_) => Ok(false),
        // Only a node that says "not found" has lost it; one that cannot be reached now
        // (a remote node) keeps its holder.
        Err(e) if e.code != lizard_api::ErrorCode::NotFound => Ok(false),
        Err(gone) => {
            store.end_sandbox(&h, ids::now_ms(), &gone.message).await?;
            Ok(true)
        }
    }
}
