//! Forks: copies of a running sandbox, processes and memory included.
//!
//! A fork freezes the source's root disk into a layer under `<data>/layers` (the source
//! goes on in a new overlay above it) and saves the source VM once, then starts each copy
//! from that save over a new overlay on the same layer. A source whose memory is a
//! copy-on-write clone (of a template, or an earlier fork) saves only the pages it changed
//! and its device state; each copy maps the same base copy-on-write and gets those pages,
//! and the source runs on untouched. A cold-booted source (memory its own file) saves all
//! of memory, which each copy loads. Layers are deleted with the last sandbox whose disk
//! they back.

use super::Node;
use crate::sandbox::{self, Identity, Live, Sandbox, State};
use crate::vm::{self, Machine};
use crate::{NodeError, Result};
use lizard_agent_proto::handshake::Secret;
use lizard_vmm::{DeltaSnapshot, Vm};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Most copies one fork call makes.
pub const MAX_FORKS: u32 = 16;

/// The source VM as saved for its copies.
pub(super) enum SourceSave {
    /// Device state and all of memory (a cold-booted source).
    Full(PathBuf),
    /// What a copy-on-write source changed over its base.
    Delta(DeltaSnapshot),
}

/// A saved source's frozen disk: its copies' machine, their layers (the new one last)
/// and that new layer.
pub(super) struct Frozen {
    pub machine: Machine,
    pub layers: Vec<PathBuf>,
    pub layer: PathBuf,
}

impl SourceSave {
    /// Where `vm`'s save goes: in `dir`, its files named `prefix` + `state` (all of
    /// memory, for a source whose memory is its own file) or + `delta` and `devices` (what
    /// a copy-on-write clone changed over its base).
    pub(super) fn of(vm: &dyn Vm, own_memory: bool, dir: &Path, prefix: &str) -> SourceSave {
        match vm.memory_base() {
            Some(base) if !own_memory => SourceSave::Delta(DeltaSnapshot {
                base: base.to_path_buf(),
                delta: dir.join(format!("{prefix}delta")),
                devices: dir.join(format!("{prefix}devices")),
            }),
            _ => SourceSave::Full(dir.join(format!("{prefix}state"))),
        }
    }

    pub(super) fn remove(&self) {
        let files = match self {
            SourceSave::Full(state) => vec![state],
            SourceSave::Delta(d) => vec![&d.delta, &d.devices],
        };
        for f in files {
            let _ = std::fs::remove_file(f);
        }
    }
}

impl Node {
    /// `count` copies of a running sandbox, processes and memory included, each with its
    /// own identity (id, secret, hostname, entropy) and its own writes from here on. All
    /// or nothing: when one copy fails, the others are killed.
    pub async fn fork(self: &Arc<Self>, id: &str, count: u32) -> Result<Vec<Arc<Sandbox>>> {
        if !(1..=MAX_FORKS).contains(&count) {
            return Err(NodeError::OutOfRange { field: "count", min: 1, max: MAX_FORKS.into(), got: count.into() });
        }
        let source = self.get(id)?;
        let node = self.clone();
        tokio::spawn(async move { node.fork_now(&source, count).await }).await.expect("fork task panicked")
    }

    async fn fork_now(self: &Arc<Self>, source: &Arc<Sandbox>, count: u32) -> Result<Vec<Arc<Sandbox>>> {
        let _transition = source.transition.lock().await;
        self.get(&source.id)?;
        let live = source.live()?;
        self.check_disk_headroom()?;
        // Held until the copies are in the map (and counted there) or failed.
        let _reservation = self.reserve(count, source.vcpus, source.memory_mib)?;
        if source.volume.is_some() {
            return Err(NodeError::ForkWithVolume { id: source.id.clone() });
        }
        let layers_dir = self.layers_dir();
        let token = sandbox::new_id();
        let save = SourceSave::of(live.vm(), source.state().own_memory, &layers_dir, &format!("{token}."));
        let frozen = self.freeze_and_save(source, &live, &token, &save).await?;

        let copies = futures_util::future::join_all(
            (0..count)
                .map(|_| self.fork_one(Identity::fork_of(source, sandbox::new_id()), &source.secret, &frozen, &save)),
        )
        .await;
        save.remove();
        let mut made = Vec::with_capacity(copies.len());
        let mut failure = None;
        for copy in copies {
            match copy {
                Ok(s) => made.push(s),
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        if let Some(e) = failure {
            for copy in &made {
                let _ = self.kill(&copy.id).await;
            }
            return Err(e);
        }
        tracing::info!(id = %source.id, count, "sandbox forked");
        Ok(made)
    }

    /// Freeze `source`'s root disk into a new layer (`<data>/layers/<token>.qcow2`) and
    /// write `save` of its VM at one instant (vCPUs stopped); the source then goes on in
    /// a new overlay above the layer. Call under the source's transition lock.
    pub(super) async fn freeze_and_save(
        &self,
        source: &Sandbox,
        live: &Live,
        token: &str,
        save: &SourceSave,
    ) -> Result<Frozen> {
        let layers_dir = self.layers_dir();
        std::fs::create_dir_all(&layers_dir).map_err(|e| NodeError::io("create the layers dir", e))?;
        let old_top = source.state().config.root_disk.clone();
        let layer = layers_dir.join(format!("{token}.qcow2"));
        let new_top = source.run_dir.join(format!("root-{token}.qcow2"));
        let vm = live.vm();
        let t = std::time::Instant::now();
        vm.pause().await?;
        let frozen: Result<()> = async {
            std::fs::hard_link(&old_top, &layer).map_err(|e| NodeError::io("link the frozen disk", e))?;
            vm::create_overlay(&layer, "qcow2", &new_top).await?;
            vm.freeze_disk(&new_top).await?;
            match save {
                SourceSave::Full(state) => vm.save_all(state).await?,
                SourceSave::Delta(d) => drop(vm.save_delta(&d.delta, &d.devices).await?),
            }
            Ok(())
        }
        .await;
        let resumed = vm.resume().await;
        if let Err(e) = frozen.and(resumed.map_err(NodeError::from)) {
            for f in [&layer, &new_top] {
                let _ = std::fs::remove_file(f);
            }
            save.remove();
            return Err(e);
        }
        tracing::debug!(id = %source.id, saved = ?t.elapsed(), "source saved");
        let (machine, layers) = {
            let mut st = source.state();
            st.config.root_disk = new_top;
            st.layers.push(layer.clone());
            (Machine::of(&st.config), st.layers.clone())
        };
        // The source's old overlay lives on as the layer (same file), read-only to every
        // VMM from here on: root's, whichever VMM uid wrote it.
        let _ = std::os::unix::fs::chown(&layer, Some(0), Some(0));
        let _ = std::fs::remove_file(&old_top);
        source.write_record(&self.seal, crate::sandbox::Durability::Synced)?;
        Ok(Frozen { machine, layers, layer })
    }

    /// One copy of a saved source (a fork's, or a sandbox snapshot's) as the sandbox
    /// `who`: a new overlay on the frozen layer, the save (a full one loaded into a memory
    /// file of its own, or a delta over the source's base mapped copy-on-write), a network
    /// of its own with `who`'s policy, and a new identity given through a handshake with
    /// the saved guest's `source_secret`.
    pub(super) async fn fork_one(
        self: &Arc<Self>,
        who: Identity,
        source_secret: &Secret,
        frozen: &Frozen,
        save: &SourceSave,
    ) -> Result<Arc<Sandbox>> {
        let id = who.id.clone();
        let secret = Secret::generate();
        let run_dir = self.sandboxes_dir().join(&id);
        // Dropped (removed) if the copy fails.
        let net = self.attach_network(&who.network_policy).await?;
        // A copy has no volume (a source with one cannot be saved): a placeholder of its own.
        let config = vm::sandbox_vm(&id, run_dir.clone(), &frozen.machine, None, net.as_ref().map(|n| n.attachment()));
        let deadline = self.config.boot_timeout;
        let backend = self.backend.as_ref();
        let layer = &frozen.layer;
        // Copies restore like creates, a few at a time: all at once on a small host, each
        // handshake outlasts the node's first wait for it and costs a retry.
        let permit = self.restore_permit().await;
        let (launched, own_memory) = match save {
            SourceSave::Full(state) => {
                (vm::load_copy(backend, &config, layer, state, source_secret, &secret, deadline).await, true)
            }
            SourceSave::Delta(d) => {
                (vm::delta_copy(backend, &config, layer, d, source_secret, &secret, deadline).await, false)
            }
        };
        drop(permit);
        let started = launched.map(|launched| {
            let live = Some(Arc::new(Live::new(launched)));
            let state = State { live, config, own_memory, layers: frozen.layers.clone() };
            Sandbox::new(who, secret, state)
        });
        // On failure the network is dropped with the closure, which removes it.
        let started = started.inspect(|s| s.set_network(net));
        self.admit(started, &run_dir)
    }

    /// Delete the layers that backed `gone`'s disk and back no other sandbox's.
    pub(super) fn release_layers(&self, gone: &Sandbox) {
        let mine = gone.state().layers.clone();
        if mine.is_empty() {
            return;
        }
        let in_use = self.layers_in_use();
        for layer in mine.iter().filter(|l| !in_use.contains(*l)) {
            let _ = std::fs::remove_file(layer);
        }
    }

    pub(super) fn layers_in_use(&self) -> HashSet<PathBuf> {
        let mut in_use: HashSet<PathBuf> = self.sandboxes().values().flat_map(|s| s.state().layers.clone()).collect();
        in_use.extend(self.sandbox_snapshot_layers());
        in_use
    }
}
