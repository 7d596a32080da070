//! A sandbox network's plumbing: slots (a /30 of the node's pool each, owned through a
//! host-wide `flock`), the namespace, the veth pair to the host and the VM's TAP device,
//! their addresses, and removing all of it again.

use super::netlink::Netlink;
use super::{io_err, NetError, Result};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Namespaces are `lizard-<slot>`, host links `lzv<slot>` (by default).
pub const NETNS_PREFIX: &str = "lizard-";
pub const HOST_IF_PREFIX: &str = "lzv";
/// Where namespaces are pinned (as `ip netns` does).
pub(super) const NETNS_DIR: &str = "/run/netns";
/// Interface names hold 15 bytes; a slot takes up to 5 digits.
pub(super) const MAX_LINK_PREFIX: usize = 10;

/// The node's pool, cut into slots, and the host-wide locks that say who owns which.
#[derive(Debug)]
pub(super) struct Slots {
    pool: Ipv4Addr,
    count: u32,
    state_dir: PathBuf,
    cursor: AtomicU32,
}

/// A slot's lock file, held while the slot is in use (removed when given up).
pub(super) type SlotLock = crate::lock_file::LockFile;

impl Slots {
    /// The /30s of `pool`/`prefix`, locked under `state_dir`; allocation starts at a
    /// random slot so that nodes sharing the pool rarely race for the same one.
    pub fn new(pool: Ipv4Addr, prefix: u8, state_dir: PathBuf) -> Slots {
        let count = 1u32 << (32 - prefix - 2);
        Slots { pool, count, state_dir, cursor: AtomicU32::new(rand::random::<u32>() % count) }
    }

    /// Addresses of a slot: (host side, namespace side).
    pub fn addrs(&self, slot: u32) -> (Ipv4Addr, Ipv4Addr) {
        let base = u32::from(self.pool) + slot * 4;
        (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2))
    }

    fn lock_path(&self, slot: u32) -> PathBuf {
        self.state_dir.join(format!("slot-{slot}.lock"))
    }

    /// Take slot `slot` if no live process holds it.
    pub fn try_lock(&self, slot: u32) -> Option<SlotLock> {
        SlotLock::try_acquire(&self.lock_path(slot))
    }

    /// A free slot: its lock taken, and its addresses on no interface of the host (a
    /// leftover under another node's prefix would otherwise clash).
    pub fn allocate(&self) -> Result<(u32, SlotLock)> {
        let in_use: std::collections::HashSet<Ipv4Addr> = super::forbidden::all_host_addresses().into_iter().collect();
        for _ in 0..self.count {
            let slot = self.cursor.fetch_add(1, Ordering::Relaxed) % self.count;
            let (host, _) = self.addrs(slot);
            if in_use.contains(&host) {
                continue;
            }
            if let Some(lock) = self.try_lock(slot) {
                return Ok((slot, lock));
            }
        }
        Err(NetError::Exhausted)
    }

    /// Remove namespaces and links named by `names` whose slot nobody holds (a crashed
    /// node's).
    pub fn sweep(&self, names: &Names) {
        let mut slots = std::collections::BTreeSet::new();
        for (dir, prefix) in [(NETNS_DIR, &names.netns_prefix), ("/sys/class/net", &names.link_prefix)] {
            let Ok(entries) = std::fs::read_dir(dir) else { continue };
            for e in entries.flatten() {
                if let Some(s) =
                    e.file_name().to_str().and_then(|n| n.strip_prefix(prefix.as_str())).and_then(|s| s.parse().ok())
                {
                    slots.insert(s);
                }
            }
        }
        for slot in slots.iter().copied().filter(|s| *s < self.count) {
            if let Some(lock) = self.try_lock(slot) {
                tracing::warn!(slot, "removing a sandbox network left by a dead node process");
                names.teardown(slot);
                drop(lock);
            }
        }
        // Lock files of slots with nothing left (a process killed after its teardown):
        // taken and given up, which removes them.
        let Ok(entries) = std::fs::read_dir(&self.state_dir) else { return };
        for e in entries.flatten() {
            let name = e.file_name();
            let slot = name.to_str().and_then(|n| n.strip_prefix("slot-")?.strip_suffix(".lock")?.parse::<u32>().ok());
            if let Some(slot) = slot.filter(|s| !slots.contains(s)) {
                drop(self.try_lock(slot));
            }
        }
    }
}

/// Make slot `slot`'s namespace: the veth pair with the host (`host_addr` on the host's
/// end, `ns_addr` inside), the default route, and the TAP device the VM attaches to, on
/// the guests' gateway address. IPv6 is off on the host's end. Through netlink (see
/// [`super::netlink`]); `host` is the node's connection.
pub(super) async fn create(host: &Netlink, names: &Names, slot: u32, addrs: (Ipv4Addr, Ipv4Addr)) -> Result<()> {
    super::netlink::create(host, &names.netns_path(slot), &names.link(slot), addrs).await
}

/// Run `f` on a thread of its own inside the namespace at `ns_path` (`setns` moves only
/// the calling thread), after turning on forwarding and turning off IPv6 there.
pub(super) fn in_namespace<T: Send>(ns_path: &Path, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    let ns = std::fs::File::open(ns_path).map_err(io_err(format!("open {}", ns_path.display())))?;
    std::thread::scope(|s| {
        s.spawn(|| -> Result<T> {
            // SAFETY: setns(2) on a namespace fd we own; it moves only this thread, which
            // ends with this closure.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io_err("enter the sandbox's network namespace")(std::io::Error::last_os_error()));
            }
            // /proc/sys/net shows the opening thread's namespace.
            for (path, value) in [
                ("/proc/sys/net/ipv4/ip_forward", "1"),
                ("/proc/sys/net/ipv6/conf/all/disable_ipv6", "1"),
                ("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1"),
            ] {
                std::fs::write(path, value).map_err(io_err(format!("write {path}")))?;
            }
            f()
        })
        .join()
        .expect("namespace thread panicked")
    })
}

/// How one node names its slots' namespaces and links.
#[derive(Debug)]
pub(super) struct Names {
    pub netns_prefix: String,
    pub link_prefix: String,
}

impl Names {
    pub fn netns(&self, slot: u32) -> String {
        format!("{}{slot}", self.netns_prefix)
    }

    pub fn netns_path(&self, slot: u32) -> PathBuf {
        Path::new(NETNS_DIR).join(self.netns(slot))
    }

    pub fn link(&self, slot: u32) -> String {
        format!("{}{slot}", self.link_prefix)
    }

    pub fn leftovers(&self, slot: u32) -> bool {
        self.netns_path(slot).exists() || Path::new("/sys/class/net").join(self.link(slot)).exists()
    }

    /// Both the namespace and the host link of `slot` are there.
    pub fn complete(&self, slot: u32) -> bool {
        self.netns_path(slot).exists() && Path::new("/sys/class/net").join(self.link(slot)).exists()
    }

    /// Delete a slot's host link (and with it its peer) and its namespace (and with it
    /// the TAP and the namespace's rules). Blocking: it runs at kill, after the VM is gone.
    pub fn teardown(&self, slot: u32) {
        if let Err(e) = super::netlink::teardown(&self.link(slot), &self.netns_path(slot)) {
            tracing::warn!(slot, "network teardown: {e}");
        }
    }
}

/// Run a command with `stdin`, optionally inside a network namespace; its stderr is the
/// error.
pub(super) async fn run(program: &str, args: &[&str], stdin: Option<&str>, netns: Option<&Path>) -> Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .stdin(if stdin.is_some() { std::process::Stdio::piped() } else { std::process::Stdio::null() })
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let ns = match netns {
        Some(p) => Some(std::fs::File::open(p).map_err(io_err(format!("open {}", p.display())))?),
        None => None,
    };
    if let Some(ns) = &ns {
        lizard_vmm::netns::enter_before_exec(&mut cmd, ns);
    }
    let command = format!("{program} {}", args.join(" "));
    let mut child = cmd.spawn().map_err(io_err(format!("run {command} (is it installed? scripts/deps.sh)")))?;
    drop(ns);
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("piped");
        pipe.write_all(input.as_bytes()).await.map_err(io_err(format!("write to {command}")))?;
    }
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .map_err(|_| NetError::Command { command: command.clone(), stderr: "timed out".into() })?
        .map_err(io_err(format!("wait for {command}")))?;
    if !out.status.success() {
        return Err(NetError::Command { command, stderr: String::from_utf8_lossy(&out.stderr).trim().to_string() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_cut_the_pool_into_30s() {
        let slots = Slots::new(Ipv4Addr::new(10, 200, 0, 0), 16, PathBuf::from("/nonexistent"));
        assert_eq!(slots.count, 1 << 14);
        assert_eq!(slots.addrs(0), (Ipv4Addr::new(10, 200, 0, 1), Ipv4Addr::new(10, 200, 0, 2)));
        assert_eq!(slots.addrs(1), (Ipv4Addr::new(10, 200, 0, 5), Ipv4Addr::new(10, 200, 0, 6)));
        assert_eq!(slots.addrs(16383), (Ipv4Addr::new(10, 200, 255, 253), Ipv4Addr::new(10, 200, 255, 254)));
        let names = Names { netns_prefix: NETNS_PREFIX.into(), link_prefix: HOST_IF_PREFIX.into() };
        assert_eq!(names.link(16383), "lzv16383");
        assert_eq!(names.netns_path(7), Path::new("/run/netns/lizard-7"));
    }

    #[test]
    fn a_sweep_removes_stale_slot_lock_files_and_leaves_held_ones() {
        let dir = tempfile::tempdir().unwrap();
        let slots = Slots::new(Ipv4Addr::new(10, 200, 0, 0), 16, dir.path().to_path_buf());
        let held = slots.try_lock(3).expect("a free slot");
        assert!(slots.try_lock(3).is_none(), "held already");
        // A stale file (its holder killed after its teardown) is swept; a held one is not.
        std::fs::write(dir.path().join("slot-9.lock"), "").unwrap();
        let names = Names { netns_prefix: "lztest-none-".into(), link_prefix: "lztnone".into() };
        slots.sweep(&names);
        assert!(!dir.path().join("slot-9.lock").exists(), "the stale file is gone");
        assert!(dir.path().join("slot-3.lock").exists(), "the held one stays");
        drop(held);
        assert!(!dir.path().join("slot-3.lock").exists(), "and goes with its lock");
    }
}
