//! Host uids for VMM processes: one per running VMM, taken from a configured range and
//! owned through a `flock` on a file under a host-wide directory (shared by every node of
//! the host, as network slots are).
//!
//! The lock's open file is inherited by the VMM itself ([`UidClaim::fd`] is passed to the
//! child), so the claim lasts exactly as long as the VMM process: a node that dies leaves
//! its VMMs' uids claimed until they end, and a VMM killed by anyone frees its uid.
//!
//! A released claim removes its file ([`UidClaim::release`], unlinked while still locked),
//! and [`sweep`] removes the files of free uids an earlier node left, so the directory
//! holds about one file per running VMM. A claimer may have opened a file just before
//! its last holder unlinked it: on locking it checks that its path still names the file
//! it locked, else it opens the path again ([`lock`]).

use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// A range of host uids (and equal gids) that belong to VMM processes only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    pub first: u32,
    pub count: u32,
}

impl UidRange {
    /// 65 536 ids from 1 500 000: far above the ids distributions hand out, and below
    /// the 2^31 that some tools take for signed.
    pub const DEFAULT: UidRange = UidRange { first: 1_500_000, count: 65_536 };

    pub fn contains(&self, uid: u32) -> bool {
        uid.checked_sub(self.first).is_some_and(|i| i < self.count)
    }
}

/// Why no uid could be claimed.
#[derive(Debug, thiserror::Error)]
pub enum UidError {
    /// The claims directory cannot be made.
    #[error("uid claims directory {}: {cause}", .dir.display())]
    Dir { dir: PathBuf, cause: std::io::Error },
    /// Every uid of the range is held by a live VMM.
    #[error("all {count} VMM uids from {first} are in use")]
    Exhausted { first: u32, count: u32 },
    /// The range wraps past u32::MAX or is empty.
    #[error("uid range {first}+{count} is empty or overflows")]
    BadRange { first: u32, count: u32 },
}

/// One uid, held while the lock file is open (here or in the VMM that inherited it).
#[derive(Debug)]
pub struct UidClaim {
    pub uid: u32,
    path: PathBuf,
    lock: nix::fcntl::Flock<std::fs::File>,
}

impl UidClaim {
    /// The locked file's descriptor, for the child to inherit.
    pub fn fd(&self) -> RawFd {
        self.lock.as_raw_fd()
    }

    /// Free the uid and remove its file. Only once no VMM holds the lock through this
    /// claim any more (it has ended, or never started): the lock is the file's, and a
    /// VMM that inherited it would keep a file nobody can find.
    pub fn release(self) {
        // Unlinked while locked: whoever opened it meanwhile finds it stale on locking.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// How often a claimer opens a path again whose file was removed under it.
const STALE_RETRIES: usize = 3;

/// Lock the claim file at `path` without waiting: `None` when someone holds it.
fn lock(path: &Path) -> Option<nix::fcntl::Flock<std::fs::File>> {
    for _ in 0..STALE_RETRIES {
        let file = std::fs::OpenOptions::new().create(true).truncate(false).read(true).write(true).open(path).ok()?;
        match lock_opened(path, file) {
            Locked::Held(lock) => return Some(lock),
            Locked::Busy => return None,
            Locked::Stale => continue,
        }
    }
    None
}

enum Locked {
    Held(nix::fcntl::Flock<std::fs::File>),
    Busy,
    /// Locked, but `path` names another file now (or none): its holder released it.
    Stale,
}

fn lock_opened(path: &Path, file: std::fs::File) -> Locked {
    use std::os::unix::fs::MetadataExt;
    let Ok(lock) = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) else {
        return Locked::Busy;
    };
    match (lock.metadata(), std::fs::metadata(path)) {
        (Ok(held), Ok(named)) if (held.dev(), held.ino()) == (named.dev(), named.ino()) => Locked::Held(lock),
        _ => Locked::Stale,
    }
}

fn claim_path(dir: &Path, uid: u32) -> PathBuf {
    dir.join(format!("uid-{uid}.lock"))
}

/// Where allocation starts next: spread over the range so that uids are seldom reused
/// soon (files a VMM left behind stay unreadable to the next ones for longer) and nodes
/// sharing the range rarely race for the same id.
static CURSOR: AtomicU32 = AtomicU32::new(u32::MAX);

fn start_cursor(count: u32) -> u32 {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos())
        ^ std::process::id().rotate_left(16);
    seed % count.max(1)
}

/// Check `range` and make `dir`, the host-wide claims directory (root only).
pub fn check(range: UidRange, dir: &Path) -> Result<(), UidError> {
    if range.count == 0 || range.first.checked_add(range.count).is_none() || range.first == 0 {
        return Err(UidError::BadRange { first: range.first, count: range.count });
    }
    std::fs::create_dir_all(dir).map_err(|cause| UidError::Dir { dir: dir.to_owned(), cause })?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|cause| UidError::Dir { dir: dir.to_owned(), cause })
}

/// Claim a free uid of `range` under `dir`.
pub fn claim(range: UidRange, dir: &Path) -> Result<UidClaim, UidError> {
    check(range, dir)?;
    let _ = CURSOR.compare_exchange(u32::MAX, start_cursor(range.count), Ordering::Relaxed, Ordering::Relaxed);
    for _ in 0..range.count {
        let offset = CURSOR.fetch_add(1, Ordering::Relaxed) % range.count;
        let uid = range.first + offset;
        debug_assert!(range.contains(uid));
        if let Some(claim) = try_claim(uid, dir) {
            return Ok(claim);
        }
    }
    Err(UidError::Exhausted { first: range.first, count: range.count })
}

/// `uid`'s claim under `dir`, if nobody holds it now.
pub fn try_claim(uid: u32, dir: &Path) -> Option<UidClaim> {
    let path = claim_path(dir, uid);
    let lock = lock(&path)?;
    Some(UidClaim { uid, path, lock })
}

/// Remove the files of uids nobody holds (left by node processes before this one, or by
/// versions that kept them); the number removed.
pub fn sweep(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let uids: Vec<u32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("uid-")?.strip_suffix(".lock")?.parse().ok())
        .collect();
    uids.into_iter().filter_map(|uid| try_claim(uid, dir)).map(UidClaim::release).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_are_distinct_while_held_and_free_once_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let range = UidRange { first: 2_000_000, count: 3 };
        let a = claim(range, dir.path()).unwrap();
        let b = claim(range, dir.path()).unwrap();
        let c = claim(range, dir.path()).unwrap();
        let mut uids = [a.uid, b.uid, c.uid];
        uids.sort_unstable();
        assert_eq!(uids, [2_000_000, 2_000_001, 2_000_002]);
        assert!(matches!(claim(range, dir.path()), Err(UidError::Exhausted { .. })));
        let freed = b.uid;
        assert!(try_claim(freed, dir.path()).is_none());
        drop(b);
        assert!(try_claim(freed, dir.path()).is_some());
        assert_eq!(claim(range, dir.path()).unwrap().uid, freed);
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    }

    #[test]
    fn a_released_claim_leaves_no_file_and_its_uid_is_claimed_again() {
        let dir = tempfile::tempdir().unwrap();
        let range = UidRange { first: 2_000_000, count: 2 };
        let (a, b) = (claim(range, dir.path()).unwrap(), claim(range, dir.path()).unwrap());
        let freed = a.uid;
        a.release();
        assert_eq!(files(dir.path()), [format!("uid-{}.lock", b.uid)]);
        let again = claim(range, dir.path()).unwrap();
        assert_eq!(again.uid, freed);
        assert!(claim(range, dir.path()).is_err(), "both held again");
    }

    #[test]
    fn a_file_opened_before_its_release_is_stale_and_the_uid_goes_to_one_claimer() {
        let dir = tempfile::tempdir().unwrap();
        let held = try_claim(7, dir.path()).unwrap();
        let path = claim_path(dir.path(), 7);
        // A racing claimer opened the file, then the holder released it.
        let opened_early = std::fs::File::open(&path).unwrap();
        held.release();
        assert!(matches!(lock_opened(&path, opened_early), Locked::Stale), "its path names no file now");
        let winner = try_claim(7, dir.path()).expect("a fresh file is claimed");
        // The early opener tries again: the path's file is the winner's, locked.
        let reopened = std::fs::File::open(&path).unwrap();
        assert!(matches!(lock_opened(&path, reopened), Locked::Busy));
        assert!(try_claim(7, dir.path()).is_none());
        drop(winner);
    }

    #[test]
    fn the_sweep_removes_free_uids_files_and_keeps_held_ones() {
        let dir = tempfile::tempdir().unwrap();
        let held = try_claim(11, dir.path()).unwrap();
        for uid in [12, 13] {
            drop(try_claim(uid, dir.path()).unwrap()); // dropped, not released: a node that died
        }
        std::fs::write(dir.path().join("other"), "").unwrap();
        assert_eq!(sweep(dir.path()), 2);
        assert_eq!(files(dir.path()), ["other", "uid-11.lock"]);
        assert!(try_claim(11, dir.path()).is_none(), "still held");
        drop(held);
    }

    #[test]
    fn empty_or_wrapping_ranges_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(check(UidRange { first: 5, count: 0 }, dir.path()), Err(UidError::BadRange { .. })));
        assert!(matches!(check(UidRange { first: u32::MAX, count: 2 }, dir.path()), Err(UidError::BadRange { .. })));
        assert!(matches!(check(UidRange { first: 0, count: 2 }, dir.path()), Err(UidError::BadRange { .. })));
    }
}
