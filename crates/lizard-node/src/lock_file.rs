//! A lock file between processes (`flock`) that goes away with its lock: removed by its
//! holder while still held, so lock files do not pile up. A taker checks, once it holds
//! the lock, that the file it locked is still the one at the path; one removed under it
//! (its holder gave it up between the taker's open and lock) is taken again.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A held lock file; dropping it removes the file, then unlocks.
#[derive(Debug)]
pub struct LockFile {
    path: PathBuf,
    _lock: nix::fcntl::Flock<File>,
}

impl Drop for LockFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl LockFile {
    /// The lock at `path` if no one holds it, else `None` (also when the file cannot be
    /// opened).
    pub fn try_acquire(path: &Path) -> Option<LockFile> {
        Self::acquire_with(path, nix::fcntl::FlockArg::LockExclusiveNonblock).ok()
    }

    /// The lock at `path`, waiting for its holder (blocks the thread).
    pub fn acquire(path: &Path) -> std::io::Result<LockFile> {
        Self::acquire_with(path, nix::fcntl::FlockArg::LockExclusive)
    }

    fn acquire_with(path: &Path, how: nix::fcntl::FlockArg) -> std::io::Result<LockFile> {
        // Each retry follows one holder's removal; a few are plenty.
        for _ in 0..8 {
            let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(path)?;
            let lock = nix::fcntl::Flock::lock(f, how).map_err(|(_, e)| std::io::Error::from(e))?;
            let same = match (lock.metadata(), std::fs::metadata(path)) {
                (Ok(held), Ok(now)) => (held.dev(), held.ino()) == (now.dev(), now.ino()),
                _ => false,
            };
            if same {
                return Ok(LockFile { path: path.to_path_buf(), _lock: lock });
            }
        }
        Err(std::io::Error::other(format!("{} kept being replaced while locking it", path.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_is_exclusive_and_its_file_goes_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        let held = LockFile::try_acquire(&path).expect("free");
        assert!(LockFile::try_acquire(&path).is_none(), "held already");
        assert!(path.exists());
        drop(held);
        assert!(!path.exists(), "the file went with the lock");
        let waited = std::thread::spawn({
            let path = path.clone();
            let held = LockFile::acquire(&path).unwrap();
            move || {
                std::thread::sleep(std::time::Duration::from_millis(100));
                drop(held);
            }
        });
        // Waits for the holder, then holds a file that is at the path.
        let mine = LockFile::acquire(&path).unwrap();
        assert!(path.exists());
        waited.join().unwrap();
        drop(mine);
        assert!(!path.exists());
    }
}
