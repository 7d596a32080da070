//! The host end of a TCP tunnel into the guest (an HTTP/2 `CONNECT` stream; see
//! `lizard_agent_proto::routes`).

use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A TCP connection to a port on the guest's loopback, from [`crate::AgentClient::connect_tcp`].
///
/// Use it like a `TcpStream`: reads return what the guest's socket sent, and 0 once it
/// shut down its write side (or closed); writes go to the guest's socket under HTTP/2
/// flow control. `shutdown` half-closes (the guest reads EOF) and keeps reading
/// possible. Dropping it closes the connection in the guest. The tunnel keeps working
/// after the [`crate::AgentClient`] it came from is dropped, until the channel itself
/// goes away, when reads and writes fail.
pub struct TcpTunnel {
    io: TokioIo<Upgraded>,
    port: u16,
}

impl TcpTunnel {
    pub(crate) fn new(upgraded: Upgraded, port: u16) -> TcpTunnel {
        TcpTunnel { io: TokioIo::new(upgraded), port }
    }

    /// The guest port this tunnel is connected to.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl std::fmt::Debug for TcpTunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTunnel").field("port", &self.port).finish_non_exhaustive()
    }
}

impl AsyncRead for TcpTunnel {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for TcpTunnel {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
