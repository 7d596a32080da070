//! [`Node`]: one host's sandboxes, and everything the node does to them.
//!
//! - this file: the node itself — start, the sandbox map and what ended sandboxes left
//!   behind (tombstones), lookups, the accelerator, per-sandbox networks.
//! - [`create`]: create a sandbox (cold boot, or a clone of the template's snapshot).
//! - [`lifecycle`]: pause, resume, kill, shutdown, and watching VMs that die.
//! - [`disk_halt`]: VMs halted by a full disk, refused meanwhile and continued once
//!   space returns.
//! - [`pool`]: machines made ahead of demand (pre-spawned VMMs, warm pools).
//! - [`kept`]: paused sandboxes' stopped VMMs, kept a while for a quick resume.
//! - [`fork`]: copies of a running sandbox, and the frozen disk layers they share.
//! - [`sandbox_snapshots`]: running sandboxes saved under an id, to start sandboxes from later.
//! - [`restart`]: what a node takes back from, or sweeps after, an earlier node process.
//! - [`volumes`]: volume disks and which sandbox holds each.
//! - [`build`]: building templates from recipes in microVMs, and deleting them.

mod build;
mod builtin;
mod builtin_layers;
mod create;
mod disk_halt;
mod fork;
mod kept;
mod lifecycle;
mod pool;
mod restart;
mod sandbox_snapshots;
mod snapshot_gc;
mod volumes;

pub use build::{BuildTemplate, BuiltTemplate};
pub use fork::MAX_FORKS;

use crate::assets::Assets;
use crate::error::EndReason;
use crate::layer_store::LayerStore;
use crate::sandbox::Sandbox;
use crate::templates::{NodeTemplate, Registry};
use crate::{forward, network, snapshot, vm, NodeConfig, NodeError, Result};
use lizard_api::SandboxInfo;
use lizard_image::ImageStore;
use lizard_vmm::{Accel, Backend};
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// How many ended sandboxes the node remembers, to say why an id is gone.
const TOMBSTONES: usize = 4096;
/// How many ends a slow [`Node::ended_sandboxes`] subscriber may fall behind before it
/// is told it lagged (and must look at every sandbox again).
const ENDS_BUFFERED: usize = 1024;

/// One host's sandboxes.
pub struct Node {
    config: NodeConfig,
    /// Held until [`Node::shutdown`]: one node process per data directory.
    dir_lock: Mutex<Option<nix::fcntl::Flock<std::fs::File>>>,
    assets: Assets,
    backend: Arc<dyn Backend>,
    /// Sandbox networking, when configured.
    network: Option<Arc<network::Network>>,
    accel: tokio::sync::OnceCell<Accel>,
    sandboxes: RwLock<HashMap<String, Arc<Sandbox>>>,
    /// Ended sandboxes and why, newest last.
    tombstones: Mutex<VecDeque<(String, EndReason)>>,
    /// Every end as it happens ([`Node::ended_sandboxes`]): the control plane stops a
    /// dead VM's meter at once instead of at the next call that touches it.
    ends: tokio::sync::broadcast::Sender<(String, EndReason)>,
    /// Sandboxes whose VM a disk error halted (`true`) or that run again (`false`).
    halts: tokio::sync::broadcast::Sender<(String, bool)>,
    /// The pool of forwarded API connections beyond each sandbox's reserved ones.
    forward_slots: forward::SharedSlots,
    /// One lock per snapshot key: the first create of a template builds its snapshot,
    /// the ones behind it wait for it.
    snapshot_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// When a clone was last made of each snapshot key (see [`snapshot_gc`]).
    snapshot_uses: Mutex<HashMap<String, std::time::Instant>>,
    /// When this node process started.
    started: std::time::Instant,
    /// Volume id → the sandbox that holds it (being created, running or paused): one
    /// writer per volume.
    volume_holders: Mutex<HashMap<String, String>>,
    /// Templates this node built.
    templates: Registry,
    /// Their disk layers.
    template_layers: LayerStore,
    /// The step layers of built-ins' last builds, kept for their next ones.
    builtin_layers: builtin_layers::BuiltinLayers,
    /// Template builds under way (leftover temporary layers are swept only when none is).
    builds_running: std::sync::atomic::AtomicUsize,
    /// Templates that creates and builds under way use (name → how many), before any
    /// sandbox of theirs is in the map: a delete refuses while one is.
    template_claims: Mutex<HashMap<String, usize>>,
    /// Machines made ahead of demand.
    pool: pool::Pool,
    /// Paused sandboxes' VMMs, stopped and kept for a while.
    kept: kept::KeptVms,
    /// Restores that may run at once ([`NodeConfig::max_concurrent_restores`]); a tokio
    /// semaphore serves waiters in order.
    restores: tokio::sync::Semaphore,
    /// Seals what sandbox records keep of their environment.
    seal: crate::sealed::SealKey,
    /// Whether VMMs run jailed, and admission by CPUs and memory.
    confinement: crate::confine::Confinement,
    /// Starts from sandbox snapshots read them; a snapshot's delete waits for them.
    sandbox_snapshot_use: tokio::sync::RwLock<()>,
    /// The node's sandbox snapshots, as their records say.
    sandbox_snapshot_index: sandbox_snapshots::SnapshotIndex,
}

/// A create or build under way that uses a template (released on drop).
pub(super) struct TemplateClaim<'a> {
    claims: &'a Mutex<HashMap<String, usize>>,
    name: String,
}

impl Drop for TemplateClaim<'_> {
    fn drop(&mut self) {
        let mut claims = self.claims.lock().expect("template claims poisoned");
        if let Some(n) = claims.get_mut(&self.name) {
            *n -= 1;
            if *n == 0 {
                claims.remove(&self.name);
            }
        }
    }
}

/// Lock `<data_dir>/node.lock` for this process (its pid written in it for the message of
/// a second one), or say which process has it.
fn lock_data_dir(data_dir: &std::path::Path) -> Result<nix::fcntl::Flock<std::fs::File>> {
    use std::io::{Read, Seek, Write};
    let path = data_dir.join("node.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| NodeError::io(format!("open {}", path.display()), e))?;
    let mut lock = match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(lock) => lock,
        Err((mut file, _)) => {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            return Err(NodeError::DataDirInUse { dir: data_dir.to_owned(), pid: pid.trim().parse().ok() });
        }
    };
    let write = |f: &mut std::fs::File| -> std::io::Result<()> {
        f.set_len(0)?;
        f.rewind()?;
        write!(f, "{}", std::process::id())
    };
    write(&mut lock).map_err(|e| NodeError::io(format!("write {}", path.display()), e))?;
    Ok(lock)
}

impl Node {
    /// A turn to restore a VM (creates, pool machines, fork copies), waited for in order.
    async fn restore_permit(&self) -> tokio::sync::SemaphorePermit<'_> {
        self.restores.acquire().await.expect("the restore semaphore is never closed")
    }

    /// Open the node's data directory, cleaning up anything a previous process left.
    pub async fn start(mut config: NodeConfig) -> Result<Arc<Node>> {
        // Disk overlays and VMM arguments name these paths; relative ones would resolve
        // against the wrong directory.
        for dir in [&mut config.data_dir, &mut config.image_root] {
            *dir = std::path::absolute(&*dir).map_err(|e| NodeError::io(format!("resolve {}", dir.display()), e))?;
        }
        // Sandbox and snapshot directories hold VMM control sockets, secrets and guest
        // memory: owner only.
        use std::os::unix::fs::PermissionsExt;
        let dirs = [
            Some("sandboxes"),
            config.snapshots.then_some("snapshots"),
            Some("volumes"),
            Some("templates"),
            Some("template-layers"),
        ];
        let (confinement, jail) = crate::confine::Confinement::start(&config.confine);
        // Jailed VMMs pass through these (never list them) to their own directories.
        let mode = if jail.is_some() { 0o711 } else { 0o700 };
        for dir in dirs.into_iter().flatten().map(|d| config.data_dir.join(d)) {
            std::fs::create_dir_all(&dir).map_err(|e| NodeError::io(format!("create {}", dir.display()), e))?;
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode));
        }
        if jail.is_some() {
            crate::confine::let_vmms_pass(&[&config.data_dir, &config.image_root]);
        }
        let mut backend = lizard_vmm::qemu::QemuBackend::with_binary(&config.qemu_binary);
        if let Some(policy) = jail {
            backend = backend.confined(policy);
        } else if let crate::confine::ConfineStatus::Refused { missing } = &confinement.status {
            backend = backend.refusing(missing.join(", "));
        }
        // Before anything is swept: what looks left over may be another live node's.
        let dir_lock = lock_data_dir(&config.data_dir)?;
        let seal = crate::sealed::SealKey::load_or_create(&config.data_dir)?;
        let network = match &config.network {
            Some(c) => Some(network::Network::start(c.clone()).await?),
            None => None,
        };
        let node = Arc::new(Node {
            dir_lock: Mutex::new(Some(dir_lock)),
            network,
            assets: Assets::new(
                ImageStore::new(&config.image_root),
                config.agent_bin.clone(),
                config.guest_cli.clone(),
            ),
            backend: Arc::new(backend),
            accel: tokio::sync::OnceCell::new(),
            sandboxes: RwLock::new(HashMap::new()),
            tombstones: Mutex::new(VecDeque::new()),
            ends: tokio::sync::broadcast::Sender::new(ENDS_BUFFERED),
            halts: tokio::sync::broadcast::Sender::new(ENDS_BUFFERED),
            forward_slots: forward::SharedSlots::new(config.api_forward_shared.max(1)),
            snapshot_locks: Mutex::new(HashMap::new()),
            snapshot_uses: Mutex::new(HashMap::new()),
            started: std::time::Instant::now(),
            volume_holders: Mutex::new(HashMap::new()),
            templates: Registry::open(&config.data_dir.join("templates")),
            template_layers: LayerStore::new(config.data_dir.join("template-layers")),
            builtin_layers: builtin_layers::BuiltinLayers::new(&config.data_dir),
            builds_running: std::sync::atomic::AtomicUsize::new(0),
            template_claims: Mutex::new(HashMap::new()),
            pool: pool::Pool::new(),
            kept: kept::KeptVms::default(),
            restores: tokio::sync::Semaphore::new(config.max_concurrent_restores.max(1)),
            seal,
            confinement,
            sandbox_snapshot_use: tokio::sync::RwLock::new(()),
            sandbox_snapshot_index: Default::default(),
            config,
        });
        node.take_back_or_sweep().await;
        node.confinement.sweep_later();
        node.drop_broken_templates();
        node.collect_template_layers();
        snapshot::sweep(&node.snapshots_dir());
        node.collect_snapshots_now_and_then();
        crate::volumes::sweep(&node.volumes_dir());
        node.start_warm_pools();
        node.prepare_boot_files();
        Ok(node)
    }

    /// Memoize the boot files in the background when the image root has a kernel, so that
    /// the first create after a start does not wait for apt's answer about the kernel
    /// package (≈0.5–1 s) and the initramfs check; a create that comes first waits on the
    /// same lock. An image root with no kernel is left alone: building one takes minutes,
    /// for `lizard images build` or a create to start.
    fn prepare_boot_files(self: &Arc<Self>) {
        let node = self.clone();
        tokio::spawn(async move {
            // Reading the kernel cache is file I/O: off the start path and off the runtime.
            let images = node.assets.images();
            if !tokio::task::spawn_blocking(move || images.has_kernel()).await.unwrap_or(false) {
                return;
            }
            if let Err(e) = node.assets.boot_files().await {
                tracing::warn!("boot files not prepared at start (the first create tries again): {e}");
            }
        });
    }

    /// Whether the boot files are memoized: a start prepares them when it can, so that the
    /// first create skips apt.
    pub fn has_boot_files(&self) -> bool {
        self.assets.has_boot_files()
    }

    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// Whether this node's VMMs run confined (for status and health).
    pub fn confinement(&self) -> &crate::confine::ConfineStatus {
        &self.confinement.status
    }

    /// What this node admits in all (host × overcommit) and what its running sandboxes
    /// hold of it now, as `((vcpus, memory_mib), (vcpus, memory_mib))`: read-only, for the
    /// control plane's placement and its node list. Pool machines are left out: they give
    /// way to any create ([`Node::reserve`]).
    pub fn load(&self) -> ((u64, u64), (u64, u64)) {
        let capacity = self.confinement.capacity();
        ((capacity.vcpus, capacity.memory_mib), self.running_size())
    }

    /// vCPUs and MiB of the sandboxes running now, of the machines on the pool's shelves
    /// (less one a create of `claimable` would claim: see [`pool::Pool::held`]) and of
    /// the kept VMMs of paused sandboxes.
    fn promised_size(&self, claimable: Option<(&str, u32, u32)>) -> (u64, u64) {
        let (running, pool, kept) = (self.running_size(), self.pool.held(claimable), self.kept.held());
        (running.0 + pool.0 + kept.0, running.1 + pool.1 + kept.1)
    }

    /// vCPUs and MiB of the sandboxes running now.
    fn running_size(&self) -> (u64, u64) {
        self.sandboxes()
            .values()
            .filter(|s| s.state().live.is_some())
            .fold((0u64, 0u64), |(c, m), s| (c + u64::from(s.vcpus), m + u64::from(s.memory_mib)))
    }

    /// Reserve CPUs and memory for `count` sandboxes of `vcpus` and `memory_mib` beside
    /// the running ones, the kept VMMs of paused ones and the pool's machines — the last
    /// two give way, one at a time, when they are what stands in the way —, or the
    /// refusal (nothing was started).
    pub(crate) fn reserve(&self, count: u32, vcpus: u32, memory_mib: u32) -> Result<crate::confine::Reservation> {
        self.reserve_beside_pool(None, count, vcpus, memory_mib)
    }

    /// [`Node::reserve`] for a create of `template`, which would claim a pool machine of
    /// its shape if there is one.
    pub(crate) fn reserve_create(
        &self,
        template: &str,
        vcpus: u32,
        memory_mib: u32,
    ) -> Result<crate::confine::Reservation> {
        self.reserve_beside_pool(Some(template), 1, vcpus, memory_mib)
    }

    fn reserve_beside_pool(
        &self,
        template: Option<&str>,
        count: u32,
        vcpus: u32,
        memory_mib: u32,
    ) -> Result<crate::confine::Reservation> {
        let want_vcpus = vcpus.saturating_mul(count);
        let want_memory = u64::from(memory_mib) * u64::from(count);
        let claimable = template.map(|t| (t, vcpus, memory_mib));
        loop {
            match self.confinement.admit(self.promised_size(claimable), want_vcpus, want_memory) {
                Ok(reservation) => return Ok(reservation),
                // Kept VMMs first: their sandboxes are saved, and resume without them.
                Err(crate::confine::ConfineError::Capacity(_))
                    if self.kept.let_go_oldest() || self.pool.discard_one() => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Refuse to start a sandbox while the data directory's filesystem has less than the
    /// headroom free ([`crate::NodeConfig::disk_headroom`]). Unknown free space: started.
    pub(crate) fn check_disk_headroom(&self) -> Result<()> {
        let headroom = self.config.disk_headroom;
        match crate::error::free_bytes(&self.config.data_dir) {
            Some(free) if free < headroom => {
                Err(NodeError::NoDiskHeadroom { free_mib: free >> 20, headroom_mib: headroom >> 20 })
            }
            _ => Ok(()),
        }
    }

    /// Refuse a build VM whose disk may grow to `disk_bytes` unless the data directory's
    /// filesystem holds that much beyond the headroom: a build writes what it installs.
    pub(crate) fn check_build_disk(&self, disk_bytes: u64) -> Result<()> {
        let headroom = self.config.disk_headroom;
        match crate::error::free_bytes(&self.config.data_dir) {
            Some(free) if free < headroom.saturating_add(disk_bytes) => Err(NodeError::BuildDiskTooLarge {
                disk_gb: disk_bytes >> 30,
                room_gb: free.saturating_sub(headroom) >> 30,
            }),
            _ => Ok(()),
        }
    }

    /// Reserve room for one more pool machine of `machine`'s shape, never making room.
    pub(crate) fn reserve_for_pool(&self, machine: &crate::vm::Machine) -> Result<crate::confine::Reservation> {
        self.check_disk_headroom()?;
        Ok(self.confinement.admit(self.promised_size(None), machine.vcpus, u64::from(machine.memory_mib))?)
    }

    fn sandboxes_dir(&self) -> PathBuf {
        self.config.data_dir.join("sandboxes")
    }

    fn snapshots_dir(&self) -> PathBuf {
        self.config.data_dir.join("snapshots")
    }

    fn volumes_dir(&self) -> PathBuf {
        self.config.data_dir.join("volumes")
    }

    fn layers_dir(&self) -> PathBuf {
        self.config.data_dir.join("layers")
    }

    /// The sandbox map, for reading (a poisoned lock means a panic mid-update).
    fn sandboxes(&self) -> RwLockReadGuard<'_, HashMap<String, Arc<Sandbox>>> {
        self.sandboxes.read().expect("sandbox map poisoned")
    }

    fn sandboxes_mut(&self) -> RwLockWriteGuard<'_, HashMap<String, Arc<Sandbox>>> {
        self.sandboxes.write().expect("sandbox map poisoned")
    }

    fn holders(&self) -> MutexGuard<'_, HashMap<String, String>> {
        self.volume_holders.lock().expect("volume holders poisoned")
    }

    pub fn get(&self, id: &str) -> Result<Arc<Sandbox>> {
        self.sandboxes().get(id).cloned().ok_or_else(|| self.not_found(id))
    }

    /// How many machines of `template` are ready in the pool (pre-spawned or warm).
    pub fn pool_ready(&self, template: &str) -> usize {
        self.pool.ready_of(template)
    }

    pub fn list(&self) -> Vec<SandboxInfo> {
        let mut v: Vec<SandboxInfo> = self.sandboxes().values().map(|s| s.info()).collect();
        v.sort_by(|a, b| a.started_at.cmp(&b.started_at).then(a.sandbox_id.cmp(&b.sandbox_id)));
        v
    }

    /// Take a sandbox out of the map, recording why in the same step, so that no lookup
    /// in between finds neither the sandbox nor the reason it is gone.
    fn remove(&self, id: &str, why: EndReason) -> Option<Arc<Sandbox>> {
        let mut map = self.sandboxes_mut();
        let sandbox = map.remove(id)?;
        self.bury(id, why);
        Some(sandbox)
    }

    fn bury(&self, id: &str, why: EndReason) {
        let mut t = self.tombstones.lock().expect("tombstones poisoned");
        if t.len() >= TOMBSTONES {
            t.pop_front();
        }
        // No subscriber is no error: nobody needs to hear of it.
        let _ = self.ends.send((id.to_string(), why.clone()));
        t.push_back((id.to_string(), why));
    }

    /// Each sandbox that ends from now on (killed, crashed, lost), with why, as it
    /// happens. A receiver that falls behind gets `Lagged` and should check the
    /// sandboxes it cares about with [`Node::get`].
    pub fn ended_sandboxes(&self) -> tokio::sync::broadcast::Receiver<(String, EndReason)> {
        self.ends.subscribe()
    }

    /// Each sandbox whose VM halts on a disk error from now on (`true`), and each that
    /// runs again after it (`false`): what is billed as paused meanwhile. A receiver that
    /// falls behind gets `Lagged` and should ask [`crate::Sandbox::is_halted`].
    pub fn halted_sandboxes(&self) -> tokio::sync::broadcast::Receiver<(String, bool)> {
        self.halts.subscribe()
    }

    fn not_found(&self, id: &str) -> NodeError {
        let t = self.tombstones.lock().expect("tombstones poisoned");
        match t.iter().rev().find(|(i, _)| i == id) {
            Some((_, why)) => NodeError::Ended { id: id.to_string(), reason: why.clone() },
            None => NodeError::NotFound { id: id.to_string() },
        }
    }

    /// The accelerator, probed once per node (and cached on disk per host).
    async fn accel(&self) -> Result<Accel> {
        if let Some(a) = self.config.accel {
            return Ok(a);
        }
        let boot = self.assets.boot_files().await?;
        let probe_dir = self.config.data_dir.join("probe");
        let _ = std::fs::remove_dir_all(&probe_dir);
        let cfg = vm::probe_vm(&boot, probe_dir);
        let backend = self.backend.clone();
        let cache = self.config.image_root.join("accel.json");
        Ok(*self
            .accel
            .get_or_init(|| async move { lizard_vmm::accel::choose(backend.as_ref(), &cfg, &cache).await })
            .await)
    }

    /// Mark `name` as used until the claim is dropped (taken before it is resolved, so
    /// that a delete either comes first and the resolve fails, or is refused).
    pub(super) fn claim_template(&self, name: &str) -> TemplateClaim<'_> {
        *self.template_claims.lock().expect("template claims poisoned").entry(name.to_owned()).or_default() += 1;
        TemplateClaim { claims: &self.template_claims, name: name.to_owned() }
    }

    /// The template `name` names: a template this node built, else a built-in one (built
    /// now if the image store does not have it). Unknown: the image store's not-found
    /// error.
    pub(crate) async fn resolve_template(self: &Arc<Self>, name: &str) -> Result<NodeTemplate> {
        if let Some(record) = self.templates.get(name) {
            return Ok(record.template(|key| self.template_layers.path(key)));
        }
        // Nobody follows a build started by a create; the log has it.
        let (events, _) = tokio::sync::mpsc::unbounded_channel();
        self.builtin_template(name, &events, &tokio_util::sync::CancellationToken::new()).await
    }

    /// Build (or take from cache) the images for `template`, without booting anything
    /// but the build VM of a built-in that is not built yet.
    pub async fn prepare(self: &Arc<Self>, template: &str) -> Result<()> {
        let (events, _) = tokio::sync::mpsc::unbounded_channel();
        self.prepare_reporting(template, &events, &tokio_util::sync::CancellationToken::new()).await
    }

    /// [`Node::prepare`], reporting a built-in's build (steps, output) to `events`;
    /// `cancel` stops that build and removes what it made.
    pub async fn prepare_reporting(
        self: &Arc<Self>,
        template: &str,
        events: &tokio::sync::mpsc::UnboundedSender<lizard_api::templates::BuildEvent>,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<()> {
        self.assets.boot_files().await?;
        self.accel().await?;
        if self.templates.get(template).is_none() {
            self.builtin_template(template, events, cancel).await?;
        }
        Ok(())
    }

    /// A new network with `policy` for a sandbox, when the node gives sandboxes one.
    async fn attach_network(&self, policy: &lizard_api::network::NetworkPolicy) -> Result<Option<network::SandboxNet>> {
        let Some(n) = &self.network else { return Ok(None) };
        let policy = policy.parse().map_err(NodeError::BadNetworkPolicy)?;
        Ok(Some(n.attach(&policy).await?))
    }

    /// Carry the guest's connections to its API address to [`NodeConfig::api_forward`]
    /// until this agent channel closes (a pause ends it; a resume opens a new one).
    fn forward_api(&self, id: &str, agent: &lizard_agent_client::AgentClient) {
        if let Some(target) = self.config.api_forward {
            forward::spawn(id.to_string(), agent.clone(), target, &self.forward_slots);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_dir_has_one_node_process() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock_data_dir(dir.path()).unwrap();
        // flock conflicts between open files even within one process: a second node here
        // is refused, naming the holder.
        match lock_data_dir(dir.path()) {
            Err(NodeError::DataDirInUse { dir: d, pid }) => {
                assert_eq!(d, dir.path());
                assert_eq!(pid, Some(std::process::id()));
            }
            other => panic!("expected DataDirInUse, got {other:?}"),
        }
        drop(held);
        lock_data_dir(dir.path()).expect("free again once the holder is gone");
    }
}
