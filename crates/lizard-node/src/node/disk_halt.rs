//! VMs halted by a full disk.
//!
//! QEMU stops a VM whose disk write fails for want of space on the host (its default
//! `werror=enospc`) and retries the write when the VM continues. Nothing is lost, but a
//! halted guest answers nothing: left alone, every operation on it hangs and it never
//! runs again. The node sees the halt the moment the VMM reports it, refuses the
//! sandbox's operations with UNAVAILABLE meanwhile ([`crate::Sandbox::live`]), says so in
//! its log, and continues the VM once the data directory's filesystem has room again.

use super::Node;
use crate::error::{free_bytes, DISK_FULL_BELOW};
use crate::sandbox::{Live, Sandbox};
use std::sync::Arc;
use std::time::Duration;

/// Free space at which a halted VM is continued: well above what counts as full, so
/// that one freed block does not wake every halted VM into the next failed write.
pub const CONTINUE_ABOVE: u64 = 4 * DISK_FULL_BELOW;

/// How often a halted VM's node looks for room.
const LOOK_EVERY: Duration = Duration::from_secs(1);

impl Node {
    /// For as long as `live` is `sandbox`'s VM: each time it halts on a disk error, wait
    /// for room on the data directory's filesystem, then continue it.
    pub(super) fn tend_disk_halts(self: &Arc<Self>, sandbox: Arc<Sandbox>, live: Arc<Live>) {
        let node = Arc::downgrade(self);
        let mut halts = live.vm().io_halt();
        tokio::spawn(async move {
            let current = || sandbox.state().live.as_ref().is_some_and(|l| Arc::ptr_eq(l, &live));
            loop {
                let halt = tokio::select! {
                    halt = halts.wait_for(Option::is_some) => match halt {
                        Ok(halt) => halt.clone().unwrap_or_default(),
                        Err(_) => return,
                    },
                    _ = live.vm().wait() => return,
                };
                if !current() {
                    return;
                }
                let data_dir = match node.upgrade() {
                    Some(node) => {
                        // No subscriber is no error: nobody bills.
                        let _ = node.halts.send((sandbox.id.clone(), true));
                        node.config.data_dir.clone()
                    }
                    None => return,
                };
                tracing::error!(
                    id = %sandbox.id, disk = %halt.disk, no_space = halt.no_space,
                    free = ?free_bytes(&data_dir),
                    "the sandbox's VM halted: a write to its disk failed on this node; it continues once {} has {CONTINUE_ABOVE} bytes free",
                    data_dir.display()
                );
                loop {
                    tokio::time::sleep(LOOK_EVERY).await;
                    if !live.vm().is_running() || !current() || node.strong_count() == 0 {
                        return;
                    }
                    if halts.borrow().is_some() && free_bytes(&data_dir).is_some_and(|free| free >= CONTINUE_ABOVE) {
                        // Not while a pause, fork or kill of it is under way.
                        let _transition = sandbox.transition.lock().await;
                        if current() && halts.borrow().is_some() {
                            match live.vm().resume().await {
                                Ok(()) => {
                                    tracing::info!(id = %sandbox.id, "the halted VM continues: the node's disk has room again")
                                }
                                Err(e) => tracing::warn!(id = %sandbox.id, "cannot continue the halted VM: {e}"),
                            }
                        }
                    }
                    if halts.borrow().is_none() {
                        let _ = node.upgrade().map(|n| n.halts.send((sandbox.id.clone(), false)));
                        break;
                    }
                }
            }
        });
    }
}
