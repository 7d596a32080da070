//! Root disk overlays: a VM writes only its own blocks, over a read-only image.

use super::BootError;
use crate::{NodeError, Result};
use std::path::Path;

/// A qcow2 overlay whose backing file is a read-only image: the VM writes only its own
/// blocks, and creating it costs well under a millisecond. The size comes from the
/// backing file's header, which is readable even while a running VM holds the file (as
/// when a fork freezes a disk).
pub(crate) async fn create_overlay(backing: &Path, backing_format: &str, overlay: &Path) -> Result<()> {
    let size = virtual_size(backing, backing_format)?;
    super::qcow2::create_overlay(backing, backing_format, size, overlay)
        .map_err(|e| NodeError::io(format!("create the disk overlay {}", overlay.display()), e))
}

/// A qcow2 overlay of the same size as the qcow2 image `like`, naming `backing` (which
/// need not exist yet) as its backing file. For freezing a running VM's disk into a
/// layer that gets its final name only once it is complete: QEMU attaches the new
/// overlay to the disk it has open, not to the named file.
pub(crate) fn create_overlay_naming(backing: &Path, like: &Path, overlay: &Path) -> Result<()> {
    let size = virtual_size(like, "qcow2")?;
    super::qcow2::create_overlay(backing, "qcow2", size, overlay)
        .map_err(|e| NodeError::io(format!("create the disk overlay {}", overlay.display()), e))
}

/// The guest-visible size of a raw or qcow2 disk image.
pub(crate) fn virtual_size(image: &Path, format: &str) -> Result<u64> {
    use std::io::Read;
    let mut f = std::fs::File::open(image).map_err(|e| NodeError::io(format!("open {}", image.display()), e))?;
    if format == "raw" {
        return f.metadata().map(|m| m.len()).map_err(|e| NodeError::io(format!("stat {}", image.display()), e));
    }
    // qcow2 header: magic "QFI\xfb", then the size as a big-endian u64 at offset 24.
    let mut header = [0u8; 32];
    f.read_exact(&mut header).map_err(|e| NodeError::io(format!("read {}", image.display()), e))?;
    let [b'Q', b'F', b'I', 0xfb, .., s0, s1, s2, s3, s4, s5, s6, s7] = header else {
        return Err(BootError::NotQcow2 { path: image.to_path_buf() }.into());
    };
    Ok(u64::from_be_bytes([s0, s1, s2, s3, s4, s5, s6, s7]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn overlays_take_their_size_from_the_backing_image() {
        let dir = tempfile::tempdir().unwrap();
        let raw = dir.path().join("base.img");
        std::fs::write(&raw, vec![0u8; 3 << 20]).unwrap();
        let top = dir.path().join("top.qcow2");
        create_overlay(&raw, "raw", &top).await.unwrap();
        assert_eq!(virtual_size(&top, "qcow2").unwrap(), 3 << 20);
        let upper = dir.path().join("upper.qcow2");
        create_overlay(&top, "qcow2", &upper).await.unwrap();
        assert_eq!(virtual_size(&upper, "qcow2").unwrap(), 3 << 20);
        assert!(matches!(virtual_size(&raw, "qcow2"), Err(NodeError::Boot(BootError::NotQcow2 { .. }))));
    }
}
