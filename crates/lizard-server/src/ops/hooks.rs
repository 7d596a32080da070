//! The operations behind the hooks lower layers call: the forced-delete reaper
//! ([`crate::state::SandboxReaper`], for tenancy deletes) and the billing pauser
//! ([`crate::billing::SandboxPauser`], for accounts out of credits).

use crate::billing::SandboxPauser;
use crate::nodes::Nodes;
use crate::ops::lifecycle;
use crate::state::{AppState, SandboxReaper};
use crate::store::{SandboxRecord, VolumeRecord};
use async_trait::async_trait;

/// Kills the VMs of sandboxes removed by a forced workspace delete, and deletes the
/// disks of their volumes.
pub struct NodeReaper(pub Nodes);

#[async_trait]
impl SandboxReaper for NodeReaper {
    async fn reap(&self, sandboxes: Vec<SandboxRecord>) {
        // Sandbox records do not name a node yet: they all run on the home node.
        let node = self.0.home();
        for s in sandboxes {
            if let Err(e) = node.kill(&s.id).await {
                tracing::debug!(id = %s.id, "reap: {}", e.message);
            }
        }
    }

    async fn remove_volumes(&self, volumes: Vec<VolumeRecord>) {
        for v in volumes {
            let node = match self.0.get(&v.node_id) {
                Ok(node) => node,
                Err(_) => {
                    tracing::warn!(volume = %v.id, node = %v.node_id, "volume disk on another node left in place");
                    continue;
                }
            };
            if let Err(e) = node.delete_volume(&v.id).await {
                tracing::warn!(volume = %v.id, "cannot delete the disk of a removed volume: {}", e.message);
            }
        }
    }

    async fn remove_templates(&self, template_refs: Vec<String>) {
        // Templates are built on the home node.
        let node = self.0.home();
        for r in template_refs {
            if let Err(e) = node.delete_template(&r).await {
                tracing::debug!(template_ref = %r, "removed template's node template: {}", e.message);
            }
        }
    }
}

/// Pauses sandboxes of accounts out of credits with the same pause as the route (VM
/// state saved; the sandbox can be resumed once credits are added).
pub struct BillingPauser(pub AppState);

#[async_trait]
impl SandboxPauser for BillingPauser {
    async fn pause(&self, sandbox_id: &str) -> Result<(), String> {
        lifecycle::pause(&self.0, sandbox_id).await.map_err(|e| e.to_string())
    }
}
