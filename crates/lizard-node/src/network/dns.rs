//! The DNS relay: guests cannot reach the host's resolver (often a private address, which
//! the firewall drops), so the node binds a UDP socket and a TCP listener on the gateway
//! address inside each sandbox's namespace and relays queries to the host's resolvers
//! from the host side, bounded per sandbox.

use super::{io_err, Result};
use lizard_agent_proto::net::GATEWAY;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;

/// Bounds of the DNS relay, per sandbox.
const DNS_UDP_INFLIGHT: usize = 64;
const DNS_TCP_CONNECTIONS: usize = 16;
const DNS_UDP_TIMEOUT: Duration = Duration::from_secs(3);
const DNS_TCP_TIMEOUT: Duration = Duration::from_secs(20);

/// Where guests' queries go: `configured`, or else the nameservers of the host's
/// `/etc/resolv.conf`.
pub(super) fn resolvers(configured: &[SocketAddr]) -> Vec<SocketAddr> {
    if !configured.is_empty() {
        return configured.to_vec();
    }
    let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    parse_resolv_conf(&text)
}

/// Bind the relay's sockets on the gateway's port 53. Call on a thread inside the
/// sandbox's namespace.
pub(super) fn bind() -> Result<(std::net::UdpSocket, std::net::TcpListener)> {
    let addr = SocketAddr::from((GATEWAY, 53));
    let udp = std::net::UdpSocket::bind(addr).map_err(io_err("bind the DNS relay (udp)"))?;
    let tcp = std::net::TcpListener::bind(addr).map_err(io_err("bind the DNS relay (tcp)"))?;
    udp.set_nonblocking(true).map_err(io_err("DNS relay socket"))?;
    tcp.set_nonblocking(true).map_err(io_err("DNS relay socket"))?;
    Ok((udp, tcp))
}

/// Serve the sockets [`bind`] made until the returned tasks are aborted (which closes
/// them).
pub(super) fn start(
    (udp, tcp): (std::net::UdpSocket, std::net::TcpListener),
    resolvers: Arc<Vec<SocketAddr>>,
) -> Result<JoinSet<()>> {
    let udp = tokio::net::UdpSocket::from_std(udp).map_err(io_err("DNS relay socket"))?;
    let tcp = tokio::net::TcpListener::from_std(tcp).map_err(io_err("DNS relay socket"))?;
    let mut relay = JoinSet::new();
    relay.spawn(udp_relay(udp, resolvers.clone()));
    relay.spawn(tcp_relay(tcp, resolvers));
    Ok(relay)
}

/// Answer guests' UDP queries by asking the host's resolvers, at most
/// [`DNS_UDP_INFLIGHT`] at a time (more are dropped: the guest retries).
async fn udp_relay(sock: tokio::net::UdpSocket, resolvers: Arc<Vec<SocketAddr>>) {
    let sock = Arc::new(sock);
    let mut inflight = JoinSet::new();
    let mut buf = vec![0u8; 4096];
    loop {
        tokio::select! {
            r = sock.recv_from(&mut buf) => {
                let Ok((n, from)) = r else { continue };
                if n < 12 || inflight.len() >= DNS_UDP_INFLIGHT {
                    continue;
                }
                let query = buf[..n].to_vec();
                let (sock, resolvers) = (sock.clone(), resolvers.clone());
                inflight.spawn(async move {
                    if let Some(answer) = ask_udp(&query, &resolvers).await {
                        let _ = sock.send_to(&answer, from).await;
                    }
                });
            }
            Some(_) = inflight.join_next(), if !inflight.is_empty() => {}
        }
    }
}

async fn ask_udp(query: &[u8], resolvers: &[SocketAddr]) -> Option<Vec<u8>> {
    for r in resolvers {
        let bind: SocketAddr = if r.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
        let Ok(up) = tokio::net::UdpSocket::bind(bind).await else { continue };
        if up.connect(r).await.is_err() || up.send(query).await.is_err() {
            continue;
        }
        let mut buf = vec![0u8; 65535];
        let answered = tokio::time::timeout(DNS_UDP_TIMEOUT, async {
            loop {
                let n = up.recv(&mut buf).await.ok()?;
                // Same transaction id, else not the answer to this query.
                if n >= 12 && buf[..2] == query[..2] {
                    return Some(n);
                }
            }
        })
        .await;
        if let Ok(Some(n)) = answered {
            buf.truncate(n);
            return Some(buf);
        }
    }
    None
}

/// Pipe guests' DNS-over-TCP connections to the first host resolver that accepts, at
/// most [`DNS_TCP_CONNECTIONS`] at a time, each for at most [`DNS_TCP_TIMEOUT`].
async fn tcp_relay(listener: tokio::net::TcpListener, resolvers: Arc<Vec<SocketAddr>>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            r = listener.accept() => {
                let Ok((mut guest, _)) = r else { continue };
                if conns.len() >= DNS_TCP_CONNECTIONS {
                    continue;
                }
                let resolvers = resolvers.clone();
                conns.spawn(async move {
                    let _ = tokio::time::timeout(DNS_TCP_TIMEOUT, async {
                        for r in resolvers.iter() {
                            let connect = tokio::time::timeout(Duration::from_secs(3), tokio::net::TcpStream::connect(r));
                            if let Ok(Ok(mut up)) = connect.await {
                                let _ = tokio::io::copy_bidirectional(&mut guest, &mut up).await;
                                return;
                            }
                        }
                    })
                    .await;
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// `nameserver` lines of a resolv.conf, as port-53 socket addresses.
fn parse_resolv_conf(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.split_whitespace().next()?.split('%').next()?.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolvers_come_from_resolv_conf() {
        let r = parse_resolv_conf("# x\nnameserver 10.255.255.53\nnameserver fe80::1%eth0\nsearch lan\n");
        assert_eq!(r, vec!["10.255.255.53:53".parse().unwrap(), "[fe80::1]:53".parse().unwrap()]);
    }
}
