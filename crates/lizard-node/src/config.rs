//! A node's settings and where their defaults come from (environment, the running
//! executable's neighbours, the user's data directory).

use crate::network;
use lizard_vmm::Accel;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Settings of a node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Root of everything the node stores (sandboxes, caches).
    pub data_dir: PathBuf,
    /// Where guest images are built and cached (`<image_root>/images`); usually the data
    /// directory, shared between nodes of one machine in tests.
    pub image_root: PathBuf,
    /// The static `lizard-agent` binary that becomes PID 1 in every guest.
    pub agent_bin: PathBuf,
    /// QEMU system emulator.
    pub qemu_binary: PathBuf,
    /// Force an accelerator instead of probing.
    pub accel: Option<Accel>,
    pub default_vcpus: u32,
    pub default_memory_mib: u32,
    /// How long a cold-booted guest may take until its agent answers.
    pub boot_timeout: Duration,
    /// Start sandboxes by restoring a template snapshot (made by cold-booting the
    /// template once) rather than booting a kernel each time.
    pub snapshots: bool,
    /// Give every sandbox a network (its own namespace, TAP, NAT and firewall). Needs
    /// root, `ip` and `nft`. Without it sandboxes have no NIC.
    pub network: Option<network::NetworkConfig>,
    /// The static `lizard` CLI put into every guest (at `/usr/local/bin/lizard`); `None`:
    /// guests get no CLI.
    pub guest_cli: Option<PathBuf>,
    /// Where connections to the guest's API address ([`lizard_agent_proto::routes::FORWARD_GUEST_URL`])
    /// go: the control plane's API. `None`: guests cannot reach any API.
    pub api_forward: Option<std::net::SocketAddr>,
    /// Forwarded API connections all sandboxes share beyond each one's reserved few
    /// ([`crate::forward`]).
    pub api_forward_shared: usize,
    /// VMM processes started ahead of demand and waiting for a snapshot's state, per
    /// template snapshot and shape that sandboxes were created from (the few most
    /// recently used): a create then skips QEMU's start. 0: none.
    pub prespawn: u32,
    /// Templates whose sandboxes are kept restored ahead of demand, and how many of
    /// each (unclaimed: no identity, closed network, not billed).
    pub warm_pool: std::collections::BTreeMap<String, u32>,
    /// Restores (and pool refills) that run at once; more wait their turn in order, so
    /// that a burst does not thrash the CPUs. Default: the host's CPU count.
    pub max_concurrent_restores: usize,
    /// How long a paused sandbox's VMM stays, stopped, once its state is saved: a resume
    /// within that time continues it instead of restoring the save (see `node::kept`).
    /// Kept VMMs give way to creates that need their memory. Zero (the default here;
    /// `lizard server` keeps them 60 s): ended at once.
    pub keep_paused_vm: Duration,
    /// How VMMs are confined and sandboxes admitted.
    pub confine: crate::confine::ConfineConfig,
    /// Free space on the data directory's filesystem below which no sandbox is started
    /// (create, fork, pool): what running sandboxes' root disks may still grow into.
    /// A running sandbox whose write the disk cannot take halts until there is room
    /// (`node::disk_halt`); this keeps new ones from taking that room first.
    pub disk_headroom: u64,
    /// How long a template snapshot that no clone was made of is kept, unless it is its
    /// template's latest or a disk backs onto it (`node::snapshot_gc`).
    pub snapshot_idle: Duration,
}

/// [`NodeConfig::disk_headroom`]'s default: 1 GiB.
pub const DEFAULT_DISK_HEADROOM: u64 = 1 << 30;

impl NodeConfig {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        let data_dir = data_dir.into();
        NodeConfig {
            image_root: data_dir.clone(),
            data_dir,
            agent_bin: default_agent_bin(),
            qemu_binary: PathBuf::from("qemu-system-x86_64"),
            accel: None,
            default_vcpus: 1,
            default_memory_mib: 512,
            boot_timeout: Duration::from_secs(60),
            snapshots: true,
            // Namespaces and firewall rules need root.
            network: nix::unistd::geteuid().is_root().then(network::NetworkConfig::default),
            guest_cli: default_guest_cli(),
            api_forward: None,
            api_forward_shared: crate::forward::TOTAL,
            prespawn: 0,
            warm_pool: Default::default(),
            max_concurrent_restores: std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get),
            keep_paused_vm: Duration::ZERO,
            confine: Default::default(),
            disk_headroom: DEFAULT_DISK_HEADROOM,
            snapshot_idle: Duration::from_secs(60 * 60),
        }
    }
}

/// `LIZARD_AGENT_BIN`, else `lizard-agent` next to the running executable, else the
/// static build in this checkout's target directory.
pub fn default_agent_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("LIZARD_AGENT_BIN") {
        return PathBuf::from(p);
    }
    let exe_dir = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf));
    if let Some(dir) = &exe_dir {
        // A plain `cargo build` also leaves a dynamically linked lizard-agent next to the
        // CLI, which cannot run as a guest's init: only a static one will do.
        let candidate = dir.join("lizard-agent");
        if is_static_executable(&candidate) {
            return candidate;
        }
        // target/{debug,release}[/deps] → target/x86_64-unknown-linux-gnu/release/lizard-agent
        for up in dir.ancestors().take(3) {
            let c = up.join("x86_64-unknown-linux-gnu/release/lizard-agent");
            if c.exists() {
                return c;
            }
        }
    }
    PathBuf::from("/usr/local/bin/lizard-agent")
}

/// `LIZARD_GUEST_CLI_BIN`, else a static `lizard` (or `lizard-guest`) next to the agent
/// (scripts/build-agent.sh builds both), else none.
pub fn default_guest_cli() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("LIZARD_GUEST_CLI_BIN") {
        return Some(PathBuf::from(p));
    }
    let agent = default_agent_bin();
    let dir = agent.parent()?;
    ["lizard", "lizard-guest"].into_iter().map(|n| dir.join(n)).find(|p| is_static_executable(p))
}

/// An ELF file without a program interpreter (static or static-pie).
fn is_static_executable(path: &Path) -> bool {
    use object::read::elf::{FileHeader, ProgramHeader};
    let Ok(data) = std::fs::read(path) else { return false };
    let Ok(header) = object::elf::FileHeader64::<object::Endianness>::parse(&*data) else { return false };
    let Ok(endian) = header.endian() else { return false };
    let Ok(segments) = header.program_headers(endian, &*data) else { return false };
    !segments.iter().any(|s| s.p_type(endian) == object::elf::PT_INTERP)
}

/// The default data directory: /var/lib/lizard as root, else the XDG data home.
pub fn default_data_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("LIZARD_DATA_DIR") {
        return PathBuf::from(p);
    }
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/var/lib/lizard");
    }
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("lizard")
}

/// The data directory whose `images/` every process of this machine shares: the installed
/// server, `lizard images`, the test suites and the bench. `LIZARD_TEST_DATA_DIR`, else
/// [`default_data_dir`]: one image store per machine, so a clone's test run after
/// `install.sh` builds no image (artefacts are keyed by content, built under a lock).
pub fn shared_image_root() -> PathBuf {
    std::env::var_os("LIZARD_TEST_DATA_DIR").map_or_else(default_data_dir, PathBuf::from)
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_static_binaries_pass_for_the_agent() {
        // This test binary is dynamically linked (it has an interpreter); /etc/hostname is no ELF.
        assert!(!super::is_static_executable(&std::env::current_exe().unwrap()));
        assert!(!super::is_static_executable(std::path::Path::new("/etc/hostname")));
        let agent = super::default_agent_bin();
        if agent.exists() {
            assert!(super::is_static_executable(&agent), "{} is not static", agent.display());
        }
    }
}
