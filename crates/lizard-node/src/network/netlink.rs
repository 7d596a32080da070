//! A sandbox network's links through rtnetlink and a few syscalls instead of `ip`
//! processes (three spawns per create and one per kill cost ≈20 ms of every create).
//!
//! Making slot S's namespace:
//!
//! 1. a thread of its own `unshare`s a new network namespace, pins it by bind-mounting
//!    `/proc/thread-self/ns/net` on `/run/netns/<name>` (what `ip netns add` does, in a
//!    `/run/netns` made a shared mount point of its own at start, [`share_dir`]), sets
//!    its sysctls, makes the VM's persistent TAP device there (TUNSETIFF + TUNSETPERSIST:
//!    the kernel makes TAPs only through ioctls) and opens a netlink socket that stays
//!    bound to the namespace after the thread ends;
//! 2. through the node's own socket: the veth pair, its peer created right inside the
//!    namespace, the host side's address, up;
//! 3. through the namespace's socket: loopback up, the namespace side's address and
//!    default route, the TAP's MAC and the guests' gateway address, up.
//!
//! Removing it: the host link is deleted (its peer goes with it), then the namespace is
//! unmounted and its file removed; the namespace itself (and the TAP) ends with its last
//! user.

use super::{NetError, Result};
use futures_util::TryStreamExt;
use lizard_agent_proto::net::{GATEWAY, GATEWAY_MAC, PREFIX_LEN};
use rtnetlink::packet_route::link::{InfoData, InfoVeth};
use rtnetlink::{Handle, LinkMessageBuilder, LinkUnspec, LinkVeth, RouteMessageBuilder};
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

/// The namespace side of the veth pair and the VM's TAP device, inside the namespace.
pub(super) const NS_IF: &str = "veth0";
pub(super) const TAP_IF: &str = "tap0";

/// The loopback device's index, the same in every namespace.
const LOOPBACK_INDEX: u32 = 1;

fn nl_err(what: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetError {
    move |cause| NetError::Netlink { what: what.into(), cause }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> NetError {
    super::io_err(what)
}

/// A netlink connection whose task ends when this is dropped.
pub(super) struct Netlink {
    handle: Handle,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Netlink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Netlink {
    /// A connection in the calling thread's network namespace (needs a tokio runtime).
    pub fn open() -> Result<Netlink> {
        let (connection, handle, _) = rtnetlink::new_connection().map_err(io_err("open a netlink socket"))?;
        Ok(Netlink { handle, task: tokio::spawn(connection) })
    }

    async fn index_of(&self, name: &str) -> Result<u32> {
        let what = || format!("find link {name}");
        let link = self.handle.link().get().match_name(name.to_string()).execute().try_next().await;
        Ok(link.map_err(nl_err(what()))?.ok_or_else(|| NetError::Io { what: what(), cause: not_found() })?.header.index)
    }

    async fn up_with_address(&self, index: u32, name: &str, addr: Ipv4Addr, prefix: u8) -> Result<()> {
        self.handle
            .address()
            .add(index, IpAddr::V4(addr), prefix)
            .execute()
            .await
            .map_err(nl_err(format!("address {addr}/{prefix} on {name}")))?;
        self.up(index, name).await
    }

    async fn up(&self, index: u32, name: &str) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index).up().build();
        self.handle.link().set(msg).execute().await.map_err(nl_err(format!("set {name} up")))
    }

    /// Delete the link called `name`, if there is one.
    pub async fn delete(&self, name: &str) -> Result<()> {
        match self.index_of(name).await {
            Ok(index) => self.handle.link().del(index).execute().await.map_err(nl_err(format!("delete link {name}"))),
            Err(NetError::Io { cause: source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn not_found() -> std::io::Error {
    std::io::ErrorKind::NotFound.into()
}

/// Make slot's namespace at `ns_path` with its TAP, the veth pair to the host
/// (`host_if` with `host_addr`/30 here, [`NS_IF`] with `ns_addr`/30 there) and the
/// namespace's default route. `host` is a connection in the node's own namespace.
pub(super) async fn create(
    host: &Netlink,
    ns_path: &Path,
    host_if: &str,
    (host_addr, ns_addr): (Ipv4Addr, Ipv4Addr),
) -> Result<()> {
    let runtime = tokio::runtime::Handle::current();
    let path = ns_path.to_path_buf();
    let (ns_fd, inside) = tokio::task::spawn_blocking(move || {
        std::thread::scope(|s| s.spawn(|| new_namespace(&path, &runtime)).join().expect("namespace thread panicked"))
    })
    .await
    .expect("namespace setup panicked")?;

    let peer = LinkMessageBuilder::<LinkUnspec>::new().name(NS_IF.to_string()).setns_by_fd(ns_fd.as_raw_fd()).build();
    let veth = LinkVeth::new(host_if, NS_IF).set_info_data(InfoData::Veth(InfoVeth::Peer(peer))).build();
    host.handle.link().add(veth).execute().await.map_err(nl_err(format!("add veth {host_if}")))?;
    drop(ns_fd);
    // Nothing of a sandbox speaks IPv6, its host link included.
    let v6 = format!("/proc/sys/net/ipv6/conf/{host_if}/disable_ipv6");
    if Path::new(&v6).exists() {
        std::fs::write(&v6, "1").map_err(io_err(format!("write {v6}")))?;
    }
    let index = host.index_of(host_if).await?;
    host.up_with_address(index, host_if, host_addr, 30).await?;

    inside.up(LOOPBACK_INDEX, "lo").await?;
    let veth = inside.index_of(NS_IF).await?;
    inside.up_with_address(veth, NS_IF, ns_addr, 30).await?;
    let route = RouteMessageBuilder::<Ipv4Addr>::new().gateway(host_addr).build();
    inside.handle.route().add(route).execute().await.map_err(nl_err("add the default route"))?;
    let tap = inside.index_of(TAP_IF).await?;
    let mac = parse_mac(GATEWAY_MAC).ok_or_else(|| NetError::Io {
        what: format!("gateway MAC {GATEWAY_MAC}"),
        cause: std::io::ErrorKind::InvalidData.into(),
    })?;
    let msg = LinkUnspec::new_with_index(tap).address(mac).build();
    inside.handle.link().set(msg).execute().await.map_err(nl_err("set the TAP's MAC"))?;
    inside.up_with_address(tap, TAP_IF, GATEWAY, PREFIX_LEN).await
}

fn parse_mac(s: &str) -> Option<Vec<u8>> {
    let bytes: Vec<u8> = s.split(':').map(|b| u8::from_str_radix(b, 16).ok()).collect::<Option<_>>()?;
    (bytes.len() == 6).then_some(bytes)
}

/// On a thread that ends right after: a new namespace pinned at `path`, set up, with its
/// TAP; returns a descriptor of the namespace and a netlink connection inside it.
fn new_namespace(path: &Path, runtime: &tokio::runtime::Handle) -> Result<(OwnedFd, Netlink)> {
    // SAFETY: unshare(2) with CLONE_NEWNET moves only the calling thread (this one, which
    // ends with this function) into a new network namespace; no memory is involved.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(io_err("unshare a network namespace")(std::io::Error::last_os_error()));
    }
    let ns = std::fs::File::open("/proc/thread-self/ns/net").map_err(io_err("open the new namespace"))?;
    pin(path)?;
    // /proc/sys/net shows the opening thread's namespace.
    for (p, value) in [
        ("/proc/sys/net/ipv4/ip_forward", "1"),
        ("/proc/sys/net/ipv6/conf/all/disable_ipv6", "1"),
        ("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1"),
    ] {
        std::fs::write(p, value).map_err(io_err(format!("write {p}")))?;
    }
    make_tap(TAP_IF)?;
    let _runtime = runtime.enter();
    Ok((ns.into(), Netlink::open()?))
}

/// Bind-mount this thread's network namespace on `path` (a new empty file), so that it
/// lives on without any process in it.
fn pin(path: &Path) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io_err(format!("create {}", dir.display())))?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(io_err(format!("create {}", path.display())))?;
    let mounted = nix::mount::mount(
        Some("/proc/thread-self/ns/net"),
        path,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    );
    if let Err(e) = mounted {
        let _ = std::fs::remove_file(path);
        return Err(io_err(format!("bind the namespace to {}", path.display()))(e.into()));
    }
    Ok(())
}

/// Make `dir` (created if need be) a shared mount point of its own, as `ip netns add` does
/// before its first pin; once, when the node's networking starts, before any pin. A pin
/// made while `dir` is a plain directory is hidden by the first `ip netns add` after it (an
/// operator's, another tool's): that bind-mounts `dir` over itself, with a copy of every
/// pin in it, so unpinning removes only the copy and the original keeps the file busy
/// forever. Once `dir` is a mount point, `ip netns add` only marks it shared again. One at
/// a time: two networks of one process starting together would stack two layers.
pub(super) fn share_dir(dir: &Path) -> Result<()> {
    use nix::mount::{mount, MsFlags};
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    std::fs::create_dir_all(dir).map_err(io_err(format!("create {}", dir.display())))?;
    let shared = || mount(None::<&str>, dir, None::<&str>, MsFlags::MS_SHARED | MsFlags::MS_REC, None::<&str>);
    let what = || format!("make {} a shared mount point", dir.display());
    match shared() {
        // Not a mount point yet.
        Err(nix::errno::Errno::EINVAL) => {
            mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)
                .map_err(|e| io_err(what())(e.into()))?;
            shared().map_err(|e| io_err(what())(e.into()))
        }
        r => r.map_err(|e| io_err(what())(e.into())),
    }
}

/// Unpin the namespace at `path` and remove its file (the namespace ends with its last
/// user). Nothing there is fine.
pub(super) fn unpin(path: &Path) -> Result<()> {
    match nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => {}
        Err(e) => return Err(io_err(format!("unmount {}", path.display()))(e.into())),
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err(format!("remove {}", path.display()))(e)),
        _ => Ok(()),
    }
}

/// `struct ifreq` as TUNSETIFF reads it: a name and the flags, padded to 40 bytes.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

nix::ioctl_write_ptr_bad!(tun_set_iff, libc::TUNSETIFF, IfReq);
nix::ioctl_write_int_bad!(tun_set_persist, libc::TUNSETPERSIST);

/// A persistent TAP device called `name` in this thread's namespace, owned by root.
fn make_tap(name: &str) -> Result<()> {
    let what = || format!("create TAP {name}");
    let tun = std::fs::OpenOptions::new().read(true).write(true).open("/dev/net/tun").map_err(io_err(what()))?;
    let mut req = IfReq { name: [0; libc::IFNAMSIZ], flags: 0, _pad: [0; 22] };
    if name.len() >= libc::IFNAMSIZ {
        return Err(NetError::Io { what: what(), cause: std::io::ErrorKind::InvalidInput.into() });
    }
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // IFF_TAP | IFF_NO_PI (0x0002 | 0x1000) fits a c_short.
    req.flags = libc::c_short::try_from(libc::IFF_TAP | libc::IFF_NO_PI)
        .map_err(|_| NetError::Io { what: what(), cause: std::io::ErrorKind::InvalidInput.into() })?;
    // SAFETY: TUNSETIFF reads a struct ifreq (name, flags; 40 bytes, which IfReq is) from
    // `req`, which lives across the call; `tun` is an open /dev/net/tun.
    unsafe { tun_set_iff(tun.as_raw_fd(), &req) }.map_err(|e| io_err(what())(e.into()))?;
    // SAFETY: TUNSETPERSIST takes an integer argument, no memory.
    unsafe { tun_set_persist(tun.as_raw_fd(), 1) }.map_err(|e| io_err(what())(e.into()))?;
    Ok(())
}

/// Remove `host_if` and unpin the namespace at `ns_path`, blocking: teardown runs in
/// `Drop` and at sweeps, where no runtime can be awaited. A thread of its own with a
/// one-off runtime carries the netlink request.
pub(super) fn teardown(host_if: &str, ns_path: &Path) -> Result<()> {
    let host_if = host_if.to_string();
    let deleted = std::thread::spawn(move || -> Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(io_err("start a runtime for teardown"))?;
        runtime.block_on(async {
            let nl = Netlink::open()?;
            nl.delete(&host_if).await
        })
    })
    .join()
    .expect("teardown thread panicked");
    let unpinned = unpin(ns_path);
    deleted.and(unpinned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_parse() {
        assert_eq!(parse_mac("02:4c:5a:00:00:01"), Some(vec![2, 0x4c, 0x5a, 0, 0, 1]));
        assert_eq!(parse_mac("02:4c:5a:00:00"), None);
        assert_eq!(parse_mac("zz:4c:5a:00:00:01"), None);
    }

    #[test]
    fn ifreq_is_what_the_kernel_reads() {
        assert_eq!(std::mem::size_of::<IfReq>(), 40);
    }
}
