//! A bound on the guest's serial console log: a guest that floods its console must not
//! fill the host's disk. QEMU appends to the file (`append=on`); while the VMM runs, the
//! node checks its size every [`CHECK_EVERY`] and, past [`MAX_BYTES`], cuts it to its last
//! [`KEEP_BYTES`] (the end is what a failed boot's diagnosis needs).

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Largest the console log may grow between checks before it is cut.
pub const MAX_BYTES: u64 = 1 << 20;
/// What is kept of it when it is cut.
pub const KEEP_BYTES: u64 = 64 << 10;
/// How often its size is checked. A guest writes its serial port at a few MB/s at most
/// under TCG, so the log stays within a few MB of [`MAX_BYTES`].
const CHECK_EVERY: Duration = Duration::from_millis(500);

/// Keep `path` bounded while `running` holds.
pub(crate) async fn cap(path: PathBuf, running: Arc<AtomicBool>) {
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while running.load(Ordering::SeqCst) {
        tick.tick().await;
        let log = path.clone();
        let cut = tokio::task::spawn_blocking(move || cut_if_over(&log, MAX_BYTES, KEEP_BYTES)).await;
        if let Ok(Err(e)) = cut {
            tracing::warn!("console log {}: {e}", path.display());
        }
    }
}

/// Cut `path` to its last `keep` bytes if it is longer than `max`; true if it was cut.
pub(crate) fn cut_if_over(path: &Path, max: u64, keep: u64) -> std::io::Result<bool> {
    let len = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    if len <= max {
        return Ok(false);
    }
    let mut file = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
    file.seek(SeekFrom::Start(len - keep.min(len)))?;
    let mut tail = Vec::new();
    Read::by_ref(&mut file).take(keep).read_to_end(&mut tail)?;
    // Bytes QEMU appends between the cut and the rewrite land after the kept tail.
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(b"[lizard: console log cut here]\n")?;
    file.write_all(&tail)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_log_is_cut_to_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("console.log");
        assert!(!cut_if_over(&log, 10, 4).unwrap(), "a missing log is no error");
        std::fs::write(&log, b"0123456789").unwrap();
        assert!(!cut_if_over(&log, 10, 4).unwrap());
        std::fs::write(&log, b"0123456789abcdef").unwrap();
        assert!(cut_if_over(&log, 10, 4).unwrap());
        assert_eq!(std::fs::read(&log).unwrap(), b"[lizard: console log cut here]\ncdef");
    }
}
