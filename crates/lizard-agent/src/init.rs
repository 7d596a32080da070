//! PID 1: bring the guest up, then serve the host until the VM is switched off.
//!
//! 1. Mount devtmpfs, proc and sysfs, and point stdin/stdout/stderr at the console (the
//!    kernel's serial console, which the host logs).
//! 2. Load the kernel modules listed in [`MODULES_ORDER`] (virtio transport, block, console,
//!    vsock are modules in the stock cloud kernel), in order; failures are logged, not fatal.
//! 3. Read the kernel command line. `lizard.mode=probe` prints [`PROBE_OK`] and powers off:
//!    the host uses it to find out whether an accelerator works at all.
//! 4. Wait for the root device, mount it, move /dev, /proc, /sys into it and switch root
//!    (`mount --move . /` + `chroot`, as pivot_root cannot leave an initramfs).
//! 5. Mount the rest (/dev/pts, /dev/shm, /tmp, /run, cgroup2), quiet what would wake an
//!    idle guest (see `quiet`), bring up `lo` (and `eth0`, see `net`), set the hostname,
//!    start the reaper, and serve the host on the chosen transport.
//!
//! PID 1 must never exit (the kernel would panic, and the host would see a hung VM rather
//! than an exit): anything fatal is printed to the console and the VM is powered off.

use crate::app::AppState;
use crate::reaper::{self, ReaperError};
use crate::transport::{self, TransportError};
use lizard_agent_proto::handshake::Secret;
use lizard_agent_proto::{cmdline, parse_cmdline, PROBE_OK};
use nix::errno::Errno;
use nix::kmod::{finit_module, ModuleInitFlags};
use nix::mount::{mount, MsFlags};
use nix::sys::reboot::{reboot, RebootMode};
use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Kernel modules to load at boot, one path per line, in load order.
pub const MODULES_ORDER: &str = "/etc/lizard/modules.order";
/// Where the root file system is mounted before the switch.
const NEW_ROOT: &str = "/newroot";
/// How long to wait for the root block device to appear.
const ROOT_WAIT: Duration = Duration::from_secs(10);
/// `finit_module` flag: the file is compressed and the kernel decompresses it (Linux 5.17+).
const MODULE_INIT_COMPRESSED_FILE: libc::c_uint = 4;

/// Why the guest could not come up.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// A mount that the agent cannot do without failed.
    #[error("mount {what}: {cause}")]
    Mount { what: String, cause: Errno },
    /// A required kernel command-line key is missing.
    #[error("{0} is not set on the kernel command line")]
    Missing(&'static str),
    /// A kernel command-line value is invalid.
    #[error("bad {key}: {reason}")]
    BadValue { key: &'static str, reason: String },
    /// The root block device never appeared.
    #[error("root device {0} did not appear")]
    NoRoot(String),
    /// A system call of the boot sequence failed.
    #[error("{what}: {cause}")]
    Io { what: String, cause: io::Error },
    /// The host channel could not be served.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The reaper could not start.
    #[error(transparent)]
    Reaper(#[from] ReaperError),
}

impl InitError {
    fn mount(what: impl Into<String>) -> impl FnOnce(Errno) -> InitError {
        let what = what.into();
        move |cause| InitError::Mount { what, cause }
    }
    fn io<E: Into<io::Error>>(what: impl Into<String>) -> impl FnOnce(E) -> InitError {
        let what = what.into();
        move |cause| InitError::Io { what, cause: cause.into() }
    }
}

/// The host channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Serial,
    Vsock,
}

/// What the kernel command line asks for.
#[derive(Debug, PartialEq)]
pub enum Boot {
    /// Print [`PROBE_OK`] and power off.
    Probe,
    /// Boot the root file system and serve the host.
    Run { secret: Secret, hostname: Option<String>, root: PathBuf, transport: Transport },
}

impl Boot {
    pub fn from_cmdline(args: &HashMap<String, String>) -> Result<Boot, InitError> {
        match args.get(cmdline::MODE).map(String::as_str) {
            Some("probe") => return Ok(Boot::Probe),
            None | Some("run") => {}
            Some(other) => {
                return Err(InitError::BadValue { key: cmdline::MODE, reason: format!("unknown mode {other:?}") })
            }
        }
        let secret = args.get(cmdline::SECRET).ok_or(InitError::Missing(cmdline::SECRET))?;
        let secret = Secret::from_hex(secret)
            .map_err(|e| InitError::BadValue { key: cmdline::SECRET, reason: e.to_string() })?;
        let transport = match args.get(cmdline::TRANSPORT).map(String::as_str) {
            None | Some("serial") => Transport::Serial,
            Some("vsock") => Transport::Vsock,
            Some(other) => {
                return Err(InitError::BadValue {
                    key: cmdline::TRANSPORT,
                    reason: format!("unknown transport {other:?}"),
                })
            }
        };
        Ok(Boot::Run {
            secret,
            hostname: args.get(cmdline::HOSTNAME).cloned(),
            root: PathBuf::from(args.get(cmdline::ROOT).map(String::as_str).unwrap_or("/dev/vda")),
            transport,
        })
    }
}

/// Run as PID 1. Never returns.
pub fn run() -> ! {
    let reason = match std::panic::catch_unwind(boot) {
        Ok(Ok(never)) => match never {},
        Ok(Err(e)) => e.to_string(),
        Err(_) => "the agent panicked".to_string(),
    };
    eprintln!("lizard-agent: fatal: {reason}; powering off");
    power_off()
}

/// Sync and power the VM off; the host sees the VMM exit.
pub fn power_off() -> ! {
    nix::unistd::sync();
    let _ = reboot(RebootMode::RB_POWER_OFF);
    // reboot only fails without CAP_SYS_BOOT; PID 1 still must not exit.
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn boot() -> Result<Infallible, InitError> {
    mount_fs("devtmpfs", "/dev", "devtmpfs", MsFlags::MS_NOSUID, Some("mode=0755"))?;
    attach_console();
    mount_fs("proc", "/proc", "proc", MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC, None)?;
    mount_fs("sysfs", "/sys", "sysfs", MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC, None)?;
    load_modules(Path::new(MODULES_ORDER));
    let line = std::fs::read_to_string("/proc/cmdline").map_err(InitError::io("read /proc/cmdline"))?;
    let mut args = parse_cmdline(&line);
    let fw_cfg = format!("/sys/firmware/qemu_fw_cfg/by_name/{}/raw", lizard_agent_proto::FW_CFG_SECRET);
    if let Ok(secret) = std::fs::read_to_string(&fw_cfg) {
        args.insert(cmdline::SECRET.to_string(), secret.trim().to_string());
    }
    let Boot::Run { secret, hostname, root, transport } = Boot::from_cmdline(&args)? else {
        eprintln!("{PROBE_OK}");
        power_off()
    };
    wait_for_device(&root)?;
    switch_root(&root)?;
    mount_late();
    // Before the runtime starts its threads (see `quiet::stop_pit`).
    crate::quiet::quiet_idle_wakeups();
    // The kernel adds 127.0.0.1/8 and ::1 by itself once `lo` is up.
    if let Err(e) = crate::net::link_up("lo") {
        eprintln!("lizard-agent: cannot bring up lo: {e}");
    }
    if let Err(e) = crate::net::configure() {
        eprintln!("lizard-agent: cannot configure {}: {e}", lizard_agent_proto::net::GUEST_IF);
    }
    if let Some(h) = hostname {
        crate::identity::set_hostname(&h).map_err(InitError::io(format!("sethostname {h}")))?;
    }
    let rt =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(InitError::io("start the runtime"))?;
    rt.block_on(async move {
        reaper::start(false)?;
        // Bound before any guest process runs, so nothing else can take the port.
        if let Err(e) = crate::forward::start(lizard_agent_proto::routes::FORWARD_GUEST_ADDR) {
            eprintln!("lizard-agent: {e}");
        }
        let state = AppState { secret: Arc::new(RwLock::new(secret)), pid1: true };
        Ok(match transport {
            Transport::Serial => transport::serve_serial(state).await?,
            Transport::Vsock => transport::serve_vsock(state).await?,
        })
    })
}

/// Create `target` if needed and mount on it; "already mounted" counts as success.
fn mount_fs(source: &str, target: &str, fstype: &str, flags: MsFlags, data: Option<&str>) -> Result<(), InitError> {
    std::fs::create_dir_all(target).map_err(InitError::io(format!("mkdir {target}")))?;
    match mount(Some(source), target, Some(fstype), flags, data) {
        Ok(()) | Err(Errno::EBUSY) => Ok(()),
        Err(e) => Err(InitError::mount(format!("{fstype} on {target}"))(e)),
    }
}

/// Make fds 0–2 the console so that every message reaches the host's log.
fn attach_console() {
    let Ok(console) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/console") else { return };
    for fd in 0..3 {
        let _ = nix::unistd::dup2(console.as_raw_fd(), fd);
    }
}

fn load_modules(order: &Path) {
    // No list: a kernel with everything built in.
    let Ok(list) = std::fs::read_to_string(order) else { return };
    for path in list.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        if let Err(e) = load_module(Path::new(path)) {
            eprintln!("lizard-agent: module {path}: {e}");
        }
    }
}

fn load_module(path: &Path) -> io::Result<()> {
    let file = std::fs::File::open(path)?;
    let compressed = matches!(path.extension().and_then(|e| e.to_str()), Some("xz" | "zst" | "gz"));
    let flags = if compressed {
        ModuleInitFlags::from_bits_retain(MODULE_INIT_COMPRESSED_FILE)
    } else {
        ModuleInitFlags::empty()
    };
    match finit_module(&file, c"", flags) {
        Ok(()) | Err(Errno::EEXIST) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn wait_for_device(dev: &Path) -> Result<(), InitError> {
    let deadline = Instant::now() + ROOT_WAIT;
    while !dev.exists() {
        if Instant::now() >= deadline {
            return Err(InitError::NoRoot(dev.display().to_string()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

fn switch_root(dev: &Path) -> Result<(), InitError> {
    std::fs::create_dir_all(NEW_ROOT).map_err(InitError::io(format!("mkdir {NEW_ROOT}")))?;
    mount(Some(dev), NEW_ROOT, Some("ext4"), MsFlags::empty(), None::<&str>)
        .map_err(InitError::mount(format!("{} on {NEW_ROOT}", dev.display())))?;
    install_cli(Path::new(NEW_ROOT));
    for dir in ["/dev", "/proc", "/sys"] {
        let target = format!("{NEW_ROOT}{dir}");
        std::fs::create_dir_all(&target).map_err(InitError::io(format!("mkdir {target}")))?;
        mount(Some(dir), target.as_str(), None::<&str>, MsFlags::MS_MOVE, None::<&str>)
            .map_err(InitError::mount(format!("move {dir}")))?;
    }
    std::env::set_current_dir(NEW_ROOT).map_err(InitError::io(format!("chdir {NEW_ROOT}")))?;
    mount(Some("."), "/", None::<&str>, MsFlags::MS_MOVE, None::<&str>)
        .map_err(InitError::mount("move the new root to /"))?;
    nix::unistd::chroot(".").map_err(InitError::io("chroot"))?;
    std::env::set_current_dir("/").map_err(InitError::io("chdir /"))?;
    Ok(())
}

/// Copy the `lizard` CLI the initramfs carries (if any) into the root filesystem, so code
/// in the sandbox can use the API with the key it was given. Skipped when the root already
/// has the same file (a template's second boot); failures are logged, not fatal.
fn install_cli(new_root: &Path) {
    use lizard_agent_proto::{GUEST_CLI_INITRAMFS_PATH, GUEST_CLI_INSTALL_PATH};
    use std::os::unix::fs::PermissionsExt;
    let src = Path::new(GUEST_CLI_INITRAMFS_PATH);
    let Ok(meta) = std::fs::metadata(src) else { return };
    let dst = new_root.join(GUEST_CLI_INSTALL_PATH.trim_start_matches('/'));
    if std::fs::metadata(&dst).is_ok_and(|d| d.len() == meta.len())
        && std::fs::read(&dst).ok() == std::fs::read(src).ok()
    {
        return;
    }
    let tmp = dst.with_extension("lizard-tmp");
    let result = (|| {
        std::fs::create_dir_all(dst.parent().unwrap_or(new_root))?;
        std::fs::copy(src, &tmp)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
        std::fs::rename(&tmp, &dst)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        eprintln!("lizard-agent: install {GUEST_CLI_INSTALL_PATH}: {e}");
    }
}

/// Mounts and links that a normal userland expects; each is logged, none is fatal.
fn mount_late() {
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    let mounts: [(&str, &str, &str, MsFlags, &str); 5] = [
        (
            "devpts",
            "/dev/pts",
            "devpts",
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            "newinstance,ptmxmode=0666,gid=5,mode=620",
        ),
        ("shm", "/dev/shm", "tmpfs", nosuid_nodev, "mode=1777"),
        ("tmpfs", "/tmp", "tmpfs", nosuid_nodev, "mode=1777"),
        ("tmpfs", "/run", "tmpfs", nosuid_nodev, "mode=0755"),
        ("cgroup2", "/sys/fs/cgroup", "cgroup2", nosuid_nodev | MsFlags::MS_NOEXEC, ""),
    ];
    for (source, target, fstype, flags, data) in mounts {
        if let Err(e) = mount_fs(source, target, fstype, flags, Some(data)) {
            eprintln!("lizard-agent: {e}");
        }
    }
    // devtmpfs lacks the /proc-backed links (bash's `<(…)` needs /dev/fd).
    for (link, target) in [
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
    ] {
        if std::fs::symlink_metadata(link).is_err() {
            let _ = std::os::unix::fs::symlink(target, link);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> HashMap<String, String> {
        parse_cmdline(line)
    }

    #[test]
    fn reads_the_command_line() {
        assert_eq!(Boot::from_cmdline(&args("console=ttyS0 lizard.mode=probe")).unwrap(), Boot::Probe);
        let secret = Secret::generate();
        let boot =
            Boot::from_cmdline(&args(&format!("lizard.secret={} lizard.hostname=sbx-1", secret.to_hex()))).unwrap();
        assert_eq!(
            boot,
            Boot::Run {
                secret: secret.clone(),
                hostname: Some("sbx-1".into()),
                root: "/dev/vda".into(),
                transport: Transport::Serial
            }
        );
        let line = format!("lizard.secret={} lizard.transport=vsock lizard.root=/dev/vdb", secret.to_hex());
        let Boot::Run { root, transport, .. } = Boot::from_cmdline(&args(&line)).unwrap() else { panic!() };
        assert_eq!((root, transport), (PathBuf::from("/dev/vdb"), Transport::Vsock));
    }

    #[test]
    fn rejects_bad_command_lines() {
        assert!(matches!(Boot::from_cmdline(&args("quiet")), Err(InitError::Missing(_))));
        assert!(matches!(Boot::from_cmdline(&args("lizard.secret=zz")), Err(InitError::BadValue { .. })));
        let line = format!("lizard.secret={} lizard.transport=pigeon", Secret::generate().to_hex());
        assert!(matches!(Boot::from_cmdline(&args(&line)), Err(InitError::BadValue { .. })));
        assert!(matches!(Boot::from_cmdline(&args("lizard.mode=dance")), Err(InitError::BadValue { .. })));
    }
}
