//! Which path a sandbox's file transfers take, and how many took each.
//!
//! Every VM has a staging disk (`staging.img` in its run directory, see
//! `lizard_agent_proto::staging`) through which file contents move in 4 MiB windows by
//! virtio-blk, while the agent channel carries one notice per window; in the guest the
//! agent moves them between that disk and the file with `O_DIRECT`, so the guest's CPU
//! copies nothing (under TCG a CPU copy is emulated: a buffered 64 MiB write into ext4
//! ran at ≈70 MB/s with its fsync, a direct one at ≈375 MB/s).
//!
//! Measured under TCG on the 2-core development machine shared with other builds (load
//! average 5–7), 64 MiB, p50 of 5, MiB/s, all in one run of a debug build of
//! `lizard-bench --creates 1 --execs 5 --transfers 5 --api-creates 1 --api-cold-creates 1
//! --burst 0 --pause-cycles 0 --idle 0 --fork-rounds 0 --pushes false --agent-creates 0
//! --api-transfers 5 --no-snapshots`:
//!
//! | path | write | read |
//! |---|---|---|
//! | agent channel alone (virtio-serial; the baseline) | 53 | 73 |
//! | staging disk, node level | 536 | 1050 |
//! | staging disk, through the HTTP API | 309 | 662 |
//!
//! The 256 MiB VM test (`tests/transfer.rs`) saw 134–310 / 421–685 MiB/s over several
//! runs. The first staged version, which copied through the guest's page cache, reached
//! only 47–61 MiB/s writing (the buffered write and its fsync) and 136–280 reading: the
//! guest's CPU copies, not the channel's 4 KiB buffers, were what remained. (That the
//! channel moves 4 KiB per interrupt into the guest comes from the virtio-serial driver's
//! page-sized receive buffers; a raw `dd` through the port was not measured apart, since
//! the port belongs to the agent.) Other options were not built:
//! several virtio-serial ports would still move 4 KiB per interrupt each, and a TCP
//! connection over the sandbox's virtio-net needs sandbox networking and a per-transfer
//! authentication, where the staging disk works in every VM and migrates with it.
//!
//! The channel stays the fallback: for VMs without the disk (paused before it existed),
//! when both slots are busy, or when the guest cannot find the disk. The counts let tests
//! see which path was used.

use lizard_agent_client::{StagingFile, TransferPath};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// How many file transfers of a sandbox took each path, since the node started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Through the staging disk.
    pub staged: u64,
    /// Over the agent channel.
    pub channel: u64,
}

/// The live counters behind [`TransferStats`].
#[derive(Debug, Default)]
pub(crate) struct TransferCounts {
    staged: AtomicU64,
    channel: AtomicU64,
}

impl TransferCounts {
    pub fn record(&self, path: TransferPath) {
        let counter = match path {
            TransferPath::Staged => &self.staged,
            TransferPath::Channel => &self.channel,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn stats(&self) -> TransferStats {
        TransferStats { staged: self.staged.load(Ordering::Relaxed), channel: self.channel.load(Ordering::Relaxed) }
    }
}

/// The staging file of the VM whose run directory is `run_dir`.
pub(crate) fn staging_file(run_dir: &Path) -> StagingFile {
    StagingFile::at(run_dir.join(crate::vm::STAGING_DISK))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_each_path() {
        let c = TransferCounts::default();
        c.record(TransferPath::Staged);
        c.record(TransferPath::Staged);
        c.record(TransferPath::Channel);
        assert_eq!(c.stats(), TransferStats { staged: 2, channel: 1 });
        assert_eq!(staging_file(Path::new("/r")).path(), Path::new("/r/staging.img"));
    }
}
