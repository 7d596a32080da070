//! Attaching a volume to a sandbox being created: one writer at a time.
//!
//! The store holds the truth (`volumes.attached_to`); a create first reserves the
//! volume under a one-off token, boots the sandbox on the volume's node, then hands the
//! attachment to the sandbox's id. Ending the sandbox (kill, timeout, loss) clears it.

use crate::api::AppState;
use crate::auth::Principal;
use crate::error::{ApiResult, AppError};
use crate::store::volumes::RESERVATION_PREFIX;
use crate::store::{ProjectRecord, Store, StoreError, VolumeRecord};
use crate::{ids, placement};
use std::sync::Arc;

/// A volume reserved for a sandbox that is being created.
pub struct Reserved {
    pub volume: VolumeRecord,
    pub reservation: String,
    pub node: Arc<lizard_node::Node>,
}

impl Reserved {
    /// Give the volume up (the create failed).
    pub async fn release(&self, store: &dyn Store) {
        if let Err(e) = store.release_volume(&self.volume.id, &self.reservation).await {
            tracing::warn!(volume = %self.volume.id, "cannot release a reservation: {e}");
        }
    }
}

/// Reserve the volume `name_or_id` of `project` for a new sandbox: 404 when the project
/// has no such volume, 409 naming the sandbox that holds it.
pub async fn reserve(
    state: &AppState,
    p: &Principal,
    project: &ProjectRecord,
    name_or_id: &str,
) -> ApiResult<Reserved> {
    let volume = crate::api::volumes::volume_for(state, p, name_or_id, None, Some(&project.id)).await?;
    let node = placement::node(state, &volume.node_id)?;
    let reservation = format!("{RESERVATION_PREFIX}{}", ids::new_id("r"));
    let store = state.server.store.as_ref();
    match store.attach_volume(&volume.id, &reservation).await {
        Ok(()) => {}
        Err(StoreError::Conflict(msg)) => {
            if !end_dead_holder(state, p, &volume.id, &node).await? {
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
pub async fn end_dead_holder(
    state: &AppState,
    p: &Principal,
    volume_id: &str,
    node: &lizard_node::Node,
) -> ApiResult<bool> {
    let store = state.server.store.as_ref();
    let holder = store.get_volume(&p.account_id, volume_id).await?.and_then(|v| v.attached_to);
    let Some(h) = holder.filter(|h| !h.starts_with(RESERVATION_PREFIX)) else { return Ok(false) };
    match node.get(&h) {
        Ok(_) => Ok(false),
        Err(gone) => {
            store.end_sandbox(&h, ids::now_ms(), &gone.to_string()).await?;
            Ok(true)
        }
    }
}
