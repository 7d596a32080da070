//! The QEMU `microvm` backend, driven through QMP.
//!
//! Guest memory is a file (`memory-backend-file`), mapped shared while the VM runs so a
//! snapshot only has to save device state (QMP `migrate` with `x-ignore-shared`: a few
//! milliseconds and ~60 KB), and mapped private copy-on-write when many clones restore
//! from one template snapshot. The agent channel is a virtio-serial port whose host end
//! is a Unix socket QEMU listens on; virtio-serial is migratable, vhost-user is not.

use crate::jail::{Jail, JailPolicy};
use crate::qmp::Qmp;
use crate::{
    Accel, Backend, DeltaSnapshot, DeltaStats, IoHalt, MemoryMapping, PendingVm, Result, Snapshot, Vm, VmConfig,
    VmExit, VmmError,
};
use serde_json::json;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long QEMU may take to create its QMP socket.
const QMP_DEADLINE: Duration = Duration::from_secs(10);
/// The name under which a migration's file descriptor is handed to QEMU.
const MIGRATION_FD: &str = "migration";
/// Upper bound for saving or loading device state.
const MIGRATION_DEADLINE: Duration = Duration::from_secs(60);

/// Boots VMs with `qemu-system-x86_64 -M microvm`.
#[derive(Debug, Clone)]
pub struct QemuBackend {
    binary: PathBuf,
    /// How each QEMU is confined; `None`: it runs as the node does (root), unconfined.
    jail: Option<Arc<JailPolicy>>,
    /// Why no QEMU may start at all (the host cannot confine them and running them
    /// unconfined was not allowed).
    refused: Option<String>,
    /// `binary --version`'s first line, asked once.
    version: Arc<std::sync::OnceLock<String>>,
}

impl Default for QemuBackend {
    fn default() -> Self {
        QemuBackend::with_binary("qemu-system-x86_64")
    }
}

impl QemuBackend {
    pub fn with_binary(binary: impl Into<PathBuf>) -> Self {
        QemuBackend { binary: binary.into(), jail: None, refused: None, version: Arc::default() }
    }

    /// Confine every QEMU this backend starts (boots, restores, pre-spawns alike) by `policy`.
    pub fn confined(mut self, policy: JailPolicy) -> Self {
        self.jail = Some(Arc::new(policy));
        self
    }

    /// Start no QEMU at all, because of `why` (what the host lacks to confine them): a
    /// node that cannot confine its VMMs runs none, pre-spawned and build VMs included.
    pub fn refusing(mut self, why: impl Into<String>) -> Self {
        self.refused = Some(why.into());
        self
    }

    /// Start QEMU; with `incoming` it waits for a migration stream instead of booting.
    async fn spawn(&self, config: &VmConfig, memory: Memory<'_>, incoming: bool) -> Result<QemuVm> {
        std::fs::create_dir_all(&config.run_dir)
            .map_err(|e| VmmError::io(format!("create {}", config.run_dir.display()), e))?;
        for sock in [config.agent_socket(), qmp_socket(config)] {
            let _ = std::fs::remove_file(sock);
        }
        if let Some(why) = &self.refused {
            return Err(VmmError::Unconfined(why.clone()));
        }
        let jail = match &self.jail {
            Some(policy) => Some(policy.enter(config, memory.copy_on_write_base(), memory.delta(), &self.binary)?),
            None => None,
        };
        let args = command_line(config, memory, incoming, self.jail.as_deref());
        tracing::debug!(id = %config.id, "qemu {}", args.join(" "));
        let mut cmd = tokio::process::Command::new(&self.binary);
        cmd.args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(config.run_dir.join("qemu.stderr"))
                    .map_err(|e| VmmError::io("create qemu.stderr", e))?,
            )
            // Own process group: a Ctrl-C aimed at the node must not kill VMs mid-write.
            .process_group(0)
            .kill_on_drop(true);
        // Held open until the child has been spawned.
        let netns = match &config.net {
            Some(net) => Some(
                std::fs::File::open(&net.netns)
                    .map_err(|e| VmmError::io(format!("open network namespace {}", net.netns.display()), e))?,
            ),
            None => None,
        };
        if let Some(ns) = &netns {
            crate::netns::enter_before_exec(&mut cmd, ns);
        }
        let jail = jail.map(|(jail, mut setup)| {
            // Opened by the child after it joined the namespace the TAP lives in.
            setup.tap = config.net.as_ref().and_then(|n| crate::jail::child::ifreq_name(&n.tap));
            cmd.envs(setup.preload.iter().flat_map(|p| p.env.iter().map(|(k, v)| (k, v))));
            // SAFETY: `apply` makes only system calls on data prepared before the fork
            // (see jail::child); it runs after the namespace change registered above.
            unsafe { cmd.pre_exec(move || setup.apply()) };
            jail
        });
        let mut child = match cmd.spawn() {
            Ok(child) => child,
            Err(source) => {
                if let Some(jail) = jail {
                    jail.release();
                }
                return Err(VmmError::Spawn { binary: self.binary.display().to_string(), cause: source });
            }
        };
        drop(netns);
        let pid = child.id().expect("a just-spawned child has a pid");
        let uid = jail.as_ref().map(Jail::uid);
        if let Some(jail) = &jail {
            tracing::debug!(id = %config.id, pid, uid = jail.uid(), cgroups = ?jail.cgroup_dirs(), "VMM confined");
        }
        std::fs::write(config.run_dir.join("vmm.pid"), pid.to_string())
            .map_err(|e| VmmError::io("write vmm.pid", e))?;

        let (tx, rx) = watch::channel(None);
        let running = Arc::new(AtomicBool::new(true));
        let r2 = running.clone();
        tokio::spawn(async move {
            let exit = match child.wait().await {
                Ok(st) => {
                    use std::os::unix::process::ExitStatusExt;
                    VmExit { code: st.code(), signal: st.signal() }
                }
                Err(_) => VmExit { code: None, signal: None },
            };
            r2.store(false, Ordering::SeqCst);
            // Before anyone hears of the exit: its uid and cgroups are free once it has.
            if let Some(jail) = jail {
                jail.release();
            }
            let _ = tx.send(Some(exit));
        });
        tokio::spawn(crate::console::cap(config.console_log(), running.clone()));

        let mut exited = rx.clone();
        let qmp_path = qmp_socket(config);
        let qmp = tokio::select! {
            q = Qmp::connect(&qmp_path, QMP_DEADLINE) => q.map_err(VmmError::from),
            _ = exited.wait_for(|e| e.is_some()) => {
                let stderr = crate::tail_of(&config.run_dir.join("qemu.stderr"), 2000);
                Err(VmmError::ExitedAtStart { stderr: stderr.trim().to_string() })
            }
        };
        let qmp = match qmp {
            Ok(q) => q,
            Err(e) => {
                // QEMU may still run with a control socket nobody answers: it must not
                // outlive the error.
                sigkill(pid);
                let _ = exited.wait_for(|e| e.is_some()).await;
                return Err(e);
            }
        };
        let memory_base = memory.copy_on_write_base().map(Path::to_path_buf);
        Ok(QemuVm { config: config.clone(), pid, qmp, exit: rx, running, memory_base, uid })
    }
}

fn sigkill(pid: u32) {
    // Pids are at most 2^22 on Linux (pid_max); one that does not fit is no process of ours.
    let Ok(pid) = i32::try_from(pid) else { return };
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
}

fn qmp_socket(config: &VmConfig) -> PathBuf {
    config.run_dir.join("qmp.sock")
}

/// Which file backs a VM's guest memory.
#[derive(Debug, Clone, Copy)]
pub enum Memory<'a> {
    /// The VM's own memory file, mapped shared.
    Own,
    /// A snapshot's memory file, mapped as given.
    Snapshot(&'a Path, MemoryMapping),
    /// A delta restore's base file, mapped copy-on-write, and the delta file that a confined
    /// QEMU maps over it ([`crate::delta`]); QEMU starts stopped (`-S`), so
    /// that the guest runs only once the delta is in, and loads device state saved without
    /// a configuration section (`xen-save-devices-state` writes none). Such a VM is saved
    /// by [`Vm::save_delta`] only: a migration stream it wrote would lack that section too,
    /// and only a `DeltaBase` QEMU could load it.
    DeltaBase(&'a Path, Option<std::os::fd::BorrowedFd<'a>>),
}

impl Memory<'_> {
    /// The file mapped private copy-on-write, if any.
    fn copy_on_write_base(&self) -> Option<&Path> {
        match self {
            Memory::Snapshot(path, MemoryMapping::CopyOnWrite) | Memory::DeltaBase(path, _) => Some(path),
            Memory::Own | Memory::Snapshot(_, MemoryMapping::Shared) => None,
        }
    }

    /// The delta file the VMM maps over its base, if any.
    fn delta(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        match self {
            Memory::DeltaBase(_, delta) => delta.map(|d| d.as_raw_fd()),
            _ => None,
        }
    }
}

/// The QEMU command line for `config`; with `incoming`, QEMU waits for a migration stream.
/// `jail`: QEMU runs jailed by this policy ([`crate::jail`]): its seccomp filter on, its
/// TAP device opened for it (it has no right to open one by name), its disks' I/O limited.
pub fn command_line(config: &VmConfig, memory: Memory<'_>, incoming: bool, jail: Option<&JailPolicy>) -> Vec<String> {
    let confined = jail.is_some();
    let throttle = jail.map_or(String::new(), |j| disk_throttle(j.disk_io));
    let (mem_path, share) = match memory {
        Memory::Own => (config.memory_file(), true),
        Memory::Snapshot(path, MemoryMapping::Shared) => (path.to_path_buf(), true),
        Memory::Snapshot(path, MemoryMapping::CopyOnWrite) | Memory::DeltaBase(path, _) => (path.to_path_buf(), false),
    };
    let accel = match config.accel {
        Accel::Kvm => "kvm".to_string(),
        Accel::Tcg => format!("tcg,tb-size={}", tcg_cache_mib(jail)),
    };
    let cpu = match config.accel {
        Accel::Kvm => "host",
        Accel::Tcg => "max",
    };
    let mut a: Vec<String> = vec![];
    let mut push = |xs: &[&str]| a.extend(xs.iter().map(|s| s.to_string()));
    push(&["-name", &format!("lizard-{}", config.id)]);
    // Under TCG there is no kvmclock: without a PIT the guest finds no clock to calibrate
    // its TSC against and hangs at boot. Under KVM, kvmclock makes the legacy PIT/PIC
    // dead weight.
    let legacy = match config.accel {
        Accel::Kvm => "pit=off,pic=off",
        Accel::Tcg => "pit=on,pic=on",
    };
    push(&["-M", &format!("microvm,{legacy},rtc=on,x-option-roms=off,memory-backend=mem")]);
    push(&["-accel", &accel, "-cpu", cpu]);
    push(&["-smp", &config.vcpus.to_string(), "-m", &format!("{}M", config.memory_mib)]);
    push(&[
        "-object",
        &format!(
            "memory-backend-file,id=mem,size={}M,mem-path={},share={}",
            config.memory_mib,
            mem_path.display(),
            if share { "on" } else { "off" }
        ),
    ]);
    push(&["-nodefaults", "-no-user-config", "-nographic", "-no-reboot"]);
    // qboot, the minimal firmware that loads `-kernel` itself: QEMU ≥ 8 gives microvm
    // SeaBIOS by default, which without option ROMs looks for a boot disk instead.
    push(&["-bios", "qboot.rom"]);
    push(&["-kernel", &config.kernel.display().to_string()]);
    push(&["-initrd", &config.initramfs.display().to_string()]);
    push(&["-append", &kernel_cmdline(config)]);
    // Appended to, so that the node can cut it short while QEMU writes (crate::console).
    push(&["-chardev", &format!("file,id=console,path={},append=on", config.console_log().display())]);
    push(&["-serial", "chardev:console"]);
    push(&["-device", "virtio-serial-device,max_ports=2"]);
    push(&["-chardev", &format!("socket,id=agent,path={},server=on,wait=off", config.agent_socket().display())]);
    push(&["-device", &format!("virtserialport,chardev=agent,name={}", lizard_agent_proto::SERIAL_PORT_NAME)]);
    for (i, disk) in std::iter::once(&config.root_disk).chain(&config.extra_disks).enumerate() {
        let format = if disk.extension().is_some_and(|e| e == "qcow2") { "qcow2" } else { "raw" };
        push(&[
            "-drive",
            &format!(
                "id=disk{i},file={},format={format},if=none,cache=writeback,discard=unmap{throttle}",
                disk.display()
            ),
        ]);
        push(&["-device", &format!("virtio-blk-device,drive=disk{i}")]);
    }
    push(&["-object", "rng-random,id=rng,filename=/dev/urandom", "-device", "virtio-rng-device,rng=rng"]);
    if let Some(net) = &config.net {
        if confined {
            push(&["-netdev", &format!("tap,id=net0,fd={}", crate::jail::child::TAP_FD)]);
        } else {
            push(&["-netdev", &format!("tap,id=net0,ifname={},script=no,downscript=no", net.tap)]);
        }
        push(&["-device", &format!("virtio-net-device,netdev=net0,mac={}", net.mac)]);
    }
    if let Some(secret) = &config.secret_file {
        push(&["-fw_cfg", &format!("name={},file={}", lizard_agent_proto::FW_CFG_SECRET, secret.display())]);
    }
    push(&["-qmp", &format!("unix:{},server=on,wait=off", qmp_socket(config).display())]);
    if incoming {
        push(&["-incoming", "defer"]);
    }
    if let Memory::DeltaBase(..) = memory {
        push(&["-S", "-global", "migration.send-configuration=off"]);
    }
    if confined {
        // Seccomp: no obsolete system calls, no setuid/setgid, no fork/exec, no changes
        // to scheduling or CPU affinity.
        push(&["-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"]);
    }
    a
}

/// TCG's translation cache, in MiB. QEMU 7.2's default is 1 GiB, which it fills before it
/// flushes anything: a guest that has run a lot of code makes its VMM outgrow the memory its
/// cgroup allows beyond the guest (three VMMs were killed at guest + 512 MiB in one bench
/// run). 256 MiB is eight times QEMU 4's default; a confined VMM's cache takes at most half
/// of its memory overhead, leaving the rest to QEMU's own heap.
const TCG_CACHE_MIB: u32 = 256;
/// The smallest cache given (QEMU 4's default).
const MIN_TCG_CACHE_MIB: u32 = 32;

fn tcg_cache_mib(jail: Option<&JailPolicy>) -> u32 {
    jail.map_or(TCG_CACHE_MIB, |j| (j.memory_overhead_mib / 2).clamp(MIN_TCG_CACHE_MIB, TCG_CACHE_MIB))
}

/// `-drive` options that hold one disk to `io` (nothing for a limit of 0).
fn disk_throttle(io: crate::jail::DiskIo) -> String {
    let mut opts = String::new();
    if io.bytes_per_second > 0 {
        opts.push_str(&format!(",throttling.bps-total={}", io.bytes_per_second));
    }
    if io.ops_per_second > 0 {
        opts.push_str(&format!(",throttling.iops-total={}", io.ops_per_second));
    }
    opts
}

/// The guest kernel's command line, plus what the accelerator needs.
///
/// Under TCG the guest has no kvmclock and no HPET, so it calibrates its TSC against the
/// PIT; on a loaded host that calibration fails and the boot can hang for good ("Marking
/// TSC unstable"). TCG's TSC runs at the host's TSC rate, so the guest is told that rate
/// instead of measuring it.
fn kernel_cmdline(config: &VmConfig) -> String {
    match (config.accel, host_tsc_khz()) {
        (Accel::Tcg, Some(khz)) => format!("{} tsc_early_khz={khz} tsc=reliable", config.cmdline),
        _ => config.cmdline.clone(),
    }
}

/// The host's TSC frequency in kHz, from /proc/cpuinfo (read once).
fn host_tsc_khz() -> Option<u64> {
    static KHZ: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *KHZ.get_or_init(|| {
        let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
        parse_cpu_mhz(&info)
    })
}

fn parse_cpu_mhz(cpuinfo: &str) -> Option<u64> {
    let line = cpuinfo.lines().find(|l| l.starts_with("cpu MHz"))?;
    let mhz: f64 = line.split(':').nth(1)?.trim().parse().ok()?;
    if !(mhz.is_finite() && mhz > 0.0) {
        return None;
    }
    // Positive and finite (checked just above), and a CPU clock is far below u64::MAX
    // kHz; a float-to-int cast saturates in any case, it never wraps.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let khz = (mhz * 1000.0).round() as u64;
    Some(khz)
}

#[async_trait::async_trait]
impl Backend for QemuBackend {
    fn name(&self) -> &'static str {
        "qemu"
    }

    fn version(&self) -> String {
        self.version
            .get_or_init(|| match std::process::Command::new(&self.binary).arg("--version").output() {
                Ok(out) if out.status.success() => {
                    String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or_default().trim().to_string()
                }
                failed => {
                    let why = failed.map_or_else(|e| e.to_string(), |out| out.status.to_string());
                    tracing::warn!(binary = %self.binary.display(), "the VMM did not tell its version: {why}");
                    String::new()
                }
            })
            .clone()
    }

    async fn boot(&self, config: &VmConfig) -> Result<Box<dyn Vm>> {
        Ok(Box::new(self.spawn(config, Memory::Own, false).await?))
    }

    async fn spawn_for_restore(
        &self,
        config: &VmConfig,
        memory: &Path,
        mapping: MemoryMapping,
    ) -> Result<Box<dyn PendingVm>> {
        Ok(Box::new(Incoming(self.spawn(config, Memory::Snapshot(memory, mapping), true).await?)))
    }

    async fn load(&self, config: &VmConfig, state: &Path) -> Result<Box<dyn Vm>> {
        let memory = config.memory_file();
        match std::fs::remove_file(&memory) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(VmmError::io(format!("remove {}", memory.display()), e))
            }
            _ => {}
        }
        let vm = self.spawn(config, Memory::Own, true).await?;
        vm.incoming(state, false).await?;
        Ok(Box::new(vm))
    }

    async fn restore_delta(&self, config: &VmConfig, saved: &DeltaSnapshot) -> Result<Box<dyn Vm>> {
        let t = std::time::Instant::now();
        let len = memory_bytes(config);
        // Opened once: a confined VMM maps the delta's pages from this descriptor, and the
        // check below reads the same file.
        let open = |e| crate::delta::DeltaError::Io { context: format!("open {}", saved.delta.display()), cause: e };
        let file = std::fs::File::open(&saved.delta).map_err(open)?;
        let checked = file.try_clone().map_err(open)?;
        // The delta is read and checked while QEMU starts: a damaged one never runs.
        let name = saved.delta.clone();
        let loading = tokio::task::spawn_blocking(move || crate::delta::load_from(&checked, &name, len));
        // Only a confined VMM loads the library that maps it; any other gets it written.
        let mapped_by_vmm = self.jail.is_some().then(|| file.as_fd());
        let spawned = self.spawn(config, Memory::DeltaBase(&saved.base, mapped_by_vmm), true).await;
        let loaded = loading.await.expect("delta load task panicked");
        let vm = spawned?;
        let ready = t.elapsed();
        let (pid, base) = (vm.pid, saved.base.clone());
        let applied = match loaded {
            Ok(delta) => tokio::task::spawn_blocking(move || {
                let layout = crate::delta::layout(pid, &base, len)?;
                let mapped = delta.mapped_in(&layout)?;
                let written = crate::delta::write_into(pid, layout.mapping, &delta, Some(&mapped))?;
                Ok((delta.pages(), written))
            })
            .await
            .expect("delta write task panicked"),
            Err(e) => Err(e),
        };
        drop(file);
        match applied {
            Ok((pages, written)) => {
                tracing::debug!(id = %config.id, pages, written, ?ready, applied = ?t.elapsed(), "delta applied");
            }
            Err(e) => {
                // Part of the delta may be in guest memory: this guest must never run.
                let _ = vm.kill().await;
                return Err(e.into());
            }
        }
        vm.incoming(&saved.devices, false).await?;
        tracing::debug!(id = %config.id, running = ?t.elapsed(), "delta restored");
        Ok(Box::new(vm))
    }

    async fn adopt(&self, config: &VmConfig, pid: u32) -> Result<Box<dyn Vm>> {
        let exit_watch =
            crate::exit_watch::ExitWatch::open(pid).map_err(|e| VmmError::io(format!("watch VMM pid {pid}"), e))?;
        // A confining node takes back only VMMs confined by its policy.
        let uid =
            match &self.jail {
                Some(policy) => Some(policy.uid_of(pid).ok_or_else(|| {
                    VmmError::Unconfined(format!("VMM pid {pid} runs as no uid of this node's range"))
                })?),
                None => None,
            };
        let args = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map_err(|e| VmmError::io(format!("read the command line of pid {pid}"), e))?;
        let args: Vec<String> = args.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let memory_base = copy_on_write_base_of(&args);
        let qmp = Qmp::connect(&qmp_socket(config), QMP_DEADLINE).await?;
        qmp.recheck_io_halt().await?;
        let (tx, rx) = watch::channel(None);
        let running = Arc::new(AtomicBool::new(true));
        let r2 = running.clone();
        let (jail, jailed) = (self.jail.clone(), config.clone());
        tokio::spawn(async move {
            let exit = exit_watch.ended().await;
            r2.store(false, Ordering::SeqCst);
            if let (Some(policy), Some(uid)) = (jail, uid) {
                policy.release_taken_back(&jailed, uid);
            }
            let _ = tx.send(Some(exit));
        });
        tokio::spawn(crate::console::cap(config.console_log(), running.clone()));
        Ok(Box::new(QemuVm { config: config.clone(), pid, qmp, exit: rx, running, memory_base, uid }))
    }
}

/// The file guest memory is a private copy-on-write mapping of, read from a QEMU command
/// line ([`command_line`]'s `memory-backend-file`, `share=off`).
fn copy_on_write_base_of(args: &[String]) -> Option<PathBuf> {
    let backend = args.iter().find(|a| a.starts_with("memory-backend-file,"))?;
    let mut path = None;
    let mut shared = true;
    for option in backend.split(',') {
        match option.split_once('=') {
            Some(("mem-path", p)) => path = Some(PathBuf::from(p)),
            Some(("share", s)) => shared = s == "on",
            _ => {}
        }
    }
    if shared {
        None
    } else {
        path
    }
}

/// Guest memory size in bytes.
fn memory_bytes(config: &VmConfig) -> u64 {
    u64::from(config.memory_mib) << 20
}

/// A `qemu-system-x86_64 -incoming defer` process waiting for a snapshot's device state.
struct Incoming(QemuVm);

#[async_trait::async_trait]
impl PendingVm for Incoming {
    fn config(&self) -> &VmConfig {
        &self.0.config
    }

    fn pid(&self) -> u32 {
        self.0.pid
    }

    async fn restore(self: Box<Self>, vmstate: &Path) -> Result<Box<dyn Vm>> {
        // The shared memory file (if any) holds RAM: the stream carries device state only.
        self.0.incoming(vmstate, true).await?;
        Ok(Box::new(self.0))
    }

    async fn kill(&self) -> Result<VmExit> {
        Vm::kill(&self.0).await
    }
}

/// A running `qemu-system-x86_64` process.
pub struct QemuVm {
    config: VmConfig,
    pid: u32,
    qmp: Qmp,
    exit: watch::Receiver<Option<VmExit>>,
    running: Arc<AtomicBool>,
    /// The file guest memory is a private copy-on-write mapping of, if it is one.
    memory_base: Option<PathBuf>,
    /// The VMM's own uid when it is confined: files it must write later are handed to it.
    uid: Option<u32>,
}

impl QemuVm {
    fn exited(&self) -> Option<VmExit> {
        self.exit.borrow().clone()
    }

    /// Load the saved VM in `state` into this `-incoming defer` process and run it; on
    /// failure the process is killed. `ignore_shared`: the stream carries no RAM of shared
    /// memory backends (it is in their files).
    async fn incoming(&self, state: &Path, ignore_shared: bool) -> Result<()> {
        let result: Result<()> = async {
            self.qmp.set_ignore_shared(ignore_shared).await?;
            let file = std::fs::File::open(state).map_err(|e| VmmError::io(format!("open {}", state.display()), e))?;
            self.qmp.send_fd(MIGRATION_FD, file.as_fd()).await?;
            drop(file);
            self.qmp.execute("migrate-incoming", json!({ "uri": format!("fd:{MIGRATION_FD}") })).await?;
            self.qmp.wait_migration(MIGRATION_DEADLINE).await?;
            self.qmp.execute("cont", json!({})).await?;
            Ok(())
        }
        .await;
        if result.is_err() {
            let _ = self.kill().await;
        }
        result
    }

    /// Save to `state` by migration; `ignore_shared` as for [`QemuVm::incoming`].
    async fn save(&self, state: &Path, ignore_shared: bool) -> Result<()> {
        self.qmp.set_ignore_shared(ignore_shared).await?;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(state)
            .map_err(|e| VmmError::io(format!("create {}", state.display()), e))?;
        self.qmp.send_fd(MIGRATION_FD, file.as_fd()).await?;
        drop(file);
        self.qmp.execute("migrate", json!({ "uri": format!("fd:{MIGRATION_FD}") })).await?;
        self.qmp.wait_migration(MIGRATION_DEADLINE).await
    }
}

#[async_trait::async_trait]
impl Vm for QemuVm {
    fn config(&self) -> &VmConfig {
        &self.config
    }

    fn pid(&self) -> u32 {
        self.pid
    }

    async fn pause(&self) -> Result<()> {
        self.qmp.execute("stop", json!({})).await?;
        Ok(())
    }

    async fn resume(&self) -> Result<()> {
        self.qmp.execute("cont", json!({})).await?;
        Ok(())
    }

    async fn snapshot(&self, snapshot: &Snapshot) -> Result<()> {
        if snapshot.memory != self.config.memory_file() {
            return Err(VmmError::ForeignMemoryFile);
        }
        self.save(&snapshot.vmstate, true).await
    }

    async fn save_all(&self, state: &Path) -> Result<()> {
        self.save(state, false).await
    }

    fn memory_base(&self) -> Option<&Path> {
        self.memory_base.as_deref()
    }

    async fn save_delta(&self, delta: &Path, devices: &Path) -> Result<DeltaStats> {
        let base = self.memory_base.clone().ok_or(VmmError::NotCopyOnWrite)?;
        let devices_arg = devices.to_str().ok_or_else(|| VmmError::NonUtf8Path(devices.to_path_buf()))?;
        // QEMU writes this file itself: a confined one may not create files outside its
        // run directory, so the file is made for it (and given back to root after).
        if let Some(uid) = self.uid {
            std::fs::File::create(devices).map_err(|e| VmmError::io(format!("create {}", devices.display()), e))?;
            std::os::unix::fs::chown(devices, Some(uid), Some(uid))
                .map_err(|e| VmmError::io(format!("give {} to the VMM", devices.display()), e))?;
        }
        // Device state only: the RAM block is skipped whatever its mapping.
        let t = std::time::Instant::now();
        let saved = self.qmp.execute("xen-save-devices-state", json!({ "filename": devices_arg, "live": false })).await;
        if self.uid.is_some() {
            let _ = std::os::unix::fs::chown(devices, Some(0), Some(0));
        }
        saved?;
        tracing::debug!(id = %self.config.id, took = ?t.elapsed(), "device state saved");
        let (pid, delta, len) = (self.pid, delta.to_path_buf(), memory_bytes(&self.config));
        let t = std::time::Instant::now();
        let stats = tokio::task::spawn_blocking(move || {
            let layout = crate::delta::layout(pid, &base, len)?;
            let pages = crate::delta::dirty_pages(pid, &layout)?;
            crate::delta::save(pid, layout.mapping, &pages, &delta)
        })
        .await
        .expect("delta save task panicked")?;
        tracing::debug!(id = %self.config.id, pages = stats.pages, took = ?t.elapsed(), "delta saved");
        Ok(stats)
    }

    async fn freeze_disk(&self, new_top: &Path) -> Result<()> {
        let file = new_top.to_str().ok_or_else(|| VmmError::NonUtf8Path(new_top.to_path_buf()))?;
        if let Some(uid) = self.uid {
            std::os::unix::fs::chown(new_top, Some(uid), Some(uid))
                .map_err(|e| VmmError::io(format!("give {} to the VMM", new_top.display()), e))?;
        }
        // `existing`: the caller made the overlay, naming the backing file it wants in its
        // header (QEMU would name the path it opened the disk by).
        let args = json!({ "device": "disk0", "snapshot-file": file, "format": "qcow2", "mode": "existing" });
        self.qmp.execute("blockdev-snapshot-sync", args).await?;
        Ok(())
    }

    async fn grow_root_disk(&self, size: u64) -> Result<()> {
        self.qmp.execute("block_resize", json!({ "device": "disk0", "size": size })).await?;
        Ok(())
    }

    async fn refresh_disk_size(&self, index: usize) -> Result<u64> {
        let disk = self.config.extra_disks.get(index).ok_or(VmmError::NoSuchDisk(index))?;
        let size = std::fs::metadata(disk).map_err(|e| VmmError::io(format!("stat {}", disk.display()), e))?.len();
        // Resizing to the file's own size changes nothing on the host; QEMU's resize
        // callback still raises virtio-blk's config-change interrupt, and the guest
        // re-reads the capacity.
        self.qmp.execute("block_resize", json!({ "device": format!("disk{}", index + 1), "size": size })).await?;
        Ok(size)
    }

    async fn kill(&self) -> Result<VmExit> {
        if let Some(exit) = self.exited() {
            return Ok(exit);
        }
        // SIGKILL: nothing in the guest needs a clean shutdown (its disks are discarded or
        // were synced by the agent first), and it cannot be ignored or delayed.
        sigkill(self.pid);
        match tokio::time::timeout(Duration::from_secs(10), self.wait()).await {
            Ok(exit) => Ok(exit),
            Err(_) => Err(VmmError::Timeout("killing the VMM")),
        }
    }

    fn io_halt(&self) -> watch::Receiver<Option<IoHalt>> {
        self.qmp.io_halt()
    }

    async fn wait(&self) -> VmExit {
        let mut rx = self.exit.clone();
        let exit = rx.wait_for(|e| e.is_some()).await.map(|e| e.clone());
        exit.ok().flatten().unwrap_or(VmExit { code: None, signal: None })
    }

    fn is_running(&self) -> bool {
        self.running.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_the_first_line_of_version_and_empty_when_it_cannot_be_asked() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("qemu");
        std::fs::write(&fake, "#!/bin/sh\necho 'QEMU emulator version 10.0.2 (Debian)'\necho 'Copyright'\n").unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(QemuBackend::with_binary(&fake).version(), "QEMU emulator version 10.0.2 (Debian)");
        assert_eq!(QemuBackend::with_binary(dir.path().join("missing")).version(), "");
    }

    fn config() -> VmConfig {
        VmConfig {
            id: "sbx1".into(),
            vcpus: 2,
            memory_mib: 512,
            kernel: "/k/vmlinux".into(),
            initramfs: "/k/initrd".into(),
            cmdline: "console=ttyS0".into(),
            root_disk: "/r/root.qcow2".into(),
            extra_disks: vec!["/v/vol.ext4".into()],
            secret_file: Some("/run/sbx1/secret".into()),
            run_dir: "/run/sbx1".into(),
            accel: Accel::Tcg,
            net: None,
        }
    }

    #[test]
    fn a_nic_is_a_tap_in_the_namespace() {
        let mut c = config();
        assert!(!command_line(&c, Memory::Own, false, None).join(" ").contains("-netdev"));
        c.net = Some(crate::NetAttachment {
            netns: "/run/netns/x".into(),
            tap: "tap0".into(),
            mac: "02:00:00:00:00:02".into(),
        });
        let a = command_line(&c, Memory::Own, false, None).join(" ");
        assert!(a.contains("-netdev tap,id=net0,ifname=tap0,script=no,downscript=no"), "{a}");
        assert!(a.contains("-device virtio-net-device,netdev=net0,mac=02:00:00:00:00:02"), "{a}");
        assert!(!a.contains("-sandbox"), "{a}");
    }

    /// A jail policy (never entered: only its command-line part is read).
    fn policy() -> JailPolicy {
        let cgroups = crate::jail::CgroupTree::V2 { parent: "/sys/fs/cgroup/lizard".into() };
        JailPolicy::new(crate::jail::UidRange { first: 1000, count: 10 }, "/run/claims".into(), cgroups, 1 << 30)
    }

    #[test]
    fn a_confined_qemu_gets_seccomp_and_its_tap_as_a_descriptor() {
        let mut c = config();
        c.net = Some(crate::NetAttachment {
            netns: "/run/netns/x".into(),
            tap: "tap0".into(),
            mac: "02:00:00:00:00:02".into(),
        });
        let a = command_line(&c, Memory::Own, false, Some(&policy())).join(" ");
        assert!(a.contains("-netdev tap,id=net0,fd=100 "), "{a}");
        assert!(!a.contains("ifname="), "{a}");
        assert!(a.contains("-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"), "{a}");
        assert!(a.contains("console.log,append=on"), "{a}");
        let (bps, iops) = (crate::jail::DEFAULT_DISK_IO.bytes_per_second, crate::jail::DEFAULT_DISK_IO.ops_per_second);
        let limits = format!("discard=unmap,throttling.bps-total={bps},throttling.iops-total={iops} ");
        assert_eq!(a.matches(&limits).count(), 2, "each disk is held to the policy's limits: {a}");
        let mut unlimited = policy();
        unlimited.disk_io = crate::jail::DiskIo { bytes_per_second: 0, ops_per_second: 0 };
        assert!(!command_line(&c, Memory::Own, false, Some(&unlimited)).join(" ").contains("throttling"));
        assert!(!command_line(&c, Memory::Own, false, None).join(" ").contains("throttling"), "unconfined: none");
    }

    #[test]
    fn cold_boot_maps_own_memory_shared() {
        let a = command_line(&config(), Memory::Own, false, None).join(" ");
        assert!(a.contains("mem-path=/run/sbx1/memory,share=on"), "{a}");
        assert!(a.contains("-smp 2 -m 512M"));
        assert!(a.contains("file=/r/root.qcow2,format=qcow2"));
        assert!(a.contains("file=/v/vol.ext4,format=raw"));
        assert!(a.contains("name=lizard.agent"));
        assert!(a.contains("-fw_cfg name=opt/lizard/secret,file=/run/sbx1/secret"));
        assert!(!a.contains("-incoming"));
        assert!(a.contains("-accel tcg,tb-size=256 "), "{a}");
    }

    #[test]
    fn a_confined_vmms_translation_cache_fits_its_memory_overhead() {
        let c = config();
        let mut policy = policy();
        let accel = |p: &JailPolicy| command_line(&c, Memory::Own, false, Some(p)).join(" ");
        assert!(accel(&policy).contains("-accel tcg,tb-size=256 "), "{}", accel(&policy));
        policy.memory_overhead_mib = 200;
        assert!(accel(&policy).contains("-accel tcg,tb-size=100 "), "{}", accel(&policy));
        policy.memory_overhead_mib = 16;
        assert!(accel(&policy).contains("-accel tcg,tb-size=32 "), "{}", accel(&policy));
        let kvm = VmConfig { accel: Accel::Kvm, ..c.clone() };
        assert!(command_line(&kvm, Memory::Own, false, Some(&policy)).join(" ").contains("-accel kvm "));
    }

    #[test]
    fn clone_maps_snapshot_memory_private() {
        let a =
            command_line(&config(), Memory::Snapshot(Path::new("/t/memory"), MemoryMapping::CopyOnWrite), true, None)
                .join(" ");
        assert!(a.contains("mem-path=/t/memory,share=off"), "{a}");
        assert!(a.ends_with("-incoming defer"));
    }

    #[test]
    fn a_delta_restore_starts_stopped_over_its_base() {
        let a = command_line(&config(), Memory::DeltaBase(Path::new("/s/base-memory"), None), true, None).join(" ");
        assert!(a.contains("mem-path=/s/base-memory,share=off"), "{a}");
        assert!(a.ends_with("-incoming defer -S -global migration.send-configuration=off"), "{a}");
        assert_eq!(Memory::DeltaBase(Path::new("/b"), None).copy_on_write_base(), Some(Path::new("/b")));
        assert_eq!(Memory::Own.copy_on_write_base(), None);
    }

    #[test]
    fn an_adopted_vm_finds_its_copy_on_write_base_in_its_command_line() {
        let clone = command_line(
            &config(),
            Memory::Snapshot(Path::new("/t/memory"), MemoryMapping::CopyOnWrite),
            true,
            Some(&policy()),
        );
        assert_eq!(copy_on_write_base_of(&clone), Some(PathBuf::from("/t/memory")));
        let delta = command_line(&config(), Memory::DeltaBase(Path::new("/s/base-memory"), None), true, None);
        assert_eq!(copy_on_write_base_of(&delta), Some(PathBuf::from("/s/base-memory")));
        assert_eq!(copy_on_write_base_of(&command_line(&config(), Memory::Own, false, None)), None);
        assert_eq!(copy_on_write_base_of(&["qemu".to_string()]), None);
    }

    #[test]
    fn tcg_guests_are_told_the_tsc_rate() {
        assert_eq!(parse_cpu_mhz("processor\t: 0\ncpu MHz\t\t: 2596.128\n"), Some(2_596_128));
        assert_eq!(parse_cpu_mhz("no such line"), None);
        let mut c = config();
        c.accel = Accel::Kvm;
        assert_eq!(kernel_cmdline(&c), "console=ttyS0");
    }
}
