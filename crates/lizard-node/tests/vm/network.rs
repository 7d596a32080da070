//! Sandbox networks, proven with real packets: every rule is tried against hosts this
//! test creates itself (servers in a network namespace of its own, on the host, in
//! another sandbox), and the outside world only as a package registry.
//!
//! Needs root (namespaces, nftables), like the node's networking itself.

// Helpers of these tests unwrap as the tests do (clippy.toml's allow-unwrap-in-tests
// covers only the #[test] functions themselves).
#![allow(clippy::unwrap_used)]

use crate::common;

use common::sh;
use lizard_api::CreateSandboxRequest;
use lizard_node::network::NetworkConfig;
use lizard_node::Sandbox;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn base() -> CreateSandboxRequest {
    CreateSandboxRequest { template: "base".into(), ..Default::default() }
}

/// Prefixes of this test's own namespaces and links, so that counts are not disturbed by
/// other nodes on the machine.
fn own_prefixes(c: &mut NetworkConfig) {
    let tag: String = (0..3).map(|_| (b'a' + rand::random::<u8>() % 26) as char).collect();
    c.netns_prefix = format!("lizard-t{tag}-");
    c.link_prefix = format!("lzt{tag}");
}

/// A network configuration of the test's own: its prefixes, and slot locks in a directory
/// that lives as long as the returned guard.
fn own_config() -> (NetworkConfig, tempfile::TempDir) {
    let state = tempfile::tempdir().unwrap();
    let mut config = NetworkConfig { state_dir: state.path().to_path_buf(), ..Default::default() };
    own_prefixes(&mut config);
    (config, state)
}

/// A node whose networks carry prefixes of their own.
struct NetNode {
    t: common::TestNode,
    link_prefix: String,
}

async fn test_node() -> NetNode {
    let mut link_prefix = String::new();
    let t = common::node_with(|c| {
        let n = c.network.as_mut().expect("the tests run as root: networking is on");
        own_prefixes(n);
        link_prefix = n.link_prefix.clone();
    })
    .await;
    NetNode { t, link_prefix }
}

impl NetNode {
    /// Kill everything, prove nothing is left, and drop the host rules of this node's
    /// prefix (a node leaves them in place: another node of the same prefix may use them).
    async fn finish(self) {
        self.t.finish().await;
        drop_host_rules(&self.link_prefix);
    }
}

fn drop_host_rules(link_prefix: &str) {
    let _ = Command::new("nft").args(["delete", "table", "ip", &format!("lizard_{link_prefix}")]).status();
}

fn ip(args: &str) {
    let out = Command::new("ip").args(args.split_whitespace()).output().unwrap();
    assert!(out.status.success(), "ip {args}: {}", String::from_utf8_lossy(&out.stderr));
}

fn ip_out(args: &str) -> String {
    let out = Command::new("ip").args(args.split_whitespace()).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An HTTP server answering `token` to every request, on `listener`, until dropped.
fn serve(listener: std::net::TcpListener, token: String) -> tokio::task::JoinHandle<()> {
    listener.set_nonblocking(true).unwrap();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        loop {
            let Ok((mut s, _)) = listener.accept().await else { continue };
            let token = token.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                let _ = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await;
                let body = format!("HTTP/1.0 200 OK\r\ncontent-length: {}\r\n\r\n{token}", token.len());
                let _ = s.write_all(body.as_bytes()).await;
            });
        }
    })
}

/// A "remote" host made by this test: a network namespace reached from the host through a
/// veth link, holding one public-looking address (TEST-NET-3, routed to it and nowhere
/// else) and one address in each private range, with an HTTP server on all of them.
struct FakeHosts {
    ns: String,
    link: String,
    public: Ipv4Addr,
    private: Vec<Ipv4Addr>,
    routes: Vec<Ipv4Addr>,
    server: tokio::task::JoinHandle<()>,
}

const PORT: u16 = 8080;

impl FakeHosts {
    fn new(token: &str) -> FakeHosts {
        let n: u8 = 1 + rand::random::<u8>() % 250;
        let tag: String = (0..4).map(|_| (b'a' + rand::random::<u8>() % 26) as char).collect();
        let ns = format!("lizard-testhosts-{tag}");
        let link = format!("lzth{tag}");
        let public = Ipv4Addr::new(203, 0, 113, n);
        let private = vec![
            Ipv4Addr::new(172, 30, n, 2), // the link's own far end (172.16/12)
            Ipv4Addr::new(10, 201, n, 1),
            Ipv4Addr::new(192, 168, 213, n),
            Ipv4Addr::new(100, 64, 213, n),
            Ipv4Addr::new(169, 254, 213, n),
        ];
        ip(&format!("netns add {ns}"));
        ip(&format!("link add {link} type veth peer name eth0 netns {ns}"));
        ip(&format!("addr add 172.30.{n}.1/30 dev {link}"));
        ip(&format!("link set {link} up"));
        ip(&format!("-n {ns} link set lo up"));
        ip(&format!("-n {ns} addr add 172.30.{n}.2/30 dev eth0"));
        for a in std::iter::once(&public).chain(&private[1..]) {
            ip(&format!("-n {ns} addr add {a}/32 dev eth0"));
        }
        ip(&format!("-n {ns} link set eth0 up"));
        let mut routes = vec![];
        for a in std::iter::once(&public).chain(&private[1..]) {
            ip(&format!("route add {a}/32 via 172.30.{n}.2 dev {link}"));
            routes.push(*a);
            // Never anywhere else: the route must lead into our namespace.
            assert!(ip_out(&format!("route get {a}")).contains(&link), "{a} is not routed to the test namespace");
        }
        let listener = in_netns(&ns, || std::net::TcpListener::bind(("0.0.0.0", PORT)).unwrap());
        FakeHosts { server: serve(listener, token.to_string()), ns, link, public, private, routes }
    }
}

impl Drop for FakeHosts {
    fn drop(&mut self) {
        self.server.abort();
        for a in &self.routes {
            let _ = Command::new("ip").args(["route", "del", &format!("{a}/32")]).status();
        }
        let _ = Command::new("ip").args(["link", "del", &self.link]).status();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

/// Run `f` on a thread inside network namespace `ns`.
fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    let file = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns(2) with a namespace fd we own; it moves only this thread.
            assert_eq!(unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
            f()
        })
        .join()
        .unwrap()
    })
}

/// From the host: does `addr:port` answer `token`?
async fn host_reaches(addr: Ipv4Addr, port: u16, token: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect((addr, port)).await.ok()?;
        s.write_all(b"GET / HTTP/1.0\r\n\r\n").await.ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        Some(out.ends_with(token))
    };
    tokio::time::timeout(Duration::from_secs(3), attempt).await.ok().flatten().unwrap_or(false)
}

/// From inside the sandbox, all at once: which of `targets` (host:port) answer `token`?
async fn reachable(sbx: &Sandbox, targets: &[String], token: &str) -> BTreeMap<String, bool> {
    let mut script = String::from(
        "probe() { r=$(curl -s --connect-timeout 2 -m 4 \"http://$1/\" 2>/dev/null); \
         if [ \"$r\" = \"$TOKEN\" ]; then echo \"$1 open\"; else echo \"$1 closed\"; fi; }\n",
    );
    for t in targets {
        script += &format!("probe {t} &\n");
    }
    script += "wait\n";
    let mut req = sh(&script);
    req.env.insert("TOKEN".into(), token.into());
    let r = sbx.exec_collect(req).await.unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    let got: BTreeMap<String, bool> =
        r.stdout.lines().filter_map(|l| l.split_once(' ')).map(|(t, v)| (t.to_string(), v == "open")).collect();
    assert_eq!(got.len(), targets.len(), "{}", r.stdout);
    got
}

/// Address of a sandbox's host-side link (in the host's namespace).
fn link_addr(link: &str) -> Ipv4Addr {
    let out = ip_out(&format!("-4 -o addr show dev {link}"));
    out.split_whitespace().skip_while(|w| *w != "inet").nth(1).unwrap().split('/').next().unwrap().parse().unwrap()
}

/// The host's own global IPv4 addresses (its uplink's), not the test's or sandboxes'.
fn host_uplink_addrs() -> Vec<Ipv4Addr> {
    ip_out("-4 -o addr show scope global")
        .lines()
        .filter(|l| !l.contains(" lz") && !l.contains("lzt"))
        .filter_map(|l| l.split_whitespace().skip_while(|w| *w != "inet").nth(1)?.split('/').next()?.parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn egress_rules_hold_for_real_packets() {
    let token = format!("lizard-net-{}", rand::random::<u64>());
    let hosts = FakeHosts::new(&token);
    // The host's own services: a server on every host address (the API port stands for
    // them all), loopback included.
    let host_listener = std::net::TcpListener::bind(("0.0.0.0", 0)).unwrap();
    let host_port = host_listener.local_addr().unwrap().port();
    let _host_server = serve(host_listener, token.clone());

    // Controls: from the host, every one of them answers; a blocked probe is the rules'
    // doing, not a missing server.
    for a in std::iter::once(hosts.public).chain(hosts.private.iter().copied()) {
        assert!(host_reaches(a, PORT, &token).await, "control: {a}:{PORT} does not answer the host");
    }
    assert!(host_reaches(Ipv4Addr::LOCALHOST, host_port, &token).await);

    let n = test_node().await;
    let t = &n.t;
    t.node.prepare("base").await.unwrap();
    let public = format!("{}:{PORT}", hosts.public);
    let default = t.node.create(base()).await.unwrap();
    let closed = t
        .node
        .create(CreateSandboxRequest {
            allow_internet_access: Some(false),
            allow_out: vec![
                format!("{}/32", hosts.public),
                format!("{}/32", hosts.private[1]),
                "169.254.0.0/16".into(),
            ],
            ..base()
        })
        .await
        .unwrap();
    let denied = t
        .node
        .create(CreateSandboxRequest {
            allow_out: vec![hosts.public.to_string()],
            deny_out: vec![format!("{}/24", hosts.public)],
            ..base()
        })
        .await
        .unwrap();
    let offline = t.node.create(CreateSandboxRequest { allow_internet_access: Some(false), ..base() }).await.unwrap();
    assert!(default.from_snapshot(), "the sandboxes restore from a snapshot made with the same NIC");

    // A server in the `closed` sandbox, for sandbox ↔ sandbox.
    let mut srv =
        sh("nohup node -e 'require(\"http\").createServer((q, r) => r.end(process.env.TOKEN)).listen(8000)' >/dev/null 2>&1 &");
    srv.env.insert("TOKEN".into(), token.clone());
    assert_eq!(closed.exec_collect(srv).await.unwrap().exit_code, 0);
    let (closed_ns, closed_link) = closed.network().unwrap();
    // Control: inside its namespace, the host reaches that guest (bounded wait for node).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ok = in_netns(&closed_ns, || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(host_reaches(Ipv4Addr::new(10, 0, 2, 2), 8000, &token))
        });
        if ok {
            break;
        }
        if Instant::now() > deadline {
            let guest = closed.exec_collect(sh("ip addr; ip route; ps ax | grep node")).await.unwrap();
            let rules =
                Command::new("ip").args(["netns", "exec", &closed_ns, "nft", "list", "ruleset"]).output().unwrap();
            panic!(
                "control: the guest's server never answered inside its namespace\n{guest:?}\n{}",
                String::from_utf8_lossy(&rules.stdout)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let closed_ns_addr = {
        let out = in_netns(&closed_ns, || ip_out("-4 -o addr show dev veth0"));
        out.split_whitespace().skip_while(|w| *w != "inet").nth(1).unwrap().split('/').next().unwrap().to_string()
    };

    let (_, default_link) = default.network().unwrap();
    let mut host_targets: Vec<String> = host_uplink_addrs().iter().map(|a| format!("{a}:{host_port}")).collect();
    host_targets.push(format!("{}:{host_port}", link_addr(&default_link))); // its own host side
    host_targets.push(format!("{}:{host_port}", link_addr(&closed_link))); // another sandbox's host side
    host_targets.push(format!("127.0.0.1:{host_port}"));
    let private: Vec<String> = hosts.private.iter().map(|a| format!("{a}:{PORT}")).collect();
    let other_sandbox = format!("{closed_ns_addr}:8000");

    // Default: the internet (here: the test's public address) yes; private and
    // link-local ranges, the host and other sandboxes no.
    let mut all = vec![public.clone(), other_sandbox.clone()];
    all.extend(private.iter().cloned());
    all.extend(host_targets.iter().cloned());
    let got = reachable(&default, &all, &token).await;
    eprintln!("default sandbox: {got:?}");
    assert!(got[&public], "the default sandbox cannot reach a public address: {got:?}");
    for t in all.iter().filter(|t| **t != public) {
        assert!(!got[t], "the default sandbox reached {t}: {got:?}");
    }

    // No internet, but an allow list: only the allowed public address; an allowed
    // private or link-local range stays closed (the platform's list wins).
    let got =
        reachable(&closed, &[public.clone(), private[1].clone(), private[4].clone(), private[0].clone()], &token).await;
    eprintln!("closed sandbox: {got:?}");
    assert!(got[&public], "allowOut did not open {public}: {got:?}");
    assert!(!got[&private[1]] && !got[&private[4]] && !got[&private[0]], "allowOut opened a private range: {got:?}");

    // denyOut wins over allowOut; no internet closes everything.
    let got = reachable(&denied, std::slice::from_ref(&public), &token).await;
    assert!(!got[&public], "denyOut did not close {public}");
    let got = reachable(&offline, std::slice::from_ref(&public), &token).await;
    assert!(!got[&public], "allowInternetAccess=false still reached {public}");

    // A fork has a network of its own, with its source's policy.
    let copies = t.node.fork(&closed.id, 1).await.unwrap();
    let (copy_ns, _) = copies[0].network().unwrap();
    assert_ne!(copy_ns, closed_ns);
    let got = reachable(&copies[0], &[public.clone(), private[0].clone()], &token).await;
    assert!(got[&public] && !got[&private[0]], "the fork lost its source's policy: {got:?}");
    t.node.kill(&copies[0].id).await.unwrap();
    assert!(!std::path::Path::new("/run/netns").join(&copy_ns).exists(), "{copy_ns} outlived its fork");

    // The guest's view: its fixed address, and DNS through the gateway.
    let r = default.exec_collect(sh("ip -4 -o addr show dev eth0; cat /etc/resolv.conf")).await.unwrap();
    assert!(r.stdout.contains("10.0.2.2/30") && r.stdout.contains("nameserver 10.0.2.1"), "{r:?}");

    for s in [&default, &closed, &denied, &offline] {
        t.node.kill(&s.id).await.unwrap();
    }
    assert!(!std::path::Path::new("/run/netns").join(&closed_ns).exists(), "{closed_ns} outlived its sandbox");
    n.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_resolves_names_and_reaches_the_npm_registry() {
    let n = test_node().await;
    let t = &n.t;
    let sbx = t.node.create(base()).await.unwrap();
    // npm resolves the registry it is configured with through the gateway's DNS relay,
    // then fetches from it: name resolution and the way out, in one step.
    let mut req = sh("npm view left-pad version");
    req.timeout_ms = Some(150_000);
    let r = sbx.exec_collect(req).await.unwrap();
    assert_eq!(r.exit_code, 0, "npm view: {r:?}");
    let v = r.stdout.trim();
    assert!(v.split('.').count() == 3 && v.split('.').all(|p| p.parse::<u32>().is_ok()), "not a version: {v:?}");
    n.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_cidrs_are_refused_before_anything_is_made() {
    let n = test_node().await;
    let t = &n.t;
    for (allow, deny) in [(vec!["10.0.0.0/33".to_string()], vec![]), (vec![], vec!["not-an-address".to_string()])] {
        let e = t.node.create(CreateSandboxRequest { allow_out: allow, deny_out: deny, ..base() }).await.err().unwrap();
        assert_eq!(e.code(), lizard_api::ErrorCode::InvalidArgument, "{e}");
    }
    assert!(t.node.list().is_empty());
    n.finish().await;
}

/// What a node's networking leaves on the host: its namespaces, its links, addresses on
/// them, its rules, and this process's open files (the DNS relay's sockets).
#[derive(Debug, PartialEq, Eq)]
struct Footprint {
    namespaces: usize,
    links: usize,
    addresses: usize,
    root_rules: usize,
    fds: usize,
}

fn footprint(ns_prefix: &str, link_prefix: &str) -> Footprint {
    let count_dir = |dir: &str, prefix: &str| {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
            .count()
    };
    let addresses = ip_out("-o addr")
        .lines()
        .filter(|l| l.split_whitespace().nth(1).is_some_and(|d| d.starts_with(link_prefix)))
        .count();
    let table = format!("lizard_{link_prefix}");
    let rules = Command::new("nft").args(["list", "table", "ip", &table]).output().unwrap();
    Footprint {
        namespaces: count_dir("/run/netns", ns_prefix),
        links: count_dir("/sys/class/net", link_prefix),
        addresses,
        root_rules: String::from_utf8_lossy(&rules.stdout).lines().count(),
        fds: std::fs::read_dir("/proc/self/fd").unwrap().count(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn fifty_sandboxes_leave_no_network_behind() {
    let mut prefixes = (String::new(), String::new());
    let t = common::node_with(|c| {
        let n = c.network.as_mut().unwrap();
        own_prefixes(n);
        prefixes = (n.netns_prefix.clone(), n.link_prefix.clone());
    })
    .await;
    let (ns_prefix, link_prefix) = prefixes;
    // The template snapshot first: its build makes and removes a network of its own.
    let warm = t.node.create(base()).await.unwrap();
    t.node.kill(&warm.id).await.unwrap();
    drop(warm);
    let before = footprint(&ns_prefix, &link_prefix);
    assert_eq!((before.namespaces, before.links, before.addresses), (0, 0, 0), "{before:?}");
    assert!(before.root_rules > 0, "the node's host rules are missing");

    let started = Instant::now();
    for i in 0..50 {
        let sbx: Arc<Sandbox> = t.node.create(base()).await.unwrap();
        let (ns, link) = sbx.network().unwrap();
        // Not vacuous: while it runs, its namespace, link and address exist.
        let during = footprint(&ns_prefix, &link_prefix);
        assert_eq!((during.namespaces, during.links, during.addresses), (1, 1, 1), "sandbox {i}: {during:?}");
        assert!(
            std::path::Path::new("/run/netns").join(&ns).exists()
                && std::path::Path::new("/sys/class/net").join(&link).exists()
        );
        if i % 10 == 0 {
            let r = sbx.exec_collect(sh("cat /sys/class/net/eth0/address")).await.unwrap();
            assert_eq!(r.stdout.trim(), lizard_agent_proto::net::GUEST_MAC);
        }
        t.node.kill(&sbx.id).await.unwrap();
    }
    eprintln!("50 × (create + kill) with networks: {:?}", started.elapsed());
    // Aborted relay tasks close their sockets on the runtime's next turn.
    // Open files are the whole test process's: other tests in it (cargo test runs them on
    // threads) open and close their own meanwhile, so they get a margin well below the
    // 100 that 50 sandboxes' two relay sockets each would leak.
    let same = |a: &Footprint, b: &Footprint| {
        (a.namespaces, a.links, a.addresses, a.root_rules) == (b.namespaces, b.links, b.addresses, b.root_rules)
            && a.fds < b.fds + 50
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut after = footprint(&ns_prefix, &link_prefix);
    while !same(&after, &before) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = footprint(&ns_prefix, &link_prefix);
    }
    eprintln!("before {before:?}, after {after:?}");
    assert!(
        same(&after, &before),
        "something of 50 sandboxes' networks was left behind: before {before:?}, after {after:?}"
    );
    t.finish().await;
    drop_host_rules(&link_prefix);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_node_sweeps_networks_a_dead_one_left() {
    let mut config = None;
    let t = common::node_with(|c| {
        own_prefixes(c.network.as_mut().unwrap());
        config = Some(c.clone());
    })
    .await;
    let net = config.unwrap().network.unwrap();
    // Simulate a crash: the namespace and link of a slot nobody holds.
    let slot = 16000 + rand::random::<u32>() % 380;
    let ns = format!("{}{slot}", net.netns_prefix);
    let link = format!("{}{slot}", net.link_prefix);
    ip(&format!("netns add {ns}"));
    ip(&format!("link add {link} type veth peer name veth0 netns {ns}"));
    drop(t.node);
    let t2 = common::node_with(|c| c.network = Some(net.clone())).await;
    assert!(!std::path::Path::new("/run/netns").join(&ns).exists(), "{ns} was not swept");
    assert!(!std::path::Path::new("/sys/class/net").join(&link).exists(), "{link} was not swept");
    t2.finish().await;
    drop_host_rules(&net.link_prefix);
}

/// From a stand-in guest's namespace: does `addr:PORT` answer `token`?
fn guest_reaches(guest_ns: &str, addr: Ipv4Addr, token: &str) -> bool {
    use std::io::{Read, Write};
    in_netns(guest_ns, || {
        let Ok(mut s) = std::net::TcpStream::connect_timeout(&(addr, PORT).into(), Duration::from_secs(2)) else {
            return false;
        };
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut out = String::new();
        s.write_all(b"GET / HTTP/1.0\r\n\r\n").is_ok() && s.read_to_string(&mut out).is_ok() && out.ends_with(token)
    })
}

/// `Node::set_network_policy` replaces a sandbox's policy while it runs and while it is
/// paused (the resumed guest is held to the new one, and a fork made then inherits it);
/// a policy that does not parse is refused and changes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_sandboxs_policy_is_replaced_while_it_runs_and_while_it_is_paused() {
    use lizard_api::network::NetworkPolicy;
    let token = format!("lizard-update-{}", rand::random::<u64>());
    let hosts = FakeHosts::new(&token);
    assert!(host_reaches(hosts.public, PORT, &token).await, "control: the public host does not answer");
    let n = test_node().await;
    let t = &n.t;
    let public = format!("{}:{PORT}", hosts.public);
    let targets = std::slice::from_ref(&public);
    let sbx = t.node.create(CreateSandboxRequest { allow_internet_access: Some(false), ..base() }).await.unwrap();
    assert!(!reachable(&sbx, targets, &token).await[&public], "a closed sandbox reached {public}");

    let open = NetworkPolicy {
        allow_internet_access: Some(false),
        allow_out: vec![format!("{}/32", hosts.public)],
        deny_out: vec![],
    };
    t.node.set_network_policy(&sbx.id, open).await.unwrap();
    assert!(reachable(&sbx, targets, &token).await[&public], "the new allowOut did not open {public}");

    let bad = NetworkPolicy { deny_out: vec!["10.0.0.0/33".into()], ..Default::default() };
    let e = t.node.set_network_policy(&sbx.id, bad).await.unwrap_err();
    assert_eq!(e.code(), lizard_api::ErrorCode::InvalidArgument, "{e}");
    assert!(reachable(&sbx, targets, &token).await[&public], "a refused policy changed the sandbox's");

    t.node.pause(&sbx.id).await.unwrap();
    let closed = NetworkPolicy { allow_internet_access: Some(false), ..Default::default() };
    t.node.set_network_policy(&sbx.id, closed).await.unwrap();
    t.node.resume(&sbx.id).await.unwrap();
    assert!(!reachable(&sbx, targets, &token).await[&public], "resumed, it still reached {public}");
    let copies = t.node.fork(&sbx.id, 1).await.unwrap();
    assert!(!reachable(&copies[0], targets, &token).await[&public], "a fork did not inherit the new policy");
    n.finish().await;
}

/// `SandboxNet::set_policy` replaces a live sandbox's firewall in place: a network
/// attached closed (as a warm pool does ahead of demand) is opened to one host, then the
/// policy is replaced again and the old allow list is gone. No VM: the sandbox's TAP is
/// swapped for a veth named like it, whose far end is a guest namespace of the test's own
/// with the guest's address, so the rules (which match on interface names) see the same
/// packets a guest would send.
#[tokio::test(flavor = "multi_thread")]
async fn set_policy_replaces_a_live_sandboxs_rules() {
    use lizard_agent_proto::net::{GATEWAY, GUEST_ADDR, PREFIX_LEN};
    use lizard_api::network::ParsedPolicy;
    let (config, _state) = own_config();
    let link_prefix = config.link_prefix.clone();
    let net = lizard_node::network::Network::start(config).await.unwrap();
    let token = format!("lizard-policy-{}", rand::random::<u64>());
    let hosts = FakeHosts::new(&token);

    let closed = ParsedPolicy::default();
    let sbx = net.attach(&closed).await.unwrap();
    let ns = sbx.netns_name();
    let guest = format!("{ns}-guest");
    ip(&format!("netns add {guest}"));
    ip(&format!("-n {ns} link del tap0"));
    ip(&format!("-n {ns} link add tap0 type veth peer name eth0 netns {guest}"));
    ip(&format!("-n {ns} addr add {GATEWAY}/{PREFIX_LEN} dev tap0"));
    ip(&format!("-n {ns} link set tap0 up"));
    ip(&format!("-n {guest} link set lo up"));
    ip(&format!("-n {guest} addr add {GUEST_ADDR}/{PREFIX_LEN} dev eth0"));
    ip(&format!("-n {guest} link set eth0 up"));
    ip(&format!("-n {guest} route add default via {GATEWAY}"));
    let public = hosts.public;
    let private = hosts.private[1];
    let reach = |addr| {
        let (guest, token) = (guest.clone(), token.clone());
        tokio::task::spawn_blocking(move || guest_reaches(&guest, addr, &token))
    };
    let ruleset = || {
        let out = Command::new("ip").args(["netns", "exec", &ns, "nft", "list", "table", "inet", "lizard"]).output();
        String::from_utf8_lossy(&out.unwrap().stdout).into_owned()
    };

    assert!(!reach(public).await.unwrap(), "a closed network reached {public}");

    // Opened to one host: it answers; private ranges stay closed whatever the list says.
    let one: ParsedPolicy = ParsedPolicy {
        allow_internet_access: false,
        allow_out: vec![format!("{public}/32").parse().unwrap(), format!("{private}/32").parse().unwrap()],
        ..Default::default()
    };
    sbx.set_policy(&one).await.unwrap();
    assert!(reach(public).await.unwrap(), "the allowed host {public} is not reachable after set_policy");
    assert!(!reach(private).await.unwrap(), "the platform's deny list lost to set_policy");
    assert!(ruleset().contains(&public.to_string()));

    // Replaced: internet on, that host denied. The old allow list is gone, not merged.
    let other = ParsedPolicy {
        allow_internet_access: true,
        allow_out: vec![],
        deny_out: vec![format!("{public}/32").parse().unwrap()],
        ..Default::default()
    };
    sbx.set_policy(&other).await.unwrap();
    assert!(!reach(public).await.unwrap(), "a denied host is reachable: the old rules survived");
    let rules = ruleset();
    assert!(!rules.contains("user_allow"), "the old allow list is still there:\n{rules}");
    assert_eq!(rules.matches("chain forward").count(), 1, "{rules}");

    // And closed again.
    sbx.set_policy(&closed).await.unwrap();
    assert!(!reach(public).await.unwrap());

    sbx.release();
    ip(&format!("netns del {guest}"));
    drop(hosts);
    drop_host_rules(&link_prefix);
}

/// Releasing a network on the runtime's only worker thread removes it before the release
/// returns, while another task of that runtime keeps running (the blocking part runs in
/// `block_in_place`, which hands the worker's tasks to another thread first).
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_network_released_on_a_runtime_worker_is_gone_at_once_and_stalls_nothing() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (config, _state) = own_config();
    let link_prefix = config.link_prefix.clone();
    let net = lizard_node::network::Network::start(config).await.unwrap();
    let mut turns_during_releases = 0;
    for _ in 0..5 {
        let sbx = net.attach(&lizard_api::network::ParsedPolicy::default()).await.unwrap();
        let ns = sbx.netns_name();
        // A task that must get turns while the release blocks: it spins on the runtime
        // until the release's own task says it is done.
        let done = Arc::new(AtomicBool::new(false));
        let turns = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (d, t) = (done.clone(), turns.clone());
        let spinner = tokio::spawn(async move {
            while !d.load(Ordering::SeqCst) {
                t.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
        });
        let t = turns.clone();
        let release = tokio::spawn(async move {
            let before = t.load(Ordering::SeqCst);
            sbx.release();
            let during = t.load(Ordering::SeqCst) - before;
            let gone = !std::path::Path::new("/run/netns").join(&ns).exists();
            done.store(true, Ordering::SeqCst);
            (gone, ns, during)
        });
        let (gone, ns, during) = release.await.unwrap();
        spinner.await.unwrap();
        assert!(gone, "{ns} outlived its release");
        turns_during_releases += during;
    }
    assert!(turns_during_releases > 0, "the runtime's other task never ran while networks were removed");
    drop_host_rules(&link_prefix);
}

/// Set in a test's copy re-executed by [`in_own_mount_namespace`].
const PRIVATE_MOUNTS: &str = "LIZARD_TEST_IN_PRIVATE_MOUNTS";

/// False: this process ran test `name` again in a mount namespace of its own (`unshare
/// --mount`, nothing propagated back to the host) and checked that it passed. True: this
/// is that copy, with /run/netns made a plain directory again (the host's mounts on it
/// unmounted here only), as on a host where nothing has run `ip netns add` yet.
fn in_own_mount_namespace(name: &str) -> bool {
    let netns_dir = std::path::Path::new("/run/netns");
    if std::env::var_os(PRIVATE_MOUNTS).is_none() {
        // The harness names a test by its path below the binary's root (`network::…`).
        let module = module_path!().split_once("::").map_or("", |(_, m)| m);
        let test = format!("{module}::{name}");
        let out = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--"])
            .arg(std::env::current_exe().unwrap())
            .args([test.as_str(), "--exact", "--nocapture"])
            .env(PRIVATE_MOUNTS, "1")
            .output()
            .unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "the copy in its own mount namespace failed:\n{said}");
        assert!(said.contains("1 passed"), "the copy ran no test:\n{said}");
        return false;
    }
    for _ in 0..16 {
        if !mounted_on(netns_dir) {
            break;
        }
        nix::mount::umount2(netns_dir, nix::mount::MntFlags::MNT_DETACH).unwrap();
    }
    assert!(!mounted_on(netns_dir), "/run/netns is still a mount point");
    std::fs::create_dir_all(netns_dir).unwrap();
    true
}

/// Something is mounted on `dir` in this mount namespace.
fn mounted_on(dir: &std::path::Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().any(|l| l.split(' ').nth(4) == Some(dir.to_str().unwrap()))
}

fn is_namespace(p: &std::path::Path) -> bool {
    nix::sys::statfs::statfs(p).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
}

/// The first `ip netns add` after a node pinned namespaces in a plain /run/netns (an
/// operator's, another tool's) must not hide those pins: a hidden pin keeps its file busy
/// after the release, and its slot could never be used again.
#[tokio::test(flavor = "multi_thread")]
async fn a_namespace_pin_survives_ip_netns_add_on_the_host() {
    if !in_own_mount_namespace("a_namespace_pin_survives_ip_netns_add_on_the_host") {
        return;
    }
    let netns_dir = std::path::Path::new("/run/netns");
    let (config, _state) = own_config();
    let link_prefix = config.link_prefix.clone();
    let other = format!("{}other", config.netns_prefix);
    let net = lizard_node::network::Network::start(config).await.unwrap();
    let sbx = net.attach(&lizard_api::network::ParsedPolicy::default()).await.unwrap();
    let pin = netns_dir.join(sbx.netns_name());
    assert!(is_namespace(&pin), "{} is no namespace", pin.display());
    // What an operator may run beside the node: a namespace of this test's own.
    ip(&format!("netns add {other}"));
    let still_visible = is_namespace(&pin);
    ip(&format!("netns del {other}"));
    assert!(still_visible, "`ip netns add` hid the sandbox's namespace at {}", pin.display());
    sbx.release();
    assert!(!pin.exists(), "{} outlived its release", pin.display());
    drop_host_rules(&link_prefix);
}

/// A slot whose earlier namespace cannot be removed (its pin hidden under a later mount
/// of /run/netns, as before the fix above) is passed over: a create gets another slot,
/// and only when every slot is stuck does it fail, with the pool exhausted.
#[tokio::test(flavor = "multi_thread")]
async fn a_slot_whose_leftovers_cannot_be_removed_is_passed_over() {
    if !in_own_mount_namespace("a_slot_whose_leftovers_cannot_be_removed_is_passed_over") {
        return;
    }
    let netns_dir = std::path::Path::new("/run/netns");
    let (mut config, _state) = own_config();
    // Four slots (a /28 of /30s), in a pool of this test's own.
    (config.pool, config.pool_prefix) = (Ipv4Addr::new(10, 201, 77, 0), 28);
    let (link_prefix, netns_prefix) = (config.link_prefix.clone(), config.netns_prefix.clone());
    let bind = |from: &str, to: &std::path::Path| {
        nix::mount::mount(Some(from), to, None::<&str>, nix::mount::MsFlags::MS_BIND, None::<&str>).unwrap();
    };
    let stick = |slots: &[u32]| {
        for slot in slots {
            let pin = netns_dir.join(format!("{netns_prefix}{slot}"));
            std::fs::File::create(&pin).unwrap();
            bind("/proc/self/ns/net", &pin);
        }
        // The directory mounted over itself, not recursively: those pins are hidden and
        // their files busy.
        bind("/run/netns", netns_dir);
    };
    stick(&[0, 1, 3]);
    let net = lizard_node::network::Network::start(config).await.unwrap();
    let sbx = net.attach(&lizard_api::network::ParsedPolicy::default()).await.unwrap();
    let got = sbx.netns_name();
    sbx.release();
    stick(&[2]);
    let all_stuck = net.attach(&lizard_api::network::ParsedPolicy::default()).await.err();
    drop_host_rules(&link_prefix);
    // The files are the host's too (only the mounts are this namespace's): uncover the
    // pins, unmount them and remove the files before asserting.
    while mounted_on(netns_dir) {
        nix::mount::umount2(netns_dir, nix::mount::MntFlags::MNT_DETACH).unwrap();
    }
    for slot in 0..4 {
        let pin = netns_dir.join(format!("{netns_prefix}{slot}"));
        let _ = nix::mount::umount2(&pin, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_file(&pin);
    }
    assert_eq!(got, format!("{netns_prefix}2"), "the only slot left");
    assert!(matches!(all_stuck, Some(lizard_node::network::NetError::Exhausted)), "{all_stuck:?}");
}
