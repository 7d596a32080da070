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
pub async fn reserve(state: &AppState, p: &Principal, project: &ProjectRecord, name_or_id: &str) -> ApiResult<Reserved> {
    let volume = crate::api::volumes::volume_for(state, p, name_or_id, None, Some(&project.id)).await?;
    let node = placement::node(state, &volume.node_id)?;
    let reservation = format!("{RESERVATION_PREFIX}{}", ids::new_id("r"));
    let store = state.server.store.as_ref();
    match store.attach_volume(&volume.id, &reservation).await {
        Ok(()) => {}
        Err(StoreError::Conflict(msg)) => {
            // The holder may be a sandbox whose VM is gone while its record was not yet
            // ended (a crash noticed only by the node): end it, then try once more.
            let holder = store.get_volume(&p.account_id, &volume.id).await?.and_then(|v| v.attached_to);
            match holder {
                Some(h) if !h.starts_with(RESERVATION_PREFIX) && node.get(&h).is_err() => {
                    let why = node.get(&h).err().map(|e| e.to_string()).unwrap_or_default();
                    store.end_sandbox(&h, ids::now_ms(), &why).await.ok();
                    store.attach_volume(&volume.id, &reservation).await?;
                }
                _ => return Err(AppError::conflict(msg)),
            }
        }
        Err(e) => return Err(e.into()),
    }
    Ok(Reserved { volume, reservation, node })
}
