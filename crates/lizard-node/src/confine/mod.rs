//! Confinement of the node's VMMs and admission of its sandboxes.
//!
//! At start the node finds out whether the host can confine VMMs (root, a usable uid
//! range, cgroups with the cpu, memory and pids controllers, seccomp) and, if it can,
//! has every QEMU jailed ([`lizard_vmm::jail`]). If it cannot, it refuses to start
//! sandboxes, naming what is missing — unless the operator said
//! `--insecure-no-confine`, which the log and the node's status then say loudly.
//!
//! - [`admission`]: CPUs and memory promised vs. the host's, with overcommit ratios.
//! - [`sizes`]: the documented set of sandbox sizes.

pub mod admission;
pub mod sizes;

use lizard_vmm::jail::{CgroupTree, JailPolicy};
use std::path::PathBuf;

pub use admission::{Capacity, CapacityExhausted, Reservation};
pub use lizard_vmm::jail::{DiskIo, UidRange};
pub use sizes::UnsupportedSize;

/// How the node confines VMMs and admits sandboxes.
#[derive(Debug, Clone)]
pub struct ConfineConfig {
    /// Run VMMs unconfined (as root, no cgroups, no seccomp) when the host cannot confine
    /// them, instead of refusing sandboxes. For development hosts only.
    pub insecure_no_confine: bool,
    /// Host uids (and gids) for VMMs, one per running VMM.
    pub uids: UidRange,
    /// Host-wide directory of uid claims, shared by every node of the host.
    pub claims_dir: PathBuf,
    /// The cgroup (in each hierarchy, below the node's own) that VMM groups go under.
    pub cgroup_parent: String,
    /// Memory a VMM may use beyond its guest's (cgroup limit = guest + this).
    pub memory_overhead_mib: u32,
    /// vCPUs promised per host CPU.
    pub cpu_overcommit: f64,
    /// Memory promised per byte of host memory.
    pub memory_overcommit: f64,
    /// I/O limits for each disk of each VMM.
    pub disk_io: DiskIo,
}

impl Default for ConfineConfig {
    fn default() -> Self {
        ConfineConfig {
            insecure_no_confine: false,
            uids: UidRange::DEFAULT,
            claims_dir: PathBuf::from("/run/lizard/vmm-uids"),
            cgroup_parent: "lizard".into(),
            memory_overhead_mib: lizard_vmm::jail::DEFAULT_MEMORY_OVERHEAD_MIB,
            // 8 vCPUs per core: TCG guests idle most of the time, and the suite runs many
            // small sandboxes at once on 2 cores; each is still bounded by its quota.
            cpu_overcommit: 8.0,
            memory_overcommit: 1.5,
            disk_io: lizard_vmm::jail::DEFAULT_DISK_IO,
        }
    }
}

/// The largest file a VMM writes: a build VM's root disk may grow to 1 TiB
/// (`[build] disk_gb`), plus qcow2 metadata.
const MAX_FILE_BYTES: u64 = (1 << 40) + (1 << 30);

/// Why sandboxes cannot start here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfineError {
    /// The host cannot confine VMMs and the operator did not allow running them
    /// unconfined. `missing` names what is missing, without host paths.
    #[error(
        "this node cannot confine sandboxes ({missing}); the operator must fix the host \
         or start the node with --insecure-no-confine"
    )]
    Unconfined { missing: String },
    #[error(transparent)]
    Capacity(#[from] CapacityExhausted),
    #[error(transparent)]
    Size(#[from] UnsupportedSize),
}

/// What the node found at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfineStatus {
    /// Every VMM runs jailed.
    Confined,
    /// VMMs run unconfined, as the operator asked; `missing`: what the host lacks (empty
    /// when the flag was given on a host that could have confined them).
    Insecure { missing: Vec<String> },
    /// Sandboxes are refused: the host lacks these.
    Refused { missing: Vec<String> },
}

/// The node's confinement: its status, the jail policy for the backend, and admission.
#[derive(Debug)]
pub struct Confinement {
    pub status: ConfineStatus,
    capacity: Capacity,
    admission: admission::Admission,
    /// The policy VMMs are jailed by (its cgroups swept at start), when they are.
    policy: Option<JailPolicy>,
}

impl Confinement {
    /// Find out what the host allows; the policy to jail VMMs with, if any.
    pub fn start(config: &ConfineConfig) -> (Confinement, Option<JailPolicy>) {
        let capacity = Capacity::of_host(config.cpu_overcommit, config.memory_overcommit);
        let (status, policy) = if config.insecure_no_confine {
            let missing = probe(config).err().unwrap_or_default();
            tracing::warn!(
                ?missing,
                "INSECURE: --insecure-no-confine: every VMM runs as root, with all capabilities, no seccomp \
                 filter and no cgroup; one emulator bug is host root"
            );
            (ConfineStatus::Insecure { missing }, None)
        } else {
            match probe(config) {
                Ok(policy) => {
                    tracing::info!(
                        uids = ?config.uids, cgroups = ?policy.cgroups, ?capacity,
                        "VMMs run confined (own uid, no capabilities, seccomp, cgroups)"
                    );
                    (ConfineStatus::Confined, Some(policy))
                }
                Err(missing) => {
                    tracing::error!(
                        ?missing,
                        "this host cannot confine VMMs: sandboxes are refused (start with --insecure-no-confine \
                         to run them unconfined)"
                    );
                    (ConfineStatus::Refused { missing }, None)
                }
            }
        };
        (Confinement { status, capacity, admission: Default::default(), policy: policy.clone() }, policy)
    }

    /// Remove, once they are dead, the cgroups of VMMs an earlier node process left
    /// running (the node has just killed them; the kernel frees a group only after).
    pub fn sweep_later(&self) {
        let Some(policy) = self.policy.clone() else { return };
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(3)).await;
            let swept = tokio::task::spawn_blocking(move || policy.sweep()).await.unwrap_or(0);
            if swept > 0 {
                tracing::info!(swept, "removed cgroups of VMMs an earlier node process left");
            }
        });
    }

    /// Whether sandboxes may start here at all.
    pub fn check(&self) -> Result<(), ConfineError> {
        match &self.status {
            ConfineStatus::Refused { missing } => Err(ConfineError::Unconfined { missing: missing.join(", ") }),
            ConfineStatus::Confined | ConfineStatus::Insecure { .. } => Ok(()),
        }
    }

    /// Reserve a sandbox of `vcpus` and `memory_mib` (its guest's; the memory ratio leaves
    /// room for what VMMs use beyond it) beside `running` (vCPUs, MiB of the running
    /// sandboxes).
    pub fn admit(&self, running: (u64, u64), vcpus: u32, memory_mib: u64) -> Result<Reservation, ConfineError> {
        self.check()?;
        Ok(self.admission.admit(self.capacity, running, vcpus, memory_mib)?)
    }

    pub fn capacity(&self) -> Capacity {
        self.capacity
    }
}

/// The jail policy, or what the host lacks for one (no paths: these reach clients).
fn probe(config: &ConfineConfig) -> Result<JailPolicy, Vec<String>> {
    let mut missing = vec![];
    if !nix::unistd::geteuid().is_root() {
        missing.push("root (to give each VMM its own uid)".to_string());
    }
    if let Err(e) = lizard_vmm::jail::uids::check(config.uids, &config.claims_dir) {
        tracing::warn!("VMM uid range: {e}");
        missing.push(format!("a usable VMM uid range ({}+{})", config.uids.first, config.uids.count));
    }
    let seccomp =
        std::fs::read_to_string("/proc/self/status").is_ok_and(|s| s.lines().any(|l| l.starts_with("Seccomp:")));
    if !seccomp {
        missing.push("seccomp in the kernel".to_string());
    }
    let cgroups = match CgroupTree::open(&config.cgroup_parent) {
        Ok(tree) => Some(tree),
        Err(e) => {
            tracing::warn!("cgroups: {e}");
            missing.push(match e {
                lizard_vmm::jail::CgroupError::Missing(c) => format!("the cgroup controller {c}"),
                lizard_vmm::jail::CgroupError::Io { .. } => "a writable cgroup filesystem".to_string(),
            });
            None
        }
    };
    match cgroups {
        Some(tree) if missing.is_empty() => {
            let mut policy = JailPolicy::new(config.uids, config.claims_dir.clone(), tree, MAX_FILE_BYTES);
            policy.memory_overhead_mib = config.memory_overhead_mib;
            policy.disk_io = config.disk_io;
            let swept = policy.sweep();
            if swept > 0 {
                tracing::info!(swept, "removed cgroups of VMMs that ended");
            }
            Ok(policy)
        }
        _ => Err(missing),
    }
}

/// Let jailed VMMs pass through `dirs` and their ancestors to the files inside: add the
/// others' search bit (never read: they cannot list them) where a root-owned directory
/// lacks it. A temporary data directory is owner-only, for one.
pub fn let_vmms_pass(dirs: &[&std::path::Path]) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    for dir in dirs {
        for d in dir.ancestors() {
            let Ok(meta) = std::fs::metadata(d) else { continue };
            if meta.is_dir() && meta.uid() == 0 && meta.mode() & 0o001 == 0 {
                let mode = (meta.mode() & 0o7777) | 0o001;
                match std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode)) {
                    Ok(()) => tracing::info!("{} is now searchable by VMM uids (mode {mode:o})", d.display()),
                    Err(e) => tracing::warn!("VMMs cannot pass through {}: {e}", d.display()),
                }
            }
        }
    }
}
