//! The guest's side of the sandbox network: `eth0` with the fixed address and default
//! route of [`lizard_agent_proto::net`], and the gateway as the DNS resolver.
//!
//! Done once at boot, before the agent serves anything; a template snapshot carries the
//! result, which is why the addresses are the same in every sandbox.

use lizard_agent_proto::net::{GATEWAY, GUEST_ADDR, GUEST_IF, PREFIX_LEN};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};

/// Configure the network if the VM has a NIC; a VM without one (the accelerator probe,
/// a node without networking) has no `eth0` and keeps loopback only.
pub fn configure() -> io::Result<bool> {
    if !std::path::Path::new(&format!("/sys/class/net/{GUEST_IF}")).exists() {
        return Ok(false);
    }
    let sock = inet_socket()?;
    set_addr(&sock, libc::SIOCSIFADDR, GUEST_ADDR)?;
    set_addr(&sock, libc::SIOCSIFNETMASK, netmask(PREFIX_LEN))?;
    set_up(&sock, GUEST_IF)?;
    add_default_route(&sock, GATEWAY)?;
    write_resolv_conf()?;
    Ok(true)
}

fn netmask(prefix: u8) -> Ipv4Addr {
    Ipv4Addr::from(u32::MAX.checked_shl(32 - prefix as u32).unwrap_or(0))
}

/// `/etc/resolv.conf` naming the gateway, where the node relays DNS to its resolvers.
/// A symlink (e.g. to systemd-resolved's file) is replaced by a plain file.
fn write_resolv_conf() -> io::Result<()> {
    let _ = std::fs::remove_file("/etc/resolv.conf");
    std::fs::write("/etc/resolv.conf", resolv_conf())
}

fn resolv_conf() -> String {
    format!("nameserver {GATEWAY}\noptions timeout:2 attempts:3\n")
}

fn inet_socket() -> io::Result<OwnedFd> {
    use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
    Ok(socket(AddressFamily::Inet, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)?)
}

/// The request naming interface `name` (NUL-terminated), all else zero.
fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain old data, for which all zeroes is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(name.bytes().chain([0])) {
        *dst = src as libc::c_char;
    }
    ifr
}

fn sockaddr_in(addr: Ipv4Addr) -> libc::sockaddr {
    // SAFETY: sockaddr_in is plain old data; all zeroes is valid.
    let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sin.sin_family = libc::sa_family_t::try_from(libc::AF_INET).expect("AF_INET is 2");
    sin.sin_addr.s_addr = u32::from(addr).to_be();
    // SAFETY: sockaddr_in and sockaddr have the same size (16 bytes) and sockaddr is
    // the generic view of it that the ioctls take.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

fn set_addr(sock: &OwnedFd, request: libc::Ioctl, addr: Ipv4Addr) -> io::Result<()> {
    let mut ifr = ifreq(GUEST_IF);
    ifr.ifr_ifru.ifru_addr = sockaddr_in(addr);
    // SAFETY: SIOCSIFADDR/SIOCSIFNETMASK read the name and address from `ifr`, which
    // outlives the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), request, &ifr) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `ip link set NAME up`: used for `lo` at boot as well as for `eth0` here.
pub fn link_up(name: &str) -> io::Result<()> {
    set_up(&inet_socket()?, name)
}

fn set_up(sock: &OwnedFd, name: &str) -> io::Result<()> {
    let mut ifr = ifreq(name);
    // SAFETY: SIOCGIFFLAGS reads the name from `ifr` and writes the flags into it.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFFLAGS filled the union's flags member, so reading it is defined.
    let up_running = libc::c_short::try_from(libc::IFF_UP | libc::IFF_RUNNING).expect("IFF_UP | IFF_RUNNING is 0x41");
    // SAFETY: as above: the union's flags member is the one SIOCGIFFLAGS filled.
    unsafe { ifr.ifr_ifru.ifru_flags |= up_running };
    // SAFETY: SIOCSIFFLAGS only reads `ifr`, which outlives the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn add_default_route(sock: &OwnedFd, gateway: Ipv4Addr) -> io::Result<()> {
    // SAFETY: rtentry is plain old data; all zeroes is valid (destination and mask
    // 0.0.0.0: the default route).
    let mut rt: libc::rtentry = unsafe { std::mem::zeroed() };
    rt.rt_dst = sockaddr_in(Ipv4Addr::UNSPECIFIED);
    rt.rt_genmask = sockaddr_in(Ipv4Addr::UNSPECIFIED);
    rt.rt_gateway = sockaddr_in(gateway);
    rt.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
    // SAFETY: SIOCADDRT only reads `rt`, which outlives the call; rt_dev is null (the
    // kernel picks the interface that reaches the gateway).
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCADDRT, &rt) } < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(e);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_and_resolver() {
        assert_eq!(netmask(30), Ipv4Addr::new(255, 255, 255, 252));
        assert_eq!(netmask(0), Ipv4Addr::UNSPECIFIED);
        assert_eq!(resolv_conf().lines().next(), Some("nameserver 10.0.2.1"));
        assert_eq!(ifreq(GUEST_IF).ifr_name[..5].iter().map(|c| *c as u8).collect::<Vec<_>>(), b"eth0\0");
    }
}
