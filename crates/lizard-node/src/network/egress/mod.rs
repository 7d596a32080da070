//! The egress proxy: where domain rules (`allowOut`/`denyOut` entries that are names) are
//! enforced for web traffic.
//!
//! When a sandbox's policy names a domain, its namespace redirects the guest's TCP to
//! ports 80 and 443 (whatever address it dialed) to two listeners here, on the gateway
//! address inside the namespace ([`HTTP_PORT`], [`TLS_PORT`]; see the firewall). For each
//! connection the proxy:
//! 1. reads the name asked for: the HTTP `Host`, or the TLS ClientHello's server name
//!    ([`sniff`]; nothing is decrypted) — no name, no connection;
//! 2. checks it against the policy ([`ParsedPolicy::allows_name`]: `denyOut` names, then
//!    `allowOut` names, then the internet switch);
//! 3. resolves it itself, through the node's resolvers — what the guest resolved is not
//!    trusted, so a name cannot be pointed at an address of the attacker's choosing — on
//!    the sandbox's DNS budget, cached ([`super::dns::Gate::resolve_for_egress`]: names
//!    sent as `Host`s are queries too);
//! 4. dials the first address that is public (never the platform's deny list: private,
//!    loopback, link-local ranges, the host's own addresses) and not in `denyOut`, on the
//!    original port, from the host, and passes the bytes read in step 1 on unchanged;
//! 5. on plain HTTP, checks every later request of the connection the same way as it
//!    passes ([`http1`]: one `Host`, the same name), so a keep-alive connection cannot
//!    turn to another virtual host at the same address; a TLS connection's name is its
//!    ClientHello's (what follows is encrypted).
//!
//! So allowing only a package registry's domain, with internet access off, lets that
//! client work and nothing else. [`super::NetworkConfig::egress_test_allow`] is a
//! test-only exception to step 4's deny list.

mod http1;
mod sniff;

use super::{forbidden, io_err, Result};
use lizard_agent_proto::net::GATEWAY;
use lizard_api::network::{Cidr, ParsedPolicy};
use sniff::Sniffed;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// Where the namespace redirects the guest's HTTP (tcp/80).
pub(super) const HTTP_PORT: u16 = 15080;
/// Where the namespace redirects the guest's HTTPS (tcp/443).
pub(super) const TLS_PORT: u16 = 15443;
/// Connections one sandbox may have through the proxy at once, per port (each costs the
/// node two descriptors).
const CONNECTIONS: usize = 64;
/// A connection idle this long (no bytes either way) is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Most bytes read before a name must have shown.
const SNIFF_LIMIT: usize = 16 * 1024;
/// How long the client may take to show it.
const SNIFF_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a connection was not carried (the operator's debug log says which).
#[derive(Debug, thiserror::Error)]
enum EgressError {
    #[error("no server name or Host in the first bytes")]
    NoName,
    #[error("{0} is not allowed by the sandbox's policy")]
    NotAllowed(String),
    #[error("{0} resolves to no address the sandbox may reach")]
    NoAddress(String),
    #[error(transparent)]
    Request(#[from] http1::Refused),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
}

/// What the proxy of one sandbox works with.
pub(super) struct Egress {
    /// The sandbox's policy, as [`super::SandboxNet::set_policy`] last set it.
    pub policy: Arc<RwLock<ParsedPolicy>>,
    pub resolvers: Arc<Vec<SocketAddr>>,
    /// The sandbox's DNS relay gate, whose budget and cache lookups use.
    pub dns: Arc<super::dns::Gate>,
    /// Test only: addresses dialed although the platform denies them.
    pub test_allow: Arc<Vec<Cidr>>,
}

/// Bind the proxy's listeners on the gateway. Call on a thread inside the sandbox's
/// namespace.
pub(super) fn bind() -> Result<[(std::net::TcpListener, u16); 2]> {
    let listen = |port: u16| -> Result<(std::net::TcpListener, u16)> {
        let l = std::net::TcpListener::bind(SocketAddr::from((GATEWAY, port)))
            .map_err(io_err(format!("bind the egress proxy on port {port}")))?;
        l.set_nonblocking(true).map_err(io_err("egress proxy socket"))?;
        let original = if port == HTTP_PORT { 80 } else { 443 };
        Ok((l, original))
    };
    Ok([listen(HTTP_PORT)?, listen(TLS_PORT)?])
}

/// Serve the listeners [`bind`] made, as tasks of `tasks` (aborting them closes them).
pub(super) fn start(
    listeners: [(std::net::TcpListener, u16); 2],
    egress: Arc<Egress>,
    tasks: &mut JoinSet<()>,
) -> Result<()> {
    for (listener, port) in listeners {
        let listener = TcpListener::from_std(listener).map_err(io_err("egress proxy socket"))?;
        tasks.spawn(serve(listener, port, egress.clone()));
    }
    Ok(())
}

async fn serve(listener: TcpListener, port: u16, egress: Arc<Egress>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            r = listener.accept() => {
                let Ok((guest, _)) = r else { continue };
                if conns.len() >= CONNECTIONS {
                    continue;
                }
                let egress = egress.clone();
                conns.spawn(async move {
                    if let Err(e) = carry(guest, port, &egress).await {
                        tracing::debug!(port, "egress: {e}");
                    }
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// Steps 1–4 of the module doc for one connection.
async fn carry(mut guest: TcpStream, port: u16, egress: &Egress) -> Result<(), EgressError> {
    let (first, name) =
        tokio::time::timeout(SNIFF_TIMEOUT, read_name(&mut guest, port)).await.map_err(|_| EgressError::NoName)??;
    let policy = egress.policy.read().expect("policy lock").clone();
    let candidates = match name.parse::<Ipv4Addr>() {
        // A bare address as the name: judged as an address.
        Ok(ip) if policy.allow_internet_access || policy.allow_out.iter().any(|c| c.contains(IpAddr::V4(ip))) => {
            vec![ip]
        }
        Ok(_) => return Err(EgressError::NotAllowed(name)),
        Err(_) if policy.allows_name(&name) => egress.dns.resolve_for_egress(&name, &egress.resolvers).await,
        Err(_) => return Err(EgressError::NotAllowed(name)),
    };
    let addr = candidates
        .into_iter()
        .find(|ip| may_dial(*ip, &policy, &egress.test_allow))
        .ok_or_else(|| EgressError::NoAddress(name.clone()))?;
    // Plain HTTP: the first request framed and checked too, before anything is dialed.
    let mut requests = (port == 80).then(|| http1::Requests::new(name.clone(), SNIFF_LIMIT));
    let first = match &mut requests {
        Some(requests) => {
            let mut checked = Vec::with_capacity(first.len());
            requests.feed(&first, &mut checked)?;
            checked
        }
        None => first,
    };
    let target = SocketAddr::from((addr, port));
    let mut upstream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(EgressError::Io(format!("connect {name} ({target})"), e)),
        Err(_) => {
            let e = std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out");
            return Err(EgressError::Io(format!("connect {name} ({target})"), e));
        }
    };
    upstream.write_all(&first).await.map_err(|e| EgressError::Io(format!("write to {name}"), e))?;
    let carried = match requests {
        Some(mut requests) => {
            let check = |bytes: &[u8], out: &mut Vec<u8>| {
                requests.feed(bytes, out).map_err(|e| std::io::Error::new(std::io::ErrorKind::PermissionDenied, e))
            };
            crate::forward::copy_until_idle_checked(&mut guest, &mut upstream, IDLE_TIMEOUT, check).await
        }
        None => crate::forward::copy_until_idle(&mut guest, &mut upstream, IDLE_TIMEOUT).await,
    };
    carried.map_err(|e| EgressError::Io(format!("carry {name}"), e))
}

/// Read until the name shows (TLS on 443, HTTP on 80): the bytes read and the name.
async fn read_name(guest: &mut TcpStream, port: u16) -> Result<(Vec<u8>, String), EgressError> {
    let mut buf = Vec::with_capacity(2048);
    let mut chunk = [0u8; 2048];
    loop {
        let n = guest.read(&mut chunk).await.map_err(|e| EgressError::Io("read the guest".into(), e))?;
        if n == 0 {
            return Err(EgressError::NoName);
        }
        buf.extend_from_slice(&chunk[..n]);
        let sniffed = if port == 443 { sniff::tls_server_name(&buf) } else { sniff::http_host(&buf, SNIFF_LIMIT) };
        match sniffed {
            Sniffed::Name(name) => return Ok((buf, name)),
            Sniffed::Absent => return Err(EgressError::NoName),
            Sniffed::NeedMore if buf.len() >= SNIFF_LIMIT => return Err(EgressError::NoName),
            Sniffed::NeedMore => {}
        }
    }
}

/// Whether the proxy may connect to `ip` for a sandbox with `policy`: never in `denyOut`;
/// never in the platform's deny list or on a subnet of the host's, unless a test allows it.
fn may_dial(ip: Ipv4Addr, policy: &ParsedPolicy, test_allow: &[Cidr]) -> bool {
    let ip_any = IpAddr::V4(ip);
    if policy.deny_out.iter().any(|c| c.contains(ip_any)) {
        return false;
    }
    if test_allow.iter().any(|c| c.contains(ip_any)) {
        return true;
    }
    !forbidden::platform_denies(ip) && !forbidden::on_a_host_subnet(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_outside_deny_out_are_dialed() {
        let policy = ParsedPolicy { deny_out: vec!["203.0.113.9".parse().unwrap()], ..Default::default() };
        assert!(may_dial(Ipv4Addr::new(203, 0, 113, 8), &policy, &[]));
        assert!(!may_dial(Ipv4Addr::new(203, 0, 113, 9), &policy, &[]));
        for private in [[10, 0, 0, 1], [127, 0, 0, 1], [169, 254, 169, 254], [192, 168, 1, 1], [172, 16, 0, 1]] {
            assert!(!may_dial(Ipv4Addr::from(private), &policy, &[]), "{private:?}");
        }
        let test_allow = vec!["10.254.0.0/16".parse().unwrap()];
        assert!(may_dial(Ipv4Addr::new(10, 254, 1, 2), &policy, &test_allow));
        assert!(!may_dial(Ipv4Addr::new(10, 253, 1, 2), &policy, &test_allow));
    }
}
