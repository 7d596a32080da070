//! Volume disks: state that outlives sandboxes, on this node's disk.
//!
//! A volume is `<data_dir>/volumes/<id>.img`, a sparse raw file of exactly its size
//! holding an ext4 filesystem (made here with `mkfs.ext4`), attached to a sandbox as its
//! second virtio-blk disk and mounted by the agent at `/workspace`.
//!
//! **Size.** The filesystem fills the file, so a guest hits ENOSPC at the volume's size,
//! and QEMU never writes past the end of a raw image, so the file never grows beyond it.
//! Sparse files can still add up to more than the host disk holds: [`create`] refuses a
//! volume unless the host filesystem's free space covers every volume's unallocated
//! remainder plus [`HOST_RESERVE`] — guests cannot fill the host's disk, only other
//! writers on the host can.
//!
//! **Durability.** QEMU opens the image with `cache=writeback`: a guest write completes
//! once QEMU's `pwrite` put it in the host's page cache, and a guest flush (`fsync`,
//! `syncfs`) becomes `fdatasync` on the image. Data a guest synced is therefore in the
//! host kernel before the guest's sync returns; SIGKILLing QEMU cannot lose it (the host
//! page cache belongs to the host kernel, not to QEMU), and a host crash cannot either
//! (fdatasync). Data a guest wrote but did not sync is synced by the node before a kill
//! or pause (agent route `/v1/volume/sync`).

use crate::{NodeError, Result};
use std::path::{Path, PathBuf};

/// Smallest and largest volume, GiB.
pub const MIN_SIZE_GB: u32 = 1;
pub const MAX_SIZE_GB: u32 = lizard_api::MAX_VOLUME_SIZE_GB;
/// Free host space that volumes never claim.
pub const HOST_RESERVE: u64 = 1 << 30;
const GIB: u64 = 1 << 30;

/// The image file of volume `id` under `dir` (`<data_dir>/volumes`).
pub fn image_path(dir: &Path, id: &str) -> Result<PathBuf> {
    check_id(id)?;
    Ok(dir.join(format!("{id}.img")))
}

/// Volume ids name files: only `[A-Za-z0-9_-]`, 1..=64 characters.
fn check_id(id: &str) -> Result<()> {
    let ok =
        !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(NodeError::BadVolumeId { id: id.to_string() })
    }
}

/// Make the image of a new volume: a sparse file of `size_gb` GiB with an empty ext4
/// filesystem whose root directory every guest user may write to. Built under a
/// temporary name and renamed, so an image that exists is complete. Conflict when
/// the volume exists.
pub async fn create(dir: &Path, id: &str, size_gb: u32) -> Result<PathBuf> {
    if !(MIN_SIZE_GB..=MAX_SIZE_GB).contains(&size_gb) {
        let (min, max, got) = (MIN_SIZE_GB.into(), MAX_SIZE_GB.into(), size_gb.into());
        return Err(NodeError::OutOfRange { field: "sizeGb", min, max, got });
    }
    let path = image_path(dir, id)?;
    std::fs::create_dir_all(dir).map_err(|e| NodeError::io(format!("create {}", dir.display()), e))?;
    if path.exists() {
        return Err(NodeError::VolumeExists { volume: id.to_string() });
    }
    let size = u64::from(size_gb) * GIB;
    check_space(dir, size)?;
    let tmp = dir.join(format!(".tmp-{id}.img"));
    let made = async {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| NodeError::io(format!("create {}", tmp.display()), e))?;
        f.set_len(size).map_err(|e| NodeError::io("size the volume image", e))?;
        drop(f);
        // On a file, mkfs's discard punches holes, which read back as zeros: it then marks
        // every inode table zeroed, so the guest's kernel never starts a lazy-init thread
        // that would write them out (≈230 MB for 10 GiB under TCG). Measured for 10 GiB:
        // 0.23 s and 4.3 MB allocated, against 229 MB written without lazy init.
        let out = tokio::process::Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0", "-L", "lizard-volume"])
            .args(["-E", "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0"])
            .arg(&tmp)
            .output()
            .await
            .map_err(|e| NodeError::io("run mkfs.ext4 (install e2fsprogs)", e))?;
        if !out.status.success() {
            return Err(NodeError::io(
                "mkfs.ext4",
                std::io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()),
            ));
        }
        open_root_dir(&tmp).await?;
        let f = std::fs::File::open(&tmp).map_err(|e| NodeError::io("open the volume image", e))?;
        f.sync_all().map_err(|e| NodeError::io("sync the volume image", e))?;
        std::fs::rename(&tmp, &path).map_err(|e| NodeError::io("store the volume image", e))
    }
    .await;
    if let Err(e) = made {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(path)
}

/// Mode 1777 on the filesystem's root, like /tmp: any guest user may create files in
/// /workspace, and only their owner may remove them.
async fn open_root_dir(image: &Path) -> Result<()> {
    let out = tokio::process::Command::new("debugfs")
        .args(["-w", "-R", "set_inode_field / mode 041777"])
        .arg(image)
        .output()
        .await
        .map_err(|e| NodeError::io("run debugfs (install e2fsprogs)", e))?;
    if !out.status.success() {
        return Err(NodeError::io("debugfs", std::io::Error::other(String::from_utf8_lossy(&out.stderr).to_string())));
    }
    Ok(())
}

/// Delete a volume's image; an absent one is fine (already deleted).
pub fn delete(dir: &Path, id: &str) -> Result<()> {
    let path = image_path(dir, id)?;
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(NodeError::io(format!("remove {}", path.display()), e)),
    }
}

/// Refuse a new volume of `size` bytes unless the host has room for it and for every
/// existing volume to fill up.
fn check_space(dir: &Path, size: u64) -> Result<()> {
    let st = nix::sys::statvfs::statvfs(dir).map_err(|e| NodeError::io("statvfs the volumes dir", e.into()))?;
    let free = st.blocks_available().saturating_mul(st.fragment_size());
    let promised: u64 = existing_unallocated(dir);
    let needed = promised + size + HOST_RESERVE;
    if needed > free {
        return Err(NodeError::InsufficientSpace {
            size_gb: size / GIB,
            free_gb: free / GIB,
            needed_gb: needed.div_ceil(GIB),
            promised_gb: promised / GIB,
        });
    }
    Ok(())
}

/// What the volumes in `dir` may still allocate on the host before they are full.
fn existing_unallocated(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len().saturating_sub(m.blocks() * 512))
        .sum()
}

/// Remove half-made images left by an earlier node process.
pub fn sweep(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(".tmp-") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_cannot_escape_the_directory() {
        let d = Path::new("/v");
        assert_eq!(image_path(d, "vol_abc-1").unwrap(), Path::new("/v/vol_abc-1.img"));
        for bad in ["", "../x", "a/b", "a.b", &"x".repeat(65)] {
            assert!(image_path(d, bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn images_are_sparse_ext4_of_the_size_and_deletable() {
        let dir = tempfile::tempdir().unwrap();
        let path = create(dir.path(), "v1", 1).await.unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), GIB);
        use std::os::unix::fs::MetadataExt;
        assert!(meta.blocks() * 512 < 64 << 20, "not sparse: {} bytes allocated", meta.blocks() * 512);
        let out = std::process::Command::new("dumpe2fs").arg("-h").arg(&path).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("lizard-volume"), "{text}");
        let groups = std::process::Command::new("dumpe2fs").arg(&path).output().unwrap();
        let groups = String::from_utf8_lossy(&groups.stdout);
        assert!(groups.contains("Group 1: (Blocks 32768-65535)"), "{groups}");
        assert!(
            groups
                .lines()
                .filter(|l| l.starts_with("Group ") && l.contains("(Blocks"))
                .all(|l| l.contains("ITABLE_ZEROED")),
            "inode tables left for the guest to zero"
        );
        assert!(matches!(create(dir.path(), "v1", 1).await, Err(NodeError::VolumeExists { .. })));
        assert!(matches!(create(dir.path(), "v2", 0).await, Err(NodeError::OutOfRange { field: "sizeGb", .. })));
        let st = nix::sys::statvfs::statvfs(dir.path()).unwrap();
        let free = st.blocks_available() * st.fragment_size();
        assert!(matches!(check_space(dir.path(), free), Err(NodeError::InsufficientSpace { .. })));
        delete(dir.path(), "v1").unwrap();
        delete(dir.path(), "v1").unwrap();
        assert!(!path.exists());
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert!(leftovers.iter().all(|n| n != ".tmp-v1.img"), "{leftovers:?}");
    }
}
