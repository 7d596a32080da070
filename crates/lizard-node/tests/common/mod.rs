//! Shared by the integration tests: a node with its own data directory over the
//! suite-wide image cache, and a check that nothing of a sandbox is left behind.

// Helpers of these tests unwrap as the tests do (clippy.toml's allow-unwrap-in-tests
// covers only the #[test] functions themselves).
#![allow(clippy::unwrap_used)]
#![allow(dead_code)]

use lizard_node::{Node, NodeConfig};
use std::path::Path;
use std::sync::Arc;

/// The data directory of the machine's one image store (outside the checkout: a fresh
/// clone reuses its images).
pub use lizard_node::shared_image_root as image_root;

pub struct TestNode {
    pub node: Arc<Node>,
    pub dir: tempfile::TempDir,
}

pub async fn node_with(tweak: impl FnOnce(&mut NodeConfig)) -> TestNode {
    // RUST_LOG=lizard_node=debug shows what the node does (a fallback to cold boot, say).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let dir = tempfile::Builder::new().prefix("lizard-test-").tempdir().unwrap();
    let mut config = NodeConfig::new(dir.path());
    config.image_root = image_root();
    tweak(&mut config);
    let node = Node::start(config).await.unwrap();
    TestNode { node, dir }
}

pub async fn node() -> TestNode {
    node_with(|_| {}).await
}

impl TestNode {
    /// Kill everything, then prove nothing is left: no sandbox directory (disks,
    /// sockets, memory files) and no VMM process that names this node's directory.
    pub async fn finish(self) {
        self.node.shutdown().await;
        assert_no_leftovers(self.dir.path());
    }
}

pub fn assert_no_leftovers(data_dir: &Path) {
    let sandboxes = data_dir.join("sandboxes");
    let left: Vec<_> =
        std::fs::read_dir(&sandboxes).map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "sandbox directories left behind: {left:?}");
    assert_eq!(vmm_processes(data_dir), Vec::<u32>::new(), "VMM processes left behind");
}

/// Pids of live QEMU processes whose command line mentions `dir`.
pub fn vmm_processes(dir: &Path) -> Vec<u32> {
    lizard_vmm::census::live_vmms(&dir.to_string_lossy())
}

pub fn sh(cmd: &str) -> lizard_api::ExecRequest {
    lizard_api::ExecRequest { cmd: Some(cmd.to_string()), ..Default::default() }
}
