//! The memory a copy-on-write clone starts from, handed to its confined VMM as a sealed
//! memfd rather than as a file it may open.
//!
//! A clone maps its base memory file private, but QEMU 7.2 opens that file read-write all
//! the same (8.2's `rom=off` would not), so every VMM would need write access to a file
//! that every other clone of the template starts from: one VMM taken over could change
//! them all. Instead the node copies each base file once into a memfd sealed against
//! writes, growth, shrinking and new seals (`F_SEAL_WRITE` refuses `write(2)`, hole
//! punching and shared writable mappings; a private mapping still works) and passes it
//! to the VMM as a descriptor ([`super::child::MEMORY_FD`]). The file on disk stays
//! root's and is read by no VMM.
//!
//! One memfd per base file (by device and inode, so a clone's hard link to its template's
//! memory shares it), kept while the file exists and either a VMM holds it or it was used
//! within [`IDLE`] (a paused clone of an old template version keeps the file, but its copy
//! is made again at its resume); a VMM's mapping keeps its own copy alive.
//! Its name, which `/proc/<pid>/maps` shows, carries the file's identity: a delta save
//! finds the mapping by it, and a node that takes a running VMM back finds the base file
//! in the VMM's run directory by it.

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use nix::unistd::{lseek, Whence};
use std::collections::HashMap;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Start of every such memfd's name.
const NAME_PREFIX: &str = "lizard-memory:";
/// Bytes copied per read.
const CHUNK: usize = 1 << 20;
/// Page size: all-zero pages are left as holes (which read as zeros).
const PAGE: usize = 4096;
/// How long a copy no VMM holds is kept for the next clone.
pub const IDLE: Duration = Duration::from_secs(600);

/// A base memory file's content in a sealed memfd.
#[derive(Debug)]
pub struct SealedMemory {
    fd: OwnedFd,
    /// The name of its mappings in `/proc/<pid>/maps`.
    mapped_as: String,
}

impl SealedMemory {
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// How a process's mapping of it shows in `/proc/<pid>/maps` (and its descriptor in
    /// `/proc/<pid>/fd`).
    pub fn mapped_as(&self) -> &str {
        &self.mapped_as
    }
}

/// What is cached per base file: the memfd, and the file kept open so that its link
/// count tells when the last name of it is gone.
#[derive(Debug)]
struct Cached {
    sealed: Arc<SealedMemory>,
    file: File,
    last_used: Instant,
}

impl Cached {
    /// Whether it is worth keeping: its file still exists, and a VMM holds it (each
    /// jail keeps a reference) or it was used within `idle`.
    fn keep(&self, idle: Duration) -> bool {
        let exists = self.file.metadata().is_ok_and(|m| m.nlink() > 0);
        exists && (Arc::strong_count(&self.sealed) > 1 || self.last_used.elapsed() < idle)
    }
}

/// The sealed copies of the base files clones of this node map.
#[derive(Debug)]
pub struct SealedMemories {
    by_inode: Mutex<HashMap<(u64, u64), Cached>>,
    idle: Duration,
}

impl Default for SealedMemories {
    fn default() -> Self {
        SealedMemories { by_inode: Mutex::default(), idle: IDLE }
    }
}

/// The `/proc/<pid>/maps` name of the memfd made from the file `(dev, ino)`.
fn mapped_as(dev: u64, ino: u64) -> String {
    format!("/memfd:{NAME_PREFIX}{dev}:{ino} (deleted)")
}

/// How a mapping of the sealed copy of `path` shows in `/proc/<pid>/maps`.
pub fn mapped_as_of(path: &Path) -> std::io::Result<String> {
    let meta = std::fs::metadata(path)?;
    Ok(mapped_as(meta.dev(), meta.ino()))
}

impl SealedMemories {
    /// The sealed copy of `path` (a regular file, not a link to one), made on first use.
    pub fn get(&self, path: &Path) -> std::io::Result<Arc<SealedMemory>> {
        // No symlink is followed: the node reads this as root, from a run directory its
        // VMM could write to (hard links to files it cannot write are refused by the
        // kernel's protected_hardlinks).
        let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"));
        }
        let key = (meta.dev(), meta.ino());
        let mut cache = self.by_inode.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Copies of files deleted since, or idle: they go (VMMs keep theirs).
        cache.retain(|k, c| *k == key || c.keep(self.idle));
        if let Some(cached) = cache.get_mut(&key).filter(|c| c.keep(self.idle)) {
            cached.last_used = Instant::now();
            return Ok(cached.sealed.clone());
        }
        let t = std::time::Instant::now();
        let sealed = Arc::new(seal_copy(&file, meta.len(), key)?);
        tracing::debug!(file = %path.display(), bytes = meta.len(), took = ?t.elapsed(), "base memory sealed");
        cache.insert(key, Cached { sealed: sealed.clone(), file, last_used: Instant::now() });
        Ok(sealed)
    }
}

/// Copy `len` bytes of `file` (the file `key`) into a new memfd and seal it. Holes and
/// all-zero pages stay holes.
fn seal_copy(file: &File, len: u64, key: (u64, u64)) -> std::io::Result<SealedMemory> {
    let name = CString::new(format!("{NAME_PREFIX}{}:{}", key.0, key.1)).expect("no NUL in a number");
    let fd = memfd_create(&name, MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING)?;
    let memfd = File::from(fd);
    memfd.set_len(len)?;
    let mut buf = vec![0u8; CHUNK];
    let mut offset = 0u64;
    while offset < len {
        let Some(data) = next_data(file, offset)? else { break };
        let hole = next_hole(file, data)?.min(len);
        let mut at = data;
        while at < hole {
            let n = usize::try_from((hole - at).min(CHUNK as u64)).expect("at most CHUNK");
            file.read_exact_at(&mut buf[..n], at)?;
            for (i, page) in buf[..n].chunks(PAGE).enumerate() {
                if page.iter().any(|b| *b != 0) {
                    memfd.write_all_at(page, at + (i * PAGE) as u64)?;
                }
            }
            at += n as u64;
        }
        offset = hole;
    }
    let seals = SealFlag::F_SEAL_WRITE | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_SEAL;
    fcntl(memfd.as_raw_fd(), FcntlArg::F_ADD_SEALS(seals))?;
    Ok(SealedMemory { fd: OwnedFd::from(memfd), mapped_as: mapped_as(key.0, key.1) })
}

/// Where the next data at or after `offset` starts; `None`: only a hole is left.
fn next_data(file: &File, offset: u64) -> std::io::Result<Option<u64>> {
    let at = i64::try_from(offset).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    match lseek(file.as_raw_fd(), at, Whence::SeekData) {
        Ok(pos) => Ok(Some(pos.unsigned_abs())),
        Err(nix::Error::ENXIO) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Where the hole after `offset` (data) starts: the end of the file at the latest.
fn next_hole(file: &File, offset: u64) -> std::io::Result<u64> {
    let at = i64::try_from(offset).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    Ok(lseek(file.as_raw_fd(), at, Whence::SeekHole)?.unsigned_abs())
}

/// The base file a running VMM `pid` maps from a sealed memfd at `fd` (a node taking it
/// back), found in `run_dir` by the identity the memfd's name carries, with the name its
/// mapping has.
pub fn base_of_running(pid: u32, fd: i32, run_dir: &Path) -> Option<(PathBuf, String)> {
    let target = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok()?;
    let target = target.to_str()?;
    let identity = target.strip_prefix("/memfd:")?.strip_prefix(NAME_PREFIX)?.strip_suffix(" (deleted)")?;
    let (dev, ino) = identity.split_once(':')?;
    let (dev, ino): (u64, u64) = (dev.parse().ok()?, ino.parse().ok()?);
    let found = std::fs::read_dir(run_dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file() && (m.dev(), m.ino()) == (dev, ino)))?;
    Some((found, target.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn base(dir: &Path) -> (PathBuf, Vec<u8>) {
        // Data, a zero page, a hole and data again: 5 pages.
        let path = dir.join("memory");
        let mut content = vec![0u8; 5 * PAGE];
        content[..PAGE].fill(7);
        content[4 * PAGE + 10] = 9;
        let mut f = File::create(&path).unwrap();
        f.write_all(&content[..2 * PAGE]).unwrap();
        f.write_all_at(&content[4 * PAGE..], 4 * PAGE as u64).unwrap();
        (path, content)
    }

    fn read_all(fd: &OwnedFd) -> Vec<u8> {
        let f = File::from(fd.try_clone().unwrap());
        let mut out = vec![0u8; usize::try_from(f.metadata().unwrap().len()).unwrap()];
        f.read_exact_at(&mut out, 0).unwrap();
        out
    }

    #[test]
    fn the_copy_is_the_file_and_nothing_can_change_it() {
        let dir = tempfile::tempdir().unwrap();
        let (path, content) = base(dir.path());
        let memories = SealedMemories::default();
        let sealed = memories.get(&path).unwrap();
        assert_eq!(read_all(sealed.fd()), content);

        let f = File::from(sealed.fd().try_clone().unwrap());
        let refused = |r: std::io::Result<()>| r.unwrap_err().raw_os_error();
        assert_eq!(refused(f.write_all_at(b"x", 0)), Some(libc::EPERM), "a write");
        assert_eq!(refused(f.set_len(PAGE as u64)), Some(libc::EPERM), "shrinking");
        assert_eq!(refused(f.set_len(64 * PAGE as u64)), Some(libc::EPERM), "growing");
        let seals = fcntl(f.as_raw_fd(), FcntlArg::F_GET_SEALS).unwrap();
        assert_eq!(seals & libc::F_SEAL_WRITE, libc::F_SEAL_WRITE);
        assert_eq!(
            fcntl(f.as_raw_fd(), FcntlArg::F_ADD_SEALS(SealFlag::empty())).map_err(|e| e as i32),
            Err(libc::EPERM),
            "the seals are sealed"
        );
        // A shared writable mapping is refused; a private one works and changes nothing
        // of the memfd.
        // SAFETY: a mapping of a memfd this test owns, refused before it exists.
        let shared = unsafe { memmap2::MmapOptions::new().len(PAGE).map_mut(&f) };
        assert_eq!(shared.unwrap_err().raw_os_error(), Some(libc::EPERM), "a shared writable mapping");
        // SAFETY: a private mapping of a sealed memfd this test owns.
        let mut private = unsafe { memmap2::MmapOptions::new().len(PAGE).map_copy(&f) }.unwrap();
        private[0] = 1;
        assert_eq!(read_all(sealed.fd()), content, "a private mapping's write reached the memfd");
        // Reopened read-write through /proc, as QEMU opens its memory path: still sealed.
        let reopened = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", f.as_raw_fd()))
            .unwrap();
        assert_eq!(refused(reopened.write_all_at(b"x", 0)), Some(libc::EPERM), "a write through a reopened memfd");
        // SAFETY: fallocate on a descriptor this test owns; integer arguments only.
        let punch = unsafe {
            libc::fallocate(reopened.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 0, 4096)
        };
        assert_eq!((punch, std::io::Error::last_os_error().raw_os_error()), (-1, Some(libc::EPERM)), "a hole punched");
    }

    #[test]
    fn one_copy_per_file_under_any_name_and_a_new_one_for_a_new_file() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = base(dir.path());
        let link = dir.path().join("base-memory");
        std::fs::hard_link(&path, &link).unwrap();
        let memories = SealedMemories::default();
        let first = memories.get(&path).unwrap();
        assert!(Arc::ptr_eq(&first, &memories.get(&link).unwrap()), "a hard link made a second copy");
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(first.mapped_as(), format!("/memfd:lizard-memory:{}:{} (deleted)", meta.dev(), meta.ino()));
        assert_eq!(mapped_as_of(&link).unwrap(), first.mapped_as());

        // The file replaced under its name (a template rebuilt): another copy.
        std::fs::remove_file(&path).unwrap();
        std::fs::remove_file(&link).unwrap();
        std::fs::write(&path, vec![3u8; PAGE]).unwrap();
        let second = memories.get(&path).unwrap();
        assert!(!Arc::ptr_eq(&first, &second));
        assert_eq!(read_all(second.fd()), vec![3u8; PAGE]);
        assert_eq!(memories.by_inode.lock().unwrap().len(), 1, "the deleted file's copy was kept");
    }

    #[test]
    fn a_copy_no_vmm_holds_goes_when_idle_and_is_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let (path, content) = base(dir.path());
        std::fs::create_dir(dir.path().join("o")).unwrap();
        let (other, _) = base(&dir.path().join("o"));
        let memories = SealedMemories { by_inode: Mutex::default(), idle: Duration::ZERO };
        let held = memories.get(&path).unwrap();
        let unheld = Arc::downgrade(&memories.get(&other).unwrap());
        // Another file's lookup sweeps: the copy a "VMM" holds stays, the other goes.
        let _ = memories.get(&path).unwrap();
        assert!(Arc::ptr_eq(&held, &memories.get(&path).unwrap()), "a held copy was made again");
        assert_eq!(memories.by_inode.lock().unwrap().len(), 1, "an idle copy no one holds was kept");
        assert!(unheld.upgrade().is_none(), "the idle copy is still open");
        drop(held);
        let again = memories.get(&path).unwrap();
        assert_eq!(read_all(again.fd()), content);
    }

    #[test]
    fn a_link_or_a_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = base(dir.path());
        let symlink = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &symlink).unwrap();
        let memories = SealedMemories::default();
        assert_eq!(memories.get(&symlink).unwrap_err().raw_os_error(), Some(libc::ELOOP));
        assert!(memories.get(dir.path()).is_err());
    }

    #[test]
    fn a_running_vmms_base_is_found_by_its_memfd() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = base(dir.path());
        let sealed = SealedMemories::default().get(&path).unwrap();
        let fd = sealed.fd().as_raw_fd();
        let found = base_of_running(std::process::id(), fd, dir.path());
        assert_eq!(found, Some((path, sealed.mapped_as().to_string())));
        let elsewhere = tempfile::tempdir().unwrap();
        assert_eq!(base_of_running(std::process::id(), fd, elsewhere.path()), None);
    }
}
