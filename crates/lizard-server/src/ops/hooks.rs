//! The operations behind the hooks lower layers call: the forced-delete reaper
//! ([`crate::state::SandboxReaper`], for tenancy deletes) and the billing pauser
//! ([`crate::billing::SandboxPauser`], for accounts out of credits).

use crate::billing::SandboxPauser;
use crate::ops::lifecycle;
use crate::placement;
use crate::state::{AppState, SandboxReaper};
use async_trait::async_trait;
use lizard_node_client::Nodes;
use lizard_store::{SandboxRecord, Store, VolumeRecord};
use std::sync::Arc;

/// Kills the VMs of sandboxes removed by a forced workspace delete, and deletes the
/// disks of their volumes, each on the node its record names.
pub struct NodeReaper {
    pub nodes: Nodes,
    pub store: Arc<dyn Store>,
}

#[async_trait]
impl SandboxReaper for NodeReaper {
    async fn reap(&self, sandboxes: Vec<SandboxRecord>) {
        for s in sandboxes {
            let killed = match placement::resolve(self.store.as_ref(), &self.nodes, &s.node_id).await {
                Ok(node) => node.kill(&s.id).await.map_err(|e| e.message),
                Err(e) => Err(e.0.message),
            };
            // A node that cannot be reached now is told to stop it at its next heartbeat.
            if let Err(e) = killed {
                tracing::debug!(id = %s.id, "reap: {e}");
            }
        }
    }

    async fn remove_snapshots(&self, snapshots: Vec<lizard_store::SnapshotRecord>) {
        super::snapshots::remove_all(self.store.as_ref(), &self.nodes, snapshots).await;
    }

    async fn remove_volumes(&self, volumes: Vec<VolumeRecord>) {
        for v in volumes {
            let node = match placement::resolve(self.store.as_ref(), &self.nodes, &v.node_id).await {
                Ok(node) => node,
                Err(e) => {
                    tracing::warn!(volume = %v.id, node = %v.node_id, "volume disk left on its node: {}", e.0.message);
                    continue;
                }
            };
            if let Err(e) = node.delete_volume(&v.id).await {
                tracing::warn!(volume = %v.id, "cannot delete the disk of a removed volume: {}", e.message);
            }
        }
    }

    async fn remove_templates(&self, template_refs: Vec<String>) {
        for r in template_refs {
            let deleted = super::templates::delete_node_template(self.store.as_ref(), &self.nodes, &r).await;
            if let Err(e) = deleted {
                tracing::debug!(template_ref = %r, "removed template's node template: {}", e.message);
            }
        }
    }
}

/// Pauses sandboxes of accounts out of credits with the same pause as the route (VM
/// state saved; the sandbox can be resumed once credits are added), and cancels their
/// template builds (metered too: a build has no state to keep).
pub struct BillingPauser(pub AppState);

#[async_trait]
impl SandboxPauser for BillingPauser {
    async fn pause(&self, meter_id: &str) -> Result<(), String> {
        if super::templates::is_build_id(meter_id) {
            let build = self.0.server.store.get_build(meter_id).await.map_err(|e| e.to_string())?;
            let build = build.ok_or_else(|| format!("build {meter_id} not found"))?;
            return super::templates::cancel(&self.0, &build).await.map_err(|e| e.to_string());
        }
        lifecycle::pause(&self.0, meter_id).await.map_err(|e| e.to_string())
    }
}
