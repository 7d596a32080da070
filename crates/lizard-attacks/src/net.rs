//! Test hosts for network attacks: a network namespace of the test's own, linked to the
//! host by a veth pair; a DNS resolver inside it that answers names with addresses the
//! test chooses and counts what it was sent; a web server inside it (HTTP on 80, a
//! recorder of TLS ClientHellos on 443). A server under attack is pointed at the resolver
//! (`--dns-resolver`), never at the machine's real resolver.

use nix::sched::{setns, CloneFlags};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinSet;

/// A namespace and its veth link to the host: `host_addr` on the host's end, `addr` on
/// the namespace's (a /30 of 10.254.0.0/16 picked at random).
pub struct TestNamespace {
    pub name: String,
    link: String,
    pub host_addr: Ipv4Addr,
    pub addr: Ipv4Addr,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

impl TestNamespace {
    pub fn new() -> TestNamespace {
        TestNamespace::in_block(10, 254)
    }

    /// The same, its link a /30 of 198.18.0.0/16 (the benchmarking range: not private,
    /// so the platform's fixed deny list does not cover it, as a cloud host's public
    /// uplink subnet).
    pub fn on_a_public_subnet() -> TestNamespace {
        TestNamespace::in_block(198, 18)
    }

    fn in_block(a: u8, b: u8) -> TestNamespace {
        let tag: String = (0..5).map(|_| char::from(b'a' + rand_below(26))).collect();
        let (c, d) = (rand_below(250), rand_below(63) * 4);
        let name = format!("lizard-atk-{tag}");
        let link = format!("lzat{tag}");
        let host_addr = Ipv4Addr::new(a, b, c, d + 1);
        let addr = Ipv4Addr::new(a, b, c, d + 2);
        ip(&["netns", "add", &name]);
        let ns = TestNamespace { name, link, host_addr, addr };
        ip(&["link", "add", &ns.link, "type", "veth", "peer", "name", "eth0", "netns", &ns.name]);
        ip(&["addr", "add", &format!("{}/30", ns.host_addr), "dev", &ns.link]);
        ip(&["link", "set", &ns.link, "up"]);
        ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        ip(&["-n", &ns.name, "addr", "add", &format!("{}/30", ns.addr), "dev", "eth0"]);
        ip(&["-n", &ns.name, "link", "set", "eth0", "up"]);
        ns
    }

    /// Give the namespace one more address, routed to it from the host (so that anything
    /// sent there, by mistake or not, reaches this namespace and nothing else).
    pub fn add_routed_address(&self, addr: Ipv4Addr) {
        ip(&["-n", &self.name, "addr", "add", &format!("{addr}/32"), "dev", "eth0"]);
        ip(&["route", "add", &format!("{addr}/32"), "via", &self.addr.to_string(), "dev", &self.link]);
        let out = Command::new("ip").args(["route", "get", &addr.to_string()]).output().expect("ip route get");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(&self.link),
            "{addr} is not routed to the test namespace"
        );
    }

    /// Run `f` on a thread inside the namespace (sockets it makes stay there).
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let file = std::fs::File::open(format!("/run/netns/{}", self.name)).expect("open the namespace");
        std::thread::scope(|s| {
            s.spawn(|| {
                setns(&file, CloneFlags::CLONE_NEWNET).expect("enter the test namespace");
                f()
            })
            .join()
            .expect("namespace thread")
        })
    }
}

impl Default for TestNamespace {
    fn default() -> Self {
        TestNamespace::new()
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.link]).status();
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

fn rand_below(n: u8) -> u8 {
    rand::random::<u8>() % n
}

/// What a [`TestResolver`] was sent.
#[derive(Debug, Default)]
pub struct ResolverStats {
    pub udp_queries: AtomicUsize,
    pub tcp_connections: AtomicUsize,
    pub tcp_bytes: AtomicUsize,
}

/// A DNS server on port 53 of a [`TestNamespace`], UDP and TCP.
pub struct TestResolver {
    pub addr: SocketAddr,
    pub stats: Arc<ResolverStats>,
    tasks: JoinSet<()>,
}

impl TestResolver {
    /// Answer every question with `answer`.
    pub fn start(ns: &TestNamespace, answer: Ipv4Addr) -> TestResolver {
        TestResolver::start_with(ns, &[], answer)
    }

    /// Answer the names of `answers` with their addresses, any other with `default`.
    pub fn start_with(ns: &TestNamespace, answers: &[(&str, Ipv4Addr)], default: Ipv4Addr) -> TestResolver {
        let answers: Arc<Vec<(String, Ipv4Addr)>> =
            Arc::new(answers.iter().map(|(n, a)| (n.to_ascii_lowercase(), *a)).collect());
        let answer = move |name: &str| answers.iter().find(|(n, _)| n == name).map_or(default, |(_, a)| *a);
        let addr = SocketAddr::from((ns.addr, 53));
        let (udp, tcp) = ns.enter(|| {
            let udp = std::net::UdpSocket::bind(addr).expect("bind the test resolver (udp)");
            let tcp = std::net::TcpListener::bind(addr).expect("bind the test resolver (tcp)");
            udp.set_nonblocking(true).expect("nonblocking");
            tcp.set_nonblocking(true).expect("nonblocking");
            (udp, tcp)
        });
        let udp = tokio::net::UdpSocket::from_std(udp).expect("tokio udp");
        let tcp = tokio::net::TcpListener::from_std(tcp).expect("tokio tcp");
        let stats = Arc::new(ResolverStats::default());
        let mut tasks = JoinSet::new();
        let s = stats.clone();
        let udp_answer = answer.clone();
        tasks.spawn(async move {
            let answer = udp_answer;
            let mut buf = vec![0u8; 4096];
            while let Ok((n, from)) = udp.recv_from(&mut buf).await {
                s.udp_queries.fetch_add(1, Ordering::SeqCst);
                if let Some(reply) = reply(&buf[..n], &answer) {
                    let _ = udp.send_to(&reply, from).await;
                }
            }
        });
        let s = stats.clone();
        tasks.spawn(async move {
            while let Ok((mut conn, _)) = tcp.accept().await {
                s.tcp_connections.fetch_add(1, Ordering::SeqCst);
                let (s, answer) = (s.clone(), answer.clone());
                tokio::spawn(async move {
                    // Every byte counts, framed or not; whole frames are answered.
                    let (mut pending, mut buf) = (Vec::new(), [0u8; 4096]);
                    loop {
                        let n = match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        s.tcp_bytes.fetch_add(n, Ordering::SeqCst);
                        pending.extend_from_slice(&buf[..n]);
                        while pending.len() >= 2 {
                            let len = usize::from(u16::from_be_bytes([pending[0], pending[1]]));
                            if pending.len() < 2 + len {
                                break;
                            }
                            let msg: Vec<u8> = pending.drain(..2 + len).skip(2).collect();
                            let Some(r) = reply(&msg, &answer) else { return };
                            let Ok(rlen) = u16::try_from(r.len()) else { return };
                            let mut framed = rlen.to_be_bytes().to_vec();
                            framed.extend_from_slice(&r);
                            if conn.write_all(&framed).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        TestResolver { addr, stats, tasks }
    }

    pub fn udp_queries(&self) -> usize {
        self.stats.udp_queries.load(Ordering::SeqCst)
    }

    pub fn tcp_bytes(&self) -> usize {
        self.stats.tcp_bytes.load(Ordering::SeqCst)
    }
}

impl Drop for TestResolver {
    fn drop(&mut self) {
        self.tasks.abort_all();
    }
}

/// The answer to `query`: its header and question, one A record of the address
/// `answer` gives for its name.
fn reply(query: &[u8], answer: &impl Fn(&str) -> Ipv4Addr) -> Option<Vec<u8>> {
    let mut at = 12;
    let mut labels = vec![];
    loop {
        let len = usize::from(*query.get(at)?);
        if len > 0 {
            labels.push(String::from_utf8_lossy(query.get(at + 1..at + 1 + len)?).to_ascii_lowercase());
        }
        at += 1 + len;
        if len == 0 {
            break;
        }
    }
    let answer = answer(&labels.join("."));
    let end = at + 4;
    let mut out = query.get(..end)?.to_vec();
    out[2] = 0x81; // QR, RD
    out[3] = 0x80; // RA, NOERROR
    out[4..12].copy_from_slice(&[0, 1, 0, 1, 0, 0, 0, 0]);
    out.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
    out.extend_from_slice(&answer.octets());
    Some(out)
}

/// A web server in a [`TestNamespace`]: HTTP on port 80 (every request answered with
/// [`TestWebServer::BODY`], connections kept alive, each request's `Host` recorded), and
/// on port 443 a recorder of the first bytes of each connection (a TLS ClientHello: no
/// handshake follows).
pub struct TestWebServer {
    http_hits: Arc<AtomicUsize>,
    hosts: Arc<std::sync::Mutex<Vec<String>>>,
    hellos: Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
    tasks: JoinSet<()>,
}

impl TestWebServer {
    pub const BODY: &'static str = "hello from the test";

    pub fn start(ns: &TestNamespace) -> TestWebServer {
        let (http, tls) = ns.enter(|| {
            let bind = |port: u16| {
                let l = std::net::TcpListener::bind(("0.0.0.0", port)).expect("bind the test web server");
                l.set_nonblocking(true).expect("nonblocking");
                l
            };
            (bind(80), bind(443))
        });
        let tokio_listener = |l| tokio::net::TcpListener::from_std(l).expect("tokio listener");
        let (http, tls) = (tokio_listener(http), tokio_listener(tls));
        let (http_hits, hellos) = (Arc::new(AtomicUsize::new(0)), Arc::new(std::sync::Mutex::new(Vec::new())));
        let hosts = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = JoinSet::new();
        let (hits, seen_hosts) = (http_hits.clone(), hosts.clone());
        tasks.spawn(async move {
            while let Ok((mut conn, _)) = http.accept().await {
                let (hits, seen_hosts) = (hits.clone(), seen_hosts.clone());
                tokio::spawn(async move {
                    // Requests without bodies, one after another on the connection.
                    let mut pending = Vec::new();
                    let mut buf = [0u8; 1024];
                    for _ in 0..16 {
                        while !pending.windows(4).any(|w| w == b"\r\n\r\n") && pending.len() < 16 * 1024 {
                            match conn.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => pending.extend_from_slice(&buf[..n]),
                            }
                        }
                        let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") else { return };
                        let head = String::from_utf8_lossy(&pending[..end]).into_owned();
                        pending.drain(..end + 4);
                        let host = head.lines().find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("host").then(|| v.trim().to_string())
                        });
                        seen_hosts.lock().expect("host log").push(host.unwrap_or_default());
                        hits.fetch_add(1, Ordering::SeqCst);
                        let body = TestWebServer::BODY;
                        let resp = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len());
                        if conn.write_all(resp.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let seen = hellos.clone();
        tasks.spawn(async move {
            while let Ok((mut conn, _)) = tls.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let read = tokio::time::timeout(std::time::Duration::from_secs(3), conn.read(&mut buf)).await;
                    if let Ok(Ok(n)) = read {
                        seen.lock().expect("hello log").push(buf[..n].to_vec());
                    }
                });
            }
        });
        TestWebServer { http_hits, hosts, hellos, tasks }
    }

    /// HTTP requests answered so far.
    pub fn http_hits(&self) -> usize {
        self.http_hits.load(Ordering::SeqCst)
    }

    /// The `Host` of each HTTP request answered so far.
    pub fn hosts(&self) -> Vec<String> {
        self.hosts.lock().expect("host log").clone()
    }

    /// First bytes of each connection to port 443 so far.
    pub fn hellos(&self) -> Vec<Vec<u8>> {
        self.hellos.lock().expect("hello log").clone()
    }
}

impl Drop for TestWebServer {
    fn drop(&mut self) {
        self.tasks.abort_all();
    }
}
