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
    /// Another sandbox of this node holds the volume.
    #[error("volume {volume} is in use by sandbox {holder}")]
    VolumeInUse { volume: String, holder: String },
    /// A volume of that id exists already.
    #[error("volume {volume} already exists on this node")]
    VolumeExists { volume: String },
    /// A sandbox with a volume cannot be copied: one writer per volume.
    #[error("sandbox {id} has a volume, which only one sandbox may use at a time: it cannot be forked")]
    ForkWithVolume { id: String },
    /// The guest did not come up.
    #[error("sandbox did not boot: {0}")]
    Boot(#[from] BootError),
    /// Making a template snapshot failed (the create falls back to a cold boot).
    #[error("template snapshot: {0}")]
    Snapshot(#[from] SnapshotError),
    /// The VMM failed.
    #[error("vmm: {0}")]
    Vmm(#[from] VmmError),
    /// The agent refused or failed a request (its code says why).
    #[error("{0}")]
    Agent(AgentError),
    /// The agent channel failed while the VM still runs.
    #[error("agent unavailable: {0}")]
    AgentUnavailable(ClientError),
    /// Image build failed (an unknown template is the client's error).
    #[error("image: {0}")]
    Image(#[from] ImageError),
    /// Filesystem work on the node failed.
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    /// The sandbox's network could not be made.
    #[error("network: {0}")]
    Network(#[from] NetError),
}

impl NodeError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        NodeError::Io { context: context.into(), source }
    }

    pub fn code(&self) -> ErrorCode {
        use lizard_agent_proto::types::ErrorCode as A;
        match self {
            NodeError::OutOfRange { .. }
            | NodeError::BadNetworkPolicy(_)
            | NodeError::ExecCommand
            | NodeError::EmptyArgv
            | NodeError::BadVolumeId { .. }
            | NodeError::UnknownVolume { .. }
            // The request asks for more than the node can hold: a smaller size fits.
            | NodeError::InsufficientSpace { .. }
            | NodeError::Image(ImageError::UnknownTemplate(_)) => ErrorCode::InvalidArgument,
            NodeError::NotFound { .. } | NodeError::Ended { .. } | NodeError::VmStopped { .. } => ErrorCode::NotFound,
            NodeError::Paused { .. }
            | NodeError::VolumeInUse { .. }
            | NodeError::VolumeExists { .. }
            | NodeError::ForkWithVolume { .. } => ErrorCode::Conflict,
            NodeError::Boot(_) | NodeError::Snapshot(_) | NodeError::Vmm(_) => ErrorCode::BootFailed,
            NodeError::AgentUnavailable(_) => ErrorCode::Unavailable,
            NodeError::Agent(e) => match e.code {
                A::NotFound => ErrorCode::NotFound,
                A::IsADirectory | A::NotADirectory | A::InvalidArgument => ErrorCode::InvalidArgument,
                A::AlreadyExists => ErrorCode::Conflict,
                A::PermissionDenied => ErrorCode::Forbidden,
                // Nothing listens on the guest port a tunnel named.
                A::ConnectionRefused => ErrorCode::PortClosed,
                A::Internal => ErrorCode::Internal,
            },
            NodeError::Network(NetError::Exhausted) => ErrorCode::Unavailable,
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
            _ => self.to_string(),
        }
    }

    /// The API's form of this error; the full cause is logged here.
    pub fn to_api(&self) -> lizard_api::ApiError {
        let code = self.code();
        match code {
            ErrorCode::Internal => tracing::error!(?code, "{self}"),
            ErrorCode::BootFailed | ErrorCode::Unavailable => tracing::warn!(?code, "{self}"),
            _ => tracing::debug!(?code, "{self}"),
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
        VmmError::ForeignMemoryFile | VmmError::NonUtf8Path(_) | VmmError::NoSuchDisk(_) => {
            "the VM was set up wrongly".into()
        }
    }
}

pub type Result<T, E = NodeError> = std::result::Result<T, E>;

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
    fn clients_see_no_host_paths_or_vmm_stderr() {
        let secret_dir = "/var/lib/lizard/sandboxes/abc";
        let errors = [
            NodeError::io(format!("create {secret_dir}"), std::io::Error::other("full")),
            NodeError::Vmm(VmmError::ExitedAtStart { stderr: format!("qemu: cannot open {secret_dir}/memory") }),
            NodeError::Vmm(VmmError::Io {
                context: format!("create {secret_dir}"),
                source: std::io::Error::other("x"),
            }),
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
}
