//! A byte stream that can be cut from outside.
//!
//! hyper's HTTP/2 client drives a connection in a task of its own, which runs for as long
//! as any request handle or response body still uses it: dropping our side of it ends
//! nothing, and while the peer keeps its end open (a VMM kept after a pause) every stream
//! on it would hang. [`crate::AgentClient::shutdown`] has to end the session now, so the
//! session's byte stream is wrapped: once cut, reads see its end and writes fail, and the
//! connection task ends, failing every stream on it.

use futures_util::task::AtomicWaker;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Cuts the [`Cuttable`] it came with.
pub(crate) struct Cutter(Arc<Shared>);

#[derive(Default)]
struct Shared {
    cut: AtomicBool,
    reader: AtomicWaker,
    writer: AtomicWaker,
}

impl Cutter {
    /// From now on the stream reads as ended and refuses writes; whoever waits on it is
    /// woken.
    pub(crate) fn cut(&self) {
        self.0.cut.store(true, Ordering::SeqCst);
        self.0.reader.wake();
        self.0.writer.wake();
    }
}

/// `S`, until its [`Cutter`] cuts it.
pub(crate) struct Cuttable<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Cuttable<S> {
    pub(crate) fn new(inner: S) -> (Cuttable<S>, Cutter) {
        let shared = Arc::new(Shared::default());
        (Cuttable { inner, shared: shared.clone() }, Cutter(shared))
    }

    fn is_cut(&self) -> bool {
        self.shared.cut.load(Ordering::SeqCst)
    }
}

fn broken() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the session was ended")
}

impl<S: AsyncRead + Unpin> AsyncRead for Cuttable<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        // Registered before the check: a cut between the two still wakes this task.
        self.shared.reader.register(cx.waker());
        if self.is_cut() {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Cuttable<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.shared.writer.register(cx.waker());
        if self.is_cut() {
            return Poll::Ready(Err(broken()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.is_cut() {
            return Poll::Ready(Err(broken()));
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_cut_ends_a_pending_read_and_refuses_writes() {
        // The peer keeps its end open and silent, as a stopped VM's VMM does.
        let (ours, mut peer) = tokio::io::duplex(64);
        let (mut stream, cutter) = Cuttable::new(ours);
        peer.write_all(b"hi").await.unwrap();
        let mut buf = [0u8; 2];
        stream.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hi");
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 8];
            let n = stream.read(&mut buf).await.unwrap();
            (n, stream)
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!reader.is_finished(), "a read ended before the cut");
        cutter.cut();
        let (n, mut stream) = tokio::time::timeout(std::time::Duration::from_secs(5), reader).await.unwrap().unwrap();
        assert_eq!(n, 0, "a cut stream reads as ended");
        assert_eq!(stream.write_all(b"x").await.unwrap_err().kind(), io::ErrorKind::BrokenPipe);
        drop(peer);
    }
}
