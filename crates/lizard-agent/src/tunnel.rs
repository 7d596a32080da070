//! HTTP/2 `CONNECT`: a TCP connection to a port on the guest's loopback, carried on one
//! stream of the session (the protocol is in `lizard_agent_proto::routes`).
//!
//! 1. The authority must be `127.0.0.1:<port>`; nothing else is reachable this way.
//! 2. The agent connects *before* it answers, so a port nothing listens on gets a clear
//!    502 `CONNECTION_REFUSED` instead of a tunnel that closes at once. A service bound
//!    only to `::1` (Node's `localhost` often resolves there) is tried next: it is the
//!    same loopback to the user.
//! 3. It answers 200; hyper then hands over the stream as a byte pipe and [`pump`] copies
//!    both ways, each direction on its own, until both have ended or either failed.
//!    An end of stream from the host half-closes the socket (FIN) and vice versa.
//!
//! A host that abandons a tunnel resets its stream. The agent notices that on its next
//! write, but a guest server that never writes and never closes (it ignored our FIN)
//! would pin the socket forever, so a half-closed tunnel also checks the stream every
//! [`RESET_CHECK`].

use crate::app::AppError;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use lizard_agent_proto::routes::{parse_tunnel_authority, TunnelTargetError, TUNNEL_HOST};
use lizard_agent_proto::types::{AgentError, ErrorCode};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// How long a connect to a guest port may take. Loopback answers at once unless the
/// listener's backlog is full.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Copy buffer per direction: 128 KiB per tunnel, so hundreds of idle WebSockets cost
/// little. Under TCG one tunnel moves ≈30 MiB/s each way with it; 256 KiB gained only
/// ≈5% there, where guest loopback TCP alone tops out near 80 MiB/s.
const COPY_BUF: usize = 64 * 1024;
/// How often a tunnel whose host side has finished checks whether the host reset it.
pub const RESET_CHECK: Duration = Duration::from_secs(1);

/// Why a tunnel could not open.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    /// A CONNECT request without an authority.
    #[error("CONNECT needs the authority {TUNNEL_HOST}:<port>")]
    NoAuthority,
    /// The authority names another host or no valid port.
    #[error(transparent)]
    Target(#[from] TunnelTargetError),
    /// Nothing accepted the connection: no listener on the port, or it did not answer.
    #[error("nothing accepts connections on port {port} in the guest ({cause})")]
    Refused { port: u16, cause: io::Error },
    /// Connecting failed for another reason.
    #[error("cannot connect to port {port} in the guest: {cause}")]
    Connect { port: u16, cause: io::Error },
    /// The request did not arrive over a connection that can carry a tunnel (only
    /// handler tests build such requests).
    #[error("this connection cannot carry a tunnel")]
    NotUpgradable,
}

impl From<TunnelError> for AgentError {
    fn from(e: TunnelError) -> AgentError {
        let code = match &e {
            TunnelError::NoAuthority | TunnelError::Target(_) => ErrorCode::InvalidArgument,
            TunnelError::Refused { .. } => ErrorCode::ConnectionRefused,
            TunnelError::Connect { .. } | TunnelError::NotUpgradable => ErrorCode::Internal,
        };
        AgentError::new(code, e.to_string())
    }
}

/// `CONNECT 127.0.0.1:<port>`: connect, answer 200, and pump bytes in a task of its own.
pub async fn handle(mut req: Request) -> Result<Response, AppError> {
    let authority = req.uri().authority().ok_or(TunnelError::NoAuthority)?;
    let port = parse_tunnel_authority(authority.as_str()).map_err(TunnelError::from)?;
    let on_upgrade = req.extensions_mut().remove::<OnUpgrade>().ok_or(TunnelError::NotUpgradable)?;
    let guest = connect(port).await?;
    tokio::spawn(async move {
        // The host may reset the stream before the upgrade completes; then there is
        // nobody to tell, and dropping the socket closes it.
        if let Ok(host) = on_upgrade.await {
            let _ = pump(host, guest).await;
        }
    });
    Ok(StatusCode::OK.into_response())
}

/// Connect to `port` on 127.0.0.1, else on ::1.
async fn connect(port: u16) -> Result<TcpStream, TunnelError> {
    let v4 = match connect_to(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await {
        Ok(s) => return Ok(s),
        Err(e) => e,
    };
    match v4.kind() {
        io::ErrorKind::ConnectionRefused => match connect_to(SocketAddr::from((Ipv6Addr::LOCALHOST, port))).await {
            Ok(s) => Ok(s),
            // The IPv4 answer is the one to report: it is the address the host asked for.
            Err(_) => Err(TunnelError::Refused { port, cause: v4 }),
        },
        io::ErrorKind::TimedOut => Err(TunnelError::Refused { port, cause: v4 }),
        _ => Err(TunnelError::Connect { port, cause: v4 }),
    }
}

async fn connect_to(addr: SocketAddr) -> io::Result<TcpStream> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    // Tunnels carry interactive traffic (WebSockets, dev servers): no Nagle delay.
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Copy host → guest and guest → host independently (one stalled direction must not
/// hold up the other), half-closing each as it ends. Returns once both ended; an error in
/// either aborts both, and dropping the halves closes the socket and resets the stream.
pub async fn pump(host: Upgraded, guest: TcpStream) -> io::Result<()> {
    let (from_host, mut to_host) = tokio::io::split(TokioIo::new(host));
    let (from_guest, mut to_guest) = guest.into_split();
    let host_finished = Notify::new();
    let up = async {
        tokio::io::copy_buf(&mut BufReader::with_capacity(COPY_BUF, from_host), &mut to_guest).await?;
        to_guest.shutdown().await?;
        host_finished.notify_one();
        io::Result::Ok(())
    };
    let down = async {
        let mut from_guest = from_guest;
        let mut buf = vec![0u8; COPY_BUF];
        let mut half_closed = false;
        let mut check = tokio::time::interval(RESET_CHECK);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                n = from_guest.read(&mut buf) => match n? {
                    0 => break,
                    n => to_host.write_all(&buf[..n]).await?,
                },
                _ = host_finished.notified(), if !half_closed => half_closed = true,
                _ = check.tick(), if half_closed => {
                    // Flushing an idle stream answers at once: Ok while it lives, the
                    // reset once the host abandoned it.
                    if let Some(Err(e)) = to_host.flush().now_or_never() {
                        return Err(e);
                    }
                }
            }
        }
        to_host.shutdown().await
    };
    tokio::try_join!(up, down).map(drop)
}

#[cfg(test)]
mod tests {
    use crate::server::tests::call;
    use axum::body::Body;
    use axum::http::StatusCode;
    use lizard_agent_proto::types::{AgentError, ErrorCode};

    #[tokio::test]
    async fn tunnels_reach_only_loopback_ports() {
        for target in ["10.0.0.1:80", "localhost:80", "127.0.0.1:0", "127.0.0.1:99999"] {
            let (status, body) = call("CONNECT", target, Body::empty()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{target}");
            let e: AgentError = serde_json::from_slice(&body).unwrap();
            assert_eq!(e.code, ErrorCode::InvalidArgument, "{target}: {e}");
        }
        // A request that cannot be upgraded (no real HTTP/2 connection) gets no tunnel.
        let (status, _) = call("CONNECT", "127.0.0.1:1", Body::empty()).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    }
}
