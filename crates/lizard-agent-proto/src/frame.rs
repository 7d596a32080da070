//! Framing of exec streams: `[kind: u8][len: u32 big-endian][len bytes]`.
//!
//! Binary frames keep stdout/stderr bytes exact (no UTF-8 or base64 detour) and let both
//! sides stream without buffering a whole command's output.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

/// Largest frame payload accepted; writers split larger chunks.
pub const MAX_FRAME: usize = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// Request: the JSON [`crate::types::ExecRequest`]; always the first frame.
    Start = 1,
    /// Request: bytes for the command's stdin.
    Stdin = 2,
    /// Request: stdin is finished (the command sees EOF).
    StdinEof = 3,
    /// Response: bytes the command wrote to stdout.
    Stdout = 4,
    /// Response: bytes the command wrote to stderr.
    Stderr = 5,
    /// Response: the JSON [`crate::types::ExitStatus`]; always the last frame of a success.
    Exit = 6,
    /// Response: the JSON [`crate::types::AgentError`] when the command could not run.
    Error = 7,
    /// Response: the JSON [`crate::types::ProcessInfo`] of a background process; always
    /// the first frame of [`crate::routes::PROCESSES`] and [`crate::routes::process_output`].
    Started = 8,
}

impl TryFrom<u8> for FrameKind {
    type Error = FrameError;
    fn try_from(v: u8) -> Result<Self, FrameError> {
        Ok(match v {
            1 => FrameKind::Start,
            2 => FrameKind::Stdin,
            3 => FrameKind::StdinEof,
            4 => FrameKind::Stdout,
            5 => FrameKind::Stderr,
            6 => FrameKind::Exit,
            7 => FrameKind::Error,
            8 => FrameKind::Started,
            other => return Err(FrameError::UnknownKind(other)),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: FrameKind,
    pub data: Bytes,
}

impl Frame {
    pub fn new(kind: FrameKind, data: impl Into<Bytes>) -> Self {
        Frame { kind, data: data.into() }
    }
    /// A frame whose payload is `value` as JSON.
    pub fn json<T: serde::Serialize>(kind: FrameKind, value: &T) -> Self {
        Frame::new(kind, serde_json::to_vec(value).expect("protocol types serialize"))
    }
    /// Encode into a standalone buffer.
    pub fn to_bytes(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(5 + self.data.len());
        FrameCodec.encode(self.clone(), &mut b).expect("encoding into memory cannot fail");
        b.freeze()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame i/o: {0}")]
    Io(std::io::Error),
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("frame of {0} bytes exceeds the limit")]
    TooLarge(usize),
}

impl From<std::io::Error> for FrameError {
    fn from(e: std::io::Error) -> Self {
        FrameError::Io(e)
    }
}

/// tokio-util codec for [`Frame`]s.
#[derive(Debug, Default, Clone, Copy)]
pub struct FrameCodec;

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = FrameError;
    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        if src.len() < 5 {
            return Ok(None);
        }
        let kind = FrameKind::try_from(src[0])?;
        let len = u32::from_be_bytes([src[1], src[2], src[3], src[4]]) as usize;
        if len > MAX_FRAME {
            return Err(FrameError::TooLarge(len));
        }
        if src.len() < 5 + len {
            src.reserve(5 + len - src.len());
            return Ok(None);
        }
        src.advance(5);
        Ok(Some(Frame { kind, data: src.split_to(len).freeze() }))
    }
}

impl Encoder<Frame> for FrameCodec {
    type Error = FrameError;
    fn encode(&mut self, f: Frame, dst: &mut BytesMut) -> Result<(), FrameError> {
        let len = u32::try_from(f.data.len())
            .ok()
            .filter(|_| f.data.len() <= MAX_FRAME)
            .ok_or(FrameError::TooLarge(f.data.len()))?;
        dst.reserve(5 + f.data.len());
        dst.put_u8(f.kind as u8);
        dst.put_u32(len);
        dst.extend_from_slice(&f.data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_in_pieces() {
        let frames = vec![
            Frame::new(FrameKind::Stdout, &b"hello"[..]),
            Frame::new(FrameKind::Stderr, Bytes::new()),
            Frame::new(FrameKind::Exit, &b"{}"[..]),
        ];
        let mut wire = BytesMut::new();
        for f in &frames {
            wire.extend_from_slice(&f.to_bytes());
        }
        // Feed one byte at a time: the decoder must wait for whole frames.
        let mut buf = BytesMut::new();
        let mut out = vec![];
        for b in wire.iter() {
            buf.put_u8(*b);
            while let Some(f) = FrameCodec.decode(&mut buf).unwrap() {
                out.push(f);
            }
        }
        assert_eq!(out, frames);
    }

    #[test]
    fn rejects_unknown_kind_and_oversize() {
        let mut b = BytesMut::from(&[99u8, 0, 0, 0, 0][..]);
        assert!(matches!(FrameCodec.decode(&mut b), Err(FrameError::UnknownKind(99))));
        let mut b = BytesMut::from(&[4u8, 0xff, 0xff, 0xff, 0xff][..]);
        assert!(matches!(FrameCodec.decode(&mut b), Err(FrameError::TooLarge(_))));
    }
}
