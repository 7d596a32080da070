//! The shape of a VM ([`VmConfig`]) and its kernel command line: the one place that says
//! what devices and files a sandbox's VM, a template VM and the accelerator probe get.

use super::run_dir::{PLACEHOLDER_DISK, ROOT_DISK, SECRET, STAGING_DISK};
use crate::assets::BootFiles;
use lizard_vmm::{Accel, NetAttachment, VmConfig};
use std::path::PathBuf;

/// Kernel arguments common to every guest. `quiet` keeps the serial console (slow under
/// TCG) nearly silent; `panic=-1` + `reboot=k` + QEMU's `-no-reboot` turn a guest panic
/// into a VMM exit the node notices; the i8042 flags skip probing a controller microvm
/// does not have.
const BASE_CMDLINE: &str =
    "console=ttyS0 quiet loglevel=3 panic=-1 reboot=k i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd random.trust_cpu=on";

/// The guest's command line. The secret is not on it: it travels in a file (see
/// [`super::run_dir::write_secret`]), since a VMM's arguments are readable by every host
/// user.
pub(crate) fn cmdline(id: &str) -> String {
    use lizard_agent_proto::cmdline as k;
    format!("{BASE_CMDLINE} {}={id} {}=/dev/vda", k::HOSTNAME, k::ROOT)
}

/// What every VM of one shape shares: CPUs, memory, kernel, initramfs, accelerator.
#[derive(Debug, Clone)]
pub(crate) struct Machine {
    pub vcpus: u32,
    pub memory_mib: u32,
    pub kernel: PathBuf,
    pub initramfs: PathBuf,
    pub accel: Accel,
}

impl Machine {
    pub fn new(boot: &BootFiles, vcpus: u32, memory_mib: u32, accel: Accel) -> Machine {
        Machine {
            vcpus,
            memory_mib,
            kernel: boot.kernel.vmlinux.clone(),
            initramfs: boot.initramfs.path.clone(),
            accel,
        }
    }

    /// The machine `config` runs on (a fork's copies run on their source's).
    pub fn of(config: &VmConfig) -> Machine {
        Machine {
            vcpus: config.vcpus,
            memory_mib: config.memory_mib,
            kernel: config.kernel.clone(),
            initramfs: config.initramfs.clone(),
            accel: config.accel,
        }
    }
}

/// The VM `id` in `run_dir`: a root overlay, always a second disk (the volume, or an
/// empty placeholder, so that every VM — template VMs included — has the same devices and
/// a template snapshot restores into any of them), always the staging disk of file
/// transfers as the third, the secret file, and the NIC if any.
pub(crate) fn sandbox_vm(
    id: &str,
    run_dir: PathBuf,
    machine: &Machine,
    volume: Option<PathBuf>,
    net: Option<NetAttachment>,
) -> VmConfig {
    VmConfig {
        id: id.to_string(),
        vcpus: machine.vcpus,
        memory_mib: machine.memory_mib,
        kernel: machine.kernel.clone(),
        initramfs: machine.initramfs.clone(),
        cmdline: cmdline(id),
        root_disk: run_dir.join(ROOT_DISK),
        extra_disks: vec![volume.unwrap_or_else(|| run_dir.join(PLACEHOLDER_DISK)), run_dir.join(STAGING_DISK)],
        secret_file: Some(run_dir.join(SECRET)),
        run_dir,
        accel: machine.accel,
        net,
    }
}

/// The accelerator probe's VM: the real kernel and initramfs with the agent in probe mode
/// (it prints a line and powers off), no disks, no secret.
pub(crate) fn probe_vm(boot: &BootFiles, run_dir: PathBuf) -> VmConfig {
    VmConfig {
        id: "accel-probe".into(),
        vcpus: 1,
        memory_mib: 128,
        kernel: boot.kernel.vmlinux.clone(),
        initramfs: boot.initramfs.path.clone(),
        cmdline: format!("{BASE_CMDLINE} {}=probe", lizard_agent_proto::cmdline::MODE),
        root_disk: PathBuf::from("/dev/null"),
        extra_disks: vec![],
        secret_file: None,
        run_dir,
        accel: Accel::Kvm,
        net: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdline_carries_identity_but_not_the_secret() {
        let c = cmdline("abc");
        assert!(c.contains("lizard.hostname=abc"));
        assert!(!c.contains("lizard.secret"));
    }

    #[test]
    fn every_sandbox_vm_has_the_volume_slot_and_a_secret_file() {
        let machine =
            Machine { vcpus: 2, memory_mib: 256, kernel: "/k".into(), initramfs: "/i".into(), accel: Accel::Tcg };
        let c = sandbox_vm("s1", "/run/s1".into(), &machine, None, None);
        assert_eq!(
            c.extra_disks,
            vec![PathBuf::from("/run/s1").join(PLACEHOLDER_DISK), PathBuf::from("/run/s1").join(STAGING_DISK)]
        );
        assert_eq!(c.root_disk, PathBuf::from("/run/s1/root.qcow2"));
        assert_eq!(c.secret_file, Some(PathBuf::from("/run/s1/secret")));
        let v = sandbox_vm("s2", "/run/s2".into(), &Machine::of(&c), Some("/v/x.img".into()), None);
        assert_eq!(
            (v.vcpus, v.memory_mib, v.extra_disks),
            (2, 256, vec![PathBuf::from("/v/x.img"), PathBuf::from("/run/s2").join(STAGING_DISK)])
        );
    }
}
