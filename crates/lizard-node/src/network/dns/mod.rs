//! The DNS relay: guests cannot reach the host's resolver (often a private address, which
//! the firewall drops), so the node binds a UDP socket and a TCP listener on the gateway
//! address inside each sandbox's namespace and relays queries to the host's resolvers
//! from the host side, bounded per sandbox.
//!
//! Only DNS passes: each UDP datagram, and each length-prefixed message on a TCP
//! connection, must be one standard query ([`message::Query`]); anything else is dropped
//! (UDP) or ends the connection (TCP), and never reaches a resolver. Each sandbox's
//! queries draw on its own [`limit::TokenBucket`]; beyond it they are dropped (the guest's
//! resolver retries later). Names are relayed as the sandbox's policy allows them
//! ([`ParsedPolicy::allows_name`]): a name in `denyOut` never, one in `allowOut` always,
//! any other only with internet access; the rest get REFUSED from the relay itself.
//!
//! - [`message`]: the wire format, as far as the relay reads it;
//! - [`limit`]: the token bucket;
//! - this file: binding, the [`Gate`] (policy and budget), the UDP and TCP relays, and
//!   [`Gate::resolve_for_egress`]: the egress proxy's own lookups, which draw on the same
//!   budget (so a guest cannot send its queries as HTTP `Host`s or TLS names instead) and
//!   are cached for [`EGRESS_CACHE_TTL`].

mod limit;
pub(super) mod message;

use super::{io_err, Result};
use lizard_agent_proto::net::GATEWAY;
use lizard_api::network::ParsedPolicy;
use message::{Query, HEADER_LEN};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

/// Bounds of the DNS relay, per sandbox.
const DNS_UDP_INFLIGHT: usize = 64;
const DNS_TCP_CONNECTIONS: usize = 16;
const DNS_UDP_TIMEOUT: Duration = Duration::from_secs(3);
/// A TCP connection's whole life.
const DNS_TCP_TIMEOUT: Duration = Duration::from_secs(20);
/// Messages one TCP connection may carry.
const DNS_TCP_MESSAGES: usize = 64;
const DNS_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the egress proxy reuses a lookup (an answer or none).
pub(super) const EGRESS_CACHE_TTL: Duration = Duration::from_secs(30);
/// Names the egress proxy remembers per sandbox; past it, the expired go, then all.
const EGRESS_CACHE_NAMES: usize = 512;

/// What the relay does with one sandbox's queries.
#[derive(Debug)]
pub(super) struct Gate {
    /// The sandbox's policy, as [`super::SandboxNet::set_policy`] last set it.
    policy: Arc<RwLock<ParsedPolicy>>,
    budget: Mutex<limit::TokenBucket>,
    /// The egress proxy's lookups: name → when, and what it resolved to.
    egress_lookups: Mutex<HashMap<String, (Instant, Vec<Ipv4Addr>)>>,
}

/// The fate of one query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Relay,
    Refuse,
    /// Over budget: no answer at all.
    Drop,
}

impl Gate {
    pub(super) fn new(policy: Arc<RwLock<ParsedPolicy>>) -> Gate {
        Gate { policy, budget: Mutex::default(), egress_lookups: Mutex::default() }
    }

    /// The IPv4 addresses of `name` for the egress proxy: a lookup of the last
    /// [`EGRESS_CACHE_TTL`], or a new one if the sandbox's DNS budget has a query left
    /// (none if not: the connection is refused, as an over-budget query is dropped).
    pub(super) async fn resolve_for_egress(&self, name: &str, resolvers: &[SocketAddr]) -> Vec<Ipv4Addr> {
        let now = Instant::now();
        {
            let lookups = self.egress_lookups.lock().expect("egress lookups lock");
            if let Some((at, addrs)) = lookups.get(name) {
                if now.saturating_duration_since(*at) < EGRESS_CACHE_TTL {
                    return addrs.clone();
                }
            }
        }
        if !self.budget.lock().expect("DNS budget lock").take() {
            return vec![];
        }
        let addrs = resolve_a(name, resolvers).await;
        let mut lookups = self.egress_lookups.lock().expect("egress lookups lock");
        if lookups.len() >= EGRESS_CACHE_NAMES {
            lookups.retain(|_, (at, _)| now.saturating_duration_since(*at) < EGRESS_CACHE_TTL);
            if lookups.len() >= EGRESS_CACHE_NAMES {
                lookups.clear();
            }
        }
        lookups.insert(name.to_owned(), (now, addrs.clone()));
        addrs
    }

    /// The fate of a query for `name`.
    fn admit(&self, name: &str) -> Verdict {
        if !self.budget.lock().expect("DNS budget lock").take() {
            Verdict::Drop
        } else if self.policy.read().expect("policy lock").allows_name(name) {
            Verdict::Relay
        } else {
            Verdict::Refuse
        }
    }
}

/// The IPv4 addresses `resolvers` give for `name` (the first that answers): for the
/// egress proxy, which resolves names itself rather than trusting the guest's lookup, and
/// for a policy's `denyOut` names.
pub(super) async fn resolve_a(name: &str, resolvers: &[SocketAddr]) -> Vec<std::net::Ipv4Addr> {
    let id = rand::random::<u16>();
    let Some(msg) = message::a_query(id, name) else { return vec![] };
    let Ok(query) = Query::parse(&msg) else { return vec![] };
    match ask_udp(&query, &msg, resolvers).await {
        Some(answer) => message::a_records(&answer),
        None => vec![],
    }
}

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

/// Serve the sockets [`bind`] made under `gate` until the returned tasks are aborted
/// (which closes them).
pub(super) fn start(
    (udp, tcp): (std::net::UdpSocket, std::net::TcpListener),
    resolvers: Arc<Vec<SocketAddr>>,
    gate: Arc<Gate>,
) -> Result<JoinSet<()>> {
    let udp = tokio::net::UdpSocket::from_std(udp).map_err(io_err("DNS relay socket"))?;
    let tcp = tokio::net::TcpListener::from_std(tcp).map_err(io_err("DNS relay socket"))?;
    let mut relay = JoinSet::new();
    relay.spawn(udp_relay(udp, resolvers.clone(), gate.clone()));
    relay.spawn(tcp_relay(tcp, resolvers, gate));
    Ok(relay)
}

/// Answer guests' UDP queries: REFUSED, or by asking the host's resolvers, at most
/// [`DNS_UDP_INFLIGHT`] at a time (more are dropped: the guest retries).
async fn udp_relay(sock: tokio::net::UdpSocket, resolvers: Arc<Vec<SocketAddr>>, gate: Arc<Gate>) {
    let sock = Arc::new(sock);
    let mut inflight = JoinSet::new();
    let mut buf = vec![0u8; 4096];
    loop {
        tokio::select! {
            r = sock.recv_from(&mut buf) => {
                let Ok((n, from)) = r else { continue };
                let msg = &buf[..n];
                let Ok(query) = Query::parse(msg) else { continue };
                match gate.admit(&query.name(msg)) {
                    Verdict::Drop => {}
                    Verdict::Refuse => {
                        let _ = sock.send_to(&query.refused(msg), from).await;
                    }
                    Verdict::Relay if inflight.len() < DNS_UDP_INFLIGHT => {
                        let msg = msg.to_vec();
                        let (sock, resolvers) = (sock.clone(), resolvers.clone());
                        inflight.spawn(async move {
                            if let Some(answer) = ask_udp(&query, &msg, &resolvers).await {
                                let _ = sock.send_to(&answer, from).await;
                            }
                        });
                    }
                    Verdict::Relay => {}
                }
            }
            Some(_) = inflight.join_next(), if !inflight.is_empty() => {}
        }
    }
}

async fn ask_udp(query: &Query, msg: &[u8], resolvers: &[SocketAddr]) -> Option<Vec<u8>> {
    for r in resolvers {
        let bind: SocketAddr = if r.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
        let Ok(up) = tokio::net::UdpSocket::bind(bind).await else { continue };
        if up.connect(r).await.is_err() || up.send(msg).await.is_err() {
            continue;
        }
        let mut buf = vec![0u8; 65535];
        let answered = tokio::time::timeout(DNS_UDP_TIMEOUT, async {
            loop {
                let n = up.recv(&mut buf).await.ok()?;
                if query.is_answered_by(&buf[..n]) {
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

/// Serve guests' DNS-over-TCP connections, at most [`DNS_TCP_CONNECTIONS`] at a time, each
/// for at most [`DNS_TCP_TIMEOUT`].
async fn tcp_relay(listener: tokio::net::TcpListener, resolvers: Arc<Vec<SocketAddr>>, gate: Arc<Gate>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            r = listener.accept() => {
                let Ok((guest, _)) = r else { continue };
                if conns.len() >= DNS_TCP_CONNECTIONS {
                    continue;
                }
                let (resolvers, gate) = (resolvers.clone(), gate.clone());
                conns.spawn(async move {
                    let _ = tokio::time::timeout(DNS_TCP_TIMEOUT, serve_tcp(guest, &resolvers, &gate)).await;
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// One guest connection: each message must be a query and gets its answer, over one
/// upstream connection opened at the first query that is relayed.
async fn serve_tcp(mut guest: impl AsyncRead + AsyncWrite + Unpin, resolvers: &[SocketAddr], gate: &Gate) {
    let mut upstream = None;
    for _ in 0..DNS_TCP_MESSAGES {
        let Some(msg) = read_message(&mut guest).await else { return };
        let Ok(query) = Query::parse(&msg) else { return };
        let answer = match gate.admit(&query.name(&msg)) {
            Verdict::Drop => return,
            Verdict::Refuse => query.refused(&msg),
            Verdict::Relay => match ask_tcp(&mut upstream, &query, &msg, resolvers).await {
                Some(a) => a,
                None => return,
            },
        };
        if write_message(&mut guest, &answer).await.is_none() {
            return;
        }
    }
}

/// Ask over `upstream` (connecting to the first resolver that accepts if there is none
/// yet); `None` when no resolver answered (the upstream connection is then dropped).
async fn ask_tcp(
    upstream: &mut Option<TcpStream>,
    query: &Query,
    msg: &[u8],
    resolvers: &[SocketAddr],
) -> Option<Vec<u8>> {
    if upstream.is_none() {
        for r in resolvers {
            if let Ok(Ok(s)) = tokio::time::timeout(DNS_CONNECT_TIMEOUT, TcpStream::connect(r)).await {
                *upstream = Some(s);
                break;
            }
        }
    }
    let up = upstream.as_mut()?;
    let answer = async {
        write_message(up, msg).await?;
        loop {
            let answer = read_message(up).await?;
            if query.is_answered_by(&answer) {
                return Some(answer);
            }
        }
    }
    .await;
    if answer.is_none() {
        *upstream = None;
    }
    answer
}

/// One length-prefixed DNS message (RFC 1035 §4.2.2), at least a header long.
async fn read_message(s: &mut (impl AsyncRead + Unpin)) -> Option<Vec<u8>> {
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await.ok()?;
    let len = usize::from(u16::from_be_bytes(len));
    if len < HEADER_LEN {
        return None;
    }
    let mut msg = vec![0u8; len];
    s.read_exact(&mut msg).await.ok()?;
    Some(msg)
}

async fn write_message(s: &mut (impl AsyncWrite + Unpin), msg: &[u8]) -> Option<()> {
    let len = u16::try_from(msg.len()).ok()?;
    let mut framed = Vec::with_capacity(msg.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(msg);
    s.write_all(&framed).await.ok()
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
    use std::sync::atomic::Ordering;

    #[test]
    fn resolvers_come_from_resolv_conf() {
        let r = parse_resolv_conf("# x\nnameserver 10.255.255.53\nnameserver fe80::1%eth0\nsearch lan\n");
        assert_eq!(r, vec!["10.255.255.53:53".parse().unwrap(), "[fe80::1]:53".parse().unwrap()]);
    }

    fn policy(internet: bool) -> ParsedPolicy {
        ParsedPolicy { allow_internet_access: internet, ..Default::default() }
    }

    fn gate(p: ParsedPolicy) -> (Gate, Arc<RwLock<ParsedPolicy>>) {
        let cell = Arc::new(RwLock::new(p));
        (Gate::new(cell.clone()), cell)
    }

    #[test]
    fn the_gate_answers_by_name_follows_the_policy_and_spends_a_budget() {
        let (g, cell) = gate(policy(false));
        assert_eq!(g.admit("a.example"), Verdict::Refuse);
        cell.write().unwrap().allow_domains = vec!["*.registry.example".parse().unwrap()];
        assert_eq!(g.admit("cdn.registry.example"), Verdict::Relay);
        assert_eq!(g.admit("a.example"), Verdict::Refuse);
        *cell.write().unwrap() = policy(true);
        assert_eq!(g.admit("a.example"), Verdict::Relay);
        cell.write().unwrap().deny_domains = vec!["a.example".parse().unwrap()];
        assert_eq!(g.admit("a.example"), Verdict::Refuse);
        let verdicts: Vec<_> = (0..limit::BURST * 2).map(|_| g.admit("b.example")).collect();
        assert!(verdicts.contains(&Verdict::Drop), "no budget");
    }

    /// A resolver on loopback that answers every UDP query with the query, QR set (no
    /// address), and counts them.
    async fn fake_udp_resolver() -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = sock.local_addr().unwrap();
        let queries = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = queries.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 1500];
            while let Ok((n, from)) = sock.recv_from(&mut buf).await {
                seen.fetch_add(1, Ordering::SeqCst);
                buf[2] |= 0x80;
                let _ = sock.send_to(&buf[..n], from).await;
            }
        });
        (addr, queries)
    }

    #[tokio::test]
    async fn the_egress_proxys_lookups_spend_the_sandboxs_budget_and_are_cached() {
        let (resolver, queries) = fake_udp_resolver().await;
        let (g, _) = gate(policy(true));
        for _ in 0..20 {
            g.resolve_for_egress("same.example", &[resolver]).await;
        }
        assert_eq!(queries.load(Ordering::SeqCst), 1, "one lookup, then the cache");
        // Distinct names (what exfiltration through Host headers sends): held to the budget.
        for i in 0..limit::BURST * 2 {
            g.resolve_for_egress(&format!("x{i}.exfil.example"), &[resolver]).await;
        }
        let sent = queries.load(Ordering::SeqCst);
        assert!(sent <= usize::try_from(limit::BURST).unwrap() + 5, "{sent} lookups reached the resolver");
        // The relay's own queries now find the budget spent too.
        assert_eq!(g.admit("y.example"), Verdict::Drop);
    }

    /// A resolver on loopback that answers every framed query over TCP with the query, QR
    /// set, and counts the bytes it was sent.
    async fn fake_resolver() -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let bytes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = bytes.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    while let Some(mut q) = read_message(&mut s).await {
                        seen.fetch_add(q.len() + 2, Ordering::SeqCst);
                        q[2] |= 0x80;
                        if write_message(&mut s, &q).await.is_none() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, bytes)
    }

    async fn exchange(gate: &Gate, resolvers: &[SocketAddr], sent: &[u8]) -> Vec<u8> {
        let (mut client, server) = tokio::io::duplex(4096);
        client.write_all(sent).await.unwrap();
        client.shutdown().await.unwrap();
        serve_tcp(server, resolvers, gate).await;
        let mut got = vec![];
        client.read_to_end(&mut got).await.unwrap();
        got
    }

    fn framed(msg: &[u8]) -> Vec<u8> {
        let mut f = u16::try_from(msg.len()).unwrap().to_be_bytes().to_vec();
        f.extend_from_slice(msg);
        f
    }

    #[tokio::test]
    async fn tcp_carries_dns_queries_only() {
        let (resolver, bytes) = fake_resolver().await;
        let (open, _) = gate(policy(true));
        let q = message::tests::query(9, "a.example");
        let got = exchange(&open, &[resolver], &framed(&q)).await;
        assert_eq!(got.len(), q.len() + 2);
        assert_eq!(got[4] & 0x80, 0x80, "the resolver's answer");
        let relayed = bytes.load(Ordering::SeqCst);
        assert_eq!(relayed, q.len() + 2);

        // Bytes that are not DNS: the connection ends, the resolver sees nothing more.
        let http = b"\x00\x20GET / HTTP/1.1\r\nHost: x\r\n\r\n......";
        assert!(exchange(&open, &[resolver], http).await.is_empty());
        assert!(exchange(&open, &[resolver], b"\x00\x05hello").await.is_empty());
        assert_eq!(bytes.load(Ordering::SeqCst), relayed);

        // Without internet: REFUSED from the relay itself.
        let (closed, _) = gate(policy(false));
        let got = exchange(&closed, &[resolver], &framed(&q)).await;
        assert_eq!(got[2..], Query::parse(&q).unwrap().refused(&q)[..]);
        assert_eq!(bytes.load(Ordering::SeqCst), relayed);
    }
}
