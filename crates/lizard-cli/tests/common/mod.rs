//! What the `lizard` binary's integration tests share: where the suite's guest images and agent are,
//! and a `lizard` command that inherits none of the caller's LIZARD_* variables.

// Helpers of these tests unwrap as the tests do (clippy.toml's allow-unwrap-in-tests
// covers only the #[test] functions themselves).
#![allow(clippy::unwrap_used)]
// Each test target is its own crate and uses only part of this.
#![allow(dead_code)]

pub mod server;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The data directory of the machine's one image store (outside the checkout: a fresh
/// clone reuses its images).
pub use lizard_node::shared_image_root as image_root;

/// The guest agent to boot: LIZARD_AGENT_BIN, else the one `scripts/build-agent.sh` builds.
pub fn agent_bin() -> PathBuf {
    std::env::var_os("LIZARD_AGENT_BIN").map(PathBuf::from).unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/x86_64-unknown-linux-gnu/release/lizard-agent")
    })
}

/// Link the suite's content-hashed images into `data` (a data directory of the test's own).
pub fn link_images(data: &Path) {
    std::os::unix::fs::symlink(image_root().canonicalize().unwrap().join("images"), data.join("images")).unwrap();
}

/// Copy the suite's accelerator probe verdict into `data`, if there is one: the probe costs seconds.
pub fn copy_accel_verdict(data: &Path) {
    let verdict = image_root().join("accel.json");
    if verdict.exists() {
        std::fs::copy(verdict, data.join("accel.json")).unwrap();
    }
}

/// `lizard` with none of the caller's LIZARD_* variables: each test sets the ones it means.
pub fn lizard_command() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lizard"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("LIZARD_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// A free loopback port, for a `lizard server` to listen on.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Processes whose command line names `data` and one of `words` (a data directory's node
/// daemon, `node run`, and its VMMs, `qemu-system`).
pub fn processes_of(data: &Path, words: &[&str]) -> Vec<i32> {
    let needle = data.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            cmd.contains(&needle) && words.iter().any(|w| cmd.contains(w))
        })
        .collect()
}
