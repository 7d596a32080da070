//! Which path a sandbox's file transfers take, and how many took each.
//!
//! Every VM has a staging disk (`staging.img` in its run directory, see
//! `lizard_agent_proto::staging`) through which file contents move in 4 MiB windows by
//! virtio-blk, while the agent channel carries one notice per window. Measured under TCG
//! on the 2-core development machine, node level, 64 MiB (see the README's performance
//! section for the command): through the agent channel (virtio-serial, 4 KiB per
//! interrupt into the guest) writes ran at 36 MiB/s and reads at 43 MiB/s; through the
//! staging disk see the numbers in the README. The channel stays the fallback: for VMs
//! without the disk (paused before it existed), when both slots are busy, or when the
//! guest cannot find the disk. The counts let tests see which path was used.

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
