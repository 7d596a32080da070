//! What the node says of itself in its join and every heartbeat ([`NodeReport`]):
//! capacity from its admission limits (host CPUs and memory times the overcommit ratios,
//! as `confine::admission` counts them), usage by its running sandboxes, the templates
//! whose snapshots it holds, and every sandbox it runs or keeps paused.

use lizard_api::cluster::{HeldSandbox, NodeCapacity, NodeReport, NodeUsage};
use lizard_api::{SandboxInfo, SandboxState};
use lizard_node::confine::Capacity;
use lizard_node::Node;
use std::collections::BTreeSet;
use std::path::Path;

/// The report of `node` now.
pub fn of_node(node: &Node) -> NodeReport {
    let config = node.config();
    let capacity = Capacity::of_host(config.confine.cpu_overcommit, config.confine.memory_overcommit);
    let disk_gib = free_disk_gib(&config.data_dir).unwrap_or(0);
    let mut templates = snapshot_templates(&config.data_dir.join("snapshots"));
    templates.extend(node.built_templates());
    build(capacity, disk_gib, &node.list(), templates)
}

/// The report from its parts.
pub fn build(capacity: Capacity, disk_gib: u64, sandboxes: &[SandboxInfo], templates: BTreeSet<String>) -> NodeReport {
    let running = sandboxes.iter().filter(|s| s.state == SandboxState::Running);
    let (vcpus, memory_mib) =
        running.fold((0u32, 0u64), |(c, m), s| (c.saturating_add(s.vcpus), m + u64::from(s.memory_mib)));
    NodeReport {
        capacity: NodeCapacity {
            vcpus: u32::try_from(capacity.vcpus).unwrap_or(u32::MAX),
            memory_mib: capacity.memory_mib,
            disk_gib,
        },
        usage: NodeUsage { vcpus, memory_mib, sandboxes: u32::try_from(sandboxes.len()).unwrap_or(u32::MAX) },
        templates: templates.into_iter().collect(),
        sandboxes: sandboxes.iter().map(|s| HeldSandbox { sandbox_id: s.sandbox_id.clone(), state: s.state }).collect(),
    }
}

/// Templates with a usable snapshot in `dir` (one subdirectory per template and size).
fn snapshot_templates(dir: &Path) -> BTreeSet<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return BTreeSet::new() };
    entries
        .flatten()
        .filter_map(|e| lizard_node::snapshot::TemplateSnapshot::load(&e.path()))
        .map(|s| s.meta.template)
        .collect()
}

/// Free space for unprivileged use in the file system of `dir`, GiB.
fn free_disk_gib(dir: &Path) -> Option<u64> {
    let st = nix::sys::statvfs::statvfs(dir).ok()?;
    #[allow(clippy::useless_conversion)] // c types differ by target
    let bytes = u64::from(st.blocks_available()).saturating_mul(u64::from(st.fragment_size()));
    Some(bytes >> 30)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(id: &str, state: SandboxState, vcpus: u32, memory_mib: u32) -> SandboxInfo {
        SandboxInfo {
            sandbox_id: id.into(),
            template: "base".into(),
            state,
            vcpus,
            memory_mib,
            started_at: "2026-12-01T00:00:00Z".into(),
            metadata: Default::default(),
            project_id: None,
            end_at: None,
            domain: None,
            workdir: None,
            access_token: None,
        }
    }

    #[test]
    fn usage_counts_running_sandboxes_and_every_held_one_is_listed() {
        let held = [
            sandbox("sbx_a", SandboxState::Running, 2, 1024),
            sandbox("sbx_b", SandboxState::Paused, 4, 4096),
            sandbox("sbx_c", SandboxState::Running, 1, 512),
        ];
        let templates = BTreeSet::from(["base".to_string(), "tb-1".to_string()]);
        let r = build(Capacity { vcpus: 16, memory_mib: 36_000 }, 100, &held, templates);
        assert_eq!(r.capacity, NodeCapacity { vcpus: 16, memory_mib: 36_000, disk_gib: 100 });
        assert_eq!(r.usage, NodeUsage { vcpus: 3, memory_mib: 1536, sandboxes: 3 });
        assert_eq!(r.templates, ["base", "tb-1"]);
        let ids: Vec<_> = r.sandboxes.iter().map(|s| (s.sandbox_id.as_str(), s.state)).collect();
        assert_eq!(
            ids,
            [("sbx_a", SandboxState::Running), ("sbx_b", SandboxState::Paused), ("sbx_c", SandboxState::Running)]
        );
        // The wire form is what the server's heartbeat route reads.
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["capacity"]["memoryMib"], 36_000);
        assert_eq!(v["sandboxes"][1], serde_json::json!({"sandboxId": "sbx_b", "state": "paused"}));
    }

    #[test]
    fn a_capacity_beyond_u32_vcpus_saturates() {
        let r = build(Capacity { vcpus: u64::MAX, memory_mib: 1 }, 0, &[], BTreeSet::new());
        assert_eq!(r.capacity.vcpus, u32::MAX);
    }

    #[test]
    fn snapshots_are_found_by_their_metadata_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("junk")).unwrap();
        assert!(snapshot_templates(dir.path()).is_empty());
        assert!(snapshot_templates(&dir.path().join("absent")).is_empty());
        assert!(free_disk_gib(dir.path()).is_some());
    }
}
