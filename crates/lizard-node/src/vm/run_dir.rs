//! A VM's run directory (`<data>/sandboxes/<id>/`, or a template VM's build directory):
//! the names of the files in it, making it ready for a VMM, and finding the VMM an
//! earlier node process left running in it.

use crate::{NodeError, Result};
use lizard_agent_proto::handshake::Secret;
use lizard_vmm::VmConfig;
use std::path::Path;

/// The writable root disk overlay.
pub(crate) const ROOT_DISK: &str = "root.qcow2";
/// The agent's secret, for the VMM to hand to the guest (mode 0600).
pub(crate) const SECRET: &str = "secret";
/// The empty disk that stands in for a volume.
pub(crate) const PLACEHOLDER_DISK: &str = "no-volume.img";
/// The staging disk of fast file transfers (`lizard_agent_proto::staging`).
pub(crate) const STAGING_DISK: &str = "staging.img";
/// Device state of a paused VM whose memory is its own file.
pub(crate) const VMSTATE: &str = "vmstate";
/// Full save (device state and memory) of a paused template clone.
pub(crate) const FULL_STATE: &str = "state";
/// The VMM's pid, written by the backend.
const VMM_PID: &str = "vmm.pid";

/// The run directory with its secret file in it, the empty placeholder disk when the
/// VM has no volume, and the staging disk.
pub(crate) fn prepare(config: &VmConfig, secret: &Secret) -> Result<()> {
    std::fs::create_dir_all(&config.run_dir).map_err(|e| NodeError::io("create sandbox dir", e))?;
    for disk in config.extra_disks.iter().filter(|d| d.starts_with(&config.run_dir)) {
        if disk.file_name().is_some_and(|n| n == STAGING_DISK) {
            let _ = std::fs::remove_file(disk);
            lizard_agent_client::StagingFile::create(disk)
                .map_err(|e| NodeError::io(format!("create {}", disk.display()), std::io::Error::other(e)))?;
            continue;
        }
        std::fs::File::create(disk).map_err(|e| NodeError::io(format!("create {}", disk.display()), e))?;
    }
    match &config.secret_file {
        Some(path) => write_secret(path, secret),
        None => Ok(()),
    }
}

/// Write the secret for the VMM to hand to the guest: owner-only, in the run dir.
pub(crate) fn write_secret(path: &Path, secret: &Secret) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| NodeError::io(format!("create {}", path.display()), e))?;
    f.write_all(secret.to_hex().as_bytes()).map_err(|e| NodeError::io("write the secret", e))
}

/// The pid in `dir/vmm.pid` if that process is still the VMM of VM `id`.
pub(crate) fn vmm_pid_of(dir: &Path, id: &str) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(dir.join(VMM_PID)).ok()?.trim().parse().ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    // Pids are reused: only a process whose arguments name this VM is ours.
    let needle = format!("lizard-{id}");
    cmdline.split(|b| *b == 0).any(|arg| arg == needle.as_bytes()).then_some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_file_is_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let s = Secret::generate();
        write_secret(&dir.path().join(SECRET), &s).unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join(SECRET)).unwrap(), s.to_hex());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(dir.path().join(SECRET)).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(write_secret(&dir.path().join(SECRET), &s).is_err(), "an existing secret was overwritten");
    }
}
