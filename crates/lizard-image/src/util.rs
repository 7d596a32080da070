//! Small helpers shared by the builders: running host tools, progress display, atomic
//! publication of artefacts, and the cross-process build lock.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use sha2::{Digest, Sha256};

use crate::ImageError;

/// How much of a failed tool's output goes into the error message.
const OUTPUT_TAIL: usize = 3000;

/// Runs a host tool to completion, capturing its output.
///
/// `install` is the command that installs the tool, quoted in the error when it is missing.
pub(crate) fn run(cmd: &mut Command, install: &str) -> Result<Output, ImageError> {
    let line = command_line(cmd);
    tracing::debug!(command = %line, "running");
    let output = cmd.output().map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            ImageError::ToolMissing { tool: cmd.get_program().to_string_lossy().into_owned(), install: install.into() }
        } else {
            ImageError::Command { command: line.clone(), status: "could not start".into(), output: e.to_string() }
        }
    })?;
    if !output.status.success() {
        let text = if output.stderr.iter().any(|b| !b.is_ascii_whitespace()) { &output.stderr } else { &output.stdout };
        return Err(ImageError::Command { command: line, status: output.status.to_string(), output: tail(text) });
    }
    Ok(output)
}

fn command_line(cmd: &Command) -> String {
    std::iter::once(cmd.get_program()).chain(cmd.get_args()).map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ")
}

/// The last [`OUTPUT_TAIL`] bytes of a tool's output, trimmed to whole lines.
fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    if text.len() <= OUTPUT_TAIL {
        return text.to_owned();
    }
    let mut start = text.len() - OUTPUT_TAIL;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let cut = &text[start..];
    format!("...{}", cut.split_once('\n').map_or(cut, |(_, rest)| rest))
}

/// A long step: a spinner on an interactive stderr (indicatif hides it otherwise) plus a log
/// line with the duration when it ends.
pub(crate) struct Step {
    bar: ProgressBar,
    name: String,
    started: Instant,
}

impl Step {
    pub(crate) fn start(name: impl Into<String>) -> Self {
        let name = name.into();
        tracing::info!(step = %name, "started");
        let bar = ProgressBar::new_spinner();
        bar.set_style(ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("valid template"));
        bar.set_message(name.clone());
        bar.enable_steady_tick(Duration::from_millis(120));
        Step { bar, name, started: Instant::now() }
    }

    pub(crate) fn finish(self) {
        self.bar.finish_and_clear();
        tracing::info!(step = %self.name, elapsed_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX), "done");
    }
}

/// An exclusive `flock` on `<images>/.lock-<kind>`, held while an artefact of that kind is
/// built so that concurrent processes build it once. Released on drop.
pub(crate) struct BuildLock {
    _lock: Flock<File>,
}

impl BuildLock {
    pub(crate) fn acquire(images_dir: &Path, kind: &str) -> Result<Self, ImageError> {
        fs::create_dir_all(images_dir).map_err(ImageError::io("create directory", images_dir))?;
        let path = images_dir.join(format!(".lock-{kind}"));
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(ImageError::io("open lock file", &path))?;
        let lock_err = |errno: Errno| ImageError::Io { action: "lock", path: path.clone(), cause: errno.into() };
        let lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((file, Errno::EWOULDBLOCK)) => {
                tracing::info!(lock = %path.display(), "another process is building this artefact; waiting");
                Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| lock_err(e))?
            }
            Err((_, e)) => return Err(lock_err(e)),
        };
        Ok(BuildLock { _lock: lock })
    }
}

/// A published artefact directory marked as in use by this process: a shared `flock` on
/// the directory itself, released when the process lets go of it or exits (so a crashed
/// server holds nothing). Pruning takes the exclusive lock without waiting and leaves a
/// held directory alone.
#[derive(Debug)]
pub(crate) struct InUse {
    _lock: Flock<File>,
}

impl InUse {
    /// Hold `dir`; `None` if it does not exist (pruned or never published). Waits only for a
    /// prune that is removing this very directory, after which it is gone.
    pub(crate) fn hold(dir: &Path) -> Result<Option<Self>, ImageError> {
        let file = match File::open(dir) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ImageError::io("open", dir)(e)),
        };
        let lock = Flock::lock(file, FlockArg::LockShared).map_err(|(_, e)| ImageError::Io {
            action: "lock",
            path: dir.to_owned(),
            cause: e.into(),
        })?;
        Ok(dir.exists().then_some(InUse { _lock: lock }))
    }

    /// The exclusive lock of `dir` if no process holds it; `None` if one does.
    pub(crate) fn unused(dir: &Path) -> Result<Option<Flock<File>>, ImageError> {
        let file = File::open(dir).map_err(ImageError::io("open", dir))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(Some(lock)),
            Err((_, Errno::EWOULDBLOCK)) => Ok(None),
            Err((_, e)) => Err(ImageError::Io { action: "lock", path: dir.to_owned(), cause: e.into() }),
        }
    }
}

/// Removes leftovers (`.tmp-*`) of builds that died; only call while holding the lock.
pub(crate) fn remove_stale_temps(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(".tmp-") {
            let path = entry.path();
            tracing::debug!(path = %path.display(), "removing a leftover of an interrupted build");
            let _ = if path.is_dir() { fs::remove_dir_all(&path) } else { fs::remove_file(&path) };
        }
    }
}

/// A temporary directory next to the final artefact, so publication is a same-filesystem rename.
pub(crate) fn temp_dir_in(dir: &Path) -> Result<tempfile::TempDir, ImageError> {
    fs::create_dir_all(dir).map_err(ImageError::io("create directory", dir))?;
    tempfile::Builder::new()
        .prefix(".tmp-")
        .tempdir_in(dir)
        .map_err(ImageError::io("create temporary directory in", dir))
}

/// Writes `bytes` to `path` and flushes them to disk.
pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), ImageError> {
    let mut f = File::create(path).map_err(ImageError::io("create", path))?;
    f.write_all(bytes).map_err(ImageError::io("write", path))?;
    f.sync_all().map_err(ImageError::io("sync", path))
}

/// Flushes a file (or a directory's entries) that something else wrote to disk.
pub(crate) fn sync_path(path: &Path) -> Result<(), ImageError> {
    File::open(path).and_then(|f| f.sync_all()).map_err(ImageError::io("sync", path))
}

/// Atomically moves a fully written and synced `staged` file or directory to `dest`.
///
/// `dest` only ever appears complete; an incomplete one left by an older layout is replaced.
pub(crate) fn publish(staged: &Path, dest: &Path) -> Result<(), ImageError> {
    sync_path(staged)?;
    if dest.is_dir() {
        fs::remove_dir_all(dest).map_err(ImageError::io("remove incomplete", dest))?;
    }
    fs::rename(staged, dest).map_err(ImageError::io("rename into place", dest))?;
    if let Some(parent) = dest.parent() {
        sync_path(parent)?;
    }
    Ok(())
}

/// Reads a JSON metadata file; `None` when missing or unreadable (the artefact is then
/// treated as absent and rebuilt).
pub(crate) fn read_meta<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    let bytes = fs::read(path).ok()?;
    match serde_json::from_slice(&bytes) {
        Ok(meta) => Some(meta),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "ignoring unreadable cache metadata");
            None
        }
    }
}

/// Serialises metadata as pretty JSON and writes it synced.
pub(crate) fn write_meta<T: serde::Serialize>(path: &Path, meta: &T) -> Result<(), ImageError> {
    let mut json = serde_json::to_vec_pretty(meta)
        .map_err(|e| ImageError::Metadata { path: path.to_owned(), reason: e.to_string() })?;
    json.push(b'\n');
    write_synced(path, &json)
}

/// A SHA-256 over length-prefixed parts, so that moving bytes between parts changes it.
#[derive(Default)]
pub(crate) struct Hasher(Sha256);

impl Hasher {
    pub(crate) fn part(&mut self, bytes: impl AsRef<[u8]>) -> &mut Self {
        let bytes = bytes.as_ref();
        self.0.update((bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
        self
    }

    pub(crate) fn hex(self) -> String {
        hex::encode(self.0.finalize())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hasher_separates_parts() {
        let mut a = Hasher::default();
        a.part("ab").part("c");
        let mut b = Hasher::default();
        b.part("a").part("bc");
        assert_ne!(a.hex(), b.hex());
    }

    #[test]
    fn tail_keeps_the_end() {
        let long = "line\n".repeat(2000) + "the error";
        let t = tail(long.as_bytes());
        assert!(t.len() <= OUTPUT_TAIL + 3 && t.ends_with("the error") && t.starts_with("...line"));
    }

    #[test]
    fn missing_tool_names_the_install_command() {
        let e = run(&mut Command::new("lizard-no-such-tool"), "apt-get install lizard").unwrap_err();
        assert!(e.to_string().contains("apt-get install lizard"), "{e}");
    }

    #[test]
    fn lock_serialises_builders() {
        let dir = tempfile::tempdir().unwrap();
        let held = BuildLock::acquire(dir.path(), "test").unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let path = dir.path().to_owned();
        let waiter = std::thread::spawn(move || {
            let _l = BuildLock::acquire(&path, "test").unwrap();
            tx.send(()).unwrap();
        });
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err(), "second lock must wait");
        drop(held);
        rx.recv_timeout(Duration::from_secs(5)).expect("second lock acquired after release");
        waiter.join().unwrap();
    }
}
