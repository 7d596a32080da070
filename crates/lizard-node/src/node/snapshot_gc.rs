//! Collecting template snapshots that nothing needs any more.
//!
//! A snapshot is made per template and shape (vCPUs, memory), and per everything else its
//! key covers (kernel, agent, QEMU): a create of an unusual size, or an upgrade, leaves
//! one that may never be cloned again, 130–220 MB each. One is deleted once all of these
//! hold:
//!
//! - no disk on the node backs onto its frozen disk: no sandbox's root overlay (running,
//!   paused, kept or pooled) and no fork's layer under one — every image's backing chain
//!   is followed, so a clone's disk keeps its snapshot however many forks lie between;
//! - the pool does not make machines from it;
//! - no clone was made of it for [`crate::NodeConfig::snapshot_idle`] (counted from the
//!   node's start for one not used since);
//! - it is not the latest of its template, nor the latest of its template in the node's
//!   default shape (latest: last cloned, then last made): what creates most likely need
//!   next stays.
//!
//! A paused clone's memory is a hard link to its snapshot's memory file (`vm::saved`):
//! deleting the snapshot's directory leaves the clone whole.

use super::Node;
use crate::snapshot::{self, TemplateSnapshot};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// How often the node looks for snapshots to collect.
const LOOK_EVERY: Duration = Duration::from_secs(10 * 60);

/// Longest backing chain followed (a fork of a fork of … a clone): far past any real one,
/// and a loop cannot hold the walk.
const MAX_CHAIN: usize = 64;

impl Node {
    /// Note that a clone of the snapshot `key` is being made.
    pub(super) fn snapshot_used(&self, key: &str) {
        self.snapshot_uses.lock().expect("snapshot uses poisoned").insert(key.to_owned(), Instant::now());
    }

    fn snapshot_last_used(&self, key: &str) -> Instant {
        self.snapshot_uses.lock().expect("snapshot uses poisoned").get(key).copied().unwrap_or(self.started)
    }

    /// Collect now and then, for as long as the node lives.
    pub(super) fn collect_snapshots_now_and_then(self: &Arc<Self>) {
        let node = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(LOOK_EVERY).await;
                let Some(node) = node.upgrade() else { return };
                node.collect_snapshots().await;
            }
        });
    }

    /// Delete the template snapshots that may go (see the module doc); their keys.
    pub async fn collect_snapshots(&self) -> Vec<String> {
        let dir = self.snapshots_dir();
        let roots = [self.sandboxes_dir(), self.layers_dir()];
        let scan = dir.clone();
        let (snaps, backed) = tokio::task::spawn_blocking(move || (complete_snapshots(&scan), backed_dirs(&roots)))
            .await
            .expect("snapshot scan panicked");
        let keep = self.latest(&snaps);
        let mut collected = Vec::new();
        for (snap, _) in snaps {
            let key = snap.key();
            if keep.contains(&key) || backed.contains(&snap.dir) || self.pool.uses_snapshot(&key) {
                continue;
            }
            // Under the key's lock: a create that clones it now either noted its use
            // first (and it stays) or finds it gone and makes it anew.
            let lock =
                self.snapshot_locks.lock().expect("snapshot locks poisoned").entry(key.clone()).or_default().clone();
            let _guard = lock.lock().await;
            if self.snapshot_last_used(&key).elapsed() < self.config.snapshot_idle {
                continue;
            }
            match std::fs::remove_dir_all(&snap.dir) {
                Ok(()) => {
                    let _ = std::fs::remove_file(dir.join(format!("{key}.lock")));
                    tracing::info!(template = %snap.meta.template, vcpus = snap.meta.vcpus, memory_mib = snap.meta.memory_mib, %key, "template snapshot collected: unused");
                    collected.push(key);
                }
                Err(e) => tracing::warn!(%key, "cannot collect a template snapshot: {e}"),
            }
        }
        collected
    }

    /// The keys of each template's latest snapshot, and of its latest in the node's
    /// default shape.
    fn latest(&self, snaps: &[(TemplateSnapshot, SystemTime)]) -> HashSet<String> {
        let default_shape = (self.config.default_vcpus, self.config.default_memory_mib);
        let mut latest: HashMap<(String, bool), (Instant, SystemTime, String)> = HashMap::new();
        for (snap, made) in snaps {
            let key = snap.key();
            let rank = (self.snapshot_last_used(&key), *made, key);
            let is_default = (snap.meta.vcpus, snap.meta.memory_mib) == default_shape;
            for group in [(snap.meta.template.clone(), false), (snap.meta.template.clone(), true)] {
                if group.1 && !is_default {
                    continue;
                }
                let best = latest.entry(group).or_insert_with(|| rank.clone());
                if rank > *best {
                    *best = rank.clone();
                }
            }
        }
        latest.into_values().map(|(_, _, key)| key).collect()
    }
}

/// The complete snapshots in `dir` (not those being made), with when each was made.
fn complete_snapshots(dir: &Path) -> Vec<(TemplateSnapshot, SystemTime)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let made = |s: &TemplateSnapshot| std::fs::metadata(s.dir.join("snapshot.json")).and_then(|m| m.modified());
    entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with(snapshot::TMP_PREFIX))
        .filter_map(|e| TemplateSnapshot::load(&e.path()))
        .map(|s| {
            let at = made(&s).unwrap_or(SystemTime::UNIX_EPOCH);
            (s, at)
        })
        .collect()
}

/// Every directory that holds an image some disk under `roots` (one level of
/// directories below each, and the root itself) backs onto, directly or down its chain.
fn backed_dirs(roots: &[PathBuf]) -> HashSet<PathBuf> {
    let mut backed = HashSet::new();
    let mut images = Vec::new();
    for root in roots {
        let Ok(entries) = std::fs::read_dir(root) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            match std::fs::read_dir(&path) {
                Ok(inner) => images.extend(inner.flatten().map(|e| e.path())),
                Err(_) => images.push(path),
            }
        }
    }
    for image in images.into_iter().filter(|p| p.extension().is_some_and(|e| e == "qcow2")) {
        let mut at = image;
        for _ in 0..MAX_CHAIN {
            match crate::vm::backing_file(&at) {
                Ok(Some(next)) => {
                    if let Some(dir) = next.parent() {
                        backed.insert(dir.to_path_buf());
                    }
                    at = next;
                }
                _ => break,
            }
        }
    }
    backed
}
