//! What a VMM process is allowed, read back from the kernel's view of it (/proc): its
//! ids, capabilities, seccomp mode, `no_new_privs`, resource limits and cgroups — never
//! from the node's own records.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// The fields of `/proc/<pid>/status`, by name.
pub fn status(pid: u32) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines().filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_string(), v.trim().to_string())).collect()
}

/// The soft limits of `/proc/<pid>/limits`, by name ("Max open files" → "512").
pub fn limits(pid: u32) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|l| {
            // "Max open files            512                  512                  files"
            let name = l.get(..26)?.trim().to_string();
            let soft = l.get(26..)?.split_whitespace().next()?.to_string();
            Some((name, soft))
        })
        .collect()
}

/// The process's cgroup in each v1 hierarchy that holds it (controller → directory
/// under /sys/fs/cgroup), from `/proc/<pid>/cgroup`.
pub fn cgroups(pid: u32) -> BTreeMap<String, PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        for c in controllers.split(',').filter(|c| !c.is_empty() && !c.starts_with("name=")) {
            out.insert(c.to_string(), PathBuf::from("/sys/fs/cgroup").join(c).join(path.trim_start_matches('/')));
        }
        if controllers.is_empty() {
            out.insert("unified".into(), PathBuf::from("/sys/fs/cgroup").join(path.trim_start_matches('/')));
        }
    }
    out
}

/// A cgroup file's value, trimmed (empty when unreadable).
pub fn cgroup_value(dir: &std::path::Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).unwrap_or_default().trim().to_string()
}

/// The tasks (threads) of every process on the host.
pub fn host_tasks() -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
    entries
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .filter_map(|e| std::fs::read_dir(e.path().join("task")).ok())
        .map(|tasks| tasks.count())
        .sum()
}

/// The median of `samples` (sorted here).
pub fn median(samples: &mut [std::time::Duration]) -> std::time::Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

/// The pid of sandbox `id`'s QEMU (its `-name lizard-<id>` argument), if it runs.
pub fn vmm_pid(id: &str) -> Option<u32> {
    lizard_vmm::census::live_vmms(&format!("lizard-{id}")).first().copied()
}

/// Names of the entries of `dir`, sorted (empty when it cannot be read).
pub fn dir_names(dir: &std::path::Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return vec![] };
    let mut names: Vec<String> = entries.flatten().filter_map(|e| e.file_name().to_str().map(str::to_string)).collect();
    names.sort();
    names
}

/// CPU time (user + system) the process `pid` has used, from `/proc/<pid>/stat`.
pub fn cpu_time(pid: u32) -> std::time::Duration {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at state, field 3.
    let rest = text.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|h| u64::try_from(h).ok())
        .unwrap_or(100)
        .max(1);
    // utime and stime are fields 14 and 15: indexes 11 and 12 from field 3.
    std::time::Duration::from_millis((ticks(11) + ticks(12)) * 1000 / hz)
}

/// The VMM cgroups (`…/lizard/vmm-<uid>`) in this process's memory hierarchy: nodes
/// started by a test make theirs there, so after a fault this says whether any leaked.
pub fn vmm_cgroups() -> Vec<PathBuf> {
    let Some(memory) = cgroups(std::process::id()).remove("memory") else { return vec![] };
    dir_names(&memory.join("lizard"))
        .into_iter()
        .filter(|n| n.starts_with("vmm-"))
        .map(|n| memory.join("lizard").join(n))
        .collect()
}
