//! Template snapshots: boot a template once, save it, and start every later sandbox of
//! that template (and shape) by restoring the saved VM instead of booting a kernel.
//!
//! `<data_dir>/snapshots/<key>/` holds
//!
//! - `vmstate`: device state (QMP `migrate` with `x-ignore-shared`, ~60 KB),
//! - `memory`: guest RAM, the template VM's own memory file; clones map it private
//!   copy-on-write, so they share its pages and never write to it,
//! - `disk.qcow2`: the template VM's root overlay, frozen; each clone writes a new
//!   overlay on top of it,
//! - `snapshot.json`: what it was made from, and the template-time agent secret that a
//!   clone answers to until the node gives it its own identity.
//!
//! The key is a hash over everything that must match for a restore to be valid: template
//! image, kernel, initramfs (hence the agent), vCPUs, memory, accelerator, the VMM's
//! version (device state is only promised to load into the QEMU that saved it) and
//! [`FORMAT`]. A directory is built under a temporary name and renamed into place, so a
//! `snapshot.json` that exists belongs to a complete snapshot.

use crate::assets::BootFiles;
pub use crate::error::SnapshotError;
use crate::templates::NodeTemplate;
use crate::vm::{self, Machine};
use crate::{NodeError, Result};
use lizard_agent_proto::handshake::Secret;
use lizard_vmm::{Accel, Backend, Snapshot};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Bumped whenever what a snapshot directory holds, or how it is made, changes — and
/// whenever the VM's device set changes, since a snapshot restores only into a VM with
/// the same devices. 2: a second virtio-blk disk (volume or placeholder); 3: a NIC; 4: a
/// third virtio-blk disk (the staging disk of file transfers).
pub const FORMAT: u32 = 4;

/// The VM's device set, part of the key beside [`FORMAT`]. Bump when devices change.
pub const DEVICE_LAYOUT: &str = "serial+blk3+rng+fwcfg/net-v2";

/// Prefix of directories being built; anything with it at node start is a leftover.
pub(crate) const TMP_PREFIX: &str = ".tmp-";

/// How long the agent gets to notice that the host went away and return to waiting for
/// the next host (it polls every 2 ms) before the VM is frozen.
const SETTLE: Duration = Duration::from_millis(100);

/// `snapshot.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotMeta {
    pub format: u32,
    pub template: String,
    pub template_hash: String,
    pub kernel_hash: String,
    pub initramfs_hash: String,
    pub vcpus: u32,
    pub memory_mib: u32,
    pub accel: Accel,
    /// The agent's secret at snapshot time (hex): what a fresh clone answers to.
    pub secret: String,
    /// Wall time of the cold boot + save, for the logs.
    pub build_ms: u64,
}

/// A complete template snapshot on disk.
#[derive(Debug, Clone)]
pub struct TemplateSnapshot {
    pub dir: PathBuf,
    pub meta: SnapshotMeta,
    pub secret: Secret,
}

impl TemplateSnapshot {
    pub fn vm_snapshot(&self) -> Snapshot {
        Snapshot { vmstate: self.dir.join("vmstate"), memory: self.dir.join("memory") }
    }
    pub fn disk(&self) -> PathBuf {
        self.dir.join("disk.qcow2")
    }
    /// Its key: the name of its directory.
    pub fn key(&self) -> String {
        self.dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    }

    /// The snapshot in `dir`, if it is complete and of this format.
    pub fn load(dir: &Path) -> Option<TemplateSnapshot> {
        let meta: SnapshotMeta = serde_json::from_slice(&std::fs::read(dir.join("snapshot.json")).ok()?).ok()?;
        if meta.format != FORMAT {
            return None;
        }
        let secret = Secret::from_hex(&meta.secret).ok()?;
        let snap = TemplateSnapshot { dir: dir.to_path_buf(), meta, secret };
        let s = snap.vm_snapshot();
        [s.vmstate, s.memory, snap.disk()].iter().all(|p| p.is_file()).then_some(snap)
    }
}

/// The directory name of the snapshot for this template and shape.
pub fn key(
    template: &NodeTemplate,
    boot: &BootFiles,
    vcpus: u32,
    memory_mib: u32,
    accel: Accel,
    vmm: &str,
    nic: bool,
) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in [
        format!("format={FORMAT}"),
        format!("template={}", template.hash),
        format!("kernel={}", boot.kernel.hash),
        format!("initramfs={}", boot.initramfs.hash),
        format!("vcpus={vcpus}"),
        format!("memory={memory_mib}"),
        format!("accel={accel:?}"),
        format!("vmm={vmm}"),
        format!("devices={DEVICE_LAYOUT}"),
        format!("nic={nic}"),
    ] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    hex::encode(h.finalize())
}

/// What a build needs.
pub(crate) struct BuildSpec<'a> {
    pub backend: &'a dyn Backend,
    pub template: &'a NodeTemplate,
    pub boot: &'a BootFiles,
    pub vcpus: u32,
    pub memory_mib: u32,
    pub accel: Accel,
    pub boot_timeout: Duration,
    /// The NIC, when sandboxes have one: the template VM must have the same.
    pub net: Option<lizard_vmm::NetAttachment>,
}

/// Cold-boot the template, start its start command (if any) and wait until it is ready,
/// quiesce it and save it into `final_dir` (renamed into place
/// from a temporary directory next to it). The caller holds the locks.
pub(crate) async fn build(spec: BuildSpec<'_>, final_dir: &Path) -> Result<TemplateSnapshot> {
    let started = Instant::now();
    let parent = final_dir.parent().expect("snapshot dirs have a parent");
    let key = final_dir.file_name().expect("snapshot dirs have a name").to_string_lossy().into_owned();
    let vm_id = format!("template-{}", &key[..12.min(key.len())]);
    let tmp = parent.join(format!("{TMP_PREFIX}{vm_id}"));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| NodeError::io(format!("create {}", tmp.display()), e))?;
    let mut unfinished = Unfinished { vmm: None, tmp: &tmp };
    let secret = Secret::generate();
    // The same devices as its clones will have (the volume slot a placeholder).
    let machine = Machine::new(spec.boot, spec.vcpus, spec.memory_mib, spec.accel);
    // Its root overlay becomes the snapshot's frozen disk.
    let config = lizard_vmm::VmConfig {
        root_disk: tmp.join("disk.qcow2"),
        ..vm::sandbox_vm(&vm_id, tmp.clone(), &machine, None, spec.net.clone())
    };
    let result = async {
        let vm::Launched { vm, agent } = vm::cold_boot(
            spec.backend,
            &config,
            &spec.template.disk,
            spec.template.disk_format.as_str(),
            &secret,
            spec.boot_timeout,
        )
        .await?;
        unfinished.vmm = Some(vm.pid());
        let saved = async {
            // The start command runs in the snapshot: every clone has it up already.
            if let Some(start) = &spec.template.start {
                crate::start::start(&agent, start).await?;
            }
            // Whatever the boot wrote reaches the disk that every clone will build on.
            let sync = lizard_agent_proto::types::ExecRequest { argv: Some(vec!["sync".into()]), ..Default::default() };
            let out = agent.exec_collect(sync).await.map_err(SnapshotError::Sync)?;
            if out.status.exit_code != 0 {
                return Err(SnapshotError::SyncExit(out.status.exit_code).into());
            }
            // The agent must be back to waiting for a host when frozen: then the first
            // connection to a clone is simply its next session.
            if tokio::time::timeout(Duration::from_secs(5), agent.close()).await.is_err() {
                return Err(SnapshotError::AgentNotClosed.into());
            }
            tokio::time::sleep(SETTLE).await;
            vm.pause().await?;
            vm.snapshot(&Snapshot { vmstate: tmp.join("vmstate"), memory: config.memory_file() }).await?;
            Ok::<(), NodeError>(())
        }
        .await;
        unfinished.vmm = None;
        let _ = vm.kill().await;
        saved
    }
    .await;
    // On failure the guard removes the directory.
    result?;
    for f in ["secret", "agent.sock", "qmp.sock", "vmm.pid", vm::PLACEHOLDER_DISK, vm::STAGING_DISK] {
        let _ = std::fs::remove_file(tmp.join(f));
    }
    let meta = SnapshotMeta {
        format: FORMAT,
        template: spec.template.name.clone(),
        template_hash: spec.template.hash.clone(),
        kernel_hash: spec.boot.kernel.hash.clone(),
        initramfs_hash: spec.boot.initramfs.hash.clone(),
        vcpus: spec.vcpus,
        memory_mib: spec.memory_mib,
        accel: spec.accel,
        secret: secret.to_hex(),
        build_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    };
    let finish = || -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(tmp.join("snapshot.json"))?;
        std::io::Write::write_all(&mut f, &serde_json::to_vec_pretty(&meta).expect("json serializes"))?;
        f.sync_all()?;
        // Clones only read these; nothing may change them under a running clone.
        for f in ["vmstate", "memory", "disk.qcow2"] {
            let p = tmp.join(f);
            let mut perm = std::fs::metadata(&p)?.permissions();
            perm.set_readonly(true);
            std::fs::set_permissions(&p, perm)?;
        }
        // Clones' VMMs pass through to the disk their overlays are backed by (the VM's
        // run directory was its own, then root's and owner-only).
        std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o711))?;
        std::fs::rename(&tmp, final_dir)
    };
    finish().map_err(|e| NodeError::io(format!("store snapshot {}", final_dir.display()), e))?;
    tracing::info!(template = %meta.template, key = %key, ms = meta.build_ms, "template snapshot ready");
    Ok(TemplateSnapshot { dir: final_dir.to_path_buf(), secret, meta })
}

/// A snapshot build that stops before its end — failed, or its future dropped (a
/// cancelled build aborts it; a node shutting down drops its tasks) — leaves nothing: the
/// template VM's VMM is killed (the backend reaps it) and the half-built directory goes,
/// as [`sweep`] does at the next start. The finished directory was renamed away before.
struct Unfinished<'a> {
    vmm: Option<u32>,
    tmp: &'a Path,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(pid) = self.vmm {
            vm::sigkill(pid);
        }
        let _ = std::fs::remove_dir_all(self.tmp);
    }
}

/// Remove half-built snapshots (and their VMMs) left by an earlier node process.
pub(crate) fn sweep(snapshots_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(snapshots_dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(vm_id) = name.strip_prefix(TMP_PREFIX) else { continue };
        if let Some(pid) = vm::vmm_pid_of(&entry.path(), vm_id) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        let _ = std::fs::remove_dir_all(entry.path());
    }
}

/// An exclusive lock on `path` between node processes sharing a data directory, held
/// while the returned value lives (its file goes with it).
pub(crate) async fn file_lock(path: PathBuf) -> Result<crate::lock_file::LockFile> {
    tokio::task::spawn_blocking(move || {
        crate::lock_file::LockFile::acquire(&path).map_err(|e| NodeError::io(format!("lock {}", path.display()), e))
    })
    .await
    .expect("lock task panicked")
}
