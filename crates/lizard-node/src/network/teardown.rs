//! Sandbox networks are removed without blocking a runtime: removing a namespace and its
//! link (a netlink request, an unmount) blocks, and it happens when a sandbox's network is
//! dropped, which can be on any runtime thread. On a multi-thread runtime's worker the
//! teardown runs in `block_in_place` (the worker's other tasks move to another thread, and
//! the caller — a kill — goes on only once the network is gone); on a current-thread
//! runtime, which must not block at all, it runs on a thread of its own, tracked here.
//! Either way the slot is freed only when the teardown is done (no slot is reused
//! half-removed), and the node waits for tracked ones before it exits
//! ([`Teardowns::settle`]), so none is cut off by the process ending. What a killed
//! process could not finish, the next start sweeps.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Teardowns still running.
#[derive(Debug, Default)]
pub(super) struct Teardowns {
    pending: Mutex<usize>,
    idle: Condvar,
}

impl Teardowns {
    /// Run `teardown` (which removes `slot`'s namespace and link, then frees the slot) on a
    /// thread of its own.
    pub(super) fn start(self: &Arc<Self>, slot: u32, teardown: impl FnOnce() + Send + 'static) {
        *self.pending.lock().expect("teardown count lock") += 1;
        let this = self.clone();
        let job = move || {
            teardown();
            let mut pending = this.pending.lock().expect("teardown count lock");
            *pending -= 1;
            this.idle.notify_all();
        };
        if let Err(e) = std::thread::Builder::new().name("lizard-net-teardown".into()).spawn(job) {
            // No thread to be had: the slot is free again with its leftovers, which its
            // next user removes first (`Network::attach`), or the next start sweeps.
            tracing::warn!(slot, "cannot start a network teardown: {e}");
            *self.pending.lock().expect("teardown count lock") -= 1;
        }
    }

    /// Wait until no teardown runs, at most `limit`; whether none does.
    pub(super) async fn settle(self: &Arc<Self>, limit: Duration) -> bool {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let pending = this.pending.lock().expect("teardown count lock");
            let (pending, _) = this.idle.wait_timeout_while(pending, limit, |p| *p > 0).expect("teardown count lock");
            *pending == 0
        })
        .await
        .unwrap_or(false)
    }
}
