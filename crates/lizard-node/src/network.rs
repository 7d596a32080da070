//! Sandbox networking: each sandbox gets its own network namespace on the host, with a
//! TAP device for its VM and a veth link to the host, outbound NAT, a firewall, and a
//! DNS relay.
//!
//! ```text
//!  guest eth0 10.0.2.2 ──tap0 (10.0.2.1, gateway + DNS relay)   namespace lizard-S
//!                          │ forward: platform deny → denyOut → allowOut → internet?
//!                          │ SNAT to the slot's address
//!                        veth0 (pool + 4S + 2) ──── lzvS (pool + 4S + 1)   host
//!                                                    │ input from lzv*: drop
//!                                                    │ masquerade out of the uplink
//! ```
//!
//! The guest side is the same in every sandbox (see [`lizard_agent_proto::net`]), so a
//! template snapshot holds a configured guest that any clone can use; what differs per
//! sandbox is the slot `S`, which names the namespace and the host link and picks a /30
//! out of the node's pool. Slots are owned through `flock`s on files under
//! [`NetworkConfig::state_dir`], shared by every node on the host: a slot whose lock is
//! free but whose namespace exists was left by a process that died, and is swept.
//!
//! Guests cannot reach the host's resolver (a private address here), so the node binds a
//! UDP socket and a TCP listener on the gateway address inside each namespace and relays
//! queries to the host's resolvers from the host side, bounded per sandbox.

use lizard_agent_proto::net::{GATEWAY, GATEWAY_MAC, GUEST_MAC, PREFIX_LEN};
use lizard_api::network::{Cidr, ParsedPolicy};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;

/// Namespaces are `lizard-<slot>`, host links `lzv<slot>` (by default).
pub const NETNS_PREFIX: &str = "lizard-";
pub const HOST_IF_PREFIX: &str = "lzv";
/// Interface names hold 15 bytes; a slot takes up to 5 digits.
const MAX_LINK_PREFIX: usize = 10;
/// The namespace side of the veth pair and the VM's TAP device, inside the namespace.
const NS_IF: &str = "veth0";
const TAP_IF: &str = "tap0";

/// Ranges no sandbox reaches, whatever its allow list says (IPv4; IPv6 is not forwarded
/// at all). The node's pool and the host's own addresses are added to it.
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

/// Bounds of the DNS relay, per sandbox.
const DNS_UDP_INFLIGHT: usize = 64;
const DNS_TCP_CONNECTIONS: usize = 16;
const DNS_UDP_TIMEOUT: Duration = Duration::from_secs(3);
const DNS_TCP_TIMEOUT: Duration = Duration::from_secs(20);

/// How sandbox networks are made on this node.
#[derive(Debug, Clone)]
pub struct NetworkConfig {
    /// IPv4 pool the per-sandbox links are cut from (a /30 each). Must be the same for
    /// every node on the host that shares `state_dir`.
    pub pool: Ipv4Addr,
    pub pool_prefix: u8,
    /// Host-wide directory of slot locks.
    pub state_dir: PathBuf,
    /// Where guests' DNS queries go; empty: the nameservers of the host's
    /// `/etc/resolv.conf`.
    pub resolvers: Vec<SocketAddr>,
    /// Names of this node's namespaces (`<netns_prefix><slot>`) and host links
    /// (`<link_prefix><slot>`). A node sweeps only leftovers with its own prefixes.
    pub netns_prefix: String,
    pub link_prefix: String,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            pool: Ipv4Addr::new(10, 200, 0, 0),
            pool_prefix: 16,
            state_dir: PathBuf::from("/run/lizard/net"),
            resolvers: vec![],
            netns_prefix: NETNS_PREFIX.into(),
            link_prefix: HOST_IF_PREFIX.into(),
        }
    }
}

/// Why network setup failed.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    /// An `ip` or `nft` command failed.
    #[error("{command} failed: {stderr}")]
    Command { command: String, stderr: String },
    #[error("every network slot of the pool is in use")]
    Exhausted,
    #[error("{0}")]
    Config(String),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> NetError {
    move |source| NetError::Io { what: what.into(), source }
}

type Result<T, E = NetError> = std::result::Result<T, E>;

/// The node's sandbox networking: the host-side rules and the slot allocator.
pub struct Network {
    config: NetworkConfig,
    names: Arc<Names>,
    resolvers: Arc<Vec<SocketAddr>>,
    slots: u32,
    cursor: AtomicU32,
}

impl Network {
    /// Check the tools, enable forwarding, install the host's rules and sweep what dead
    /// nodes left.
    pub async fn start(config: NetworkConfig) -> Result<Arc<Network>> {
        if !(8..=28).contains(&config.pool_prefix) || u32::from(config.pool) & !mask(config.pool_prefix) != 0 {
            return Err(NetError::Config(format!("bad network pool {}/{}", config.pool, config.pool_prefix)));
        }
        let name_ok = |p: &str, max: usize| {
            !p.is_empty() && p.len() <= max && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if !name_ok(&config.link_prefix, MAX_LINK_PREFIX) || !name_ok(&config.netns_prefix, 64) {
            return Err(NetError::Config("bad network name prefixes".into()));
        }
        std::fs::create_dir_all(&config.state_dir).map_err(io_err(format!("create {}", config.state_dir.display())))?;
        let resolvers = if config.resolvers.is_empty() {
            let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
            parse_resolv_conf(&text)
        } else {
            config.resolvers.clone()
        };
        if resolvers.is_empty() {
            tracing::warn!("no DNS resolvers on the host: guests will not resolve names");
        }
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").map_err(io_err("enable IPv4 forwarding"))?;
        let slots = 1u32 << (32 - config.pool_prefix - 2);
        let net = Arc::new(Network {
            names: Arc::new(Names {
                netns_prefix: config.netns_prefix.clone(),
                link_prefix: config.link_prefix.clone(),
            }),
            resolvers: Arc::new(resolvers),
            slots,
            cursor: AtomicU32::new(rand::random::<u32>() % slots),
            config,
        });
        run("nft", &["-f", "-"], Some(&net.host_ruleset()), None).await?;
        net.sweep().await;
        Ok(net)
    }

    fn table_name(&self) -> String {
        format!("lizard_{}", self.config.link_prefix.replace('-', "_"))
    }

    /// The root namespace's rules: nothing from a sandbox link reaches the host itself or
    /// another sandbox link; the pool is masqueraded out of the uplink; TCP MSS follows
    /// the route's MTU (uplinks are often below the guests' 1500).
    fn host_ruleset(&self) -> String {
        let t = self.table_name();
        let links = format!("{}*", self.config.link_prefix);
        let pool = format!("{}/{}", self.config.pool, self.config.pool_prefix);
        let deny = PLATFORM_DENY.join(", ");
        format!(
            "table ip {t}\ndelete table ip {t}\ntable ip {t} {{\n\
             \tchain input {{ type filter hook input priority filter - 5; policy accept;\n\
             \t\tiifname \"{links}\" drop\n\t}}\n\
             \tchain forward {{ type filter hook forward priority filter - 5; policy accept;\n\
             \t\tiifname \"{links}\" ip daddr {{ {deny}, {pool} }} drop\n\
             \t\tiifname \"{links}\" tcp flags syn tcp option maxseg size set rt mtu\n\
             \t\toifname \"{links}\" tcp flags syn tcp option maxseg size set rt mtu\n\t}}\n\
             \tchain postrouting {{ type nat hook postrouting priority srcnat; policy accept;\n\
             \t\tip saddr {pool} ip daddr != {pool} masquerade\n\t}}\n}}\n"
        )
    }

    /// Addresses of a slot: (host side, namespace side).
    fn slot_addrs(&self, slot: u32) -> (Ipv4Addr, Ipv4Addr) {
        let base = u32::from(self.config.pool) + slot * 4;
        (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2))
    }

    fn lock_path(&self, slot: u32) -> PathBuf {
        self.config.state_dir.join(format!("slot-{slot}.lock"))
    }

    /// Take slot `slot` if no live process holds it.
    fn try_lock(&self, slot: u32) -> Option<nix::fcntl::Flock<std::fs::File>> {
        let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(self.lock_path(slot)).ok()?;
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock).ok()
    }

    /// Remove namespaces and links whose slot nobody holds (a crashed node's).
    async fn sweep(&self) {
        let mut slots = std::collections::BTreeSet::new();
        for (dir, prefix) in [("/run/netns", &self.names.netns_prefix), ("/sys/class/net", &self.names.link_prefix)] {
            let Ok(entries) = std::fs::read_dir(dir) else { continue };
            for e in entries.flatten() {
                if let Some(s) =
                    e.file_name().to_str().and_then(|n| n.strip_prefix(prefix)).and_then(|s| s.parse().ok())
                {
                    slots.insert(s);
                }
            }
        }
        for slot in slots.into_iter().filter(|s| *s < self.slots) {
            if let Some(lock) = self.try_lock(slot) {
                tracing::warn!(slot, "removing a sandbox network left by a dead node process");
                self.names.teardown(slot);
                drop(lock);
            }
        }
    }

    /// Make a sandbox's network, with `policy`, ready for a VM to attach to.
    pub async fn attach(&self, policy: &ParsedPolicy) -> Result<SandboxNet> {
        let (slot, lock) = self.allocate()?;
        if self.names.leftovers(slot) {
            self.names.teardown(slot);
        }
        // From here on, dropping `net` undoes whatever part was made.
        let mut net = SandboxNet { slot, names: self.names.clone(), lock: Some(lock), relay: None };
        net.relay = Some(self.build(slot, policy).await?);
        Ok(net)
    }

    /// A free slot: its lock taken, and its addresses on no interface of the host (a
    /// leftover under another node's prefix would otherwise clash).
    fn allocate(&self) -> Result<(u32, nix::fcntl::Flock<std::fs::File>)> {
        let in_use: std::collections::HashSet<Ipv4Addr> = all_host_addresses().into_iter().collect();
        for _ in 0..self.slots {
            let slot = self.cursor.fetch_add(1, Ordering::Relaxed) % self.slots;
            let (host, _) = self.slot_addrs(slot);
            if in_use.contains(&host) {
                continue;
            }
            if let Some(lock) = self.try_lock(slot) {
                return Ok((slot, lock));
            }
        }
        Err(NetError::Exhausted)
    }

    async fn build(&self, slot: u32, policy: &ParsedPolicy) -> Result<JoinSet<()>> {
        let ns = self.names.netns(slot);
        let host_if = self.names.link(slot);
        let (host_addr, ns_addr) = self.slot_addrs(slot);
        let root = format!(
            "netns add {ns}\n\
             link add {host_if} type veth peer name {NS_IF} netns {ns}\n\
             addr add {host_addr}/30 dev {host_if}\n\
             link set {host_if} up\n"
        );
        run("ip", &["-batch", "-"], Some(&root), None).await?;
        // Nothing of a sandbox speaks IPv6, its host link included.
        let v6 = format!("/proc/sys/net/ipv6/conf/{host_if}/disable_ipv6");
        if Path::new(&v6).exists() {
            std::fs::write(&v6, "1").map_err(io_err(format!("write {v6}")))?;
        }
        let inside = format!(
            "link set lo up\n\
             addr add {ns_addr}/30 dev {NS_IF}\n\
             link set {NS_IF} up\n\
             route add default via {host_addr}\n\
             tuntap add dev {TAP_IF} mode tap\n\
             link set {TAP_IF} address {GATEWAY_MAC}\n\
             addr add {GATEWAY}/{PREFIX_LEN} dev {TAP_IF}\n\
             link set {TAP_IF} up\n"
        );
        run("ip", &["-n", &ns, "-batch", "-"], Some(&inside), None).await?;
        let ns_path = self.names.netns_path(slot);
        let ruleset = self.sandbox_ruleset(ns_addr, policy);
        run("nft", &["-f", "-"], Some(&ruleset), Some(&ns_path)).await?;
        let (udp, tcp) = tokio::task::spawn_blocking(move || prepare_namespace(&ns_path))
            .await
            .expect("namespace setup panicked")?;
        let mut relay = JoinSet::new();
        relay.spawn(udp_relay(udp, self.resolvers.clone()));
        relay.spawn(tcp_relay(tcp, self.resolvers.clone()));
        Ok(relay)
    }

    /// The namespace's rules: the guest may send DNS to the gateway and nothing else to
    /// the namespace itself; what it forwards passes the platform's deny list, then the
    /// user's lists, then the internet switch; everything leaving is SNATed to the slot's
    /// address.
    fn sandbox_ruleset(&self, ns_addr: Ipv4Addr, policy: &ParsedPolicy) -> String {
        let mut deny: Vec<String> = PLATFORM_DENY.iter().map(|s| s.to_string()).collect();
        deny.push(format!("{}/{}", self.config.pool, self.config.pool_prefix));
        deny.extend(host_addresses().into_iter().map(|a| format!("{a}/32")));
        let v4 = |l: &[Cidr]| l.iter().filter(|c| c.addr.is_ipv4()).map(Cidr::to_string).collect::<Vec<_>>();
        let (user_deny, user_allow) = (v4(&policy.deny_out), v4(&policy.allow_out));
        let set = |name: &str, elems: &[String]| {
            if elems.is_empty() {
                String::new()
            } else {
                format!(
                    "\tset {name} {{ type ipv4_addr; flags interval; auto-merge; elements = {{ {} }} }}\n",
                    elems.join(", ")
                )
            }
        };
        let mut forward = vec![
            format!("iifname \"{NS_IF}\" oifname \"{TAP_IF}\" ct state established,related accept"),
            format!("iifname != \"{TAP_IF}\" drop"),
            format!("oifname != \"{NS_IF}\" drop"),
            "meta nfproto != ipv4 drop".to_string(),
            "ip daddr @platform_deny drop".to_string(),
        ];
        if !user_deny.is_empty() {
            forward.push("ip daddr @user_deny drop".into());
        }
        if !user_allow.is_empty() {
            forward.push("ip daddr @user_allow accept".into());
        }
        forward.push(if policy.allow_internet_access { "accept" } else { "drop" }.into());
        let forward: String = forward.iter().map(|r| format!("\t\t{r}\n")).collect();
        format!(
            "table inet lizard {{\n{}{}{}\
             \tchain input {{ type filter hook input priority filter; policy drop;\n\
             \t\tiif \"lo\" accept\n\
             \t\tct state established,related accept\n\
             \t\tiifname \"{TAP_IF}\" ip daddr {GATEWAY} meta l4proto {{ tcp, udp }} th dport 53 accept\n\t}}\n\
             \tchain forward {{ type filter hook forward priority filter; policy drop;\n{forward}\t}}\n\
             \tchain postrouting {{ type nat hook postrouting priority srcnat; policy accept;\n\
             \t\toifname \"{NS_IF}\" snat ip to {ns_addr}\n\t}}\n}}\n",
            set("platform_deny", &deny),
            set("user_deny", &user_deny),
            set("user_allow", &user_allow),
        )
    }
}

/// One sandbox's network. [`SandboxNet::release`] removes everything of it.
pub struct SandboxNet {
    slot: u32,
    names: Arc<Names>,
    /// Ownership of the slot; dropped last, once nothing of it is left.
    lock: Option<nix::fcntl::Flock<std::fs::File>>,
    /// The DNS relay's tasks: aborting them closes the sockets inside the namespace.
    relay: Option<JoinSet<()>>,
}

impl SandboxNet {
    /// What the VMM needs: the namespace to run in and the TAP device.
    pub fn attachment(&self) -> lizard_vmm::NetAttachment {
        lizard_vmm::NetAttachment { netns: self.names.netns_path(self.slot), tap: TAP_IF.into(), mac: GUEST_MAC.into() }
    }

    /// Its namespace, under /run/netns.
    pub fn netns_name(&self) -> String {
        self.names.netns(self.slot)
    }

    /// Its link in the host's namespace.
    pub fn host_link(&self) -> String {
        self.names.link(self.slot)
    }

    /// Remove the namespace, its links (the TAP goes with the namespace) and its rules,
    /// stop the DNS relay and free the slot. Call after the VM has exited (dropping does
    /// the same).
    pub fn release(self) {}
}

impl Drop for SandboxNet {
    fn drop(&mut self) {
        if let Some(mut relay) = self.relay.take() {
            relay.abort_all();
        }
        if let Some(lock) = self.lock.take() {
            self.names.teardown(self.slot);
            drop(lock);
        }
    }
}

/// How one node names its slots' namespaces and links.
#[derive(Debug)]
struct Names {
    netns_prefix: String,
    link_prefix: String,
}

impl Names {
    fn netns(&self, slot: u32) -> String {
        format!("{}{slot}", self.netns_prefix)
    }

    fn netns_path(&self, slot: u32) -> PathBuf {
        Path::new("/run/netns").join(self.netns(slot))
    }

    fn link(&self, slot: u32) -> String {
        format!("{}{slot}", self.link_prefix)
    }

    fn leftovers(&self, slot: u32) -> bool {
        self.netns_path(slot).exists() || Path::new("/sys/class/net").join(self.link(slot)).exists()
    }

    /// Delete a slot's host link (and with it its peer) and its namespace (and with it
    /// the TAP and the namespace's rules). Blocking: it runs at kill, after the VM is gone.
    fn teardown(&self, slot: u32) {
        let mut batch = String::new();
        if Path::new("/sys/class/net").join(self.link(slot)).exists() {
            batch += &format!("link del {}\n", self.link(slot));
        }
        if self.netns_path(slot).exists() {
            batch += &format!("netns del {}\n", self.netns(slot));
        }
        if batch.is_empty() {
            return;
        }
        let out = std::process::Command::new("ip")
            .args(["-force", "-batch", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().expect("piped").write_all(batch.as_bytes())?;
                c.wait_with_output()
            });
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => tracing::warn!(slot, "network teardown: {}", String::from_utf8_lossy(&o.stderr).trim()),
            Err(e) => tracing::warn!(slot, "network teardown: {e}"),
        }
    }
}

/// Inside the namespace (on a thread of its own, which is the only one `setns` moves):
/// turn on forwarding, turn off IPv6, and bind the DNS relay's sockets on the gateway.
fn prepare_namespace(ns_path: &Path) -> Result<(tokio::net::UdpSocket, tokio::net::TcpListener)> {
    let ns = std::fs::File::open(ns_path).map_err(io_err(format!("open {}", ns_path.display())))?;
    std::thread::scope(|s| {
        s.spawn(|| -> Result<_> {
            // SAFETY: setns(2) on a namespace fd we own; it moves only this thread, which
            // ends with this closure.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io_err("enter the sandbox's network namespace")(std::io::Error::last_os_error()));
            }
            // /proc/sys/net shows the opening thread's namespace.
            for (path, value) in [
                ("/proc/sys/net/ipv4/ip_forward", "1"),
                ("/proc/sys/net/ipv6/conf/all/disable_ipv6", "1"),
                ("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1"),
            ] {
                std::fs::write(path, value).map_err(io_err(format!("write {path}")))?;
            }
            let addr = SocketAddr::from((GATEWAY, 53));
            let udp = std::net::UdpSocket::bind(addr).map_err(io_err("bind the DNS relay (udp)"))?;
            let tcp = std::net::TcpListener::bind(addr).map_err(io_err("bind the DNS relay (tcp)"))?;
            udp.set_nonblocking(true).map_err(io_err("DNS relay socket"))?;
            tcp.set_nonblocking(true).map_err(io_err("DNS relay socket"))?;
            Ok((udp, tcp))
        })
        .join()
        .expect("namespace thread panicked")
    })
    .and_then(|(udp, tcp)| {
        let udp = tokio::net::UdpSocket::from_std(udp).map_err(io_err("DNS relay socket"))?;
        let tcp = tokio::net::TcpListener::from_std(tcp).map_err(io_err("DNS relay socket"))?;
        Ok((udp, tcp))
    })
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

/// IPv4 addresses of the host's own interfaces that the platform list does not already
/// cover (e.g. a public uplink address). The host's input rule drops sandbox traffic to
/// them anyway; listing them here stops it one hop earlier.
fn host_addresses() -> Vec<Ipv4Addr> {
    let mut v: Vec<Ipv4Addr> = all_host_addresses().into_iter().filter(|ip| !platform_denies(*ip)).collect();
    v.sort();
    v.dedup();
    v
}

/// Every IPv4 address on the host's interfaces (this thread's namespace: the host's).
fn all_host_addresses() -> Vec<Ipv4Addr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else { return vec![] };
    addrs.filter_map(|a| a.address?.as_sockaddr_in().map(|s| s.ip())).collect()
}

fn platform_denies(ip: Ipv4Addr) -> bool {
    PLATFORM_DENY.iter().filter_map(|c| c.parse::<Cidr>().ok()).any(|c| match c.addr {
        IpAddr::V4(net) => u32::from(ip) & mask(c.prefix) == u32::from(net),
        IpAddr::V6(_) => false,
    })
}

fn mask(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - prefix as u32).unwrap_or(0)
}

/// Run a command with `stdin`, optionally inside a network namespace; its stderr is the
/// error.
async fn run(program: &str, args: &[&str], stdin: Option<&str>, netns: Option<&Path>) -> Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .stdin(if stdin.is_some() { std::process::Stdio::piped() } else { std::process::Stdio::null() })
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let ns = match netns {
        Some(p) => Some(std::fs::File::open(p).map_err(io_err(format!("open {}", p.display())))?),
        None => None,
    };
    if let Some(ns) = &ns {
        let fd = ns.as_raw_fd();
        // SAFETY: runs in the forked child before exec and only calls setns(2), which is
        // async-signal-safe; `fd` stays open in the parent until spawn returns.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let command = format!("{program} {}", args.join(" "));
    let mut child = cmd.spawn().map_err(io_err(format!("run {command} (is it installed? scripts/deps.sh)")))?;
    drop(ns);
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("piped");
        pipe.write_all(input.as_bytes()).await.map_err(io_err(format!("write to {command}")))?;
    }
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .map_err(|_| NetError::Command { command: command.clone(), stderr: "timed out".into() })?
        .map_err(io_err(format!("wait for {command}")))?;
    if !out.status.success() {
        return Err(NetError::Command { command, stderr: String::from_utf8_lossy(&out.stderr).trim().to_string() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net() -> Network {
        Network {
            names: Arc::new(Names { netns_prefix: NETNS_PREFIX.into(), link_prefix: HOST_IF_PREFIX.into() }),
            config: NetworkConfig::default(),
            resolvers: Arc::new(vec![]),
            slots: 1 << 14,
            cursor: AtomicU32::new(0),
        }
    }

    #[test]
    fn slots_cut_the_pool_into_30s() {
        let n = net();
        assert_eq!(n.slot_addrs(0), (Ipv4Addr::new(10, 200, 0, 1), Ipv4Addr::new(10, 200, 0, 2)));
        assert_eq!(n.slot_addrs(1), (Ipv4Addr::new(10, 200, 0, 5), Ipv4Addr::new(10, 200, 0, 6)));
        assert_eq!(n.slot_addrs(16383), (Ipv4Addr::new(10, 200, 255, 253), Ipv4Addr::new(10, 200, 255, 254)));
        assert_eq!(n.names.link(16383), "lzv16383");
        assert_eq!(n.names.netns_path(7), Path::new("/run/netns/lizard-7"));
    }

    #[test]
    fn platform_deny_comes_before_the_users_lists() {
        let policy = ParsedPolicy {
            allow_internet_access: false,
            allow_out: vec![
                "10.1.2.3/32".parse().unwrap(),
                "203.0.113.0/24".parse().unwrap(),
                "2001:db8::/32".parse().unwrap(),
            ],
            deny_out: vec!["203.0.113.9".parse().unwrap()],
        };
        let r = net().sandbox_ruleset(Ipv4Addr::new(10, 200, 0, 2), &policy);
        let at = |s: &str| r.find(s).unwrap_or_else(|| panic!("{s} missing in\n{r}"));
        assert!(at("@platform_deny drop") < at("@user_deny drop"));
        assert!(at("@user_deny drop") < at("@user_allow accept"));
        assert!(r.contains("10.200.0.0/16"), "{r}");
        assert!(r.contains("169.254.0.0/16"));
        assert!(!r.contains("2001:db8"), "IPv6 is not forwarded at all: {r}");
        assert!(r.contains("snat ip to 10.200.0.2"));
        assert!(r.trim_end().ends_with("}\n}") || r.contains("\t\tdrop\n\t}"), "internet off ends in drop: {r}");
        let open = net().sandbox_ruleset(
            Ipv4Addr::new(10, 200, 0, 2),
            &ParsedPolicy { allow_internet_access: true, allow_out: vec![], deny_out: vec![] },
        );
        assert!(open.contains("\t\taccept\n\t}") && !open.contains("@user_"), "{open}");
    }

    #[test]
    fn resolvers_come_from_resolv_conf() {
        let r = parse_resolv_conf("# x\nnameserver 10.255.255.53\nnameserver fe80::1%eth0\nsearch lan\n");
        assert_eq!(r, vec!["10.255.255.53:53".parse().unwrap(), "[fe80::1]:53".parse().unwrap()]);
    }
}
