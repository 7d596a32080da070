//! Paused sandboxes' VMMs kept a while, stopped, after their state was saved
//! ([`crate::NodeConfig::keep_paused_vm`]).
//!
//! A resume within that time continues the same process (`cont`, then a handshake that
//! sets the clock) instead of restoring the save, which costs a new VMM, writing back every
//! page the sandbox dirtied and translating the guest's code again. The save on disk is
//! the sandbox all the same, so a kept VMM can be let go at any moment: its time is up, a
//! create needs the memory it holds (it gives way like a pool machine), the sandbox is
//! killed, the node stops; after a node crash the next node kills it as the VMM of a
//! sandbox recorded paused. The next resume then restores the save.
//!
//! A VMM being let go stays listed until it has exited: it still holds the sandbox's disk
//! images (QEMU locks them), so a resume that finds it waits for its end before a new VMM
//! opens them.

use crate::sandbox::Live;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// Kept VMMs by sandbox id.
#[derive(Default)]
pub(super) struct KeptVms {
    kept: Arc<Mutex<HashMap<String, Kept>>>,
    /// Tells one keeping of a sandbox's VMM from a later one (a resume continues the
    /// same VMM, whose next pause keeps it again).
    next_token: AtomicU64,
}

struct Kept {
    live: Arc<Live>,
    token: u64,
    vcpus: u32,
    memory_mib: u32,
    since: Instant,
    /// Killed, not yet exited.
    dying: bool,
}

/// A kept VMM taken out of the list.
pub(super) enum Taken {
    /// Stopped and whole: it can continue.
    Stopped(Arc<Live>),
    /// Being let go: wait for its end ([`Taken::ended`]) before the sandbox gets a new one.
    Dying(Arc<Live>),
}

impl Taken {
    /// Kill it (if it was not already) and wait until it has exited.
    pub(super) async fn ended(self) {
        let (Taken::Stopped(live) | Taken::Dying(live)) = self;
        let _ = live.vm().kill().await;
    }
}

impl KeptVms {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Kept>> {
        lock(&self.kept)
    }

    /// Keep `live`, whose VM is stopped and saved, as sandbox `id`'s; the token names this
    /// keeping for [`KeptVms::let_go_if`].
    pub(super) fn keep(&self, id: &str, live: Arc<Live>, vcpus: u32, memory_mib: u32) -> u64 {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let kept = Kept { live, token, vcpus, memory_mib, since: Instant::now(), dying: false };
        if let Some(old) = self.map().insert(id.to_owned(), kept) {
            // Not expected (a sandbox has one VMM); never left running unlisted.
            tokio::spawn(Taken::Dying(old.live).ended());
        }
        token
    }

    /// Sandbox `id`'s kept VMM, taken out of the list.
    pub(super) fn take(&self, id: &str) -> Option<Taken> {
        self.map().remove(id).map(|k| if k.dying { Taken::Dying(k.live) } else { Taken::Stopped(k.live) })
    }

    /// Let sandbox `id`'s VMM go if it is still the one kept under `token`.
    pub(super) fn let_go_if(&self, id: &str, token: u64) {
        let mut map = self.map();
        if let Some(k) = map.get_mut(id).filter(|k| k.token == token && !k.dying) {
            self.let_go(id, k);
        }
    }

    /// Let the longest-kept VMM go; false when none is kept.
    pub(super) fn let_go_oldest(&self) -> bool {
        let mut map = self.map();
        match map.iter_mut().filter(|(_, k)| !k.dying).min_by_key(|(_, k)| k.since) {
            Some((id, k)) => {
                self.let_go(&id.clone(), k);
                true
            }
            None => false,
        }
    }

    /// Kill `k` in the background; it leaves the list once it has exited.
    fn let_go(&self, id: &str, k: &mut Kept) {
        k.dying = true;
        let (kept, live, token, id) = (self.kept.clone(), k.live.clone(), k.token, id.to_owned());
        tokio::spawn(async move {
            let _ = live.vm().kill().await;
            let mut map = lock(&kept);
            if map.get(&id).is_some_and(|k| k.token == token) {
                map.remove(&id);
            }
        });
    }

    /// Every kept VMM, taken out of the list (node shutdown).
    pub(super) fn take_all(&self) -> Vec<Taken> {
        self.map().drain().map(|(_, k)| Taken::Dying(k.live)).collect()
    }

    /// vCPUs and MiB the kept VMMs that are not being let go were admitted with.
    pub(super) fn held(&self) -> (u64, u64) {
        self.map()
            .values()
            .filter(|k| !k.dying)
            .fold((0, 0), |(c, m), k| (c + u64::from(k.vcpus), m + u64::from(k.memory_mib)))
    }
}

fn lock(map: &Mutex<HashMap<String, Kept>>) -> MutexGuard<'_, HashMap<String, Kept>> {
    map.lock().expect("kept VMMs lock poisoned")
}
