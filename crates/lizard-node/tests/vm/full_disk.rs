//! A node whose data directory's filesystem is full (a small loop-mounted ext4 the test
//! makes): a create refuses with a clear error and leaves nothing behind, a pause fails
//! and leaves the sandbox running, a guest write that the disk cannot take halts only
//! that VM — seen at once, its operations refused instead of hanging — and all of it
//! works again once space returns, the halted write included. A pause whose own volume
//! sync halts the VM is refused, and leaves the sandbox as it was.

#![allow(clippy::unwrap_used)]

use crate::common;

use common::sh;
use lizard_api::{CreateSandboxRequest, ErrorCode, SandboxState};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A loop-mounted ext4 of `size` under a temp dir, unmounted on drop.
struct SmallFs {
    mount: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallFs {
    fn new(size: &str) -> SmallFs {
        let dir = tempfile::Builder::new().prefix("lizard-full-").tempdir_in("/var/tmp").unwrap();
        let image = dir.path().join("fs.img");
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).unwrap();
        let ok = |c: &mut Command| assert!(c.status().unwrap().success(), "{c:?}");
        ok(Command::new("truncate").args(["-s", size]).arg(&image));
        // No blocks reserved for root: the node runs as root and would write into them.
        ok(Command::new("mkfs.ext4").args(["-q", "-F", "-m", "0"]).arg(&image));
        ok(Command::new("mount").args(["-o", "loop"]).arg(&image).arg(&mount));
        SmallFs { mount, _dir: dir }
    }

    /// Take every free byte with one file, and keep it so until
    /// nothing frees more: a node may still be removing what its first create left (a
    /// template VM's run directory) after that create returned.
    fn fill(&self) -> PathBuf {
        let filler = self.mount.join("filler");
        // What a writer can still take (ext4 keeps a few clusters for its own metadata
        // out of everyone's reach; with `-m 0` root has no more than others).
        let free = || {
            let s = nix::sys::statvfs::statvfs(&self.mount).unwrap();
            s.blocks_available() * s.fragment_size()
        };
        for _ in 0..20 {
            let _ = Command::new("fallocate").args(["-l", &free().to_string()]).arg(&filler).status();
            // What fallocate could not take (reserved rounding), a write takes.
            let _ = Command::new("dd")
                .args(["if=/dev/zero", "bs=64k", "oflag=append", "conv=notrunc"])
                .arg(format!("of={}", filler.display()))
                .stderr(std::process::Stdio::null())
                .status();
            std::thread::sleep(std::time::Duration::from_millis(500));
            if free() < 1 << 20 {
                return filler;
            }
        }
        panic!("the filesystem does not stay full: {} bytes free", free());
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

fn sandbox_dirs(data: &Path) -> Vec<String> {
    std::fs::read_dir(data.join("sandboxes"))
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// 503 saying why, and no host path.
fn assert_disk_full(e: &lizard_node::NodeError) {
    let message = e.to_api().message;
    assert_eq!(e.code(), ErrorCode::Unavailable, "{e}");
    assert!(message.contains("no space left on the node's disk") && !message.contains('/'), "{message}");
}

/// 503 saying the sandbox is halted for a full disk, and no host path.
fn assert_halted(e: &lizard_node::NodeError) {
    let message = e.to_api().message;
    assert_eq!(e.code(), ErrorCode::Unavailable, "{e}");
    assert!(message.contains("halted") && message.contains("disk is full") && !message.contains('/'), "{message}");
}

/// Whether `done` holds within `limit` (looked at every 100 ms).
async fn wait_until(limit: Duration, done: impl Fn() -> bool) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    done()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_refuses_creates_and_pauses_cleanly_and_both_work_once_space_returns() {
    let fs = SmallFs::new("4G");
    let mut config = lizard_node::NodeConfig::new(&fs.mount);
    config.image_root = common::image_root();
    let node = lizard_node::Node::start(config).await.unwrap();
    let base = || CreateSandboxRequest { template: "base".into(), ..Default::default() };
    let first = node.create(base()).await.unwrap();
    let filler = fs.fill();

    let e = node.create(base()).await.unwrap_err();
    assert_disk_full(&e);
    assert_eq!(sandbox_dirs(&fs.mount), std::slice::from_ref(&first.id), "a failed create left its directory");
    assert_eq!(common::vmm_processes(&fs.mount).len(), 1, "a failed create left a VMM");

    let e = node.pause(&first.id).await.unwrap_err();
    assert_disk_full(&e);
    assert_eq!(first.info().state, SandboxState::Running, "a failed pause must leave it running");
    let r = first.exec_collect(sh("echo alive")).await.unwrap();
    assert_eq!(r.stdout, "alive\n");

    // The guest writes what the host's disk cannot hold: QEMU halts its VM.
    let writer = {
        let first = first.clone();
        let write = "dd if=/dev/zero of=/root/big bs=1M count=32 conv=fsync 2>&1 && echo written";
        tokio::spawn(async move { first.exec_collect(sh(write)).await })
    };
    let halted = wait_until(Duration::from_secs(60), || first.is_halted()).await;
    assert!(halted, "the node did not see the VM halt");
    let refused = tokio::time::timeout(Duration::from_secs(5), first.exec_collect(sh("echo hi"))).await;
    let e = refused.expect("an exec on a halted VM hangs instead of failing").unwrap_err();
    assert_halted(&e);
    assert_halted(&node.pause(&first.id).await.unwrap_err());
    assert_eq!(first.info().state, SandboxState::Running, "a refused pause must leave it running");

    std::fs::remove_file(filler).unwrap();
    let continued = wait_until(Duration::from_secs(30), || !first.is_halted()).await;
    assert!(continued, "the halted VM did not continue once space returned");
    let written = tokio::time::timeout(Duration::from_secs(60), writer).await.expect("the halted write never ended");
    let written = written.unwrap().unwrap();
    assert!(written.stdout.ends_with("written\n"), "the write failed: {written:?}");
    let size = first.exec_collect(sh("stat -c %s /root/big")).await.unwrap().stdout;
    assert_eq!(size.trim(), (32u64 << 20).to_string(), "the halted write lost data");

    let second = node.create(base()).await.unwrap();
    node.pause(&first.id).await.unwrap();
    node.resume(&first.id).await.unwrap();
    assert_eq!(first.info().state, SandboxState::Running);
    assert_eq!(first.exec_collect(sh("echo back")).await.unwrap().stdout, "back\n");
    drop(second);
    node.shutdown().await;
    common::assert_no_leftovers(&fs.mount);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pause_whose_own_volume_sync_halts_the_vm_is_refused_and_the_sandbox_runs_on() {
    let fs = SmallFs::new("4G");
    let mut config = lizard_node::NodeConfig::new(&fs.mount);
    config.image_root = common::image_root();
    let node = lizard_node::Node::start(config).await.unwrap();
    node.create_volume("vol_full", 1).await.unwrap();
    let req = CreateSandboxRequest { template: "base".into(), volume: Some("vol_full".into()), ..Default::default() };
    let sandbox = node.create(req).await.unwrap();
    // 16 MiB written to the volume and kept in the guest's page cache (no writeback
    // until asked): the pause's own volume sync is the write the host's disk cannot take.
    let write = "sysctl -q vm.dirty_writeback_centisecs=0 vm.dirty_expire_centisecs=360000 \
                 && head -c 16M /dev/urandom > /workspace/cached && sha256sum < /workspace/cached";
    let r = sandbox.exec_collect(sh(write)).await.unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    let written = r.stdout;
    let filler = fs.fill();

    let paused = tokio::time::timeout(Duration::from_secs(30), node.pause(&sandbox.id)).await;
    let e = paused.expect("a pause whose volume sync halted the VM hangs").unwrap_err();
    assert_halted(&e);
    assert!(sandbox.is_halted());
    assert_eq!(sandbox.info().state, SandboxState::Running, "a refused pause must leave it running");

    std::fs::remove_file(filler).unwrap();
    let continued = wait_until(Duration::from_secs(30), || !sandbox.is_halted()).await;
    assert!(continued, "the halted VM did not continue once space returned");
    // The agent session the pause did not end serves it again, and the data is whole.
    let check = "sync /workspace/cached && echo 3 > /proc/sys/vm/drop_caches && sha256sum < /workspace/cached";
    let r = tokio::time::timeout(Duration::from_secs(30), sandbox.exec_collect(sh(check))).await;
    let r = r.expect("the sandbox does not answer after its halt").unwrap();
    assert_eq!(r.stdout, written, "{r:?}");
    node.pause(&sandbox.id).await.unwrap();
    node.resume(&sandbox.id).await.unwrap();
    assert_eq!(sandbox.exec_collect(sh("echo back")).await.unwrap().stdout, "back\n");
    node.shutdown().await;
    common::assert_no_leftovers(&fs.mount);
}
