//! Confining VMM processes, as a jailer would: each VMM runs as a uid and gid of its own
//! ([`uids`]), with no capabilities, `no_new_privs`, QEMU's seccomp filter, resource
//! limits ([`child`]), in cgroups of its own ([`cgroup`]), and owns only its run directory
//! and the disks it writes ([`files`]); the memory clones share it may only read
//! ([`preload`]).
//!
//! A [`JailPolicy`] is the host's part (ranges, where cgroups go, the limits); [`JailPolicy::enter`]
//! makes one VMM's [`Jail`] and the [`child::ChildSetup`] its process applies before exec.
//! [`Jail::release`] undoes it when the VMM has ended.

pub mod cgroup;
pub mod child;
pub mod files;
pub mod preload;
pub mod uids;
pub mod view;

pub use cgroup::{CgroupError, CgroupLimits, CgroupTree};
pub use uids::{UidError, UidRange};

use crate::VmConfig;
use std::path::{Path, PathBuf};

/// Tasks (threads) one VMM may have: QEMU runs a thread per vCPU, a few of its own and
/// up to 64 block-I/O workers.
pub const DEFAULT_PIDS: u32 = 256;
/// Open files one VMM may have (its disks and their backing chains, sockets, eventfds).
pub const DEFAULT_OPEN_FILES: u64 = 512;
/// Memory a VMM may use beyond its guest's: TCG's translation cache and QEMU's own heap.
/// Measured under TCG: a clone's group peaked at 54–244 MiB in all (guest pages it
/// dirtied included; the template's shared pages are charged elsewhere); too tight kills VMs.
pub const DEFAULT_MEMORY_OVERHEAD_MIB: u32 = 512;

/// I/O limits for each of a VMM's disks, enforced by QEMU's block layer (a v1 `blkio`
/// cgroup throttles only direct I/O, and a guest's writes reach the host's page cache):
/// one guest cannot take a shared disk's bandwidth from its neighbours. `0`: no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskIo {
    pub bytes_per_second: u64,
    pub ops_per_second: u64,
}

/// Per disk: 512 MiB/s and 20 000 operations a second — beyond what a guest under TCG
/// reaches in normal work, a fraction of a host NVMe device.
pub const DEFAULT_DISK_IO: DiskIo = DiskIo { bytes_per_second: 512 << 20, ops_per_second: 20_000 };

/// Why a VMM could not be confined.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    #[error(transparent)]
    Uid(#[from] UidError),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// Handing the run directory or a disk to the VMM's uid failed.
    #[error("give {} to the VMM's uid: {cause}", .path.display())]
    Files { path: PathBuf, cause: std::io::Error },
    /// The library that maps shared memory read-only could not be prepared.
    #[error("prepare the read-only memory library: {0}")]
    Preload(std::io::Error),
}

/// How this host confines its VMMs.
#[derive(Debug, Clone)]
pub struct JailPolicy {
    pub uids: UidRange,
    /// Host-wide directory of uid claims (one for every node of the host).
    pub claims_dir: PathBuf,
    /// The group every VMM has besides its own: files all of them share (template memory).
    pub shared_gid: u32,
    pub cgroups: CgroupTree,
    pub memory_overhead_mib: u32,
    pub pids: u32,
    pub open_files: u64,
    /// RLIMIT_FSIZE floor: the largest disk the node makes (a VMM's own memory and volume
    /// sizes raise it for that VMM).
    pub max_file_bytes: u64,
    pub disk_io: DiskIo,
}

impl JailPolicy {
    /// A policy with the default limits.
    pub fn new(uids: UidRange, claims_dir: PathBuf, cgroups: CgroupTree, max_file_bytes: u64) -> JailPolicy {
        JailPolicy {
            uids,
            claims_dir,
            // The id just below the range: no VMM's own.
            shared_gid: uids.first.saturating_sub(1),
            cgroups,
            memory_overhead_mib: DEFAULT_MEMORY_OVERHEAD_MIB,
            pids: DEFAULT_PIDS,
            open_files: DEFAULT_OPEN_FILES,
            max_file_bytes,
            disk_io: DEFAULT_DISK_IO,
        }
    }

    /// Remove the cgroups and uid claim files that VMMs which have ended left (a node that
    /// died never removed theirs); those of uids someone holds stay. The number of groups.
    pub fn sweep(&self) -> usize {
        let groups = self.cgroups.sweep(|uid| uids::try_claim(uid, &self.claims_dir));
        uids::sweep(&self.claims_dir);
        groups
    }

    /// Confine the VMM of `config`: claim a uid, make its cgroups, hand it its files
    /// (`shared_memory`: the file it maps copy-on-write, shared with other VMs; `delta`: an
    /// open memory delta it maps over that, read-only). The returned setup runs in the
    /// child; the jail is released when the VMM ends.
    pub fn enter(
        &self,
        config: &VmConfig,
        shared_memory: Option<&Path>,
        delta: Option<std::os::fd::RawFd>,
        binary: &Path,
    ) -> Result<(Jail, child::ChildSetup), JailError> {
        let claim = uids::claim(self.uids, &self.claims_dir)?;
        let uid = claim.uid;
        let memory_bytes = u64::from(config.memory_mib) << 20;
        let limits = CgroupLimits {
            cpus: config.vcpus,
            memory_bytes: memory_bytes + (u64::from(self.memory_overhead_mib) << 20),
            pids: self.pids,
        };
        let cgroup = self.cgroups.create(uid, limits)?;
        let jail = Jail { claim, cgroup, run_dir: config.run_dir.clone(), writable: writable_outside_run_dir(config) };
        let handed = (|| {
            let refs: Vec<&Path> = jail.writable.iter().map(PathBuf::as_path).collect();
            files::hand_over(&config.run_dir, &refs, uid, uid)
                .map_err(|cause| JailError::Files { path: config.run_dir.clone(), cause })?;
            for input in [&config.kernel, &config.initramfs] {
                files::share_readable(input, self.shared_gid)
                    .map_err(|cause| JailError::Files { path: input.clone(), cause })?;
            }
            if let Some(memory) = shared_memory {
                files::share_memory(memory, self.shared_gid)
                    .map_err(|cause| JailError::Files { path: memory.to_owned(), cause })?;
                return preload::for_memory(memory, delta).map(Some).map_err(JailError::Preload);
            }
            Ok(None)
        })();
        let preload = match handed {
            Ok(preload) => preload,
            Err(e) => {
                jail.release();
                return Err(e);
            }
        };
        let largest_disk = jail.writable.iter().filter_map(|d| std::fs::metadata(d).ok()).map(|m| m.len()).max();
        let file_size = self.max_file_bytes.max(memory_bytes).max(largest_disk.unwrap_or(0));
        let mut groups = vec![self.shared_gid];
        if config.accel == crate::Accel::Kvm {
            // /dev/kvm is its group's (usually `kvm`): without it KVM would fail and the
            // accelerator probe would settle for TCG.
            use std::os::unix::fs::MetadataExt;
            if let Ok(kvm) = std::fs::metadata("/dev/kvm") {
                groups.push(kvm.gid());
            }
        }
        let mut needed: Vec<PathBuf> = vec![config.run_dir.clone(), config.kernel.clone(), config.initramfs.clone()];
        needed.extend(view::backing_chain(&config.root_disk));
        needed.extend(config.extra_disks.iter().cloned());
        needed.extend(shared_memory.map(Path::to_path_buf));
        needed.extend(view::executable(binary));
        let setup = child::ChildSetup {
            uid,
            gid: uid,
            groups,
            cgroup_procs: jail.cgroup.procs_files(),
            tap: None,
            claim_fd: jail.claim.fd(),
            preload,
            rlimits: vec![
                (libc::RLIMIT_NOFILE, self.open_files),
                (libc::RLIMIT_NPROC, u64::from(self.pids)),
                (libc::RLIMIT_CORE, 0),
                (libc::RLIMIT_FSIZE, file_size),
            ],
            last_cap: child::last_cap(),
            hide: view::hidden_dirs(&needed),
        };
        Ok((jail, setup))
    }
}

/// The disks a VMM writes outside its run directory (volumes), handed to its uid.
fn writable_outside_run_dir(config: &VmConfig) -> Vec<PathBuf> {
    config.extra_disks.iter().filter(|d| !d.starts_with(&config.run_dir)).cloned().collect()
}

impl JailPolicy {
    /// The uid of the running VMM `pid` that an earlier node process confined, if it is
    /// one of this policy's (its uid claim it still holds: the lock it inherited).
    pub fn uid_of(&self, pid: u32) -> Option<u32> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let line = status.lines().find(|l| l.starts_with("Uid:"))?;
        let uid: u32 = line.split_whitespace().nth(1)?.parse().ok()?;
        self.uids.contains(uid).then_some(uid)
    }

    /// Undo the jail of a VMM taken back from an earlier node process ([`JailPolicy::uid_of`]),
    /// once it has ended: its claim is free again then, and held while its files go back
    /// to root and its cgroups are removed.
    pub fn release_taken_back(&self, config: &VmConfig, uid: u32) {
        let Some(claim) = uids::try_claim(uid, &self.claims_dir) else {
            tracing::warn!(uid, "the uid of an ended VMM is still claimed: its jail is left for the sweep");
            return;
        };
        let cgroup = self.cgroups.group(uid);
        Jail { claim, cgroup, run_dir: config.run_dir.clone(), writable: writable_outside_run_dir(config) }.release();
    }
}

/// One VMM's confinement: its uid (claimed while this lives, and while the VMM does),
/// its cgroups and the files handed to it.
#[derive(Debug)]
pub struct Jail {
    claim: uids::UidClaim,
    cgroup: cgroup::VmCgroup,
    run_dir: PathBuf,
    writable: Vec<PathBuf>,
}

impl Jail {
    pub fn uid(&self) -> u32 {
        self.claim.uid
    }

    /// The VMM's cgroup directories.
    pub fn cgroup_dirs(&self) -> &[PathBuf] {
        self.cgroup.dirs()
    }

    /// Undo the jail once its VMM has ended: files back to root, cgroups removed, uid
    /// free and its claim file gone.
    pub fn release(self) {
        let refs: Vec<&Path> = self.writable.iter().map(PathBuf::as_path).collect();
        files::take_back(&self.run_dir, &refs, self.claim.uid);
        self.cgroup.remove();
        self.claim.release();
    }
}
