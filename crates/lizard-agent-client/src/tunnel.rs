//! The host end of a TCP tunnel into the guest (an HTTP/2 `CONNECT` stream; see
//! `lizard_agent_proto::routes`).
//!
//! Dropping an HTTP/2 stream that is still open resets it, and h2 then discards the DATA
//! it had queued but not yet written: bytes a caller wrote just before dropping would be
//! lost, unlike with a socket, whose `close` still delivers them. So a tunnel dropped
//! before both directions ended closes the way a socket does: its write side is shut
//! (queued bytes go out, the guest reads EOF) and the stream is held, discarding what
//! still arrives, until the guest side ends too or [`TcpTunnel::LINGER`] passes.

use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// A TCP connection to a port on the guest's loopback, from [`crate::AgentClient::connect_tcp`].
///
/// Use it like a `TcpStream`: reads return what the guest's socket sent, and 0 once it
/// shut down its write side (or closed); writes go to the guest's socket under HTTP/2
/// flow control. `shutdown` half-closes (the guest reads EOF) and keeps reading
/// possible. Dropping it closes the connection like closing a socket: what was written
/// is still delivered (see [`TcpTunnel::LINGER`]). The tunnel keeps working after the
/// [`crate::AgentClient`] it came from is dropped, until the channel itself goes away,
/// when reads and writes fail.
pub struct TcpTunnel {
    /// `None` only while dropping.
    io: Option<TokioIo<Upgraded>>,
    port: u16,
    /// The guest side ended (a read returned EOF).
    read_done: bool,
    /// Our side ended (`shutdown` completed).
    write_done: bool,
}

impl TcpTunnel {
    /// How long a dropped tunnel waits for the guest side to end before it resets.
    pub const LINGER: Duration = Duration::from_secs(5);

    pub(crate) fn new(upgraded: Upgraded, port: u16) -> TcpTunnel {
        TcpTunnel { io: Some(TokioIo::new(upgraded)), port, read_done: false, write_done: false }
    }

    /// The guest port this tunnel is connected to.
    pub fn port(&self) -> u16 {
        self.port
    }

    fn io(&mut self) -> Pin<&mut TokioIo<Upgraded>> {
        Pin::new(self.io.as_mut().expect("tunnel used after drop"))
    }
}

impl std::fmt::Debug for TcpTunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTunnel").field("port", &self.port).finish_non_exhaustive()
    }
}

impl AsyncRead for TcpTunnel {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let wanted = buf.remaining() > 0;
        let result = self.io().poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = result {
            if wanted && buf.filled().len() == before {
                self.read_done = true;
            }
        }
        result
    }
}

impl AsyncWrite for TcpTunnel {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.io().poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.write_done {
            return Poll::Ready(Ok(()));
        }
        let result = self.io().poll_shutdown(cx);
        if let Poll::Ready(Ok(())) = result {
            self.write_done = true;
        }
        result
    }
}

impl Drop for TcpTunnel {
    fn drop(&mut self) {
        let Some(io) = self.io.take() else { return };
        if self.read_done && self.write_done {
            return; // both directions ended: the stream is closed, nothing to reset
        }
        // Outside a runtime nothing can linger: the stream is reset at once.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (read_done, write_done) = (self.read_done, self.write_done);
        runtime.spawn(async move {
            let _ = tokio::time::timeout(TcpTunnel::LINGER, linger(io, read_done, write_done)).await;
        });
    }
}

/// Close a dropped tunnel gracefully: shut our side, then wait for the guest's end.
async fn linger(mut io: TokioIo<Upgraded>, read_done: bool, write_done: bool) -> io::Result<()> {
    if !write_done {
        io.shutdown().await?;
    }
    if !read_done {
        let mut sink = vec![0u8; 16 * 1024];
        while io.read(&mut sink).await? != 0 {}
    }
    Ok(())
}
