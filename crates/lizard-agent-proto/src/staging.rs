//! The staging disk: the bulk data path for file transfers.
//!
//! The agent channel (virtio-serial) moves host → guest data in 4 KiB pieces, one
//! interrupt each, which bounds a file transfer under TCG near 40 MiB/s. Every VM
//! therefore has one more virtio-blk disk, a small raw file in its run directory, laid out
//! as a header and [`SLOTS`] slots of two [`WINDOW`]-sized windows each. The file's
//! contents travel through the windows; the agent channel carries only short notices.
//!
//! A transfer owns one slot (the host locks it) and double-buffers through its two
//! windows:
//!
//! - **write** (host → guest, [`STAGED_WRITE`]): the host `pwrite`s up to a window of the
//!   file into the staging file and sends [`HostMsg::Chunk`]; the agent reads that window
//!   with `O_DIRECT` (the guest's page cache must never hold a stale copy), answers
//!   [`AgentMsg::Ack`] (the window is free again) and writes the bytes into the target's
//!   temporary file. [`HostMsg::End`] closes the transfer; the agent then syncs and
//!   renames exactly as the plain write does and answers [`AgentMsg::Written`].
//! - **read** (guest → host, [`STAGED_READ`]): the agent writes up to a window of the
//!   file into the staging disk with `O_DIRECT` and sends [`AgentMsg::Chunk`]; the host
//!   `pread`s it and answers [`HostMsg::Ack`]. [`AgentMsg::End`] closes it.
//!
//! Both directions are one HTTP/2 request on the agent channel whose bodies carry these
//! messages as JSON lines. Anything that fails before the transfer starts (missing file,
//! a directory, a bad path) is an ordinary error answer with the usual code; a failure
//! during it is [`AgentMsg::Error`] with the same codes. A disk is found by its header
//! ([`MAGIC`]), never by its position, so a transfer can never write into the volume.
//!
//! The disk is migratable like the rest of the VM: template snapshots, their clones and
//! paused sandboxes have it, and nothing about a transfer outlives the session.

use crate::types::{AgentError, WriteResult};
use serde::{Deserialize, Serialize};

/// Write a file through the staging disk: `?path=&mode=&slot=`, body and answer are
/// message lines.
pub const STAGED_WRITE: &str = "/v1/files/staged/write";
/// Read a file through the staging disk: `?path=&slot=`, body and answer are message lines.
pub const STAGED_READ: &str = "/v1/files/staged/read";
/// Content type of the message lines.
pub const CONTENT_TYPE: &str = "application/x-ndjson";
/// Response header of a staged read: the file's length, where the file system knows it.
pub const LENGTH_HEADER: &str = "x-lizard-length";

/// The first bytes of the disk.
pub const MAGIC: &[u8; 16] = b"LIZARD-STAGING-1";
/// Bytes before the first window (the header, padded to the guest's direct-I/O alignment).
pub const HEADER_LEN: u64 = 4096;
/// Bytes of one window: large, so that notices are few, and a multiple of 4 KiB.
pub const WINDOW: u64 = 4 << 20;
/// Windows per slot (double-buffered).
pub const WINDOWS_PER_SLOT: usize = 2;
/// Transfers that can use the disk at once; more run over the agent channel.
pub const SLOTS: u64 = 2;
/// Alignment of the agent's direct I/O (the guest's logical block size divides it).
pub const ALIGN: usize = 4096;
/// The disk's size. Part of the VM's device state, so fixed: a snapshot's clones see the
/// same size.
pub const DISK_LEN: u64 = HEADER_LEN + SLOTS * WINDOWS_PER_SLOT as u64 * WINDOW;

/// Why a slot or window number is out of range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// No such slot.
    #[error("staging slot {0} does not exist")]
    Slot(u64),
    /// No such window in a slot.
    #[error("staging window {0} does not exist")]
    Window(u64),
    /// A chunk longer than a window.
    #[error("staging chunk of {0} bytes is longer than a window")]
    Length(u64),
}

/// Byte offset of `window` of `slot` in the disk, after checking both and that `len`
/// bytes fit in it.
pub fn window_offset(slot: u64, window: u64, len: u64) -> Result<u64, LayoutError> {
    if slot >= SLOTS {
        return Err(LayoutError::Slot(slot));
    }
    if window >= WINDOWS_PER_SLOT as u64 {
        return Err(LayoutError::Window(window));
    }
    if len > WINDOW {
        return Err(LayoutError::Length(len));
    }
    Ok(HEADER_LEN + (slot * WINDOWS_PER_SLOT as u64 + window) * WINDOW)
}

/// `len` rounded up to [`ALIGN`] (what a direct write of `len` bytes covers).
pub fn aligned(len: u64) -> u64 {
    len.div_ceil(ALIGN as u64) * ALIGN as u64
}

/// A notice from the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum HostMsg {
    /// Write: `len` bytes of the file are in `window` of the slot.
    Chunk { window: u64, len: u64 },
    /// Read: the host has copied `window`; the agent may fill it again.
    Ack { window: u64 },
    /// Write: no more data; `bytes` were sent in all.
    End { bytes: u64 },
}

/// A notice from the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum AgentMsg {
    /// Write: the agent has copied `window`; the host may fill it again.
    Ack { window: u64 },
    /// Read: `len` bytes of the file are in `window` of the slot.
    Chunk { window: u64, len: u64 },
    /// Write: the file is in place.
    Written(WriteResult),
    /// Read: the whole file was sent, `bytes` in all.
    End { bytes: u64 },
    /// The transfer failed; nothing was replaced.
    Error(AgentError),
}

/// One message as a JSON line.
pub fn encode<T: Serialize>(msg: &T) -> bytes::Bytes {
    let mut line = serde_json::to_vec(msg).expect("staging messages serialize");
    line.push(b'\n');
    line.into()
}

/// Splits a byte stream into message lines.
#[derive(Debug, Default)]
pub struct LineBuffer {
    buf: bytes::BytesMut,
}

/// A line that is not a message, or one longer than any message.
#[derive(Debug, thiserror::Error)]
pub enum LineError {
    #[error("staging message: {0}")]
    Json(serde_json::Error),
    #[error("staging message longer than {MAX_LINE} bytes")]
    TooLong,
}

impl From<serde_json::Error> for LineError {
    fn from(e: serde_json::Error) -> Self {
        LineError::Json(e)
    }
}

/// Longest message line accepted (an error message with a long path fits).
pub const MAX_LINE: usize = 64 * 1024;

impl LineBuffer {
    /// Add received bytes.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next complete message, if one has arrived.
    pub fn next_message<T: serde::de::DeserializeOwned>(&mut self) -> Result<Option<T>, LineError> {
        match self.buf.iter().position(|b| *b == b'\n') {
            Some(end) => {
                let line = self.buf.split_to(end + 1);
                Ok(Some(serde_json::from_slice(&line[..end])?))
            }
            None if self.buf.len() > MAX_LINE => Err(LineError::TooLong),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_disjoint_aligned_and_inside_the_disk() {
        let mut seen = vec![];
        for slot in 0..SLOTS {
            for w in 0..WINDOWS_PER_SLOT as u64 {
                let at = window_offset(slot, w, WINDOW).unwrap();
                assert_eq!(at % ALIGN as u64, 0);
                assert!(at >= HEADER_LEN && at + WINDOW <= DISK_LEN);
                seen.push(at);
            }
        }
        seen.dedup();
        assert_eq!(seen.len() as u64, SLOTS * WINDOWS_PER_SLOT as u64);
        assert_eq!(window_offset(SLOTS, 0, 1), Err(LayoutError::Slot(SLOTS)));
        assert_eq!(window_offset(0, 2, 1), Err(LayoutError::Window(2)));
        assert_eq!(window_offset(0, 0, WINDOW + 1), Err(LayoutError::Length(WINDOW + 1)));
        assert_eq!((aligned(0), aligned(1), aligned(4096), aligned(4097)), (0, 4096, 4096, 8192));
    }

    #[test]
    fn messages_split_into_lines() {
        let mut wire = Vec::new();
        wire.extend_from_slice(&encode(&HostMsg::Chunk { window: 1, len: 5 }));
        wire.extend_from_slice(&encode(&HostMsg::End { bytes: 5 }));
        let mut lines = LineBuffer::default();
        let mut got: Vec<HostMsg> = vec![];
        for b in &wire {
            lines.push(&[*b]);
            while let Some(m) = lines.next_message().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(got, vec![HostMsg::Chunk { window: 1, len: 5 }, HostMsg::End { bytes: 5 }]);
        let mut bad = LineBuffer::default();
        bad.push(b"{\"bogus\":1}\n");
        assert!(bad.next_message::<HostMsg>().is_err());
        let mut long = LineBuffer::default();
        long.push(&vec![b'x'; MAX_LINE + 1]);
        assert!(matches!(long.next_message::<HostMsg>(), Err(LineError::TooLong)));
    }
}
