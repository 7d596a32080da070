//! Empty qcow2 overlays, written directly: every create makes one over a template or
//! snapshot disk, and spawning `qemu-img` for it cost tens of milliseconds of a create that
//! should take few.
//!
//! The file is what `qemu-img create -f qcow2 -b BACKING -F FMT` makes (version 3, 64 KiB
//! clusters, 16-bit refcounts): the header with a backing-format extension and the backing
//! file's name, then one cluster each for the refcount table, its one refcount block, and
//! an all-zero L1 table. Every cluster is unallocated, so every read goes to the backing
//! file until the guest writes.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

const CLUSTER_BITS: u32 = 16;
const CLUSTER: u64 = 1 << CLUSTER_BITS;
const HEADER_LEN: usize = 104;
/// Header extension "backing file format name".
const EXT_BACKING_FORMAT: u32 = 0xe279_2aca;

/// Write an empty overlay `out` of `size` bytes over `backing` (`raw` or `qcow2`),
/// failing if `out` exists. Not fsynced, like `qemu-img create`: the VM's own flushes
/// make the overlay durable along with what the guest writes to it.
pub fn create_overlay(backing: &Path, backing_format: &str, size: u64, out: &Path) -> std::io::Result<()> {
    let header = header(backing, backing_format, size)?;
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(out)?;
    let written = f.write_all(&header).and_then(|_| {
        // Refcount table → block at cluster 2; the block counts clusters 0..=3 once each.
        f.write_all_at(&(2 * CLUSTER).to_be_bytes(), CLUSTER)?;
        f.write_all_at(&[0, 1, 0, 1, 0, 1, 0, 1], 2 * CLUSTER)?;
        // The L1 table (cluster 3) is all zeros: a sparse tail.
        f.set_len(4 * CLUSTER)
    });
    if written.is_err() {
        let _ = std::fs::remove_file(out);
    }
    written
}

/// The first cluster's bytes: header, extensions, backing file name.
fn header(backing: &Path, backing_format: &str, size: u64) -> std::io::Result<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let invalid = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, m.to_string());
    let name = backing.as_os_str().as_bytes();
    if name.is_empty() || name.len() > 1023 {
        return Err(invalid("the backing file name must be 1..=1023 bytes"));
    }
    if !matches!(backing_format, "raw" | "qcow2") {
        return Err(invalid("the backing format must be raw or qcow2"));
    }
    // One L2 table maps CLUSTER/8 clusters; the L1 table must fit its one cluster.
    let per_l2 = CLUSTER * (CLUSTER / 8);
    let l1_size = size.div_ceil(per_l2);
    if size == 0 || l1_size * 8 > CLUSTER {
        return Err(invalid("the disk size must be 1 byte..=4 TiB"));
    }

    // Every length written below fits its 32-bit field (the name is ≤ 1023 bytes, the L1
    // table ≤ CLUSTER/8 entries); a value that did not would be refused, not cut.
    let field = |n: u64| u32::try_from(n).map_err(|_| invalid("a header field out of range"));
    let mut h = vec![0u8; HEADER_LEN];
    let put32 = |h: &mut Vec<u8>, at: usize, v: u32| h[at..at + 4].copy_from_slice(&v.to_be_bytes());
    let put64 = |h: &mut Vec<u8>, at: usize, v: u64| h[at..at + 8].copy_from_slice(&v.to_be_bytes());
    h[..4].copy_from_slice(b"QFI\xfb");
    put32(&mut h, 4, 3); // version
    put32(&mut h, 20, CLUSTER_BITS);
    put64(&mut h, 24, size);
    put32(&mut h, 36, field(l1_size)?);
    put64(&mut h, 40, 3 * CLUSTER); // L1 table
    put64(&mut h, 48, CLUSTER); // refcount table
    put32(&mut h, 56, 1); // refcount table clusters
    put32(&mut h, 96, 4); // refcount order: 16-bit
    put32(&mut h, 100, field(HEADER_LEN as u64)?);
    // Extensions: the backing format (padded to 8 bytes), then the end marker.
    h.extend_from_slice(&EXT_BACKING_FORMAT.to_be_bytes());
    h.extend_from_slice(&field(backing_format.len() as u64)?.to_be_bytes());
    h.extend_from_slice(backing_format.as_bytes());
    h.resize(h.len().next_multiple_of(8), 0);
    h.extend_from_slice(&[0; 8]);
    // The backing file's name follows the extensions.
    let at = h.len();
    h.extend_from_slice(name);
    put64(&mut h, 8, at as u64);
    put32(&mut h, 16, field(name.len() as u64)?);
    debug_assert!(h.len() as u64 <= CLUSTER);
    Ok(h)
}

/// The backing file a qcow2 image names (as written: a relative name is relative to the
/// image's directory), or None for an image with none. Read from the header, as QEMU
/// does: the name's offset (bytes 8..16) and length (16..20).
pub fn backing_file(image: &Path) -> std::io::Result<Option<std::path::PathBuf>> {
    use std::os::unix::ffi::OsStringExt;
    let f = std::fs::File::open(image)?;
    let mut head = [0u8; 20];
    f.read_exact_at(&mut head, 0)?;
    let [b'Q', b'F', b'I', 0xfb, _, _, _, _, o0, o1, o2, o3, o4, o5, o6, o7, l0, l1, l2, l3] = head else {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "not a qcow2 image"));
    };
    let (offset, len) = (u64::from_be_bytes([o0, o1, o2, o3, o4, o5, o6, o7]), u32::from_be_bytes([l0, l1, l2, l3]));
    if offset == 0 || len == 0 {
        return Ok(None);
    }
    if len > 1023 {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "a backing file name over 1023 bytes"));
    }
    let mut name = vec![0u8; len as usize];
    f.read_exact_at(&mut name, offset)?;
    let name = std::path::PathBuf::from(std::ffi::OsString::from_vec(name));
    Ok(Some(match image.parent() {
        Some(dir) if name.is_relative() => dir.join(name),
        _ => name,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backing_file_reads_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base.raw");
        std::fs::write(&base, [0u8; 4096]).unwrap();
        let top = dir.path().join("top.qcow2");
        create_overlay(&base, "raw", 4096, &top).unwrap();
        assert_eq!(backing_file(&top).unwrap(), Some(base.clone()));
        let relative = dir.path().join("relative.qcow2");
        create_overlay(Path::new("top.qcow2"), "qcow2", 4096, &relative).unwrap();
        assert_eq!(backing_file(&relative).unwrap(), Some(dir.path().join("top.qcow2")));
        assert_eq!(backing_file(&base).unwrap_err().kind(), std::io::ErrorKind::InvalidData);
    }
    #[cfg(feature = "vm-tests")]
    use std::process::Command;

    #[cfg(feature = "vm-tests")]
    fn qemu_img(args: &[&str]) -> String {
        let out = Command::new("qemu-img").args(args).output().expect("qemu-img (qemu-utils) is installed");
        assert!(out.status.success(), "qemu-img {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    /// Needs `qemu-img` and `qemu-io` (QEMU's tools): with the VM tests.
    #[cfg(feature = "vm-tests")]
    #[test]
    fn qemu_reads_the_backing_data_through_the_overlay() {
        let dir = tempfile::tempdir().unwrap();
        let raw = dir.path().join("base.raw");
        let data: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| u8::try_from(i % 251).unwrap()).collect();
        std::fs::write(&raw, &data).unwrap();
        let top = dir.path().join("top.qcow2");
        create_overlay(&raw, "raw", data.len() as u64, &top).unwrap();

        qemu_img(&["check", top.to_str().unwrap()]);
        let info: serde_json::Value =
            serde_json::from_str(&qemu_img(&["info", "--output=json", top.to_str().unwrap()])).unwrap();
        assert_eq!(info["virtual-size"], data.len() as u64);
        assert_eq!(info["backing-filename"], raw.to_str().unwrap());
        assert_eq!(info["backing-filename-format"], "raw");

        // A qcow2 over that overlay, then everything read back through both.
        let top2 = dir.path().join("top2.qcow2");
        create_overlay(&top, "qcow2", data.len() as u64, &top2).unwrap();
        let flat = dir.path().join("flat.raw");
        qemu_img(&["convert", "-O", "raw", top2.to_str().unwrap(), flat.to_str().unwrap()]);
        assert!(std::fs::read(&flat).unwrap() == data, "the overlay chain does not read as its base");

        // Writes land in the top overlay only.
        let io = Command::new("qemu-io")
            .args(["-f", "qcow2", "-c", "write -P 0x5a 0 64k", top2.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(io.status.success(), "{}", String::from_utf8_lossy(&io.stderr));
        qemu_img(&["check", top2.to_str().unwrap()]);
        qemu_img(&["convert", "-O", "raw", top2.to_str().unwrap(), flat.to_str().unwrap()]);
        let read = std::fs::read(&flat).unwrap();
        assert!(read[..65536].iter().all(|b| *b == 0x5a) && read[65536..] == data[65536..]);
        assert!(std::fs::read(&raw).unwrap() == data, "the base changed");
        qemu_img(&["convert", "-O", "raw", top.to_str().unwrap(), flat.to_str().unwrap()]);
        assert!(std::fs::read(&flat).unwrap() == data, "the middle overlay changed");
    }

    #[test]
    fn bad_arguments_are_refused_and_nothing_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("x.qcow2");
        assert!(create_overlay(Path::new("/b"), "vmdk", 1 << 20, &out).is_err());
        assert!(create_overlay(Path::new("/b"), "raw", 0, &out).is_err());
        assert!(create_overlay(Path::new(""), "raw", 1 << 20, &out).is_err());
        assert!(!out.exists());
        create_overlay(Path::new("/b"), "raw", 1 << 20, &out).unwrap();
        // Never over an existing file (a sandbox's disk).
        assert!(create_overlay(Path::new("/b"), "raw", 1 << 20, &out).is_err());
    }
}
