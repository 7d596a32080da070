//! What a node may leave behind on the host, counted from the kernel's own view (/proc,
//! /run/netns, /sys/class/net) rather than from the node's records: after a fault these
//! counts say whether anything leaked.

use std::path::Path;

/// Pids of QEMU processes whose command line names a path under `data_dir`.
pub fn vmm_pids(data_dir: &Path) -> Vec<u32> {
    lizard_vmm::census::live_vmms(&data_dir.to_string_lossy())
}

/// Network namespaces (under /run/netns) whose name starts with `prefix`.
pub fn netns(prefix: &str) -> Vec<String> {
    names_in(Path::new("/run/netns"), prefix)
}

/// Host network links whose name starts with `prefix`.
pub fn links(prefix: &str) -> Vec<String> {
    names_in(Path::new("/sys/class/net"), prefix)
}

/// Sandbox directories (run dirs and disks) of a node.
pub fn sandbox_dirs(node_dir: &Path) -> Vec<String> {
    names_in(&node_dir.join("sandboxes"), "")
}

fn names_in(dir: &Path, prefix: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return vec![] };
    let mut names: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort();
    names
}
