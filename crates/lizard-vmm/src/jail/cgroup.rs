//! One cgroup per VMM process, under a parent the node owns, in every controller that
//! bounds a neighbour's share of the host: CPU (a quota of its vCPUs), memory (guest
//! size plus the VMM's own overhead) and pids (the VMM's threads).
//!
//! The CPU quota may be exceeded by one period's worth of quota saved while the VMM was
//! idle (the CFS burst, where the kernel has it: Linux 5.14+): a restore or a first
//! command is a short spike across QEMU's threads, and a quota alone would stall it until
//! the next period. Over any longer time the VMM stays within its vCPUs.
//!
//! cgroup v2 when the host has it (`/sys/fs/cgroup/cgroup.controllers`), v1 otherwise
//! (one hierarchy per controller). The parent sits below the node's own cgroup in each
//! hierarchy, so that whoever bounds the node bounds its VMs too. The VMM joins its group
//! itself, before exec ([`super::child`]), so no instruction of QEMU runs outside it.

use std::ffi::CString;
use std::path::{Path, PathBuf};

const ROOT: &str = "/sys/fs/cgroup";
/// The controllers a VMM's group is made in (v1: one hierarchy each).
const CONTROLLERS: [&str; 3] = ["cpu", "memory", "pids"];
/// The CFS period the CPU quota is a multiple of.
const CPU_PERIOD_US: u64 = 100_000;
/// Names of VMM groups start with this, so that a sweep removes nothing else.
const GROUP_PREFIX: &str = "vmm-";

/// Why cgroups cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A controller has no hierarchy mounted (v1), or cannot be enabled below the node's
    /// group (v2).
    #[error("cgroup controller {0} is not available")]
    Missing(&'static str),
    /// A group or one of its files could not be made or written.
    #[error("cgroup {}: {cause}", .path.display())]
    Io { path: PathBuf, cause: std::io::Error },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CgroupError + '_ {
    move |cause| CgroupError::Io { path: path.to_owned(), cause }
}

/// The limits of one VMM's group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupLimits {
    /// CPU time per period, in whole CPUs (its vCPUs).
    pub cpus: u32,
    pub memory_bytes: u64,
    /// Tasks (threads included) in the group.
    pub pids: u32,
}

/// Which cgroup layout the host has, and where the node's VMM groups go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupTree {
    /// One hierarchy per controller: the parent directory in each, in [`CONTROLLERS`] order.
    V1 { parents: Vec<PathBuf> },
    /// The unified hierarchy: the one parent directory.
    V2 { parent: PathBuf },
}

impl CgroupTree {
    /// Find the host's layout and make the parent `name` below this process's group in
    /// each hierarchy (and, on v2, enable the controllers for its children).
    pub fn open(name: &str) -> Result<CgroupTree, CgroupError> {
        let own = std::fs::read_to_string("/proc/self/cgroup").map_err(io(Path::new("/proc/self/cgroup")))?;
        let tree = if Path::new(ROOT).join("cgroup.controllers").exists() {
            let path = own_path(&own, None).unwrap_or("/");
            CgroupTree::V2 { parent: v2_parent(&Path::new(ROOT).join(path.trim_start_matches('/')), name)? }
        } else {
            let mut parents = vec![];
            for controller in CONTROLLERS {
                let mount = Path::new(ROOT).join(controller);
                if !mount.join("cgroup.procs").exists() {
                    return Err(CgroupError::Missing(controller));
                }
                let path = own_path(&own, Some(controller)).unwrap_or("/");
                let parent = mount.join(path.trim_start_matches('/')).join(name);
                std::fs::create_dir_all(&parent).map_err(io(&parent))?;
                parents.push(parent);
            }
            CgroupTree::V1 { parents }
        };
        Ok(tree)
    }

    /// The group of the VMM `uid`, as it is (nothing made or changed).
    pub fn group(&self, uid: u32) -> VmCgroup {
        let name = format!("{GROUP_PREFIX}{uid}");
        let dirs = match self {
            CgroupTree::V1 { parents } => parents.iter().map(|p| p.join(&name)).collect::<Vec<_>>(),
            CgroupTree::V2 { parent } => vec![parent.join(&name)],
        };
        VmCgroup { dirs }
    }

    /// Make (or take over, when a dead VMM left it) the group of the VMM `uid`, with `limits`.
    pub fn create(&self, uid: u32, limits: CgroupLimits) -> Result<VmCgroup, CgroupError> {
        let quota = CPU_PERIOD_US * u64::from(limits.cpus.max(1));
        let group = self.group(uid);
        let made: Result<(), CgroupError> = (|| {
            for dir in &group.dirs {
                std::fs::create_dir_all(dir).map_err(io(dir))?;
            }
            match self {
                CgroupTree::V1 { .. } => {
                    let [cpu, memory, pids] = [0, 1, 2].map(|i| &group.dirs[i]);
                    write(&cpu.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
                    write(&cpu.join("cpu.cfs_quota_us"), &quota.to_string())?;
                    write_if_known(&cpu.join("cpu.cfs_burst_us"), &quota.to_string())?;
                    write(&memory.join("memory.limit_in_bytes"), &limits.memory_bytes.to_string())?;
                    write(&pids.join("pids.max"), &limits.pids.to_string())?;
                }
                CgroupTree::V2 { .. } => {
                    let dir = &group.dirs[0];
                    write(&dir.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
                    write_if_known(&dir.join("cpu.max.burst"), &quota.to_string())?;
                    write(&dir.join("memory.max"), &limits.memory_bytes.to_string())?;
                    // No swap: a guest's memory must not spill to the host's disk unbounded.
                    let _ = write(&dir.join("memory.swap.max"), "0");
                    write(&dir.join("pids.max"), &limits.pids.to_string())?;
                }
            }
            Ok(())
        })();
        match made {
            Ok(()) => Ok(group),
            Err(e) => {
                group.remove();
                Err(e)
            }
        }
    }

    /// Remove the empty VMM groups that dead VMMs left, for uids whose claim `claim` can
    /// take (and holds while the group goes): a group being made for a VMM about to join
    /// it is empty too, but its uid is claimed; a group with a live VMM in it is busy.
    pub fn sweep<G>(&self, claim: impl Fn(u32) -> Option<G>) -> usize {
        let parents = match self {
            CgroupTree::V1 { parents } => parents.clone(),
            CgroupTree::V2 { parent } => vec![parent.clone()],
        };
        let mut removed = 0;
        for parent in parents {
            let Ok(entries) = std::fs::read_dir(&parent) else { continue };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Some(uid) = name.strip_prefix(GROUP_PREFIX).and_then(|u| u.parse().ok()) else { continue };
                let Some(_held) = claim(uid) else { continue };
                if std::fs::remove_dir(entry.path()).is_ok() {
                    removed += 1;
                }
            }
        }
        removed
    }
}

/// The path of this process's group in the hierarchy of `controller` (v1) or in the
/// unified one (`None`), from `/proc/self/cgroup`.
fn own_path<'a>(proc_cgroup: &'a str, controller: Option<&str>) -> Option<&'a str> {
    proc_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let matches = match controller {
            Some(c) => controllers.split(',').any(|x| x == c),
            None => controllers.is_empty(),
        };
        matches.then_some(path)
    })
}

/// The v2 parent `name` below `own`, with the controllers enabled for its children. A
/// group with processes in it cannot hand controllers down (except the root), so the
/// parent is made beside the node's own group when that one is not the root.
fn v2_parent(own: &Path, name: &str) -> Result<PathBuf, CgroupError> {
    let base = if own == Path::new(ROOT) { own } else { own.parent().unwrap_or(own) };
    let enable = |dir: &Path| -> Result<(), CgroupError> {
        let available = std::fs::read_to_string(dir.join("cgroup.controllers")).map_err(io(dir))?;
        for controller in CONTROLLERS {
            if !available.split_whitespace().any(|c| c == controller) {
                return Err(CgroupError::Missing(controller));
            }
            write(&dir.join("cgroup.subtree_control"), &format!("+{controller}"))?;
        }
        Ok(())
    };
    enable(base)?;
    let parent = base.join(name);
    std::fs::create_dir_all(&parent).map_err(io(&parent))?;
    enable(&parent)?;
    Ok(parent)
}

/// [`write`], where a kernel without the file (older than the feature) is no error.
fn write_if_known(path: &Path, value: &str) -> Result<(), CgroupError> {
    if !path.exists() {
        tracing::debug!("{} is not in this kernel", path.display());
        return Ok(());
    }
    write(path, value)
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(io(path))
}

/// One VMM's group (a directory per v1 hierarchy, one on v2).
#[derive(Debug)]
pub struct VmCgroup {
    dirs: Vec<PathBuf>,
}

impl VmCgroup {
    /// The `cgroup.procs` files the VMM writes itself into before exec.
    pub fn procs_files(&self) -> Vec<CString> {
        use std::os::unix::ffi::OsStrExt;
        self.dirs.iter().filter_map(|d| CString::new(d.join("cgroup.procs").as_os_str().as_bytes()).ok()).collect()
    }

    /// The directories of the group, for reading it back.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Remove the group; its VMM must have ended (a busy group stays for the next sweep).
    pub fn remove(&self) {
        for dir in &self.dirs {
            if let Err(e) = std::fs::remove_dir(dir) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!("cannot remove cgroup {}: {e}", dir.display());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_groups_are_found_per_controller() {
        let text = "9:name=systemd:/\n4:memory:/process_api/abc\n2:cpu,cpuacct:/x\n1:pids:/\n0::/unified/y\n";
        assert_eq!(own_path(text, Some("memory")), Some("/process_api/abc"));
        assert_eq!(own_path(text, Some("cpu")), Some("/x"));
        assert_eq!(own_path(text, Some("cpuacct")), Some("/x"));
        assert_eq!(own_path(text, Some("blkio")), None);
        assert_eq!(own_path(text, None), Some("/unified/y"));
    }

    /// A unified (v2) tree as the kernel shows it, in a plain directory: these hosts have
    /// v1 only, so the v2 writes are checked against files (the kernel fills
    /// `cgroup.controllers` of a new group; here the test does).
    fn fake_v2(dir: &Path, controllers: &str) -> PathBuf {
        let own = dir.join("node.service");
        for d in [dir, own.as_path(), &dir.join("lizard")] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join("cgroup.controllers"), controllers).unwrap();
        }
        own
    }

    #[test]
    fn on_v2_the_parent_sits_beside_the_nodes_group_and_each_vmm_gets_its_limits() {
        let root = tempfile::tempdir().unwrap();
        let own = fake_v2(root.path(), "cpuset cpu io memory pids");
        // The node's group has processes: the parent goes beside it, controllers enabled
        // in the group above and in the parent.
        let parent = v2_parent(&own, "lizard").unwrap();
        assert_eq!(parent, root.path().join("lizard"));
        for d in [root.path(), parent.as_path()] {
            let enabled = std::fs::read_to_string(d.join("cgroup.subtree_control")).unwrap();
            assert!(enabled.starts_with('+'), "{}: {enabled}", d.display());
        }
        let tree = CgroupTree::V2 { parent: parent.clone() };
        // A kernel with the CFS burst shows its file in every new group.
        let dir = parent.join("vmm-1500007");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cpu.max.burst"), "0").unwrap();
        let group = tree.create(1_500_007, CgroupLimits { cpus: 2, memory_bytes: 1 << 30, pids: 256 }).unwrap();
        assert_eq!(group.dirs(), std::slice::from_ref(&dir));
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
        assert_eq!(read("cpu.max"), "200000 100000", "two vCPUs' quota per period");
        assert_eq!(read("cpu.max.burst"), "200000", "one period's quota saved while idle");
        assert_eq!(read("memory.max"), (1u64 << 30).to_string());
        assert_eq!(read("memory.swap.max"), "0");
        assert_eq!(read("pids.max"), "256");
        let procs: Vec<String> = group.procs_files().into_iter().map(|c| c.into_string().unwrap()).collect();
        assert_eq!(procs, [dir.join("cgroup.procs").display().to_string()]);
    }

    #[test]
    fn on_v2_a_missing_controller_is_named() {
        let root = tempfile::tempdir().unwrap();
        let own = fake_v2(root.path(), "cpu memory");
        match v2_parent(&own, "lizard") {
            Err(CgroupError::Missing(controller)) => assert_eq!(controller, "pids"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_group_names_its_procs_files() {
        let g = VmCgroup { dirs: vec!["/c/cpu/lizard/vmm-7".into(), "/c/memory/lizard/vmm-7".into()] };
        let files: Vec<String> = g.procs_files().into_iter().map(|c| c.into_string().unwrap()).collect();
        assert_eq!(files, ["/c/cpu/lizard/vmm-7/cgroup.procs", "/c/memory/lizard/vmm-7/cgroup.procs"]);
    }
}
