//! Which files a confined VMM may use, and giving them back when it ends.
//!
//! A VMM gets its run directory (mode 0700, its own: sockets, console log, memory file,
//! overlay, secret, staging disk) and the disks it writes outside it (volumes). Files it
//! only reads (kernel, initramfs, the backing files of its overlay) stay root's and
//! world-readable in directories that can be passed through but not listed. The memory
//! file of a template snapshot that clones map copy-on-write is shared: root's, and only
//! readable to the group every VMM has (QEMU opens it read-only through [`super::preload`]).
//! When the VMM ends, what its uid owns is given back to root, so that a later VMM that
//! draws the same uid finds nothing of its own.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Make `run_dir` and the files in it (other than shared ones) owned by `uid`/`gid`,
/// and each of `writable` outside it.
pub fn hand_over(run_dir: &Path, writable: &[&Path], uid: u32, gid: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::os::unix::fs::chown(run_dir, Some(uid), Some(gid))?;
    std::fs::set_permissions(run_dir, std::fs::Permissions::from_mode(0o700))?;
    for entry in std::fs::read_dir(run_dir)? {
        let path = entry?.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        // A hard link (a template's memory): shared with other VMs, never one VMM's.
        if meta.is_file() && meta.nlink() == 1 {
            std::os::unix::fs::chown(&path, Some(uid), Some(gid))?;
        }
    }
    for path in writable {
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file()) {
            std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
        }
    }
    Ok(())
}

/// Make the memory file that clones map copy-on-write readable by every VMM and
/// writable by none: root's, read-only for `shared_gid`.
/// Every clone's spawn calls it: a file already so is only looked at.
pub fn share_memory(path: &Path, shared_gid: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path)?;
    if (meta.uid(), meta.gid(), meta.mode() & 0o7777) == (0, shared_gid, 0o440) {
        return Ok(());
    }
    std::os::unix::fs::chown(path, Some(0), Some(shared_gid))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o440))
}

/// Make `path`, a file every VMM only reads (kernel, initramfs), readable to them: when
/// the others may not read it, it goes to `shared_gid` with the group's read bit.
pub fn share_readable(path: &Path, shared_gid: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path)?;
    let mode = meta.mode() & 0o7777;
    if mode & 0o004 != 0 || (meta.gid() == shared_gid && mode & 0o040 != 0) {
        return Ok(());
    }
    std::os::unix::fs::chown(path, None, Some(shared_gid))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode | 0o040))
}

/// Give root what `uid` owns in `run_dir` (and `run_dir` itself), and each of `writable`.
pub fn take_back(run_dir: &Path, writable: &[&Path], uid: u32) {
    let give_back = |path: &Path| {
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.uid() == uid) {
            if let Err(e) = std::os::unix::fs::lchown(path, Some(0), Some(0)) {
                tracing::warn!("cannot give {} back to root: {e}", path.display());
            }
        }
    };
    if let Ok(entries) = std::fs::read_dir(run_dir) {
        for entry in entries.flatten() {
            give_back(&entry.path());
        }
    }
    give_back(run_dir);
    for path in writable {
        give_back(path);
    }
}
