//! Why a node operation failed: one typed variant per cause, each mapped to a stable API
//! code ([`NodeError::code`]) and to a message for clients ([`NodeError::to_api`]) that
//! carries no host internals (paths, VMM stderr); the full cause goes to the operator's
//! log where the error is mapped.
//!
//! The errors of the VM layer ([`BootError`]) and of template snapshots
//! ([`SnapshotError`]) live here too, so that this module depends on no other module of
//! the node but the network (whose error it wraps) and every module can use it.

use crate::network::NetError;
use lizard_agent_client::ClientError;
use lizard_agent_proto::types::AgentError;
use lizard_api::ErrorCode;
use lizard_image::ImageError;
use lizard_vmm::{VmExit, VmmError};
use std::path::PathBuf;
use std::time::Duration;

/// Why a sandbox the node knew has ended (kept to answer later lookups of its id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndReason {
    /// Killed on request.
    Killed,
    /// Its VMM exited by itself (crash, guest power-off, OOM kill).
    Crashed(VmExit),
    /// It was running when the node process ended.
    Lost,
}

impl std::fmt::Display for EndReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndReason::Killed => f.write_str("killed"),
            EndReason::Crashed(exit) => write!(f, "its VM stopped unexpectedly (VMM exit {exit:?})"),
            EndReason::Lost => f.write_str("lost: the node restarted while it ran"),
        }
    }
}

/// Why a guest did not come up.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// The VMM exited or the agent never answered. `console` is the end of the guest's
    /// serial console (its own output, shown to clients); `vmm_stderr` what the VMM
    /// printed (host details: for the operator's log only).
    #[error("{cause}; console: {} {}", console.trim(), vmm_stderr.trim())]
    Failed { cause: BootCause, console: String, vmm_stderr: String },
    /// The agent did not accept the secret it was given.
    #[error("the agent refused the secret")]
    SecretRefused,
    /// A restored guest failed to take its new identity.
    #[error("identity: {0}")]
    Identity(ClientError),
    /// A restored guest did not take its identity in time.
    #[error("the restored guest did not take its identity within {0:?}")]
    IdentityTimeout(Duration),
    /// The agent failed to mount the volume.
    #[error("mount the volume: {0}")]
    VolumeMount(ClientError),
    /// The agent did not mount the volume in time.
    #[error("the volume was not mounted within {0:?}")]
    VolumeMountTimeout(Duration),
    /// A VM that should have a volume has no second disk.
    #[error("no volume disk")]
    NoVolumeDisk,
    /// A disk that should be qcow2 is not.
    #[error("{} is not a qcow2 image", path.display())]
    NotQcow2 { path: PathBuf },
    /// A template snapshot of another shape than the sandbox asked for.
    #[error("the snapshot has another shape")]
    SnapshotShape,
}

impl BootError {
    /// The message without host internals: the console tail stays (guest output), the
    /// VMM's stderr and host paths go.
    pub(crate) fn client_message(&self) -> String {
        match self {
            BootError::Failed { cause, console, .. } => format!("{cause}; console: {}", console.trim()),
            BootError::NotQcow2 { .. } => "a disk image is not qcow2".into(),
            other => other.to_string(),
        }
    }
}

/// Why a boot ended without an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootCause {
    /// The VMM process ended (with this exit, when known).
    VmmExited(Option<VmExit>),
    /// The agent did not answer within the boot deadline.
    AgentTimeout(Duration),
}

impl std::fmt::Display for BootCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BootCause::VmmExited(None) => f.write_str("the VMM exited during boot"),
            BootCause::VmmExited(Some(exit)) => write!(f, "the VMM exited during boot ({exit:?})"),
            BootCause::AgentTimeout(d) => write!(f, "the guest agent did not answer within {d:?}"),
        }
    }
}

/// Why a template VM could not be saved (the create that wanted it cold-boots instead).
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The guest's `sync` could not run.
    #[error("sync: {0}")]
    Sync(lizard_agent_client::ClientError),
    /// The guest's `sync` failed.
    #[error("sync exited {0}")]
    SyncExit(i32),
    /// The agent did not go back to waiting for a host.
    #[error("the agent connection did not close")]
    AgentNotClosed,
}

/// Why a template's start command did not come up in a guest.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The command could not be launched (no such user or directory, say).
    #[error("the start command could not be launched (exit {exit_code}): {output}")]
    Launch { exit_code: i32, output: String },
    /// It ran, but `ready` did not hold within the limit.
    #[error("the start command was not ready ({ready}) within {timeout_s} s")]
    NotReady { ready: String, timeout_s: u32, output_tail: String },
    /// The agent failed while starting it or checking on it.
    #[error("agent: {0}")]
    Agent(ClientError),
}

impl StartError {
    /// The end of what the start command printed, when known.
    pub fn output_tail(&self) -> Option<&str> {
        match self {
            StartError::Launch { output, .. } => Some(output),
            StartError::NotReady { output_tail, .. } => Some(output_tail),
            StartError::Agent(_) => None,
        }
    }
}

/// Why a template build failed (see [`NodeError::build_failure`] for its wire form).
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A step's command exited non-zero (or could not run).
    #[error("step {step} ({description}) failed: {reason}")]
    StepFailed { step: u32, description: String, reason: String, output_tail: String },
    /// A `copy` takes something the pushed directory lacks, or a symlink out of it.
    #[error("step {step} ({description}): {reason}")]
    CopyRefused { step: u32, description: String, reason: String },
    /// The whole build ran past `[build] timeout_s`.
    #[error("the build did not finish within its time limit of {limit_s} s")]
    TimedOut { limit_s: u32 },
    /// The start command did not become ready in the template snapshot's VM.
    #[error("start command: {0}")]
    StartNotReady(StartError),
    /// The build was cancelled.
    #[error("the build was cancelled")]
    Cancelled,
    /// A template ref that does not fit `[a-z0-9-]{1,64}`, or names a built-in.
    #[error("{template_ref:?} cannot name a built template")]
    BadRef { template_ref: String },
    /// A template of that ref exists already on this node.
    #[error("template {template_ref} already exists on this node")]
    RefTaken { template_ref: String },
}

/// Why a node operation failed. Each maps to one stable API code.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// A number outside its bounds (vcpus, memoryMib, a fork's count, a volume's sizeGb).
    #[error("{field} must be {min}..={max}, got {got}")]
    OutOfRange { field: &'static str, min: u64, max: u64, got: u64 },
    /// A network policy that does not parse (the parser's own words).
    #[error("{0}")]
    BadNetworkPolicy(String),
    /// An exec request with both or neither of `cmd` and `argv`.
    #[error("give exactly one of cmd (a shell string) or argv")]
    ExecCommand,
    /// An exec request with an empty `argv`.
    #[error("argv must not be empty")]
    EmptyArgv,
    /// A volume id that could not name a file.
    #[error("bad volume id {id:?}")]
    BadVolumeId { id: String },
    /// A volume this node does not have.
    #[error("no volume {volume} on this node")]
    UnknownVolume { volume: String },
    /// The node has no room for a volume: INVALID_ARGUMENT (422), as for a region without
    /// nodes; a smaller size may fit.
    #[error(
        "not enough disk on this node for a {size_gb} GiB volume: {free_gb} GiB free, {needed_gb} GiB needed \
         (existing volumes may still grow by {promised_gb} GiB)"
    )]
    InsufficientSpace { size_gb: u64, free_gb: u64, needed_gb: u64, promised_gb: u64 },
    /// No such sandbox (never existed, or ended too long ago to remember).
    #[error("sandbox {id} not found")]
    NotFound { id: String },
    /// The sandbox existed but has ended; 404 like an unknown id, saying why.
    #[error("sandbox {id} not found: {reason}")]
    Ended { id: String, reason: EndReason },
    /// The agent channel broke because the sandbox's VM is gone.
    #[error("sandbox {id} not found: its VM stopped ({cause})")]
    VmStopped { id: String, cause: ClientError },
    /// The sandbox is paused (or pausing): resume it first.
    #[error("sandbox {id} is paused: resume it first")]
    Paused { id: String },
    /// A build's disk (`[build] disk_gb`) does not fit the node's free disk beyond the
    /// headroom kept for running sandboxes: a smaller one may.
    #[error("a build disk of {disk_gb} GiB does not fit this node: {room_gb} GiB free beyond what is kept for running sandboxes")]
    BuildDiskTooLarge { disk_gb: u64, room_gb: u64 },
    /// The sandbox's VM stands halted: a write to its disk failed, for want of space on
    /// the node's disk (`no_space`) or another disk error. It goes on by itself, the write
    /// retried, once the node's disk has room again.
    #[error("sandbox {id} is halted: {}; it continues by itself once the node's disk has room", if *.no_space { "the node's disk is full" } else { "a disk write failed on the node" })]
    Halted { id: String, no_space: bool },
    /// Another sandbox of this node holds the volume.
    #[error("volume {volume} is in use by sandbox {holder}")]
    VolumeInUse { volume: String, holder: String },
    /// A volume of that id exists already.
    #[error("volume {volume} already exists on this node")]
    VolumeExists { volume: String },
    /// A sandbox with a volume cannot be copied (forked or saved as a snapshot): one
    /// writer per volume.
    #[error("sandbox {id} has a volume, which only one sandbox may use at a time: it cannot be forked or snapshotted")]
    ForkWithVolume { id: String },
    /// No sandbox snapshot of that id on this node.
    #[error("snapshot {id} not found")]
    SandboxSnapshotNotFound { id: String },
    /// A start from a sandbox snapshot asked for what a snapshot's sandboxes cannot have.
    #[error("{0}")]
    SnapshotRequest(String),
    /// The guest did not come up.
    #[error("sandbox did not boot: {0}")]
    Boot(BootError),
    /// Making a template snapshot failed (the create falls back to a cold boot).
    #[error("template snapshot: {0}")]
    Snapshot(SnapshotError),
    /// The VMM failed.
    #[error(transparent)]
    Vmm(#[from] VmmError),
    /// The agent refused or failed a request (its code says why).
    #[error("{0}")]
    Agent(AgentError),
    /// The agent channel failed while the VM still runs.
    #[error("agent unavailable: {0}")]
    AgentUnavailable(ClientError),
    /// Image build failed (an unknown template is the client's error).
    #[error(transparent)]
    Image(#[from] ImageError),
    /// Filesystem work on the node failed.
    #[error("{context}: {cause}")]
    Io { context: String, cause: std::io::Error },
    /// The sandbox's network could not be made.
    #[error(transparent)]
    Network(#[from] NetError),
    /// No built-in or built template of that name (a build's base, a delete).
    #[error("template {name} not found")]
    TemplateNotFound { name: String },
    /// Sandboxes (running or paused) are made from the template, or creates or builds
    /// under way use it.
    #[error("template {name} is in use by {users} sandbox(es), snapshot(s) or build(s): delete them first")]
    TemplateInUse { name: String, users: usize },
    /// A template build failed.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// A template's start command did not come up in a cold-booted sandbox.
    #[error(transparent)]
    Start(#[from] StartError),
    /// The template registry could not be written.
    #[error("template registry: {0}")]
    Registry(crate::templates::RegistryError),
    /// The node's sealing key could not be read or made.
    #[error("seal key: {0}")]
    Seal(crate::sealed::SealError),
    /// Another node process has this data directory: a second one would take its VMs for
    /// a dead process's leftovers and kill them.
    #[error("another Lizard node process{} uses {}", .pid.map(|p| format!(" (pid {p})")).unwrap_or_default(), .dir.display())]
    DataDirInUse { dir: std::path::PathBuf, pid: Option<u32> },
    /// The node cannot confine the sandbox's VMM, has no room for it, or its size is not
    /// one the node runs.
    #[error(transparent)]
    Confine(#[from] crate::confine::ConfineError),
    /// The filesystem of the node's data directory is full: `what` failed for want of
    /// space (the cause names host paths: the log has it, clients get
    /// [`NodeError::client_message`]'s summary).
    #[error("no space left on the node's disk to {what}: {cause}")]
    DiskFull { what: &'static str, cause: Box<NodeError> },
    /// The data directory's filesystem has less free than the headroom kept for running
    /// sandboxes' disks ([`crate::NodeConfig::disk_headroom`]): no sandbox starts.
    #[error("no space left on the node's disk to start a sandbox: {free_mib} MiB free, {headroom_mib} MiB kept for running sandboxes' disks")]
    NoDiskHeadroom { free_mib: u64, headroom_mib: u64 },
}

impl From<BootError> for NodeError {
    fn from(e: BootError) -> Self {
        NodeError::Boot(e)
    }
}

impl From<SnapshotError> for NodeError {
    fn from(e: SnapshotError) -> Self {
        NodeError::Snapshot(e)
    }
}

impl From<crate::templates::RegistryError> for NodeError {
    fn from(e: crate::templates::RegistryError) -> Self {
        NodeError::Registry(e)
    }
}

impl From<crate::sealed::SealError> for NodeError {
    fn from(e: crate::sealed::SealError) -> Self {
        NodeError::Seal(e)
    }
}

impl NodeError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        NodeError::Io { context: context.into(), cause: source }
    }

    /// This error as [`NodeError::DiskFull`] when it is for want of space: an `ENOSPC`
    /// itself, or — the VMM reports only "an IO error" — a failure while `data_dir`'s
    /// filesystem has less than [`DISK_FULL_BELOW`] free.
    pub fn or_disk_full(self, what: &'static str, data_dir: &std::path::Path) -> Self {
        // The client's own mistakes stay theirs.
        if !matches!(self.code(), ErrorCode::Internal | ErrorCode::BootFailed) {
            return self;
        }
        let enospc =
            matches!(&self, NodeError::Io { cause: source, .. } if source.raw_os_error() == Some(libc::ENOSPC));
        if enospc || free_bytes(data_dir).is_some_and(|f| f < DISK_FULL_BELOW) {
            NodeError::DiskFull { what, cause: Box::new(self) }
        } else {
            self
        }
    }

    pub fn code(&self) -> ErrorCode {
        use lizard_agent_proto::types::ErrorCode as A;
        match self {
            NodeError::OutOfRange { .. }
            | NodeError::BadNetworkPolicy(_)
            | NodeError::ExecCommand
            | NodeError::EmptyArgv
            | NodeError::SnapshotRequest(_)
            | NodeError::BadVolumeId { .. }
            | NodeError::UnknownVolume { .. }
            // The request asks for more than the node can hold: a smaller size fits.
            | NodeError::InsufficientSpace { .. }
            | NodeError::BuildDiskTooLarge { .. }
            | NodeError::Image(ImageError::UnknownTemplate(_))
            | NodeError::Build(BuildError::CopyRefused { .. } | BuildError::BadRef { .. }) => ErrorCode::InvalidArgument,
            NodeError::NotFound { .. }
            | NodeError::Ended { .. }
            | NodeError::VmStopped { .. }
            | NodeError::TemplateNotFound { .. }
            | NodeError::SandboxSnapshotNotFound { .. } => ErrorCode::NotFound,
            NodeError::Paused { .. }
            | NodeError::VolumeInUse { .. }
            | NodeError::VolumeExists { .. }
            | NodeError::ForkWithVolume { .. }
            | NodeError::TemplateInUse { .. }
            | NodeError::Build(BuildError::RefTaken { .. }) => ErrorCode::Conflict,
            // The build's own failures: the request was fine, what it asked for failed
            // (their detail is in `build_failure`).
            NodeError::Build(
                BuildError::StepFailed { .. }
                | BuildError::TimedOut { .. }
                | BuildError::StartNotReady(_)
                | BuildError::Cancelled,
            ) => ErrorCode::InvalidArgument,
            NodeError::Start(_) => ErrorCode::BootFailed,
            NodeError::Registry(_) | NodeError::DataDirInUse { .. } | NodeError::Seal(_) => ErrorCode::Internal,
            NodeError::Boot(_) | NodeError::Snapshot(_) | NodeError::Vmm(_) => ErrorCode::BootFailed,
            NodeError::AgentUnavailable(_) => ErrorCode::Unavailable,
            NodeError::Agent(e) => match e.code {
                A::NotFound => ErrorCode::NotFound,
                A::IsADirectory | A::NotADirectory | A::InvalidArgument => ErrorCode::InvalidArgument,
                A::AlreadyExists => ErrorCode::Conflict,
                A::PermissionDenied => ErrorCode::Forbidden,
                // Nothing listens on the guest port a tunnel named.
                A::ConnectionRefused => ErrorCode::PortClosed,
                A::TimedOut => ErrorCode::TimedOut,
                A::Conflict => ErrorCode::Conflict,
                A::Internal => ErrorCode::Internal,
            },
            NodeError::Network(NetError::Exhausted) => ErrorCode::Unavailable,
            // Another node may have room, or this one once space is freed.
            NodeError::DiskFull { .. } | NodeError::NoDiskHeadroom { .. } | NodeError::Halted { .. } => {
                ErrorCode::Unavailable
            }
            NodeError::Confine(crate::confine::ConfineError::Size(_)) => ErrorCode::InvalidArgument,
            // Another node (or this one, later) may have room or be able to confine.
            NodeError::Confine(_) => ErrorCode::Unavailable,
            NodeError::Image(_) | NodeError::Io { .. } | NodeError::Network(_) => ErrorCode::Internal,
        }
    }

    /// What a client is told: the whole message where it holds only the request's facts
    /// and the guest's output, a summary where the full one would show host paths or
    /// what the VMM printed.
    fn client_message(&self) -> String {
        const SEE_LOG: &str = "(details in the node's log)";
        match self {
            NodeError::Boot(e) => format!("sandbox did not boot: {}", e.client_message()),
            NodeError::Vmm(e) => format!("vmm: {} {SEE_LOG}", vmm_summary(e)),
            NodeError::Image(ImageError::UnknownTemplate(_)) => self.to_string(),
            NodeError::Image(_) => format!("image: the guest images could not be built {SEE_LOG}"),
            NodeError::Io { .. } => format!("internal error on the node {SEE_LOG}"),
            NodeError::Network(NetError::Exhausted) => self.to_string(),
            NodeError::Network(_) => format!("network: the sandbox's network could not be made {SEE_LOG}"),
            NodeError::Registry(_) | NodeError::Seal(_) => format!("internal error on the node {SEE_LOG}"),
            NodeError::DiskFull { what, .. } => {
                format!("no space left on the node's disk to {what}: try again once space is freed {SEE_LOG}")
            }
            // A create's start command, which no build status shows: the guest's output
            // says why, as a boot's console does.
            NodeError::Start(StartError::NotReady { output_tail, .. }) if !output_tail.trim().is_empty() => {
                format!("{self}; its output ends: {}", output_tail.trim())
            }
            NodeError::Start(StartError::Agent(_))
            | NodeError::Build(BuildError::StartNotReady(StartError::Agent(_))) => {
                format!("start command: the guest agent failed {SEE_LOG}")
            }
            _ => self.to_string(),
        }
    }

    /// The build-status form of an error a template build ended with: `STEP_FAILED`
    /// (with the step and its output tail), `TIMED_OUT`, `START_NOT_READY`, `CANCELLED`,
    /// `NOT_FOUND` (an unknown base), `INVALID_ARGUMENT`, `CONFLICT`. `None` for the node's
    /// own failures (VMM, disk, network): the caller reports those as `INTERNAL` with
    /// [`NodeError::to_api`]'s message.
    pub fn build_failure(&self) -> Option<lizard_api::templates::BuildFailure> {
        use lizard_api::templates::BuildFailure;
        let failure = |code: &str, step: Option<u32>, output_tail: Option<&str>| BuildFailure {
            code: code.into(),
            message: self.client_message(),
            step,
            output_tail: output_tail.map(str::to_owned),
        };
        Some(match self {
            NodeError::Build(BuildError::StepFailed { step, output_tail, .. }) => {
                failure("STEP_FAILED", Some(*step), Some(output_tail))
            }
            NodeError::Build(BuildError::CopyRefused { step, .. }) => failure("INVALID_ARGUMENT", Some(*step), None),
            NodeError::Build(BuildError::TimedOut { .. }) => failure("TIMED_OUT", None, None),
            NodeError::Build(BuildError::StartNotReady(e)) | NodeError::Start(e) => {
                failure("START_NOT_READY", None, e.output_tail())
            }
            NodeError::Build(BuildError::Cancelled) => failure("CANCELLED", None, None),
            NodeError::Build(BuildError::BadRef { .. }) => failure("INVALID_ARGUMENT", None, None),
            NodeError::Build(BuildError::RefTaken { .. }) => failure("CONFLICT", None, None),
            NodeError::TemplateNotFound { .. } => failure("NOT_FOUND", None, None),
            // A build size the node does not run, a disk that does not fit.
            e if e.code() == ErrorCode::InvalidArgument => failure("INVALID_ARGUMENT", None, None),
            // No room for the build VM now (CPUs, memory, disk): it may fit later.
            e if e.code() == ErrorCode::Unavailable => failure("UNAVAILABLE", None, None),
            _ => return None,
        })
    }

    /// What a template's start command printed before it was given up as never ready:
    /// the operator's log carries it beside the error, as the build status and client do
    /// (a launch failure's message holds its output already).
    pub fn start_output(&self) -> Option<&str> {
        match self {
            NodeError::Build(BuildError::StartNotReady(StartError::NotReady { output_tail, .. }))
            | NodeError::Start(StartError::NotReady { output_tail, .. }) => Some(output_tail),
            _ => None,
        }
    }

    /// The API's form of this error; the full cause is logged here.
    pub fn to_api(&self) -> lizard_api::ApiError {
        let code = self.code();
        let start_output = self.start_output();
        match code {
            ErrorCode::Internal => tracing::error!(?code, start_output, "{self}"),
            ErrorCode::BootFailed | ErrorCode::Unavailable => tracing::warn!(?code, start_output, "{self}"),
            _ => tracing::debug!(?code, start_output, "{self}"),
        }
        lizard_api::ApiError::new(code, self.client_message())
    }
}

/// What went wrong in the VMM, in words that name no host path and quote nothing the
/// VMM printed.
fn vmm_summary(e: &VmmError) -> String {
    match e {
        VmmError::Spawn { .. } => "the VMM could not be started".into(),
        VmmError::Io { .. } => "a file of the VM could not be made or read".into(),
        VmmError::Control(lizard_vmm::QmpError::Command { command, class, .. }) => {
            format!("the VMM refused {command} ({class})")
        }
        VmmError::Control(_) => "the VMM's control channel failed".into(),
        VmmError::ExitedAtStart { .. } => "the VMM exited at start".into(),
        VmmError::Exited(exit) => format!("the VMM process exited ({exit:?})"),
        VmmError::Timeout(what) => format!("{what} timed out"),
        VmmError::Delta(_) => "the sandbox's saved memory is damaged or missing".into(),
        VmmError::Jail(_) | VmmError::Unconfined(_) => "the VMM could not be confined".into(),
        VmmError::ForeignMemoryFile | VmmError::NonUtf8Path(_) | VmmError::NoSuchDisk(_) | VmmError::NotCopyOnWrite => {
            "the VM was set up wrongly".into()
        }
    }
}

pub type Result<T, E = NodeError> = std::result::Result<T, E>;

/// Free space under which a failure on the data directory's filesystem is taken for a
/// full disk ([`NodeError::or_disk_full`]).
pub const DISK_FULL_BELOW: u64 = 16 << 20;

/// Free space on the filesystem of `dir` that a writer may take (root included: the
/// node runs as root), or None when it cannot be told.
pub(crate) fn free_bytes(dir: &std::path::Path) -> Option<u64> {
    nix::sys::statvfs::statvfs(dir).ok().map(|s| s.blocks_available() * s.fragment_size())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_messages_stay_as_clients_know_them() {
        let e = NodeError::OutOfRange { field: "vcpus", min: 1, max: 16, got: 17 };
        assert_eq!(
            (e.code(), e.to_api().message.as_str()),
            (ErrorCode::InvalidArgument, "vcpus must be 1..=16, got 17")
        );
        let e = NodeError::VolumeInUse { volume: "v".into(), holder: "s".into() };
        assert_eq!((e.code(), e.to_api().message.as_str()), (ErrorCode::Conflict, "volume v is in use by sandbox s"));
        let e = NodeError::Ended { id: "s".into(), reason: EndReason::Killed };
        assert_eq!((e.code(), e.to_api().message.as_str()), (ErrorCode::NotFound, "sandbox s not found: killed"));
        let e = NodeError::Paused { id: "s".into() };
        assert_eq!(e.to_api().message, "sandbox s is paused: resume it first");
    }

    #[test]
    fn a_failure_for_want_of_space_says_so_without_host_paths() {
        let roomy = std::env::temp_dir();
        let full = std::io::Error::from_raw_os_error(libc::ENOSPC);
        let e = NodeError::io("create /var/lib/lizard/sandboxes/abc/root.qcow2", full)
            .or_disk_full("make a sandbox", &roomy);
        assert!(matches!(e, NodeError::DiskFull { .. }), "{e}");
        let api = e.to_api();
        assert_eq!(api.code, ErrorCode::Unavailable);
        assert!(api.message.starts_with("no space left on the node's disk to make a sandbox"), "{}", api.message);
        assert!(!api.message.contains("/var/lib"), "{}", api.message);
        // Other failures, with room on the disk, and the client's own errors stay as they are.
        let other = NodeError::io("read", std::io::Error::from_raw_os_error(libc::EIO)).or_disk_full("x", &roomy);
        assert!(matches!(other, NodeError::Io { .. }));
        let missing = NodeError::NotFound { id: "s".into() }.or_disk_full("x", &roomy);
        assert_eq!(missing.code(), ErrorCode::NotFound);
    }

    #[test]
    fn clients_see_no_host_paths_or_vmm_stderr() {
        let secret_dir = "/var/lib/lizard/sandboxes/abc";
        let errors = [
            NodeError::io(format!("create {secret_dir}"), std::io::Error::other("full")),
            NodeError::Vmm(VmmError::ExitedAtStart { stderr: format!("qemu: cannot open {secret_dir}/memory") }),
            NodeError::Vmm(VmmError::Io { context: format!("create {secret_dir}"), cause: std::io::Error::other("x") }),
            NodeError::Boot(BootError::NotQcow2 { path: PathBuf::from(secret_dir) }),
            NodeError::Boot(BootError::Failed {
                cause: BootCause::AgentTimeout(Duration::from_secs(1)),
                console: "guest says hi".into(),
                vmm_stderr: format!("qemu: {secret_dir}"),
            }),
            NodeError::Network(NetError::Command { command: "ip -batch -".into(), stderr: secret_dir.into() }),
        ];
        for e in &errors {
            let api = e.to_api();
            assert!(!api.message.contains(secret_dir), "{e:?} shows the host: {}", api.message);
            assert!(e.to_string().contains(secret_dir), "the operator's message lost the cause: {e}");
        }
        // The console tail is the guest's own output, kept for clients by design.
        assert!(errors[4].to_api().message.contains("console: guest says hi"), "{}", errors[4].to_api().message);
        assert!(errors[4].to_api().message.contains("did not answer"), "{}", errors[4].to_api().message);
    }

    #[test]
    fn build_errors_map_to_build_failures_and_api_codes() {
        let step = NodeError::Build(BuildError::StepFailed {
            step: 2,
            description: "run make".into(),
            reason: "exit code 3".into(),
            output_tail: "cc: error".into(),
        });
        let f = step.build_failure().unwrap();
        assert_eq!((f.code.as_str(), f.step, f.output_tail.as_deref()), ("STEP_FAILED", Some(2), Some("cc: error")));
        assert_eq!(f.message, "step 2 (run make) failed: exit code 3");
        let cases = [
            (NodeError::Build(BuildError::TimedOut { limit_s: 60 }), "TIMED_OUT", ErrorCode::InvalidArgument),
            (NodeError::Build(BuildError::Cancelled), "CANCELLED", ErrorCode::InvalidArgument),
            (NodeError::TemplateNotFound { name: "nope".into() }, "NOT_FOUND", ErrorCode::NotFound),
            (
                NodeError::Build(BuildError::StartNotReady(StartError::NotReady {
                    ready: "port 80".into(),
                    timeout_s: 5,
                    output_tail: "bind failed".into(),
                })),
                "START_NOT_READY",
                ErrorCode::InvalidArgument,
            ),
            (NodeError::Build(BuildError::RefTaken { template_ref: "t".into() }), "CONFLICT", ErrorCode::Conflict),
        ];
        for (e, code, api) in cases {
            assert_eq!(e.build_failure().unwrap().code, code, "{e}");
            assert_eq!(e.code(), api, "{e}");
        }
        // A create's start command that never got ready: its output goes to the client
        // (no build status carries it) and to the operator's log.
        let not_ready =
            StartError::NotReady { ready: "port 80".into(), timeout_s: 5, output_tail: "bind failed\n".into() };
        let e = NodeError::Start(not_ready);
        assert_eq!(e.start_output(), Some("bind failed\n"));
        let api = e.to_api();
        assert_eq!(api.code, ErrorCode::BootFailed);
        assert!(api.message.ends_with("within 5 s; its output ends: bind failed"), "{}", api.message);
        let e = NodeError::TemplateNotFound { name: "nope".into() };
        assert_eq!(e.to_api().message, "template nope not found");
        let e = NodeError::TemplateInUse { name: "t".into(), users: 1 };
        assert_eq!(e.code(), ErrorCode::Conflict);
        // The node's own failures are the caller's INTERNAL, with a message naming no path.
        let e = NodeError::io("publish layer /var/lib/lizard/template-layers/k.qcow2", std::io::Error::other("full"));
        assert!(e.build_failure().is_none());
        assert!(!e.to_api().message.contains("/var/lib"));
    }
}
