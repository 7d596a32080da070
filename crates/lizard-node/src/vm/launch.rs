//! Starting VMs, the ways a node does it — cold boot, clone of a template snapshot, copy
//! of a fork's source (its full save, or its memory delta over the base it maps), resume
//! of a paused VM in place — and saving a paused VM into its run directory
//! ([`super::saved`] has the forms a save takes). Each start ends with an authenticated agent connection; on
//! failure the VM is killed (the caller removes the run directory).

use super::agent::{connect_agent, give_identity, mount_volume, send_identity, COPY_HANDSHAKE, RESTORED_HANDSHAKE};
use super::disk::create_overlay;
use super::run_dir::{self, FULL_STATE, VMSTATE};
use super::saved::{self, SavedForm};
use crate::Result;
use lizard_agent_client::AgentClient;
use lizard_agent_proto::handshake::Secret;
use lizard_vmm::{Backend, DeltaSnapshot, MemoryMapping, PendingVm, Snapshot, Vm, VmConfig, VmmError};
use std::path::Path;
use std::time::{Duration, Instant};

/// A VMM process and the authenticated connection to its agent.
pub(crate) struct Launched {
    pub vm: Box<dyn Vm>,
    pub agent: AgentClient,
}

impl Launched {
    /// Have the agent mount the volume at /workspace; on failure the VM is killed.
    pub async fn mount_volume(self, restored: bool) -> Result<Launched> {
        connected(self.vm.as_ref(), async { mount_volume(self.vm.as_ref(), &self.agent, restored).await }).await?;
        Ok(self)
    }
}

/// Boot `config` over a new overlay on the image `rootfs` (`raw` or `qcow2`), and
/// authenticate to its agent with `secret` within `deadline`.
pub(crate) async fn cold_boot(
    backend: &dyn Backend,
    config: &VmConfig,
    rootfs: &Path,
    rootfs_format: &str,
    secret: &Secret,
    deadline: Duration,
) -> Result<Launched> {
    run_dir::prepare(config, secret)?;
    create_overlay(rootfs, rootfs_format, &config.root_disk).await?;
    let vm = backend.boot(config).await?;
    let attempt = Some(super::agent::COLD_BOOT_HANDSHAKE);
    let agent = connected(vm.as_ref(), connect_agent(vm.as_ref(), secret, deadline, attempt)).await?;
    Ok(Launched { vm, agent })
}

/// Start `config` as a clone of a template snapshot: a new overlay over the snapshot's
/// frozen `disk`, its memory mapped copy-on-write, then a fresh identity for the guest,
/// given before anything else runs in it.
pub(crate) async fn clone_template(
    backend: &dyn Backend,
    config: &VmConfig,
    disk: &Path,
    saved: &Snapshot,
    saved_secret: &Secret,
    secret: &Secret,
    deadline: Duration,
) -> Result<Launched> {
    let t = Instant::now();
    let pending = spawn_clone(backend, config, disk, &saved.memory, secret).await?;
    let vmm = t.elapsed();
    let launched = restore_clone(pending, &saved.vmstate, saved_secret, Some(secret), deadline).await?;
    tracing::debug!(id = %config.id, ?vmm, total = ?t.elapsed(), "restored");
    Ok(launched)
}

/// The first half of [`clone_template`], which can run ahead of demand: the run
/// directory, a new overlay over the snapshot's frozen `disk`, and a VMM process that
/// maps the snapshot's `memory` copy-on-write and waits for its device state.
pub(crate) async fn spawn_clone(
    backend: &dyn Backend,
    config: &VmConfig,
    disk: &Path,
    memory: &Path,
    secret: &Secret,
) -> Result<Box<dyn PendingVm>> {
    // Same devices as the template VM, the fw_cfg item included; a restored guest does
    // not read it again: its secret arrives with the identity.
    run_dir::prepare(config, secret)?;
    create_overlay(disk, "qcow2", &config.root_disk).await?;
    // The clone maps a link to the template's memory in its own directory: pausing it
    // writes only the pages it changed, and its resume needs that file, not the template.
    let memory = match saved::link_base(memory, &config.run_dir) {
        Ok(linked) => linked,
        Err(e) => {
            tracing::warn!(id = %config.id, "cannot link the template's memory (its pauses save all of memory): {e}");
            memory.to_path_buf()
        }
    };
    Ok(backend.spawn_for_restore(config, &memory, MemoryMapping::CopyOnWrite).await?)
}

/// The second half of [`clone_template`]: load the snapshot's device state into
/// `pending`, run it, and authenticate with the snapshot's secret; with `secret`, give
/// the guest its own identity at once (without: a warm pool's machine, which gets it
/// when claimed, through [`identify`]).
pub(crate) async fn restore_clone(
    pending: Box<dyn PendingVm>,
    vmstate: &Path,
    saved_secret: &Secret,
    secret: Option<&Secret>,
    deadline: Duration,
) -> Result<Launched> {
    let mut unclaimed = KillOnDrop(Some(pending.pid()));
    let vm = pending.restore(vmstate).await?;
    unclaimed.0 = None;
    let id = vm.config().id.clone();
    let agent = match secret {
        Some(secret) => give_identity(vm.as_ref(), &id, saved_secret, secret, deadline, RESTORED_HANDSHAKE).await,
        None => connect_agent(vm.as_ref(), saved_secret, deadline, Some(RESTORED_HANDSHAKE)).await,
    };
    let agent = connected(vm.as_ref(), std::future::ready(agent)).await?;
    Ok(Launched { vm, agent })
}

/// Give a restored guest whose session is open (a warm pool's machine) its own identity;
/// on failure the VM is killed.
pub(crate) async fn identify(launched: Launched, secret: &Secret, deadline: Duration) -> Result<Launched> {
    let vm = launched.vm.as_ref();
    connected(vm, send_identity(&launched.agent, &vm.config().id, secret, deadline)).await?;
    Ok(launched)
}

/// Start `config` as a copy of a fork's source: a new overlay on the frozen `layer`, the
/// source's full save loaded into a memory file of its own, and a new identity.
pub(crate) async fn load_copy(
    backend: &dyn Backend,
    config: &VmConfig,
    layer: &Path,
    state_file: &Path,
    source_secret: &Secret,
    secret: &Secret,
    deadline: Duration,
) -> Result<Launched> {
    prepare_copy(config, layer, secret).await?;
    let vm = backend.load(config, state_file).await?;
    identify_copy(vm, source_secret, secret, deadline).await
}

/// Start `config` as a copy of a fork's source that is a copy-on-write clone: a new
/// overlay on the frozen `layer`, the source's base memory linked into the copy's run
/// directory and mapped copy-on-write, the source's delta (`saved`) applied, and a new
/// identity.
pub(crate) async fn delta_copy(
    backend: &dyn Backend,
    config: &VmConfig,
    layer: &Path,
    saved: &DeltaSnapshot,
    source_secret: &Secret,
    secret: &Secret,
    deadline: Duration,
) -> Result<Launched> {
    prepare_copy(config, layer, secret).await?;
    // No fallback to mapping the source's base where it is: a VM restored from a delta
    // can only be saved as a delta (see lizard_vmm's `Memory::DeltaBase`), which needs
    // the link.
    let base = saved::link_base(&saved.base, &config.run_dir)
        .map_err(|e| crate::NodeError::io("link the source's base memory", e))?;
    let vm = backend.restore_delta(config, &DeltaSnapshot { base, ..saved.clone() }).await?;
    identify_copy(vm, source_secret, secret, deadline).await
}

/// A fork copy's run directory and its overlay on the frozen `layer`.
async fn prepare_copy(config: &VmConfig, layer: &Path, secret: &Secret) -> Result<()> {
    run_dir::prepare(config, secret)?;
    create_overlay(layer, "qcow2", &config.root_disk).await
}

/// A fork copy's new identity, through a handshake that first ends the source's stale
/// session; on failure the VM is killed.
async fn identify_copy(
    vm: Box<dyn Vm>,
    source_secret: &Secret,
    secret: &Secret,
    deadline: Duration,
) -> Result<Launched> {
    let id = vm.config().id.clone();
    let identity = give_identity(vm.as_ref(), &id, source_secret, secret, deadline, COPY_HANDSHAKE);
    let agent = connected(vm.as_ref(), identity).await?;
    Ok(Launched { vm, agent })
}

/// Stop `vm`'s vCPUs and save it into its run directory (see [`saved::save_paused`]).
pub(crate) async fn save_in_place(vm: &dyn Vm, own_memory: bool) -> Result<SavedForm, VmmError> {
    vm.pause().await?;
    saved::save_paused(vm, own_memory).await
}

/// Start the VM [`save_in_place`] saved, where it stopped; also true when its guest
/// memory is now its own file (a full save loads into one; a delta save restores a
/// copy-on-write clone again). The identity call sets the guest's clock, which stood
/// still while it was saved (and adds entropy); the guest keeps its name and `secret`.
pub(crate) async fn resume_in_place(
    backend: &dyn Backend,
    config: &VmConfig,
    own_memory: bool,
    secret: &Secret,
    deadline: Duration,
) -> Result<(Launched, bool)> {
    // With no complete save at all, the restore names the file that is missing.
    let default = if own_memory { SavedForm::DeviceState } else { SavedForm::Delta };
    let form = saved::saved_form(&config.run_dir, own_memory).unwrap_or(default);
    let vm = match form {
        SavedForm::DeviceState => {
            let saved = Snapshot { vmstate: config.run_dir.join(VMSTATE), memory: config.memory_file() };
            backend.restore(config, &saved, MemoryMapping::Shared).await?
        }
        SavedForm::Delta => backend.restore_delta(config, &saved::delta_snapshot(&config.run_dir)).await?,
        SavedForm::Full => backend.load(config, &config.run_dir.join(FULL_STATE)).await?,
    };
    let identity = give_identity(vm.as_ref(), &config.id, secret, secret, deadline, RESTORED_HANDSHAKE);
    let agent = connected(vm.as_ref(), identity).await?;
    Ok((Launched { vm, agent }, form != SavedForm::Delta))
}

/// The agent connection `connect` makes, or the VM killed and the error. If this future
/// is dropped before it ends (a build past its time limit, a cancelled build), the VMM is
/// killed too: nobody holds it yet, so nobody else could.
async fn connected<T>(vm: &dyn Vm, connect: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    let mut unclaimed = KillOnDrop(Some(vm.pid()));
    let result = connect.await;
    unclaimed.0 = None;
    match result {
        Ok(a) => Ok(a),
        Err(e) => {
            let _ = vm.kill().await;
            Err(e)
        }
    }
}

/// SIGKILL the VMM process `pid` now, from code that cannot wait for [`Vm::kill`] (a
/// drop); the backend reaps it.
pub(crate) fn sigkill(pid: u32) {
    // Pids are at most 2^22 on Linux (pid_max), and a live child's is never 0: one that
    // does not fit, or 0 (the caller's whole group), is no process of ours.
    match i32::try_from(pid) {
        Ok(pid) if pid > 0 => {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        _ => {}
    }
}

/// SIGKILLs the VMM process it names when dropped.
struct KillOnDrop(Option<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            sigkill(pid);
        }
    }
}
