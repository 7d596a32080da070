//! Creating a sandbox: check the request, claim its volume, make its network, then start
//! its VM — a clone of the template's snapshot (made now, by one cold boot, if there is
//! none yet) or, when that is off or fails, a cold boot.

use super::{pool, Node};
use crate::assets::BootFiles;
use crate::sandbox::{self, Identity, Live, Sandbox, State};
use crate::templates::NodeTemplate;
use crate::vm::{self, BootError, Machine};
use crate::{snapshot, NodeError, Result};
use lizard_agent_proto::handshake::Secret;
use lizard_api::network::ParsedPolicy;
use lizard_api::CreateSandboxRequest;
use lizard_recipe::SandboxSize;
use lizard_vmm::VmConfig;
use std::path::PathBuf;
use std::sync::Arc;

/// `got` if it lies in `bounds`, else the error naming `field`.
fn in_range(field: &'static str, got: u32, (min, max): (u32, u32)) -> Result<u32> {
    if (min..=max).contains(&got) {
        Ok(got)
    } else {
        Err(NodeError::OutOfRange { field, min: min.into(), max: max.into(), got: got.into() })
    }
}

/// `asked` where set, else the template's, else the node's `(vcpus, memory_mib)` —
/// checked against the bounds.
fn size_of(asked: SandboxSize, template: SandboxSize, (vcpus, memory_mib): (u32, u32)) -> Result<(u32, u32)> {
    let size = asked.or(template);
    let vcpus = size.vcpus.unwrap_or(vcpus);
    let memory_mib = size.memory_mib.unwrap_or(memory_mib);
    Ok((in_range("vcpus", vcpus, SandboxSize::VCPUS)?, in_range("memoryMib", memory_mib, SandboxSize::MEMORY_MIB)?))
}

impl Node {
    /// The size of a sandbox of `template`: what the request names, else the template's
    /// `[sandbox]` size, else the node's default — checked against the bounds.
    pub(super) fn sandbox_size(
        &self,
        template: &NodeTemplate,
        vcpus: Option<u32>,
        memory_mib: Option<u32>,
    ) -> Result<(u32, u32)> {
        let asked = SandboxSize { vcpus, memory_mib };
        let (vcpus, memory_mib) =
            size_of(asked, template.config.size, (self.config.default_vcpus, self.config.default_memory_mib))?;
        Ok(crate::confine::sizes::check(vcpus, memory_mib).map_err(crate::confine::ConfineError::from)?)
    }

    /// Boot a new sandbox and wait until its agent answers.
    ///
    /// The work runs in its own task: a caller that goes away mid-boot (a dropped HTTP
    /// request) must not leave a VM that nothing tracks.
    pub async fn create(self: &Arc<Self>, req: CreateSandboxRequest) -> Result<Arc<Sandbox>> {
        let node = self.clone();
        let data_dir = self.config.data_dir.clone();
        let created = tokio::spawn(async move { node.create_now(req).await }).await.expect("create task panicked");
        created.map_err(|e| e.or_disk_full("make a sandbox", &data_dir))
    }

    async fn create_now(self: &Arc<Self>, mut req: CreateSandboxRequest) -> Result<Arc<Sandbox>> {
        if let Some(snapshot) = req.snapshot.take() {
            return self.create_from_snapshot(&snapshot, req).await;
        }
        // Checked before anything is made (create_with makes the network from it).
        let policy = req.network_policy().parse().map_err(NodeError::BadNetworkPolicy)?;
        let _under_way = self.pool.create_under_way();
        // Until the sandbox is in the map (or failed), its template cannot be deleted.
        let _claim = self.claim_template(&req.template);
        let template = self.resolve_template(&req.template).await?;
        let (vcpus, memory_mib) = self.sandbox_size(&template, req.vcpus, req.memory_mib)?;
        self.check_disk_headroom()?;
        // Held until the sandbox is in the map (and counted there) or failed.
        let _reservation = match &req.volume {
            // A create with a volume never takes a pool machine.
            Some(_) => self.reserve(1, vcpus, memory_mib)?,
            None => self.reserve_create(&template.name, vcpus, memory_mib)?,
        };
        let boot = self.assets.boot_files().await?;
        let machine = Machine::new(&boot, vcpus, memory_mib, self.accel().await?);
        let snap = if self.config.snapshots {
            match self.template_snapshot(&template, &boot, &machine).await {
                Ok(snap) => Some(snap),
                Err(e) => {
                    tracing::warn!(template = %template.name, start_output = e.start_output(), "no template snapshot, cold-booting: {e}");
                    None
                }
            }
        } else {
            None
        };
        // A machine made ahead of demand, when one is ready (a volume is attached at
        // VMM start, so creates with one never take one).
        if let (Some(snap), None) = (&snap, &req.volume) {
            let ready = self.pool.take(&snap.key());
            self.keep_ready(snap, &machine);
            if let Some(ready) = ready {
                match self.create_from_pool(ready, req.clone(), &policy, &template, snap).await {
                    Ok(sandbox) => return Ok(sandbox),
                    Err(e) => tracing::warn!(template = %template.name, "a pool machine failed its claim: {e}"),
                }
            }
        }
        let id = sandbox::new_id();
        let volume = req.volume.clone();
        let volume_disk = match &volume {
            Some(v) => Some(self.claim_volume(v, &id)?),
            None => None,
        };
        let result = self.create_with(req, id.clone(), volume_disk, &template, snap.as_ref(), &machine).await;
        if result.is_err() {
            self.release_volume(volume.as_deref(), &id);
        }
        result
    }

    /// A sandbox from the pool's `ready` machine: the request's network policy and the
    /// guest's identity, then the same admission as any create.
    async fn create_from_pool(
        self: &Arc<Self>,
        mut ready: pool::Ready,
        req: CreateSandboxRequest,
        policy: &ParsedPolicy,
        template: &NodeTemplate,
        snap: &snapshot::TemplateSnapshot,
    ) -> Result<Arc<Sandbox>> {
        let started = self.claim(&mut ready, policy, snap).await.map(|launched| {
            let who = Identity::created(req, &ready.config, template, true);
            let config = ready.config.clone();
            // Its memory is a copy-on-write mapping of the snapshot's, as for any clone.
            let state = State { live: Some(Arc::new(Live::new(launched))), config, own_memory: false, layers: vec![] };
            let sandbox = Sandbox::new(who, ready.secret.clone(), state);
            sandbox.set_network(ready.net.take());
            sandbox
        });
        let sandbox = self.admit(started, &ready.config.run_dir)?;
        tracing::info!(id = %sandbox.id, template = %sandbox.template, "sandbox running (from the pool)");
        Ok(sandbox)
    }

    async fn create_with(
        self: &Arc<Self>,
        req: CreateSandboxRequest,
        id: String,
        volume_disk: Option<PathBuf>,
        template: &NodeTemplate,
        snap: Option<&snapshot::TemplateSnapshot>,
        machine: &Machine,
    ) -> Result<Arc<Sandbox>> {
        let secret = Secret::generate();
        let run_dir = self.sandboxes_dir().join(&id);
        // Dropped on every error path below, which removes it again.
        let net = self.attach_network(&req.network_policy()).await?;
        let config = vm::sandbox_vm(&id, run_dir.clone(), machine, volume_disk, net.as_ref().map(|n| n.attachment()));
        let with_volume = req.volume.is_some();
        let mut restored = None;
        if let Some(snap) = snap {
            let _permit = self.restore_permit().await;
            match self.clone_template(&config, snap, &secret, with_volume).await {
                Ok(launched) => restored = Some(launched),
                Err(e) => {
                    tracing::warn!(%id, template = %template.name, "restore from the template snapshot failed, cold-booting: {e}");
                    let _ = std::fs::remove_dir_all(&run_dir);
                }
            }
        }
        let from_snapshot = restored.is_some();
        let launched = match restored {
            Some(l) => Ok(l),
            None => self.cold_boot(&config, template, &secret, with_volume).await,
        };
        let started = launched.map(|launched| {
            let who = Identity::created(req, &config, template, from_snapshot);
            // A clone's memory is a copy-on-write mapping of the snapshot's, not its own.
            let state =
                State { live: Some(Arc::new(Live::new(launched))), config, own_memory: !from_snapshot, layers: vec![] };
            Sandbox::new(who, secret, state)
        });
        // On failure the network is dropped with the closure, which removes it.
        let started = started.inspect(|s| s.set_network(net));
        let sandbox = self.admit(started, &run_dir)?;
        tracing::info!(%id, template = %sandbox.template, "sandbox running");
        Ok(sandbox)
    }

    /// Cold-boot `config` from the template's root disk, mount its volume, and start
    /// the template's start command (a snapshot would have had it running).
    async fn cold_boot(
        &self,
        config: &VmConfig,
        template: &NodeTemplate,
        secret: &Secret,
        with_volume: bool,
    ) -> Result<vm::Launched> {
        let (disk, format) = (&template.disk, template.disk_format.as_str());
        let mut launched =
            vm::cold_boot(self.backend.as_ref(), config, disk, format, secret, self.config.boot_timeout).await?;
        if with_volume {
            launched = launched.mount_volume(false).await?;
        }
        if let Some(start) = &template.start {
            if let Err(e) = crate::start::start(&launched.agent, start).await {
                let _ = launched.vm.kill().await;
                return Err(e.into());
            }
        }
        Ok(launched)
    }

    /// Start `config` as a clone of the template snapshot `snap` (and mount its volume).
    async fn clone_template(
        &self,
        config: &VmConfig,
        snap: &snapshot::TemplateSnapshot,
        secret: &Secret,
        with_volume: bool,
    ) -> Result<vm::Launched> {
        if (config.vcpus, config.memory_mib) != (snap.meta.vcpus, snap.meta.memory_mib) {
            return Err(BootError::SnapshotShape.into());
        }
        let launched = vm::clone_template(
            self.backend.as_ref(),
            config,
            &snap.disk(),
            &snap.vm_snapshot(),
            &snap.secret,
            secret,
            self.config.boot_timeout,
        )
        .await?;
        if with_volume {
            return launched.mount_volume(true).await;
        }
        Ok(launched)
    }

    /// The snapshot of `template` in this shape, made now (one cold boot) if there is
    /// none yet. Builders of one key are serialized within the node by a mutex and
    /// between node processes by a file lock.
    pub(super) async fn template_snapshot(
        &self,
        template: &NodeTemplate,
        boot: &BootFiles,
        machine: &Machine,
    ) -> Result<snapshot::TemplateSnapshot> {
        let (vcpus, memory_mib, accel) = (machine.vcpus, machine.memory_mib, machine.accel);
        let key =
            snapshot::key(template, boot, vcpus, memory_mib, accel, &self.backend.version(), self.network.is_some());
        let dir = self.snapshots_dir().join(&key);
        // Noted before it is looked at, so that a collection under way keeps it (see
        // `snapshot_gc`).
        self.snapshot_used(&key);
        if let Some(s) = snapshot::TemplateSnapshot::load(&dir) {
            return Ok(s);
        }
        let lock = self.snapshot_locks.lock().expect("snapshot locks poisoned").entry(key.clone()).or_default().clone();
        let _guard = lock.lock().await;
        if let Some(s) = snapshot::TemplateSnapshot::load(&dir) {
            return Ok(s);
        }
        std::fs::create_dir_all(self.snapshots_dir()).map_err(|e| NodeError::io("create the snapshots dir", e))?;
        let _file_lock = snapshot::file_lock(self.snapshots_dir().join(format!("{key}.lock"))).await?;
        if let Some(s) = snapshot::TemplateSnapshot::load(&dir) {
            return Ok(s);
        }
        // Incomplete or of another format: replace it. Running clones keep their open
        // files.
        let _ = std::fs::remove_dir_all(&dir);
        tracing::info!(template = %template.name, %key, "making a template snapshot (one cold boot)");
        // The template VM needs the same NIC as its clones; its network is closed to the
        // outside and goes away with it.
        let closed = lizard_api::network::ParsedPolicy::default();
        let net = match &self.network {
            Some(n) => Some(n.attach(&closed).await?),
            None => None,
        };
        let spec = snapshot::BuildSpec {
            net: net.as_ref().map(|n| n.attachment()),
            backend: self.backend.as_ref(),
            template,
            boot,
            vcpus,
            memory_mib,
            accel,
            boot_timeout: self.config.boot_timeout,
        };
        snapshot::build(spec, &dir).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: (u32, u32) = (1, 512);
    const NONE: SandboxSize = SandboxSize { vcpus: None, memory_mib: None };

    #[test]
    fn the_request_wins_then_the_template_then_the_node() {
        let desktop = SandboxSize { vcpus: Some(2), memory_mib: Some(2048) };
        assert_eq!(size_of(NONE, NONE, NODE).unwrap(), (1, 512));
        assert_eq!(size_of(NONE, desktop, NODE).unwrap(), (2, 2048));
        let asked = SandboxSize { vcpus: None, memory_mib: Some(1024) };
        assert_eq!(size_of(asked, desktop, NODE).unwrap(), (2, 1024));
        let half = SandboxSize { vcpus: Some(4), memory_mib: None };
        assert_eq!(size_of(NONE, half, NODE).unwrap(), (4, 512));
    }

    #[test]
    fn out_of_bounds_sizes_are_refused_wherever_they_come_from() {
        let huge = SandboxSize { vcpus: Some(64), memory_mib: None };
        assert!(matches!(size_of(huge, NONE, NODE), Err(NodeError::OutOfRange { field: "vcpus", .. })));
        let tiny = SandboxSize { vcpus: None, memory_mib: Some(64) };
        assert!(matches!(size_of(NONE, tiny, NODE), Err(NodeError::OutOfRange { field: "memoryMib", .. })));
    }
}
