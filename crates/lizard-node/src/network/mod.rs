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
//! Guests cannot reach the host's resolver (a private address here), so the node relays
//! their DNS queries from inside each namespace.
//!
//! - [`links`]: slots and their names, running `nft` (in a namespace).
//! - [`netlink`]: namespaces, the veth pair and the TAP device, teardown, through
//!   rtnetlink (no `ip` processes).
//! - [`firewall`]: the host's and each namespace's nftables rules.
//! - [`dns`]: the per-sandbox DNS relay.
//! - [`egress`]: the per-sandbox egress proxy, where domain rules hold.
//! - this file: the node's [`Network`] and a sandbox's [`SandboxNet`], tying them together.

mod dns;
mod egress;
mod firewall;
mod forbidden;
mod links;
mod netlink;

pub use forbidden::PLATFORM_DENY;
pub use links::{HOST_IF_PREFIX, NETNS_PREFIX};

use links::{Names, SlotLock, Slots, MAX_LINK_PREFIX};
use lizard_agent_proto::net::GUEST_MAC;
use lizard_api::network::{Cidr, ParsedPolicy};
use netlink::TAP_IF;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::task::JoinSet;

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
    /// TESTS ONLY: addresses the egress proxy may dial although the platform's deny list
    /// holds them (the private addresses of a test's own namespaces). Empty in production:
    /// anything here is reachable by name from every sandbox whose policy allows the name.
    pub egress_test_allow: Vec<Cidr>,
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
            egress_test_allow: vec![],
        }
    }
}

/// Why network setup failed.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("{what}: {cause}")]
    Io { what: String, cause: std::io::Error },
    /// A netlink request failed.
    #[error("{what}: {cause}")]
    Netlink { what: String, cause: rtnetlink::Error },
    /// An `nft` command failed.
    #[error("{command} failed: {stderr}")]
    Command { command: String, stderr: String },
    #[error("every network slot of the pool is in use")]
    Exhausted,
    /// A dead node process's network that [`Network::adopt`] could not take back.
    #[error("network not taken back: {0}")]
    NotTakenBack(String),
    /// The pool is not an IPv4 network of prefix 8..=28.
    #[error("bad network pool {pool}/{prefix}")]
    BadPool { pool: Ipv4Addr, prefix: u8 },
    /// A namespace or link prefix that cannot name interfaces.
    #[error("bad network name prefixes")]
    BadPrefixes,
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> NetError {
    move |cause| NetError::Io { what: what.into(), cause }
}

type Result<T, E = NetError> = std::result::Result<T, E>;

/// The netmask of a prefix length.
fn mask(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

/// The node's sandbox networking: the host-side rules and the slot allocator.
pub struct Network {
    config: NetworkConfig,
    names: Arc<Names>,
    resolvers: Arc<Vec<SocketAddr>>,
    slots: Slots,
    /// Netlink in the node's own namespace, for the host ends of the links.
    netlink: netlink::Netlink,
    /// [`NetworkConfig::egress_test_allow`].
    egress_test_allow: Arc<Vec<Cidr>>,
}

impl Network {
    /// Check the tools, enable forwarding and install the host's rules. What dead node
    /// processes left is swept by [`Network::sweep`], once the caller took back what it
    /// still uses ([`Network::adopt`]).
    pub async fn start(config: NetworkConfig) -> Result<Arc<Network>> {
        if !(8..=28).contains(&config.pool_prefix) || u32::from(config.pool) & !mask(config.pool_prefix) != 0 {
            return Err(NetError::BadPool { pool: config.pool, prefix: config.pool_prefix });
        }
        let name_ok = |p: &str, max: usize| {
            !p.is_empty() && p.len() <= max && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if !name_ok(&config.link_prefix, MAX_LINK_PREFIX) || !name_ok(&config.netns_prefix, 64) {
            return Err(NetError::BadPrefixes);
        }
        std::fs::create_dir_all(&config.state_dir).map_err(io_err(format!("create {}", config.state_dir.display())))?;
        netlink::share_dir(std::path::Path::new(links::NETNS_DIR))?;
        let resolvers = dns::resolvers(&config.resolvers);
        if resolvers.is_empty() {
            tracing::warn!("no DNS resolvers on the host: guests will not resolve names");
        }
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").map_err(io_err("enable IPv4 forwarding"))?;
        let net = Arc::new(Network {
            names: Arc::new(Names {
                netns_prefix: config.netns_prefix.clone(),
                link_prefix: config.link_prefix.clone(),
            }),
            resolvers: Arc::new(resolvers),
            slots: Slots::new(config.pool, config.pool_prefix, config.state_dir.clone()),
            netlink: netlink::Netlink::open()?,
            egress_test_allow: Arc::new(config.egress_test_allow.clone()),
            config,
        });
        let rules = firewall::host_ruleset(&net.host_table(), &net.config.link_prefix, &net.pool());
        links::run("nft", &["-f", "-"], Some(&rules), None).await?;
        Ok(net)
    }

    /// The host's table of this node's rules.
    fn host_table(&self) -> String {
        format!("lizard_{}", self.config.link_prefix.replace('-', "_"))
    }

    /// Remove the host's rules, once no sandbox of this node runs (a node's shutdown: a
    /// crashed node leaves them to the VMs that outlive it, and its successor replaces them).
    pub async fn stop(&self) {
        let table = self.host_table();
        if let Err(e) = links::run("nft", &["delete", "table", "ip", &table], None, None).await {
            tracing::warn!("removing the host's firewall table {table}: {e}");
        }
    }

    /// Remove the namespaces and links with this node's prefixes whose slot no live
    /// process holds (a dead node process's).
    pub fn sweep(&self) {
        self.slots.sweep(&self.names);
    }

    /// Take back the network a previous node process made for a VM that still runs in
    /// it (`attachment`, from the sandbox's record): the slot's lock, the namespace's
    /// firewall set to `policy` again and a new DNS relay (the old one died with that
    /// process). Fails, changing nothing, when the slot is held or its namespace is gone.
    pub async fn adopt(&self, attachment: &lizard_vmm::NetAttachment, policy: &ParsedPolicy) -> Result<SandboxNet> {
        let slot = attachment
            .netns
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix(self.names.netns_prefix.as_str()))
            .and_then(|s| s.parse::<u32>().ok())
            .filter(|slot| self.names.netns_path(*slot) == attachment.netns)
            .ok_or_else(|| {
                NetError::NotTakenBack(format!("{} is no namespace of this node", attachment.netns.display()))
            })?;
        let lock = self
            .slots
            .try_lock(slot)
            .ok_or_else(|| NetError::NotTakenBack(format!("slot {slot} is held by a live process")))?;
        if !self.names.complete(slot) {
            return Err(NetError::NotTakenBack(format!("slot {slot}'s namespace or host link is gone")));
        }
        let mut net = self.sandbox_net(slot, None, policy, Rules::Replaceable);
        net.set_policy(policy).await?;
        net.relay = Some(self.services(slot, net.policy.clone()).await?);
        // Only now does dropping `net` tear the namespace down: a failed take-back above
        // leaves it to the caller, who kills the VM and sweeps.
        net.lock = Some(lock);
        Ok(net)
    }

    /// Slot `slot`'s network under `policy`, its services not started yet; with `lock`,
    /// dropping it tears the slot down.
    fn sandbox_net(&self, slot: u32, lock: Option<SlotLock>, policy: &ParsedPolicy, rules: Rules) -> SandboxNet {
        SandboxNet {
            slot,
            names: self.names.clone(),
            pool: self.pool(),
            ns_addr: self.slots.addrs(slot).1,
            lock,
            relay: None,
            policy: Arc::new(RwLock::new(policy.clone())),
            rules: tokio::sync::Mutex::new(rules),
            resolvers: self.resolvers.clone(),
        }
    }

    /// The pool as `address/prefix`.
    fn pool(&self) -> String {
        format!("{}/{}", self.config.pool, self.config.pool_prefix)
    }

    /// Make a sandbox's network, with `policy`, ready for a VM to attach to.
    pub async fn attach(&self, policy: &ParsedPolicy) -> Result<SandboxNet> {
        let start = std::time::Instant::now();
        let policy = &with_denied_names_resolved(policy, &self.resolvers).await;
        let (slot, lock) = self.free_slot().await?;
        // From here on, dropping `net` undoes whatever part was made.
        let rules = if firewall::policy_additions(policy).is_empty() { Rules::Closed } else { Rules::Replaceable };
        let mut net = self.sandbox_net(slot, Some(lock), policy, rules);
        net.relay = Some(self.build(slot, policy, net.policy.clone()).await?);
        tracing::debug!(slot, took = ?start.elapsed(), "sandbox network ready");
        Ok(net)
    }

    /// A slot with nothing of an earlier network left: what a dead node process left is
    /// removed first; a slot whose leftovers cannot be removed (a namespace pin hidden
    /// under a later mount of /run/netns keeps its file busy) is passed over, with a
    /// warning for the operator, rather than failing the create.
    async fn free_slot(&self) -> Result<(u32, SlotLock)> {
        const TRIES: usize = 8;
        for _ in 0..TRIES {
            let (slot, lock) = self.slots.allocate()?;
            if !self.names.leftovers(slot) {
                return Ok((slot, lock));
            }
            let names = self.names.clone();
            tokio::task::spawn_blocking(move || names.teardown(slot)).await.expect("network teardown panicked");
            if !self.names.leftovers(slot) {
                return Ok((slot, lock));
            }
            tracing::warn!(slot, "passing over a slot whose earlier network cannot be removed");
        }
        Err(NetError::Exhausted)
    }

    /// Links and addresses, then the namespace's firewall, then the DNS relay and the
    /// egress proxy (both follow `policy_cell`).
    async fn build(
        &self,
        slot: u32,
        policy: &ParsedPolicy,
        policy_cell: Arc<RwLock<ParsedPolicy>>,
    ) -> Result<JoinSet<()>> {
        let start = std::time::Instant::now();
        let addrs = self.slots.addrs(slot);
        links::create(&self.netlink, &self.names, slot, addrs).await?;
        let linked = start.elapsed();
        let ns_path = self.names.netns_path(slot);
        let ruleset = firewall::sandbox_ruleset(&self.pool(), addrs.1, policy);
        links::run("nft", &["-f", "-"], Some(&ruleset), Some(&ns_path)).await?;
        let ruled = start.elapsed();
        let tasks = self.services(slot, policy_cell).await?;
        tracing::debug!(slot, ?linked, ?ruled, relay = ?start.elapsed(), "sandbox network steps");
        Ok(tasks)
    }

    /// The node's services inside slot `slot`'s namespace: the DNS relay and the egress
    /// proxy, both following `policy_cell`.
    async fn services(&self, slot: u32, policy_cell: Arc<RwLock<ParsedPolicy>>) -> Result<JoinSet<()>> {
        let ns_path = self.names.netns_path(slot);
        let (sockets, listeners) =
            tokio::task::spawn_blocking(move || links::in_namespace(&ns_path, || Ok((dns::bind()?, egress::bind()?))))
                .await
                .expect("namespace setup panicked")?;
        let gate = Arc::new(dns::Gate::new(policy_cell.clone()));
        let mut tasks = dns::start(sockets, self.resolvers.clone(), gate.clone())?;
        let egress = egress::Egress {
            policy: policy_cell,
            resolvers: self.resolvers.clone(),
            dns: gate,
            test_allow: self.egress_test_allow.clone(),
        };
        egress::start(listeners, Arc::new(egress), &mut tasks)?;
        Ok(tasks)
    }
}

/// Most `denyOut` names resolved for one policy.
const MAX_DENIED_NAMES_RESOLVED: usize = 64;

/// `policy` as a sandbox's network enforces it (its rules, and what its DNS relay and
/// egress proxy read): the addresses its exact `denyOut` names resolve to now (through the
/// node's resolvers) join its `denyOut` CIDRs, so a guest that dials such an address
/// directly, on any port, is refused like one that asks for the name. Resolved when the
/// policy is set; a wildcard (`*.example.com`) names no address of its own.
async fn with_denied_names_resolved(policy: &ParsedPolicy, resolvers: &[SocketAddr]) -> ParsedPolicy {
    let names: Vec<&str> = policy
        .deny_domains
        .iter()
        .filter(|d| !d.wildcard)
        .map(|d| d.name.as_str())
        .take(MAX_DENIED_NAMES_RESOLVED)
        .collect();
    let mut enforced = policy.clone();
    if names.is_empty() {
        return enforced;
    }
    let resolved = futures_util::future::join_all(names.iter().map(|n| dns::resolve_a(n, resolvers))).await;
    for ip in resolved.into_iter().flatten() {
        let cidr = Cidr { addr: std::net::IpAddr::V4(ip), prefix: 32 };
        if !enforced.deny_out.contains(&cidr) {
            enforced.deny_out.push(cidr);
        }
    }
    enforced
}

/// One sandbox's network. [`SandboxNet::release`] removes everything of it.
pub struct SandboxNet {
    slot: u32,
    names: Arc<Names>,
    /// The node's pool and the slot's namespace-side address, which its ruleset names.
    pool: String,
    ns_addr: Ipv4Addr,
    /// Ownership of the slot; dropped last, once nothing of it is left.
    lock: Option<SlotLock>,
    /// The DNS relay's and the egress proxy's tasks: aborting them closes their sockets
    /// inside the namespace.
    relay: Option<JoinSet<()>>,
    /// Its policy as the DNS relay and the egress proxy read it (follows
    /// [`SandboxNet::set_policy`]).
    policy: Arc<RwLock<ParsedPolicy>>,
    /// What the namespace's rules are now, which decides how a policy is set.
    rules: tokio::sync::Mutex<Rules>,
    /// The node's resolvers, for a policy's `denyOut` names.
    resolvers: Arc<Vec<SocketAddr>>,
}

/// The namespace's rules, as [`SandboxNet::set_policy`] finds them.
enum Rules {
    /// The closed table a fresh namespace got, nothing of a policy added (a pool
    /// machine's): a policy is only added to it, which spares the kernel's wait that a
    /// deletion costs.
    Closed,
    /// Anything else: a policy replaces the whole table.
    Replaceable,
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

    /// Replace the sandbox's firewall policy in place, in one atomic nftables transaction:
    /// the old rules and lists are gone and the new ones in force once this returns (on
    /// error the old ones stay). Flows already open are held to the new policy too: only
    /// replies into the sandbox pass on connection state. A pool machine's network is
    /// attached closed ahead of demand and opened at claim: its closed table only gains
    /// the policy's rules (≈5 ms of `nft`, against ≈15 for a replacement).
    pub async fn set_policy(&self, policy: &ParsedPolicy) -> Result<()> {
        let policy = &with_denied_names_resolved(policy, &self.resolvers).await;
        let mut rules = self.rules.lock().await;
        let script = match *rules {
            Rules::Closed => firewall::policy_additions(policy),
            Rules::Replaceable => firewall::replacement_ruleset(&self.pool, self.ns_addr, policy),
        };
        if !script.is_empty() {
            links::run("nft", &["-f", "-"], Some(&script), Some(&self.names.netns_path(self.slot))).await?;
            *rules = Rules::Replaceable;
        }
        *self.policy.write().expect("policy lock") = policy.clone();
        Ok(())
    }

    /// Stop the DNS relay and the egress proxy, remove the namespace, its links (the TAP
    /// goes with the namespace) and its rules, and free the slot. Call after the VM has
    /// exited (dropping does the same). The removal blocks (a netlink request, an
    /// unmount): on a multi-thread runtime's worker it runs in `block_in_place`, which
    /// hands the worker's other tasks to another thread first, so no runtime stalls and
    /// the network is gone when the caller (a kill) goes on; the slot is freed only then,
    /// so it is never reused half-removed.
    pub fn release(self) {}
}

impl Drop for SandboxNet {
    fn drop(&mut self) {
        if let Some(mut relay) = self.relay.take() {
            relay.abort_all();
        }
        let Some(lock) = self.lock.take() else { return };
        let (names, slot) = (self.names.clone(), self.slot);
        let now = move || {
            names.teardown(slot);
            drop(lock);
        };
        match Handle::try_current().map(|h| h.runtime_flavor()) {
            // A runtime worker (the server's runtime): hand its other tasks to another
            // thread while this one blocks.
            Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(now),
            // No runtime, or a current-thread one (tests, tools) that has no other thread
            // to hand work to: this thread blocks, as it must to leave nothing behind.
            _ => now(),
        }
    }
}
