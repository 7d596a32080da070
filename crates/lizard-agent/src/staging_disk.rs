//! The guest's end of the staging disk (see `lizard_agent_proto::staging`): finding it,
//! and moving windows between it and memory with direct I/O.
//!
//! The disk is found by its header, not its position: every `/dev/vd*` whose size is
//! [`DISK_LEN`] is checked for [`MAGIC`], so that no mistake about device order can make a
//! transfer write into the root disk or a volume. On a block device every access is
//! `O_DIRECT`: the host rewrites the windows behind the guest's back, so the guest's page
//! cache must never hold a copy. In dev mode (`serve --staging FILE`) the "disk" is a
//! plain file that shares the host's page cache, and direct I/O is not needed.

use lizard_agent_proto::staging::{aligned, window_offset, LayoutError, ALIGN, DISK_LEN, HEADER_LEN, MAGIC, WINDOW};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Dev mode's staging file, set once at start.
static DEV_FILE: OnceLock<PathBuf> = OnceLock::new();

/// Why the staging disk cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StagingError {
    /// No device carries the staging header (a VM without one, or dev mode without
    /// `--staging`): the host falls back to the agent channel.
    #[error("no staging disk")]
    Missing,
    /// A slot or window outside the layout, or a chunk longer than a window.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// Reading or writing the disk failed.
    #[error("staging disk: {0}")]
    Io(io::Error),
}

impl From<io::Error> for StagingError {
    fn from(e: io::Error) -> Self {
        StagingError::Io(e)
    }
}

/// Use `path` as the staging disk (dev mode). Only the first call counts.
pub fn use_file(path: PathBuf) {
    let _ = DEV_FILE.set(path);
}

/// One slot of the staging disk, open for a transfer.
pub struct StagingSlot {
    disk: std::fs::File,
    slot: u64,
}

impl StagingSlot {
    /// Find the disk and open `slot` of it.
    pub fn open(slot: u64) -> Result<StagingSlot, StagingError> {
        window_offset(slot, 0, 0)?;
        let disk = match DEV_FILE.get() {
            Some(path) => open_checked(path, false)?.ok_or(StagingError::Missing)?,
            None => find_device(Path::new("/sys/block"), Path::new("/dev"))?,
        };
        Ok(StagingSlot { disk, slot })
    }

    /// `slot` of the staging file at `path` (handler tests).
    #[cfg(test)]
    pub fn open_file(path: &Path, slot: u64) -> StagingSlot {
        StagingSlot { disk: open_checked(path, false).unwrap().unwrap(), slot }
    }

    /// Read `len` bytes of `window` into `buf` (an [`AlignedBuf`]'s window).
    pub fn read_window(&self, window: u64, len: u64, buf: &mut [u8]) -> Result<(), StagingError> {
        let at = window_offset(self.slot, window, len)?;
        let span = usize::try_from(aligned(len)).map_err(|_| LayoutError::Length(len))?;
        self.disk.read_exact_at(&mut buf[..span], at)?;
        Ok(())
    }

    /// Write the first `len` bytes of `buf` into `window` (rounded up to the alignment:
    /// the host reads only `len`).
    pub fn write_window(&self, window: u64, len: u64, buf: &[u8]) -> Result<(), StagingError> {
        let at = window_offset(self.slot, window, len)?;
        let span = usize::try_from(aligned(len)).map_err(|_| LayoutError::Length(len))?;
        self.disk.write_all_at(&buf[..span], at)?;
        Ok(())
    }
}

/// The first `/dev/<name>` under `sysfs` that is the staging disk.
fn find_device(sysfs: &Path, dev: &Path) -> Result<std::fs::File, StagingError> {
    let Ok(entries) = std::fs::read_dir(sysfs) else { return Err(StagingError::Missing) };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| n.starts_with("vd")) else { continue };
        // Size in 512-byte sectors: skip every disk of another size without opening it.
        let sectors =
            std::fs::read_to_string(entry.path().join("size")).ok().and_then(|s| s.trim().parse::<u64>().ok());
        if sectors != Some(DISK_LEN / 512) {
            continue;
        }
        if let Some(file) = open_checked(&dev.join(name), true)? {
            return Ok(file);
        }
    }
    Err(StagingError::Missing)
}

/// Open `path` read-write (direct I/O where it is a block device and `direct`) if it
/// starts with the staging header.
fn open_checked(path: &Path, direct: bool) -> Result<Option<std::fs::File>, StagingError> {
    let is_block = std::fs::metadata(path).map(|m| m.file_type().is_block_device()).unwrap_or(false);
    let flags = if direct && is_block { libc::O_DIRECT } else { 0 };
    let file = match std::fs::OpenOptions::new().read(true).write(true).custom_flags(flags).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut header = AlignedBuf::new(HEADER_LEN);
    file.read_exact_at(header.as_mut(), 0)?;
    Ok(header.as_mut().starts_with(MAGIC).then_some(file))
}

/// A buffer aligned for direct I/O, one window long.
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (at most a window) at an [`ALIGN`]ed address.
    pub fn new(len: u64) -> AlignedBuf {
        // Both constants are a few MiB at most.
        #[allow(clippy::cast_possible_truncation)]
        let (len, align) = (len.min(WINDOW) as usize, ALIGN);
        let raw = vec![0u8; len + align];
        let start = raw.as_ptr().align_offset(align);
        AlignedBuf { raw, start, len }
    }

    /// A whole window.
    pub fn window() -> AlignedBuf {
        AlignedBuf::new(WINDOW)
    }
}

impl AsMut<[u8]> for AlignedBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staging_file(dir: &Path, header: &[u8]) -> PathBuf {
        let path = dir.join("staging.img");
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(DISK_LEN).unwrap();
        f.write_all_at(header, 0).unwrap();
        path
    }

    #[test]
    fn buffers_are_aligned() {
        let mut b = AlignedBuf::window();
        assert_eq!(b.as_mut().len() as u64, WINDOW);
        assert_eq!(b.as_mut().as_ptr() as usize % ALIGN, 0);
        assert_eq!(AlignedBuf::new(WINDOW * 2).as_ref().len() as u64, WINDOW);
    }

    #[test]
    fn finds_only_disks_with_the_header() {
        let root = tempfile::tempdir().unwrap();
        let (sys, dev) = (root.path().join("sys"), root.path().join("dev"));
        std::fs::create_dir_all(&dev).unwrap();
        // vda: the right size but no header (a volume of exactly that size); vdb: a
        // different size; vdc: the staging disk.
        for (name, sectors) in [("vda", DISK_LEN / 512), ("vdb", 8), ("vdc", DISK_LEN / 512), ("loop0", 1)] {
            std::fs::create_dir_all(sys.join(name)).unwrap();
            std::fs::write(sys.join(name).join("size"), format!("{sectors}\n")).unwrap();
        }
        std::fs::rename(staging_file(root.path(), b"not the header"), dev.join("vda")).unwrap();
        assert!(matches!(find_device(&sys, &dev), Err(StagingError::Missing)));
        std::fs::rename(staging_file(root.path(), MAGIC), dev.join("vdc")).unwrap();
        let found = find_device(&sys, &dev).unwrap();
        let mut head = [0u8; 16];
        found.read_exact_at(&mut head, 0).unwrap();
        assert_eq!(&head, MAGIC);
        assert!(matches!(find_device(&root.path().join("none"), &dev), Err(StagingError::Missing)));
    }

    #[test]
    fn windows_round_trip_and_stay_in_their_slot() {
        let root = tempfile::tempdir().unwrap();
        let path = staging_file(root.path(), MAGIC);
        let slot = StagingSlot { disk: open_checked(&path, false).unwrap().unwrap(), slot: 1 };
        let mut buf = AlignedBuf::window();
        buf.as_mut()[..5].copy_from_slice(b"hello");
        slot.write_window(1, 5, buf.as_ref()).unwrap();
        let raw = std::fs::read(&path).unwrap();
        let at = usize::try_from(window_offset(1, 1, 5).unwrap()).unwrap();
        assert_eq!(&raw[at..at + 5], b"hello");
        let mut back = AlignedBuf::window();
        slot.read_window(1, 5, back.as_mut()).unwrap();
        assert_eq!(&back.as_ref()[..5], b"hello");
        assert!(matches!(slot.write_window(2, 1, buf.as_ref()), Err(StagingError::Layout(_))));
        assert!(matches!(slot.read_window(0, WINDOW + 1, back.as_mut()), Err(StagingError::Layout(_))));
    }
}
