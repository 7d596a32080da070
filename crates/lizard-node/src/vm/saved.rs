//! A paused VM saved in its run directory, in one of three forms:
//!
//! - its memory is its own file (cold boot): device state only, beside that file;
//! - a copy-on-write clone (of a template's or a fork's memory): the pages it changed
//!   over its base ([`lizard_vmm::delta`]) and device state without RAM, beside a hard
//!   link to the base, so that the clone does not depend on the original's directory;
//! - a full save (device state and all of memory), which template clones were paused to
//!   before memory deltas, and which a clone whose base cannot be linked falls back to.

use super::run_dir::{FULL_STATE, VMSTATE};
use lizard_vmm::{DeltaSnapshot, Snapshot, Vm, VmmError};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A hard link to the file a copy-on-write clone's memory maps.
pub(crate) const BASE_MEMORY: &str = "base-memory";
/// The guest pages a paused copy-on-write clone changed over [`BASE_MEMORY`].
pub(crate) const MEMORY_DELTA: &str = "memory.delta";
/// Device state, without RAM, of a paused copy-on-write clone.
pub(crate) const DEVICE_STATE: &str = "devices";
/// A VM's own memory file ([`lizard_vmm::VmConfig::memory_file`]).
const OWN_MEMORY: &str = "memory";

/// How a paused VM was saved into its run directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SavedForm {
    /// Device state; memory in the VM's own file.
    DeviceState,
    /// Memory delta and device state over the linked base memory.
    Delta,
    /// Device state and all of memory in one file.
    Full,
}

/// The delta save of a copy-on-write clone in `run_dir`.
pub(crate) fn delta_snapshot(run_dir: &Path) -> DeltaSnapshot {
    DeltaSnapshot {
        base: run_dir.join(BASE_MEMORY),
        delta: run_dir.join(MEMORY_DELTA),
        devices: run_dir.join(DEVICE_STATE),
    }
}

/// Hard-link `base` (the file a clone's memory maps) into `run_dir`, unless the link is
/// already there. Links are free and keep the file's pages alive however long the
/// original stays; they need the same filesystem.
pub(crate) fn link_base(base: &Path, run_dir: &Path) -> std::io::Result<PathBuf> {
    let link = run_dir.join(BASE_MEMORY);
    use std::os::unix::fs::MetadataExt;
    if base == link {
        return Ok(link);
    }
    let original = std::fs::metadata(base)?;
    match std::fs::metadata(&link) {
        Ok(m) if (m.dev(), m.ino()) == (original.dev(), original.ino()) => return Ok(link),
        // Another file (a base from before a fork): replaced.
        Ok(_) => std::fs::remove_file(&link)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::hard_link(base, &link)?;
    Ok(link)
}

/// Save paused `vm` into its run directory: device state only when guest memory is its
/// own file (`own_memory`); else the pages it changed over its base (linked into the
/// run directory) — or, when the base cannot be linked, all of memory. Returns once what
/// it saved is on the disk (fsync): a pause reported done survives a host crash.
pub(crate) async fn save_paused(vm: &dyn Vm, own_memory: bool) -> Result<SavedForm, VmmError> {
    let form = save(vm, own_memory).await?;
    let run_dir = vm.config().run_dir.clone();
    tokio::task::spawn_blocking(move || persist(&run_dir, form))
        .await
        .expect("persist task panicked")
        .map_err(|cause| VmmError::Io { context: "sync the saved VM to disk".into(), cause })?;
    Ok(form)
}

/// The files a save of `form` consists of.
fn files_of(form: SavedForm) -> &'static [&'static str] {
    match form {
        // Guest memory is the VM's own file, mapped shared: its pages are the save too.
        SavedForm::DeviceState => &[VMSTATE, OWN_MEMORY],
        SavedForm::Delta => &[MEMORY_DELTA, DEVICE_STATE, BASE_MEMORY],
        SavedForm::Full => &[FULL_STATE],
    }
}

/// fsync the files of a save of `form` in `run_dir`, then the directory (their names).
fn persist(run_dir: &Path, form: SavedForm) -> std::io::Result<()> {
    for name in files_of(form) {
        std::fs::File::open(run_dir.join(name))?.sync_all()?;
    }
    std::fs::File::open(run_dir)?.sync_all()
}

async fn save(vm: &dyn Vm, own_memory: bool) -> Result<SavedForm, VmmError> {
    let run_dir = vm.config().run_dir.clone();
    if own_memory {
        let saved = Snapshot { vmstate: run_dir.join(VMSTATE), memory: vm.config().memory_file() };
        vm.snapshot(&saved).await?;
        return Ok(SavedForm::DeviceState);
    }
    let linked = match vm.memory_base() {
        Some(base) => link_base(base, &run_dir).map_err(
            |e| tracing::warn!(id = %vm.config().id, "cannot link the base memory, saving all of memory: {e}"),
        ),
        None => Err(()),
    };
    if linked.is_err() {
        vm.save_all(&run_dir.join(FULL_STATE)).await?;
        return Ok(SavedForm::Full);
    }
    let saved = delta_snapshot(&run_dir);
    let stats = vm.save_delta(&saved.delta, &saved.devices).await?;
    tracing::debug!(id = %vm.config().id, pages = stats.pages, bytes = stats.bytes, "memory delta saved");
    Ok(SavedForm::Delta)
}

/// The form [`save_paused`] left in `run_dir`, if a complete one is there. A delta save
/// counts once its device state is there: a missing or damaged delta beside it fails the
/// resume with a clear error rather than passing for no save at all.
pub(crate) fn saved_form(run_dir: &Path, own_memory: bool) -> Option<SavedForm> {
    let has = |f: &str| run_dir.join(f).is_file();
    if own_memory {
        return has(VMSTATE).then_some(SavedForm::DeviceState);
    }
    if has(DEVICE_STATE) && has(BASE_MEMORY) {
        Some(SavedForm::Delta)
    } else {
        has(FULL_STATE).then_some(SavedForm::Full)
    }
}

/// Remove what [`save_paused`] wrote, once the VM runs again (the base link stays: the
/// running clone maps it). The files are renamed out of the way at once and deleted on a
/// thread of their own: freeing a delta of hundreds of MiB takes the filesystem tens of
/// milliseconds, which a resume need not wait for.
pub(crate) fn discard_saved(run_dir: &Path) {
    static DISCARDS: AtomicU64 = AtomicU64::new(0);
    let n = DISCARDS.fetch_add(1, Ordering::Relaxed);
    let doomed: Vec<PathBuf> = [FULL_STATE, VMSTATE, MEMORY_DELTA, DEVICE_STATE]
        .into_iter()
        .filter_map(|f| {
            let discarded = run_dir.join(format!("{f}.discarded-{n}"));
            std::fs::rename(run_dir.join(f), &discarded).ok().map(|()| discarded)
        })
        .collect();
    if doomed.is_empty() {
        return;
    }
    let remove = move || {
        for f in &doomed {
            let _ = std::fs::remove_file(f);
        }
    };
    if let Err(e) = std::thread::Builder::new().name("discard-save".into()).spawn(remove) {
        tracing::warn!("cannot start a thread to delete a discarded save (left in {}): {e}", run_dir.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_saved_form_is_read_from_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let touch = |f: &str| std::fs::write(d.join(f), b"x").unwrap();
        assert_eq!(saved_form(d, true), None);
        assert_eq!(saved_form(d, false), None);
        touch(VMSTATE);
        assert_eq!(saved_form(d, true), Some(SavedForm::DeviceState));
        touch(FULL_STATE);
        assert_eq!(saved_form(d, false), Some(SavedForm::Full));
        touch(BASE_MEMORY);
        touch(DEVICE_STATE);
        // The delta itself missing: still a delta save, whose resume reports it.
        assert_eq!(saved_form(d, false), Some(SavedForm::Delta));
        discard_saved(d);
        assert!(d.join(BASE_MEMORY).exists(), "the base link went with the save");
        assert_eq!(saved_form(d, false), None);
        // Deleted in the background: soon nothing but the base link is left.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let names = || -> Vec<_> { std::fs::read_dir(d).unwrap().flatten().map(|e| e.file_name()).collect() };
        while names().len() > 1 {
            assert!(std::time::Instant::now() < deadline, "left: {:?}", names());
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    #[test]
    fn persisting_a_save_needs_all_of_its_files() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for form in [SavedForm::DeviceState, SavedForm::Delta, SavedForm::Full] {
            assert!(persist(d, form).is_err(), "{form:?} persisted without its files");
            for f in files_of(form) {
                std::fs::write(d.join(f), b"x").unwrap();
            }
            persist(d, form).unwrap();
        }
    }

    #[test]
    fn the_base_is_linked_once() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("memory");
        std::fs::write(&base, b"guest").unwrap();
        let run = dir.path().join("run");
        std::fs::create_dir(&run).unwrap();
        let link = link_base(&base, &run).unwrap();
        assert_eq!(std::fs::read(&link).unwrap(), b"guest");
        // Again, over the old link, and from the link itself.
        assert_eq!(link_base(&base, &run).unwrap(), link);
        assert_eq!(link_base(&link, &run).unwrap(), link);
        // Another base replaces the link.
        let other = dir.path().join("other");
        std::fs::write(&other, b"fork").unwrap();
        assert_eq!(std::fs::read(link_base(&other, &run).unwrap()).unwrap(), b"fork");
        std::fs::remove_file(&other).unwrap();
        assert_eq!(std::fs::read(&link).unwrap(), b"fork", "the link does not outlive the original");
        // A base that is gone: an error, and the link stays.
        assert!(link_base(&other, &run).is_err());
        assert!(link.exists());
    }
}
