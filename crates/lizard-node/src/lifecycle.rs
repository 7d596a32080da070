//! A sandbox's life after create: pause to disk, resume, fork, kill, and what survives
//! a node restart.
//!
//! A paused sandbox has no VMM process. Its directory holds everything it is: the root
//! disk overlay, the secret, `sandbox.json` (this module's [`Record`]), and its saved VM —
//! either device state only (`vmstate`) beside a memory file of its own (`memory`), or,
//! for a template clone whose memory is a private copy-on-write mapping of the
//! template's, one full save with all of memory (`state`). Resuming a full save loads it
//! into a memory file of the sandbox's own, so every later pause only saves device state.
//!
//! A fork freezes the source's root disk into a layer under `<data>/layers` (the source
//! goes on in a new overlay above it), saves the source VM in full once, and loads that
//! save into each copy, over a new overlay on the same layer. Layers are deleted with the
//! last sandbox whose disk they back.

use crate::sandbox::{self, Live, Sandbox};
use crate::{Node, NodeError, Result};
use lizard_agent_proto::handshake::Secret;
use lizard_vmm::{MemoryMapping, Snapshot, VmConfig};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// How long the agent gets to notice that its host left (it polls every 2 ms) before
/// the VM is paused. If it has not by then, the resume's handshake retries cover it.
const AGENT_SETTLE: Duration = Duration::from_millis(50);

/// Most copies one fork call makes.
pub const MAX_FORKS: u32 = 16;

/// What `sandbox.json` says about a sandbox, enough to take a paused one back after the
/// node restarts.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Record {
    id: String,
    template: String,
    vcpus: u32,
    memory_mib: u32,
    started_at_ms: u64,
    metadata: BTreeMap<String, String>,
    env: BTreeMap<String, String>,
    from_snapshot: bool,
    config: VmConfig,
    own_memory: bool,
    layers: Vec<PathBuf>,
    paused: bool,
    #[serde(default)]
    network_policy: lizard_api::network::NetworkPolicy,
    /// The volume it holds (mounted at /workspace), if any.
    #[serde(default)]
    volume: Option<String>,
}

const RECORD: &str = "sandbox.json";
/// Device state of a paused VM whose memory is its own file.
const VMSTATE: &str = "vmstate";
/// Full save (device state and memory) of a paused template clone.
const FULL_STATE: &str = "state";

impl Sandbox {
    /// Write `sandbox.json` (replacing it atomically).
    pub(crate) fn write_record(&self) -> Result<()> {
        let record = {
            let st = self.state.lock().unwrap();
            Record {
                id: self.id.clone(),
                template: self.template.clone(),
                vcpus: self.vcpus,
                memory_mib: self.memory_mib,
                started_at_ms: self.started_at.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_millis()
                    as u64,
                metadata: self.metadata.clone(),
                env: self.env.clone(),
                from_snapshot: self.from_snapshot(),
                config: st.config.clone(),
                own_memory: st.own_memory,
                layers: st.layers.clone(),
                paused: st.live.is_none(),
                network_policy: self.network_policy.clone(),
                volume: self.volume.clone(),
            }
        };
        let tmp = self.run_dir.join(format!("{RECORD}.tmp"));
        let json = serde_json::to_vec_pretty(&record).expect("records serialize");
        std::fs::write(&tmp, json)
            .and_then(|_| std::fs::rename(&tmp, self.run_dir.join(RECORD)))
            .map_err(|e| NodeError::io(format!("write {}/{RECORD}", self.run_dir.display()), e))
    }

    /// A paused sandbox from its directory, if the directory holds a complete one.
    pub(crate) fn adopt(dir: &Path) -> Option<Sandbox> {
        let record: Record = serde_json::from_slice(&std::fs::read(dir.join(RECORD)).ok()?).ok()?;
        let saved = if record.own_memory { dir.join(VMSTATE) } else { dir.join(FULL_STATE) };
        if !record.paused || record.config.run_dir != dir || !saved.exists() || !record.config.root_disk.exists() {
            return None;
        }
        let secret = Secret::from_hex(std::fs::read_to_string(dir.join("secret")).ok()?.trim()).ok()?;
        Some(Sandbox::paused(
            sandbox::Identity {
                id: record.id,
                template: record.template,
                vcpus: record.vcpus,
                memory_mib: record.memory_mib,
                started_at: SystemTime::UNIX_EPOCH + Duration::from_millis(record.started_at_ms),
                metadata: record.metadata,
                env: record.env,
                from_snapshot: record.from_snapshot,
                network_policy: record.network_policy,
                volume: record.volume,
            },
            secret,
            record.config,
            record.own_memory,
            record.layers,
        ))
    }
}

impl Node {
    pub(crate) fn layers_dir(&self) -> PathBuf {
        self.config.data_dir.join("layers")
    }

    /// Stop a sandbox's vCPUs, save it to its directory and end its VMM process. Its
    /// processes, memory and files come back with [`Node::resume`]. Pausing a paused
    /// sandbox does nothing.
    pub async fn pause(self: &Arc<Self>, id: &str) -> Result<Arc<Sandbox>> {
        let sandbox = self.get(id)?;
        let (node, s) = (self.clone(), sandbox.clone());
        tokio::spawn(async move { node.pause_now(&s).await }).await.expect("pause task panicked")?;
        Ok(sandbox)
    }

    async fn pause_now(&self, sandbox: &Arc<Sandbox>) -> Result<()> {
        let _transition = sandbox.transition.lock().await;
        self.get(&sandbox.id)?; // killed while we waited
        let (live, config, own_memory) = {
            let st = sandbox.state.lock().unwrap();
            match &st.live {
                None => return Ok(()),
                Some(live) => (live.clone(), st.config.clone(), st.own_memory),
            }
        };
        // The volume's data reaches its disk before the VM stops: a paused sandbox's
        // volume must read the same from the host as from the guest.
        sandbox.sync_volume().await;
        // New operations are refused from here, as for a paused sandbox.
        sandbox.pausing.store(true, Ordering::SeqCst);
        // The agent goes back to waiting for a host while the guest still runs, so that
        // the first connection after the resume is simply its next session.
        let _ = tokio::time::timeout(Duration::from_secs(2), live.agent().shutdown()).await;
        tokio::time::sleep(AGENT_SETTLE).await;
        let vm = live.vm();
        let saved = match vm.pause().await {
            Ok(()) if own_memory => {
                vm.snapshot(&Snapshot { vmstate: sandbox.run_dir.join(VMSTATE), memory: config.memory_file() }).await
            }
            Ok(()) => vm.save_all(&sandbox.run_dir.join(FULL_STATE)).await,
            Err(e) => Err(e),
        };
        if let Err(e) = saved {
            // Not paused after all: run on, with a new session.
            let _ = vm.resume().await;
            let deadline = self.config.boot_timeout;
            match sandbox::connect_agent(vm, &sandbox.secret, deadline, Some(sandbox::RESTORED_HANDSHAKE)).await {
                Ok(agent) => {
                    self.forward_api(&sandbox.id, &agent);
                    live.set_agent(agent)
                }
                Err(e) => tracing::warn!(id = %sandbox.id, "no agent session after a failed pause: {e}"),
            }
            sandbox.pausing.store(false, Ordering::SeqCst);
            return Err(e.into());
        }
        // From here the saved VM is the sandbox: the process must not run on. Taking it
        // out of the state first tells its monitor that its exit is no crash.
        sandbox.state.lock().unwrap().live = None;
        sandbox.pausing.store(false, Ordering::SeqCst);
        let recorded = sandbox.write_record();
        let _ = vm.kill().await;
        recorded?;
        tracing::info!(id = %sandbox.id, full = !own_memory, "sandbox paused");
        Ok(())
    }

    /// Start a paused sandbox's VM again where it stopped. Resuming a running sandbox
    /// does nothing.
    pub async fn resume(self: &Arc<Self>, id: &str) -> Result<Arc<Sandbox>> {
        let sandbox = self.get(id)?;
        let (node, s) = (self.clone(), sandbox.clone());
        tokio::spawn(async move { node.resume_now(&s).await }).await.expect("resume task panicked")?;
        Ok(sandbox)
    }

    async fn resume_now(self: &Arc<Self>, sandbox: &Arc<Sandbox>) -> Result<()> {
        let _transition = sandbox.transition.lock().await;
        self.get(&sandbox.id)?;
        let (config, own_memory) = {
            let st = sandbox.state.lock().unwrap();
            if st.live.is_some() {
                return Ok(());
            }
            (st.config.clone(), st.own_memory)
        };
        // Taken back after a node restart: the old process's namespace is gone (swept at
        // start), so it gets a new one, same policy; the guest's side is the same in every
        // namespace.
        let mut config = config;
        if config.net.is_some() && sandbox.network().is_none() {
            let net = self.attach_network(&sandbox.network_policy).await?;
            config.net = net.as_ref().map(|n| n.attachment());
            sandbox.set_network(net);
            sandbox.state.lock().unwrap().config.net = config.net.clone();
        }
        let vm = if own_memory {
            let saved = Snapshot { vmstate: sandbox.run_dir.join(VMSTATE), memory: config.memory_file() };
            self.backend.restore(&config, &saved, MemoryMapping::Shared).await?
        } else {
            self.backend.load(&config, &sandbox.run_dir.join(FULL_STATE)).await?
        };
        // The guest's clock stood still while it was paused: the identity call sets it
        // (and adds entropy), keeping the sandbox's own secret and name.
        let identity = sandbox::give_identity(
            vm.as_ref(),
            &sandbox.id,
            &sandbox.secret,
            &sandbox.secret,
            self.config.boot_timeout,
        );
        let agent = sandbox::connected(vm.as_ref(), identity).await?;
        let live = Arc::new(Live::new(vm, agent));
        {
            let mut st = sandbox.state.lock().unwrap();
            st.live = Some(live.clone());
            st.own_memory = true;
        }
        let _ = std::fs::remove_file(sandbox.run_dir.join(FULL_STATE));
        let _ = std::fs::remove_file(sandbox.run_dir.join(VMSTATE));
        self.watch(sandbox.clone(), live);
        sandbox.write_record()?;
        tracing::info!(id = %sandbox.id, "sandbox resumed");
        Ok(())
    }

    /// `count` copies of a running sandbox, processes and memory included, each with its
    /// own identity (id, secret, hostname, entropy) and its own writes from here on. All
    /// or nothing: when one copy fails, the others are killed.
    pub async fn fork(self: &Arc<Self>, id: &str, count: u32) -> Result<Vec<Arc<Sandbox>>> {
        if !(1..=MAX_FORKS).contains(&count) {
            return Err(NodeError::InvalidArgument(format!("count must be 1..={MAX_FORKS}, got {count}")));
        }
        let source = self.get(id)?;
        let node = self.clone();
        tokio::spawn(async move { node.fork_now(&source, count).await }).await.expect("fork task panicked")
    }

    async fn fork_now(self: &Arc<Self>, source: &Arc<Sandbox>, count: u32) -> Result<Vec<Arc<Sandbox>>> {
        let _transition = source.transition.lock().await;
        self.get(&source.id)?;
        let live = source.live()?;
        let config = source.state.lock().unwrap().config.clone();
        if source.volume.is_some() {
            return Err(NodeError::Conflict(format!(
                "sandbox {} has a volume, which only one sandbox may use at a time: it cannot be forked",
                source.id
            )));
        }
        let layers_dir = self.layers_dir();
        std::fs::create_dir_all(&layers_dir).map_err(|e| NodeError::io("create the layers dir", e))?;
        let token = sandbox::new_id();
        let layer = layers_dir.join(format!("{token}.qcow2"));
        let state_file = layers_dir.join(format!("{token}.state"));
        let new_top = source.run_dir.join(format!("root-{token}.qcow2"));

        // Freeze the disk and save the VM at one instant (vCPUs stopped), then let the
        // source go on in a new overlay.
        let vm = live.vm();
        vm.pause().await?;
        let frozen: Result<()> = async {
            std::fs::hard_link(&config.root_disk, &layer).map_err(|e| NodeError::io("link the frozen disk", e))?;
            sandbox::create_overlay(&layer, "qcow2", &new_top).await?;
            vm.freeze_disk(&new_top).await?;
            vm.save_all(&state_file).await?;
            Ok(())
        }
        .await;
        let resumed = vm.resume().await;
        if let Err(e) = frozen.and(resumed.map_err(NodeError::from)) {
            for f in [&layer, &state_file, &new_top] {
                let _ = std::fs::remove_file(f);
            }
            return Err(e);
        }
        let base = {
            let mut st = source.state.lock().unwrap();
            st.config.root_disk = new_top;
            st.layers.push(layer);
            st.config.clone()
        };
        // The source's old overlay lives on as the layer (same file).
        let _ = std::fs::remove_file(&config.root_disk);
        let layers = source.state.lock().unwrap().layers.clone();
        source.write_record()?;

        let copies =
            futures_util::future::join_all((0..count).map(|_| self.fork_one(source, &base, &layers, &state_file)))
                .await;
        let _ = std::fs::remove_file(&state_file);
        let (made, failed): (Vec<_>, Vec<_>) = copies.into_iter().partition(|r| r.is_ok());
        let made: Vec<Arc<Sandbox>> = made.into_iter().map(|r| r.unwrap()).collect();
        if let Some(Err(e)) = failed.into_iter().next() {
            for copy in &made {
                let _ = self.kill(&copy.id).await;
            }
            return Err(e);
        }
        tracing::info!(id = %source.id, count, "sandbox forked");
        Ok(made)
    }

    /// One copy for [`Node::fork`]: a new overlay on the frozen layer, the source's full
    /// save loaded into a memory file of its own, and a new identity.
    async fn fork_one(
        self: &Arc<Self>,
        source: &Sandbox,
        base: &VmConfig,
        layers: &[PathBuf],
        state_file: &Path,
    ) -> Result<Arc<Sandbox>> {
        let id = sandbox::new_id();
        let secret = Secret::generate();
        let run_dir = self.sandboxes_dir().join(&id);
        let config = VmConfig {
            id: id.clone(),
            cmdline: sandbox::cmdline(&id),
            root_disk: run_dir.join("root.qcow2"),
            // The source has no volume (it could not be forked): a placeholder of its own.
            extra_disks: vec![run_dir.join(sandbox::PLACEHOLDER_DISK)],
            secret_file: Some(run_dir.join("secret")),
            run_dir: run_dir.clone(),
            ..base.clone()
        };
        let layer = layers.last().expect("a fork has a layer");
        // Each copy has a network of its own, with the source's policy; dropped (removed)
        // if the copy fails.
        let net = self.attach_network(&source.network_policy).await?;
        let config = VmConfig { net: net.as_ref().map(|n| n.attachment()), ..config };
        let started: Result<Sandbox> = async {
            sandbox::prepare_run_dir(&config, &secret)?;
            sandbox::create_overlay(layer, "qcow2", &config.root_disk).await?;
            let vm = self.backend.load(&config, state_file).await?;
            let identity = sandbox::give_identity(vm.as_ref(), &id, &source.secret, &secret, self.config.boot_timeout);
            let agent = sandbox::connected(vm.as_ref(), identity).await?;
            Ok(Sandbox::forked(source, config, secret, Live::new(vm, agent), layers.to_vec()))
        }
        .await;
        // On failure the network is dropped with the closure, which removes it.
        let started = started.inspect(|s| s.set_network(net));
        self.admit(started, &run_dir)
    }

    /// Put a just-started sandbox in the map, under watch, with its record written; or,
    /// when it did not start, remove its directory.
    pub(crate) fn admit(self: &Arc<Self>, started: Result<Sandbox>, run_dir: &Path) -> Result<Arc<Sandbox>> {
        let sandbox = match started {
            Ok(s) => Arc::new(s),
            Err(e) => {
                let _ = std::fs::remove_dir_all(run_dir);
                return Err(e);
            }
        };
        if let Err(e) = sandbox.write_record() {
            if let Ok(live) = sandbox.live() {
                let vm = live.clone();
                tokio::spawn(async move { vm.vm().kill().await });
            }
            sandbox.cleanup();
            return Err(e);
        }
        self.sandboxes.write().unwrap().insert(sandbox.id.clone(), sandbox.clone());
        if let Ok(live) = sandbox.live() {
            self.watch(sandbox.clone(), live);
        }
        Ok(sandbox)
    }

    /// Clean up after a VMM that exits by itself (crash, guest power-off, OOM kill). A VM
    /// that a pause ended is no longer the sandbox's live one, and is left alone.
    pub(crate) fn watch(self: &Arc<Self>, sandbox: Arc<Sandbox>, live: Arc<Live>) {
        // Every live VM (created, resumed, forked) gets its guest's API connections carried.
        self.forward_api(&sandbox.id, &live.agent());
        let node = Arc::downgrade(self);
        tokio::spawn(async move {
            let exit = live.vm().wait().await;
            let current = sandbox.state.lock().unwrap().live.as_ref().is_some_and(|l| Arc::ptr_eq(l, &live));
            let Some(node) = node.upgrade() else { return };
            if !current {
                return;
            }
            let why = format!("its VM stopped unexpectedly (VMM exit {exit:?})");
            // Files first: once the sandbox is reported gone, nothing of it is left. (Killed
            // on purpose, it is no longer in the map and kill() cleans up as well.)
            sandbox.cleanup();
            node.release_volume(sandbox.volume.as_deref(), &sandbox.id);
            if node.remove(&sandbox.id, &why).is_some() {
                node.release_layers(&sandbox);
                tracing::warn!(id = %sandbox.id, "{why}");
            }
        });
    }

    /// Stop a sandbox's VM (if it runs) and delete everything the node made for it (in
    /// its own task, so a caller that goes away cannot leave it half done).
    pub async fn kill(self: &Arc<Self>, id: &str) -> Result<()> {
        // What the guest wrote to its volume and did not sync yet reaches the disk first
        // (bounded: a hung guest must not keep its sandbox alive).
        self.get(id)?.sync_volume().await;
        let sandbox = self.remove(id, "killed").ok_or_else(|| self.not_found(id))?;
        let node = self.clone();
        tokio::spawn(async move {
            let _transition = sandbox.transition.lock().await;
            let live = sandbox.state.lock().unwrap().live.clone();
            let result = match live {
                Some(live) => live.vm().kill().await.map(drop).map_err(NodeError::from),
                None => Ok(()),
            };
            sandbox.cleanup();
            node.release_layers(&sandbox);
            node.release_volume(sandbox.volume.as_deref(), &sandbox.id);
            result
        })
        .await
        .expect("kill task panicked")
    }

    /// Delete the layers that backed `gone`'s disk and back no other sandbox's.
    pub(crate) fn release_layers(&self, gone: &Sandbox) {
        let mine = gone.state.lock().unwrap().layers.clone();
        if mine.is_empty() {
            return;
        }
        let in_use = self.layers_in_use();
        for layer in mine.iter().filter(|l| !in_use.contains(*l)) {
            let _ = std::fs::remove_file(layer);
        }
    }

    fn layers_in_use(&self) -> HashSet<PathBuf> {
        let map = self.sandboxes.read().unwrap();
        map.values().flat_map(|s| s.state.lock().unwrap().layers.clone()).collect()
    }

    /// Take back the paused sandboxes an earlier node process left; kill VMM processes
    /// and delete directories of the rest (recorded as lost), and delete layers nothing
    /// uses any more.
    pub(crate) fn adopt_or_sweep(self: &Arc<Self>) {
        if let Ok(entries) = std::fs::read_dir(self.sandboxes_dir()) {
            for entry in entries.flatten() {
                let id = entry.file_name().to_string_lossy().into_owned();
                let dir = entry.path();
                if let Some(pid) = sandbox::vmm_pid_of(&dir, &id) {
                    tracing::warn!(%id, pid, "killing VMM left by a previous node process");
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
                } else if let Some(sandbox) = Sandbox::adopt(&dir) {
                    tracing::info!(%id, "paused sandbox taken back");
                    if let Some(volume) = &sandbox.volume {
                        self.volume_holders.lock().unwrap().insert(volume.clone(), id.clone());
                    }
                    self.sandboxes.write().unwrap().insert(id, Arc::new(sandbox));
                    continue;
                }
                let _ = std::fs::remove_dir_all(&dir);
                self.bury(&id, "lost: the node restarted while it ran".into());
            }
        }
        let in_use = self.layers_in_use();
        if let Ok(entries) = std::fs::read_dir(self.layers_dir()) {
            for path in entries.flatten().map(|e| e.path()) {
                if !in_use.contains(&path) {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
    }

    /// Kill every running sandbox (node shutdown). Paused ones stay on disk for the next
    /// node process.
    pub async fn shutdown(self: &Arc<Self>) {
        let running: Vec<String> =
            self.sandboxes.read().unwrap().values().filter(|s| !s.is_paused()).map(|s| s.id.clone()).collect();
        for id in running {
            let _ = self.kill(&id).await;
        }
    }
}
