//! Sandbox snapshots: a running sandbox saved — memory, processes and disk — under an id
//! of its own, from which new sandboxes start later, any number, after the source is
//! gone and after the node restarts (E2B's `create_snapshot`).
//!
//! A snapshot is a fork whose copies are made later ([`super::fork`]): the source's disk
//! is frozen into a layer under `<data>/layers` (the source goes on in a new overlay above
//! it) and its VM is saved once, into `<data>/sandbox-snapshots/<id>/`, beside
//! `snapshot.json` and the saved guest's secret (a copy's handshake needs it to give the
//! guest its own). A copy-on-write clone's save is the pages it changed over a hard link
//! to its base memory, kept in the snapshot's directory, so the snapshot needs nothing of
//! its template's snapshot but the disk its layer backs onto, which snapshot collection
//! follows. Layers that back a snapshot are in use ([`Node::layers_in_use`]) until it is
//! deleted, and a template with snapshots is not deleted.
//!
//! Starts from a snapshot share it for reading; a delete waits for them. What a kill's
//! layer release, a template delete and a listing ask of the snapshots is kept in memory
//! ([`SnapshotIndex`], read from the records at start), not read from the disk each time.

use super::fork::{Frozen, SourceSave};
use super::Node;
use crate::sandbox::{self, Identity, Sandbox};
use crate::sealed::SealKey;
use crate::vm::{self, Machine};
use crate::{NodeError, Result};
use lizard_agent_proto::handshake::Secret;
use lizard_api::network::NetworkPolicy;
use lizard_api::node_api::NodeSandboxSnapshot;
use lizard_api::CreateSandboxRequest;
use lizard_vmm::{Accel, DeltaSnapshot};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

const RECORD: &str = "snapshot.json";
const SECRET: &str = "secret";

/// What `snapshot.json` says of a snapshot: the source as it was saved.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    id: String,
    /// The sandbox it was taken of.
    source: String,
    template: String,
    vcpus: u32,
    memory_mib: u32,
    kernel: PathBuf,
    initramfs: PathBuf,
    accel: Accel,
    /// The source's environment, sealed with the node's key as sandbox records are.
    env_sealed: String,
    workdir: Option<String>,
    user: Option<String>,
    network_policy: NetworkPolicy,
    /// The frozen layers its copies' disks back onto, the newest last.
    layers: Vec<PathBuf>,
    /// A delta save over `base-memory` (else a full save, `state`).
    delta: bool,
    created_at_ms: u64,
}

impl Record {
    fn info(&self) -> NodeSandboxSnapshot {
        NodeSandboxSnapshot {
            id: self.id.clone(),
            source: self.source.clone(),
            template: self.template.clone(),
            vcpus: self.vcpus,
            memory_mib: self.memory_mib,
        }
    }

    fn save(&self, dir: &Path) -> SourceSave {
        if self.delta {
            SourceSave::Delta(DeltaSnapshot {
                base: dir.join(vm::BASE_MEMORY),
                delta: dir.join("delta"),
                devices: dir.join("devices"),
            })
        } else {
            SourceSave::Full(dir.join("state"))
        }
    }

    fn frozen(&self) -> Option<Frozen> {
        let machine = Machine {
            vcpus: self.vcpus,
            memory_mib: self.memory_mib,
            kernel: self.kernel.clone(),
            initramfs: self.initramfs.clone(),
            accel: self.accel,
        };
        Some(Frozen { machine, layers: self.layers.clone(), layer: self.layers.last()?.clone() })
    }

    fn read(dir: &Path) -> Option<Record> {
        serde_json::from_slice(&std::fs::read(dir.join(RECORD)).ok()?).ok()
    }

    fn write(&self, dir: &Path) -> Result<()> {
        let json = serde_json::to_vec_pretty(self).expect("records serialize");
        let tmp = dir.join(format!("{RECORD}.tmp"));
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(&json)?;
            file.sync_all()?;
            std::fs::rename(&tmp, dir.join(RECORD))?;
            std::fs::File::open(dir)?.sync_all()
        };
        write().map_err(|e| NodeError::io(format!("write {}/{RECORD}", dir.display()), e))
    }

    fn env(&self, seal: &SealKey) -> Option<BTreeMap<String, String>> {
        serde_json::from_slice(&seal.open(&self.env_sealed).ok()?).ok()
    }
}

/// The node's snapshots: each one's description and layers, as its record says.
#[derive(Default)]
pub(super) struct SnapshotIndex(Mutex<BTreeMap<String, Indexed>>);

/// One snapshot's description, and the layers its copies back onto.
type Indexed = (NodeSandboxSnapshot, Vec<PathBuf>);

impl SnapshotIndex {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Indexed>> {
        self.0.lock().expect("snapshot index poisoned")
    }

    fn insert(&self, record: &Record) {
        self.lock().insert(record.id.clone(), (record.info(), record.layers.clone()));
    }
}

/// Whether `id` can name a snapshot's directory (what [`sandbox::new_id`] makes).
fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

impl Node {
    fn sandbox_snapshots_dir(&self) -> PathBuf {
        self.config.data_dir.join("sandbox-snapshots")
    }

    /// The directory of snapshot `id`, if it holds a whole snapshot.
    fn sandbox_snapshot(&self, id: &str) -> Result<(PathBuf, Record)> {
        let missing = || NodeError::SandboxSnapshotNotFound { id: id.to_owned() };
        if !valid_id(id) {
            return Err(missing());
        }
        let dir = self.sandbox_snapshots_dir().join(id);
        Record::read(&dir).map(|r| (dir, r)).ok_or_else(missing)
    }

    /// The layers the node's snapshots' copies would back onto.
    pub(super) fn sandbox_snapshot_layers(&self) -> Vec<PathBuf> {
        self.sandbox_snapshot_index.lock().values().flat_map(|(_, layers)| layers.clone()).collect()
    }

    /// How many snapshots were taken of sandboxes of `template`.
    pub(super) fn sandbox_snapshots_of(&self, template: &str) -> usize {
        self.sandbox_snapshot_index.lock().values().filter(|(s, _)| s.template == template).count()
    }

    /// The node's snapshots.
    pub fn sandbox_snapshots(&self) -> Vec<NodeSandboxSnapshot> {
        self.sandbox_snapshot_index.lock().values().map(|(s, _)| s.clone()).collect()
    }

    /// Save running sandbox `id` as a new snapshot; it runs on. A sandbox with a volume
    /// cannot be saved (one writer per volume).
    pub async fn snapshot_sandbox(self: &Arc<Self>, id: &str) -> Result<NodeSandboxSnapshot> {
        let source = self.get(id)?;
        let node = self.clone();
        let data_dir = self.config.data_dir.clone();
        let made = tokio::spawn(async move { node.snapshot_now(&source).await }).await.expect("snapshot task panicked");
        made.map_err(|e| e.or_disk_full("save the sandbox", &data_dir))
    }

    async fn snapshot_now(self: &Arc<Self>, source: &Arc<Sandbox>) -> Result<NodeSandboxSnapshot> {
        let _transition = source.transition.lock().await;
        self.get(&source.id)?;
        let live = source.live()?;
        if source.volume.is_some() {
            return Err(NodeError::ForkWithVolume { id: source.id.clone() });
        }
        self.check_disk_headroom()?;
        let id = sandbox::new_id();
        let all = self.sandbox_snapshots_dir();
        let dir = all.join(&id);
        // Made under a temporary name and renamed whole: a directory with a record is a
        // whole snapshot, one left half made by a crash is no snapshot at all.
        let making = all.join(format!(".{id}"));
        std::fs::create_dir_all(&making).map_err(|e| NodeError::io("create the snapshot's directory", e))?;
        let save = SourceSave::of(live.vm(), source.state().own_memory, &making, "");
        let made: Result<Record> = async {
            vm::write_secret(&making.join(SECRET), &source.secret)?;
            let frozen = self.freeze_and_save(source, &live, &id, &save).await?;
            if let SourceSave::Delta(d) = &save {
                vm::link_base(&d.base, &making).map_err(|e| NodeError::io("link the base memory", e))?;
            }
            let since_epoch = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
            let record = Record {
                id: id.clone(),
                source: source.id.clone(),
                template: source.template.clone(),
                vcpus: frozen.machine.vcpus,
                memory_mib: frozen.machine.memory_mib,
                kernel: frozen.machine.kernel,
                initramfs: frozen.machine.initramfs,
                accel: frozen.machine.accel,
                env_sealed: self.seal.seal(&serde_json::to_vec(&source.env).expect("maps of strings serialize")),
                workdir: source.workdir.clone(),
                user: source.user.clone(),
                network_policy: source.network_policy(),
                layers: frozen.layers,
                delta: matches!(save, SourceSave::Delta(_)),
                created_at_ms: u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX),
            };
            record.write(&making)?;
            std::fs::rename(&making, &dir).map_err(|e| NodeError::io("name the snapshot's directory", e))?;
            self.sandbox_snapshot_index.insert(&record);
            Ok(record)
        }
        .await;
        match made {
            Ok(record) => {
                tracing::info!(id = %source.id, snapshot = %id, "sandbox snapshot taken");
                Ok(record.info())
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&making);
                Err(e)
            }
        }
    }

    /// A new sandbox started from snapshot `req.snapshot`: its processes, memory and
    /// files, its template, shape, directory and user; its environment with `req.env`
    /// over it; `req.metadata`; the network fields of `req` when it gives any, else the
    /// snapshot's policy. A size other than the snapshot's and a volume are refused.
    pub(super) async fn create_from_snapshot(
        self: &Arc<Self>,
        snapshot: &str,
        req: CreateSandboxRequest,
    ) -> Result<Arc<Sandbox>> {
        let _reading = self.sandbox_snapshot_use.read().await;
        let (dir, record) = self.sandbox_snapshot(snapshot)?;
        if req.volume.is_some() {
            return Err(NodeError::SnapshotRequest("a sandbox started from a snapshot cannot mount a volume".into()));
        }
        for (field, asked, has) in
            [("vcpus", req.vcpus, record.vcpus), ("memoryMib", req.memory_mib, record.memory_mib)]
        {
            if asked.is_some_and(|a| a != has) {
                return Err(NodeError::SnapshotRequest(format!("{field} is the snapshot's ({has}) for its sandboxes")));
            }
        }
        let network_policy =
            if req.allow_internet_access.is_some() || !req.allow_out.is_empty() || !req.deny_out.is_empty() {
                req.network_policy()
            } else {
                record.network_policy.clone()
            };
        network_policy.parse().map_err(NodeError::BadNetworkPolicy)?;
        let Some(mut env) = record.env(&self.seal) else {
            return Err(NodeError::io(
                format!("open the environment in {}/{RECORD}", dir.display()),
                std::io::Error::other("sealed with another key, or damaged"),
            ));
        };
        let source_secret = std::fs::read_to_string(dir.join(SECRET))
            .ok()
            .and_then(|hex| Secret::from_hex(hex.trim()).ok())
            .ok_or_else(|| NodeError::io("read the snapshot's secret", std::io::Error::other("missing or damaged")))?;
        let frozen = record.frozen().ok_or_else(|| NodeError::SandboxSnapshotNotFound { id: snapshot.to_owned() })?;
        self.check_disk_headroom()?;
        // Held until the sandbox is in the map (and counted there) or failed.
        let _reservation = self.reserve(1, record.vcpus, record.memory_mib)?;
        env.extend(req.env);
        let who = Identity {
            id: sandbox::new_id(),
            template: record.template.clone(),
            vcpus: record.vcpus,
            memory_mib: record.memory_mib,
            started_at: SystemTime::now(),
            metadata: req.metadata,
            env,
            workdir: record.workdir.clone(),
            user: record.user.clone(),
            from_snapshot: true,
            network_policy,
            volume: None,
        };
        let sandbox = self.fork_one(who, &source_secret, &frozen, &record.save(&dir)).await?;
        tracing::info!(id = %sandbox.id, snapshot, "sandbox started from a snapshot");
        Ok(sandbox)
    }

    /// Delete snapshot `id` (sandboxes started from it keep what they need), and the
    /// layers nothing else backs onto.
    pub async fn delete_sandbox_snapshot(&self, id: &str) -> Result<()> {
        let _writing = self.sandbox_snapshot_use.write().await;
        let (dir, record) = self.sandbox_snapshot(id)?;
        // The record first: a directory without one is no snapshot, whatever is left.
        std::fs::remove_file(dir.join(RECORD)).map_err(|e| NodeError::io("remove the snapshot's record", e))?;
        self.sandbox_snapshot_index.lock().remove(id);
        let _ = std::fs::remove_dir_all(&dir);
        let in_use = self.layers_in_use();
        for layer in record.layers.iter().filter(|l| !in_use.contains(*l)) {
            let _ = std::fs::remove_file(layer);
        }
        tracing::info!(snapshot = %id, "sandbox snapshot deleted");
        Ok(())
    }

    /// Index the snapshots an earlier node process left, and remove what one left half
    /// made (a node that stopped while saving).
    pub(super) fn take_back_sandbox_snapshots(&self) {
        let Ok(entries) = std::fs::read_dir(self.sandbox_snapshots_dir()) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            let record = Record::read(&path).filter(|_| !entry.file_name().to_string_lossy().starts_with('.'));
            match record {
                Some(record) => self.sandbox_snapshot_index.insert(&record),
                None => {
                    tracing::info!(dir = %path.display(), "removing a half-made sandbox snapshot");
                    let _ = std::fs::remove_dir_all(&path);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::valid_id;

    #[test]
    fn only_names_the_node_makes_reach_the_disk() {
        assert!(valid_id("s-0a9z"));
        for bad in ["", "..", "../x", "a/b", "A", "a b", &"a".repeat(65)] {
            assert!(!valid_id(bad), "{bad:?}");
        }
    }
}
