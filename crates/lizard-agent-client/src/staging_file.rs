//! The host's end of the staging disk (layout in `lizard_agent_proto::staging`): the raw
//! file in the VM's run directory that the VMM serves as a virtio-blk disk.
//!
//! A transfer claims one slot with an open-file-description lock on a byte of that slot
//! (`F_OFD_SETLK`): a second transfer, in this process or another, finds it taken and
//! uses another slot or the agent channel, and the lock goes away with the file
//! descriptor however the transfer ends. The bytes locked lie in the data area, away from
//! the bytes QEMU locks in the image's first few hundred bytes for its own image locking.

use lizard_agent_proto::staging::{aligned, window_offset, LayoutError, DISK_LEN, MAGIC, SLOTS};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why the staging file could not be made or used.
#[derive(Debug, thiserror::Error)]
pub enum StagingFileError {
    /// Creating, locking, reading or writing the file failed.
    #[error("staging file {path}: {cause}")]
    Io { path: PathBuf, cause: io::Error },
    /// The agent named a window outside the slot, or a chunk longer than a window.
    #[error(transparent)]
    Layout(#[from] LayoutError),
}

/// A VM's staging file.
#[derive(Debug, Clone)]
pub struct StagingFile {
    path: PathBuf,
}

impl StagingFile {
    /// The staging file at `path` (which [`StagingFile::create`] made).
    pub fn at(path: impl Into<PathBuf>) -> StagingFile {
        StagingFile { path: path.into() }
    }

    /// Create the file for a new VM: sparse, [`DISK_LEN`] bytes, the header in front.
    pub fn create(path: &Path) -> Result<StagingFile, StagingFileError> {
        let io = |cause| StagingFileError::Io { path: path.to_path_buf(), cause };
        let file = std::fs::OpenOptions::new().write(true).create_new(true).open(path).map_err(io)?;
        file.set_len(DISK_LEN).map_err(io)?;
        file.write_all_at(MAGIC, 0).map_err(io)?;
        Ok(StagingFile::at(path))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A free slot, or None when every slot is in use (or the file is missing: a VM
    /// made before staging disks existed).
    pub fn claim(&self) -> Result<Option<Slot>, StagingFileError> {
        let io = |cause| StagingFileError::Io { path: self.path.clone(), cause };
        let file = match std::fs::OpenOptions::new().read(true).write(true).open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(e)),
        };
        for slot in 0..SLOTS {
            if try_lock(&file, window_offset(slot, 0, 0)?).map_err(io)? {
                return Ok(Some(Slot { file: Arc::new(file), slot, path: self.path.clone() }));
            }
        }
        Ok(None)
    }
}

/// Take an exclusive OFD lock on the byte at `at`; false when someone else holds it.
fn try_lock(file: &std::fs::File, at: u64) -> io::Result<bool> {
    let start = libc::off_t::try_from(at).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // l_type and l_whence are small constants that fit a c_short.
    #[allow(clippy::cast_possible_truncation)]
    let lock = libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: start,
        l_len: 1,
        l_pid: 0,
    };
    match nix::fcntl::fcntl(file.as_raw_fd(), nix::fcntl::FcntlArg::F_OFD_SETLK(&lock)) {
        Ok(_) => Ok(true),
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// One claimed slot; the claim ends when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct Slot {
    file: Arc<std::fs::File>,
    slot: u64,
    path: PathBuf,
}

impl Slot {
    pub fn number(&self) -> u64 {
        self.slot
    }

    /// Put `data` into `window` (runs on a blocking thread).
    pub async fn put(&self, window: u64, data: bytes::Bytes) -> Result<(), StagingFileError> {
        let at = window_offset(self.slot, window, data.len() as u64)?;
        let (file, path) = (self.file.clone(), self.path.clone());
        blocking(&path, move || file.write_all_at(&data, at)).await
    }

    /// Take `len` bytes out of `window` (runs on a blocking thread).
    pub async fn take(&self, window: u64, len: u64) -> Result<bytes::Bytes, StagingFileError> {
        let at = window_offset(self.slot, window, len)?;
        let n = usize::try_from(len).map_err(|_| LayoutError::Length(len))?;
        let (file, path) = (self.file.clone(), self.path.clone());
        let mut buf = vec![0u8; n];
        blocking(&path, move || file.read_exact_at(&mut buf, at).map(|()| buf)).await.map(bytes::Bytes::from)
    }

    /// Give the slot's disk space back to the host file system (the windows are sparse
    /// again); the contents do not matter between transfers.
    pub async fn release_space(&self) -> Result<(), StagingFileError> {
        let at = window_offset(self.slot, 0, 0)?;
        let len = aligned(lizard_agent_proto::staging::WINDOW * lizard_agent_proto::staging::WINDOWS_PER_SLOT as u64);
        let (file, path) = (self.file.clone(), self.path.clone());
        blocking(&path, move || {
            let (at, len) = (
                libc::off_t::try_from(at).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
                libc::off_t::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
            );
            let mode =
                nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE;
            nix::fcntl::fallocate(file.as_raw_fd(), mode, at, len).map_err(io::Error::from)
        })
        .await
    }
}

async fn blocking<T: Send + 'static>(
    path: &Path,
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> Result<T, StagingFileError> {
    let io = |cause| StagingFileError::Io { path: path.to_path_buf(), cause };
    tokio::task::spawn_blocking(f).await.map_err(|e| io(io::Error::other(e)))?.map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lizard_agent_proto::staging::{WINDOW, WINDOWS_PER_SLOT};

    #[tokio::test]
    async fn slots_are_claimed_once_and_windows_hold_data() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("staging.img");
        let file = StagingFile::create(&path).unwrap();
        assert!(StagingFile::create(&path).is_err(), "an existing staging file was overwritten");
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), DISK_LEN);
        assert!(std::fs::read(&path).unwrap().starts_with(MAGIC));

        let a = file.claim().unwrap().unwrap();
        let b = file.claim().unwrap().unwrap();
        assert_ne!(a.number(), b.number());
        assert!(file.claim().unwrap().is_none(), "a third transfer got a slot of two");
        drop(b);
        let c = file.claim().unwrap().expect("a dropped claim frees its slot");

        a.put(1, bytes::Bytes::from_static(b"hello")).await.unwrap();
        assert_eq!(&a.take(1, 5).await.unwrap()[..], b"hello");
        assert_eq!(c.take(1, 5).await.unwrap(), vec![0u8; 5], "slots share windows");
        assert!(matches!(a.take(WINDOWS_PER_SLOT as u64, 1).await, Err(StagingFileError::Layout(_))));
        assert!(matches!(a.take(0, WINDOW + 1).await, Err(StagingFileError::Layout(_))));
        a.release_space().await.unwrap();
        assert_eq!(a.take(1, 5).await.unwrap(), vec![0u8; 5]);
        assert!(std::fs::read(&path).unwrap().starts_with(MAGIC), "the header survived");
        assert!(StagingFile::at(dir.path().join("none")).claim().unwrap().is_none());
    }
}
