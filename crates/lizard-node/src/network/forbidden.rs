//! What no sandbox reaches, whatever its lists say: the platform's deny list, and the
//! host's own addresses and the subnets it is connected to (read from its interfaces).
//! The firewall drops them; the egress proxy refuses to connect to them.

use super::mask;
use lizard_api::network::Cidr;
use std::net::{IpAddr, Ipv4Addr};

/// Ranges no sandbox reaches, whatever its allow list says (IPv4; IPv6 is not forwarded
/// at all). The node's pool and every subnet the host is connected to (its own addresses
/// and their neighbours, public or not: a cloud host's uplink neighbours are other
/// machines of its network) are added to it.
pub const PLATFORM_DENY: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    // Multicast, reserved, broadcast.
    "224.0.0.0/3",
];

/// The subnets of the host's own interfaces that the platform list does not already
/// cover (e.g. a public uplink's): the host itself (whose input rule drops sandbox traffic
/// anyway) and its neighbours there, which a sandbox must not reach through it.
pub(super) fn host_subnets() -> Vec<String> {
    subnets_outside_the_platform_list(host_networks().into_iter())
}

/// Every IPv4 address on the host's interfaces with its prefix length (this thread's
/// namespace: the host's).
fn host_networks() -> Vec<(Ipv4Addr, u8)> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else { return vec![] };
    addrs
        .filter_map(|a| {
            let ip = a.address?.as_sockaddr_in()?.ip();
            let prefix = a.netmask.and_then(|m| m.as_sockaddr_in().map(|m| u32::from(m.ip()).count_ones()));
            Some((ip, u8::try_from(prefix.unwrap_or(32)).unwrap_or(32)))
        })
        .collect()
}

/// Whether `ip` is in a subnet the host is connected to.
pub(super) fn on_a_host_subnet(ip: Ipv4Addr) -> bool {
    host_networks().into_iter().any(|(net, prefix)| u32::from(ip) & mask(prefix) == u32::from(net) & mask(prefix))
}

/// The subnets of `addrs` (address and prefix length) that [`PLATFORM_DENY`] does not
/// cover already, as CIDRs, each once.
fn subnets_outside_the_platform_list(addrs: impl Iterator<Item = (Ipv4Addr, u8)>) -> Vec<String> {
    let mut v: Vec<String> = addrs
        .filter(|(ip, _)| !platform_denies(*ip))
        .map(|(ip, prefix)| format!("{}/{prefix}", Ipv4Addr::from(u32::from(ip) & mask(prefix))))
        .collect();
    v.sort();
    v.dedup();
    v
}

/// Every IPv4 address on the host's interfaces (this thread's namespace: the host's).
pub(super) fn all_host_addresses() -> Vec<Ipv4Addr> {
    host_networks().into_iter().map(|(ip, _)| ip).collect()
}

/// Whether `ip` is in [`PLATFORM_DENY`].
pub(super) fn platform_denies(ip: Ipv4Addr) -> bool {
    PLATFORM_DENY.iter().filter_map(|c| c.parse::<Cidr>().ok()).any(|c| match c.addr {
        IpAddr::V4(net) => u32::from(ip) & mask(c.prefix) == u32::from(net),
        IpAddr::V6(_) => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_subnets_are_denied_whole() {
        let addrs = [
            (Ipv4Addr::new(203, 0, 113, 5), 24),
            (Ipv4Addr::new(203, 0, 113, 9), 24),
            (Ipv4Addr::new(198, 51, 100, 7), 32),
            (Ipv4Addr::new(10, 0, 2, 15), 24),
            (Ipv4Addr::new(127, 0, 0, 1), 8),
        ];
        assert_eq!(subnets_outside_the_platform_list(addrs.into_iter()), ["198.51.100.7/32", "203.0.113.0/24"]);
    }

    #[test]
    fn private_ranges_are_denied_public_ones_not() {
        assert!(platform_denies(Ipv4Addr::new(192, 168, 1, 1)) && !platform_denies(Ipv4Addr::new(203, 0, 113, 1)));
    }
}
