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

/// The host's nftables tables (`family name`) whose name starts with `prefix`.
pub fn nft_tables(prefix: &str) -> Vec<String> {
    let out = std::process::Command::new("nft").args(["list", "tables"]).output().expect("nft runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("table "))
        .filter(|t| t.split_whitespace().nth(1).is_some_and(|name| name.starts_with(prefix)))
        .map(str::to_string)
        .collect()
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
