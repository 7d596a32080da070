//! Virtual machine monitors behind Lizard sandboxes.
//!
//! A [`Backend`] boots or restores [`Vm`]s from a [`VmConfig`]; a [`Vm`] is one running
//! VMM process that can be paused, resumed, snapshotted and killed. The node never
//! touches VMM command lines or control sockets itself, so Firecracker can slot in
//! beside [`qemu::QemuBackend`] without changes above this crate.
//!
//! Every QEMU the backend starts can be confined ([`jail`]): its own uid, no
//! capabilities, seccomp, cgroups, rlimits and a mount namespace; one spawn path serves
//! boots, restores and pre-spawned VMMs alike.
//!
//! The host↔guest channel is part of the config: [`Vm::agent_socket`] is a Unix socket
//! whose other end is the agent's transport (a virtio-serial port under QEMU).

pub mod accel;
pub mod census;
mod console;
pub mod delta;
pub mod exit_watch;
pub mod jail;
pub mod netns;
pub mod qemu;
mod qmp;

use std::path::{Path, PathBuf};

pub use accel::Accel;
pub use delta::{DeltaError, DeltaStats};
pub use qmp::QmpError;

/// Everything that shapes one VM. Pure data: runtime state lives in the [`Vm`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VmConfig {
    /// Sandbox id; names the VMM process.
    pub id: String,
    pub vcpus: u32,
    pub memory_mib: u32,
    /// Uncompressed ELF kernel (PVH entry).
    pub kernel: PathBuf,
    pub initramfs: PathBuf,
    /// Kernel command line (the node adds the agent's keys).
    pub cmdline: String,
    /// The writable root disk (qcow2 over the template image). Attached first: /dev/vda.
    pub root_disk: PathBuf,
    /// Further disks in order (/dev/vdb, …), e.g. volumes.
    #[serde(default)]
    pub extra_disks: Vec<PathBuf>,
    /// File (mode 0600) holding the agent's secret, handed to the guest out of band so
    /// that it appears in no process's arguments.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// Directory owned by this VM: control sockets, console log, memory file.
    pub run_dir: PathBuf,
    pub accel: Accel,
    /// The VM's NIC, if it has one. Part of the device set: a snapshot restores only
    /// into a VM that has the same.
    #[serde(default)]
    pub net: Option<NetAttachment>,
}

/// A virtio-net device backed by a TAP device inside a network namespace; the VMM
/// process runs in that namespace (its control sockets are paths, so they still work).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NetAttachment {
    /// The namespace, as a file to `setns(2)` into (e.g. `/run/netns/NAME`).
    pub netns: PathBuf,
    /// TAP device name inside the namespace (it must exist).
    pub tap: String,
    /// The guest's MAC address.
    pub mac: String,
}

impl VmConfig {
    /// File that backs guest memory (shared mapping, so snapshots need not copy it).
    pub fn memory_file(&self) -> PathBuf {
        self.run_dir.join("memory")
    }
    /// Unix socket connected to the agent's channel.
    pub fn agent_socket(&self) -> PathBuf {
        self.run_dir.join("agent.sock")
    }
    /// The guest's serial console, for diagnosing boots that fail.
    pub fn console_log(&self) -> PathBuf {
        self.run_dir.join("console.log")
    }
}

/// How guest memory is mapped when restoring a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryMapping {
    /// Private copy-on-write mapping of the snapshot's memory file: many clones share
    /// its pages and none of them writes to it (template snapshots).
    CopyOnWrite,
    /// Shared mapping: the VM keeps writing to the file it was restored from (resume of a
    /// paused sandbox whose memory file is its own).
    Shared,
}

/// A saved VM: device state in `dir/vmstate`, memory in the file given at save time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub vmstate: PathBuf,
    pub memory: PathBuf,
}

impl Snapshot {
    pub fn in_dir(dir: &Path, memory: PathBuf) -> Self {
        Snapshot { vmstate: dir.join("vmstate"), memory }
    }
}

/// A paused copy-on-write clone saved as a delta: the base memory file it maps private,
/// the pages it changed ([`delta`]) and its device state (no RAM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeltaSnapshot {
    pub base: PathBuf,
    pub delta: PathBuf,
    pub devices: PathBuf,
}

/// A VM stopped by its VMM because a disk operation failed: it stands still, guest and
/// all, until it is resumed ([`Vm::resume`]), which retries the failed operation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IoHalt {
    /// The VMM's name for the disk (`disk0` is the root disk).
    pub disk: String,
    /// The host filesystem under the disk had no space left.
    pub no_space: bool,
}

/// How a VMM process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmExit {
    /// Exit code of the VMM process, if it exited normally.
    pub code: Option<i32>,
    /// Signal that killed it, if any.
    pub signal: Option<i32>,
}

/// Errors of VMM backends.
#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    /// The VMM binary is missing or could not start.
    #[error("cannot start {binary}: {cause} (install it with `apt-get install qemu-system-x86`)")]
    Spawn { binary: String, cause: std::io::Error },
    /// Filesystem work around the VM failed.
    #[error("{context}: {cause}")]
    Io { context: String, cause: std::io::Error },
    /// The VMM's control channel failed or answered an error.
    #[error("VMM control: {0}")]
    Control(QmpError),
    /// QEMU ended before its control socket answered; `stderr` is the end of what it
    /// printed (for the operator's log, never for clients).
    #[error("QEMU exited at start: {stderr}")]
    ExitedAtStart { stderr: String },
    /// A snapshot was asked to keep memory in a file other than the VM's own.
    #[error("a QEMU snapshot keeps memory in the VM's own memory file")]
    ForeignMemoryFile,
    /// A path the VMM must be given as text is not UTF-8.
    #[error("non-UTF-8 path {}", .0.display())]
    NonUtf8Path(PathBuf),
    /// The VM has no extra disk of that index.
    #[error("the VM has no extra disk {0}")]
    NoSuchDisk(usize),
    /// A memory delta could not be saved or applied (damaged, missing, not this VM's).
    #[error("memory delta: {0}")]
    Delta(DeltaError),
    /// A delta save of a VM whose memory is no copy-on-write mapping of a base file.
    #[error("the VM's memory is not a copy-on-write mapping")]
    NotCopyOnWrite,
    /// The VMM process is gone.
    #[error("the VMM process exited ({0:?})")]
    Exited(VmExit),
    /// The VMM could not be confined.
    #[error("confine the VMM: {0}")]
    Jail(jail::JailError),
    /// No VMM may start: the host cannot confine them (what it lacks).
    #[error("VMMs cannot be confined on this host ({0})")]
    Unconfined(String),
    /// An operation did not finish in time.
    #[error("{0} timed out")]
    Timeout(&'static str),
}

impl From<QmpError> for VmmError {
    fn from(e: QmpError) -> Self {
        VmmError::Control(e)
    }
}

impl From<DeltaError> for VmmError {
    fn from(e: DeltaError) -> Self {
        VmmError::Delta(e)
    }
}

impl From<jail::JailError> for VmmError {
    fn from(e: jail::JailError) -> Self {
        VmmError::Jail(e)
    }
}

impl VmmError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        VmmError::Io { context: context.into(), cause: source }
    }
}

pub type Result<T, E = VmmError> = std::result::Result<T, E>;

/// A kind of VMM.
#[async_trait::async_trait]
pub trait Backend: Send + Sync {
    /// Short name for logs, e.g. "qemu".
    fn name(&self) -> &'static str;
    /// The VMM's own version, e.g. "QEMU emulator version 10.0.2 (…)": saved device state
    /// and an accelerator probe hold for this version only. Empty when it cannot be told.
    fn version(&self) -> String {
        String::new()
    }
    /// Cold-boot a VM.
    async fn boot(&self, config: &VmConfig) -> Result<Box<dyn Vm>>;
    /// Start a VM from a snapshot; it runs when this returns.
    async fn restore(&self, config: &VmConfig, snapshot: &Snapshot, memory: MemoryMapping) -> Result<Box<dyn Vm>> {
        self.spawn_for_restore(config, &snapshot.memory, memory).await?.restore(&snapshot.vmstate).await
    }
    /// Start the VMM process of a VM to be restored from a snapshot whose memory is
    /// `memory`, without its device state yet: the costly part of a restore (the process,
    /// its devices, mapping the memory), done ahead of demand.
    async fn spawn_for_restore(
        &self,
        config: &VmConfig,
        memory: &Path,
        mapping: MemoryMapping,
    ) -> Result<Box<dyn PendingVm>>;
    /// Start a VM from a full save ([`Vm::save_all`]): guest memory comes out of `state`
    /// into the VM's own memory file ([`VmConfig::memory_file`], replaced), so that the
    /// VM can later be snapshotted without copying memory. It runs when this returns.
    async fn load(&self, config: &VmConfig, state: &Path) -> Result<Box<dyn Vm>>;
    /// Start a VM from a delta save ([`Vm::save_delta`]): `saved.base` mapped
    /// copy-on-write, the delta's pages mapped over it (or written into it) and the device
    /// state loaded before the guest runs. A damaged or missing delta fails here, the VMM
    /// killed. It runs when this returns, still a copy-on-write clone of `saved.base`.
    async fn restore_delta(&self, config: &VmConfig, saved: &DeltaSnapshot) -> Result<Box<dyn Vm>>;
    /// Take back the running VMM process `pid` of `config`, which an earlier process of
    /// the caller started (a node restart): its control channel is reconnected and its
    /// exit watched; the VM runs on untouched. Its exit status will not be known.
    async fn adopt(&self, config: &VmConfig, pid: u32) -> Result<Box<dyn Vm>>;
}

/// One running VMM process.
#[async_trait::async_trait]
pub trait Vm: Send + Sync {
    fn config(&self) -> &VmConfig;
    /// Host pid of the VMM process.
    fn pid(&self) -> u32;
    /// Stop the vCPUs; memory and devices stay as they are.
    async fn pause(&self) -> Result<()>;
    /// Continue after [`Vm::pause`].
    async fn resume(&self) -> Result<()>;
    /// Save device state to `snapshot.vmstate` while paused. Memory is not copied: it
    /// already lives in the VM's memory file, which must be `snapshot.memory`.
    async fn snapshot(&self, snapshot: &Snapshot) -> Result<()>;
    /// Tell the guest to re-read the size of extra disk `index` (0: /dev/vdb) from its
    /// backing file: a VM restored from a snapshot keeps the size its guest saw at
    /// snapshot time until the device signals a change.
    async fn refresh_disk_size(&self, index: usize) -> Result<u64>;
    /// Save device state and all of guest memory to `state` while paused: for a VM whose
    /// memory is not a file of its own (a copy-on-write clone), and for copies of a VM that
    /// keeps running.
    async fn save_all(&self, state: &Path) -> Result<()>;
    /// The file this VM's memory is a private copy-on-write mapping of, if it is one.
    fn memory_base(&self) -> Option<&Path>;
    /// Save, while paused, what a copy-on-write clone changed: the guest pages that are no
    /// longer its base file's to `delta`, and device state without RAM to `devices`
    /// (both replaced). For VMs with a [`Vm::memory_base`] only.
    async fn save_delta(&self, delta: &Path, devices: &Path) -> Result<DeltaStats>;
    /// Freeze the root disk as it is now: the empty overlay `new_top`, a qcow2 file the
    /// caller made over (a link to) the current disk, takes the VM's writes from here on.
    /// Call while paused.
    async fn freeze_disk(&self, new_top: &Path) -> Result<()>;

    /// Grow the root disk (its qcow2 overlay) to `size` bytes; the guest sees the new
    /// capacity at once and grows its file system itself.
    async fn grow_root_disk(&self, size: u64) -> Result<()>;
    /// Stop the VMM process now (SIGKILL) and reap it.
    async fn kill(&self) -> Result<VmExit>;
    /// Whether the VM stands halted by a failed disk operation (`Some` from the moment
    /// the VMM reports it until the VM runs again).
    fn io_halt(&self) -> tokio::sync::watch::Receiver<Option<IoHalt>>;
    /// Wait until the VMM process exits by itself.
    async fn wait(&self) -> VmExit;
    /// True while the VMM process is alive.
    fn is_running(&self) -> bool;
}

/// A VMM process started by [`Backend::spawn_for_restore`], waiting for device state.
#[async_trait::async_trait]
pub trait PendingVm: Send + Sync {
    fn config(&self) -> &VmConfig;
    /// Host pid of the VMM process.
    fn pid(&self) -> u32;
    /// Load the device state in `vmstate` (saved from a VM whose memory is the file this
    /// one maps) and run. On failure the process is killed.
    async fn restore(self: Box<Self>, vmstate: &Path) -> Result<Box<dyn Vm>>;
    /// Stop the waiting process now (SIGKILL) and reap it.
    async fn kill(&self) -> Result<VmExit>;
}

/// The last `max` bytes of a text file, lossily decoded; empty when missing.
pub fn tail_of(path: &Path, max: usize) -> String {
    match std::fs::read(path) {
        Ok(b) => String::from_utf8_lossy(&b[b.len().saturating_sub(max)..]).into_owned(),
        Err(_) => String::new(),
    }
}
