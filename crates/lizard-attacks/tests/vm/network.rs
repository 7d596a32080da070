//! A guest against the node's DNS relay: it cannot flood the resolver behind it, cannot
//! use the relay's TCP side as a pipe to that resolver, and without internet access it
//! resolves no name at all.
//!
//! The relay points at a resolver this test runs in a namespace of its own
//! ([`lizard_attacks::net`]), never at the machine's resolver; it answers every question
//! with 192.0.2.7 and counts what reached it.

#![allow(clippy::unwrap_used)]

use lizard_attacks::net::{TestNamespace, TestResolver};
use lizard_attacks::system::System;
use serde_json::json;
use std::net::Ipv4Addr;

/// What the test resolver answers.
const ANSWER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 7);

/// A DNS client in the guest, talking to the gateway's relay (10.0.2.1:53):
/// `one NAME` (UDP), `tcp NAME` (one framed query over TCP), `junk` (HTTP over the TCP
/// port), `flood N` (N UDP queries as fast as it can). Prints what it got.
const CLIENT: &str = r#"cat > /tmp/dnsq.py <<'EOF'
import socket, struct, sys, time
RELAY = ('10.0.2.1', 53)
def query(name, qid):
    q = struct.pack('>HHHHHH', qid, 0x0100, 1, 0, 0, 0)
    for label in name.split('.'):
        if label:
            q += bytes([len(label)]) + label.encode()
    return q + b'\0' + struct.pack('>HH', 1, 1)
def show(data):
    ancount = struct.unpack('>H', data[6:8])[0]
    ip = '.'.join(str(b) for b in data[-4:]) if ancount else '-'
    print('rcode=%d ip=%s' % (data[3] & 15, ip))
mode = sys.argv[1]
if mode == 'one':
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    s.sendto(query(sys.argv[2], 4242), RELAY)
    try:
        show(s.recv(4096))
    except socket.timeout:
        print('timeout')
elif mode == 'tcp':
    s = socket.create_connection(RELAY, timeout=3)
    q = query(sys.argv[2], 4343)
    s.sendall(struct.pack('>H', len(q)) + q)
    data = b''
    try:
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
            if len(data) >= 2 and len(data) >= 2 + struct.unpack('>H', data[:2])[0]:
                break
    except socket.timeout:
        pass
    show(data[2:]) if len(data) > 14 else print('nothing')
elif mode == 'junk':
    s = socket.create_connection(RELAY, timeout=3)
    s.sendall(b'\x00\x40GET / HTTP/1.1\r\nHost: resolver\r\nX-Smuggled: yes\r\n\r\n' + b'x' * 64)
    try:
        print('answered=%d' % len(s.recv(4096)))
    except (socket.timeout, ConnectionResetError):
        print('answered=0')
elif mode == 'flood':
    n = int(sys.argv[2])
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    sent = answered = 0
    start = time.time()
    def drain():
        global answered
        while True:
            try:
                s.recv(4096)
                answered += 1
            except BlockingIOError:
                return
    while sent < n:
        try:
            s.sendto(query('flood%d.test' % sent, sent & 0xffff), RELAY)
            sent += 1
        except BlockingIOError:
            pass
        drain()
    secs = time.time() - start
    time.sleep(1)
    drain()
    print('sent=%d answered=%d secs=%.2f' % (sent, answered, secs))
EOF
echo ready"#;

async fn with_client(system: &System, id: &str) {
    let (code, out, err) = system.exec(id, CLIENT).await;
    assert_eq!((code, out.trim()), (0, "ready"), "{err}");
}

async fn dns(system: &System, id: &str, args: &str) -> String {
    let (code, out, err) = system.exec(id, &format!("python3 /tmp/dnsq.py {args}")).await;
    assert_eq!(code, 0, "dnsq {args}: {err}");
    out.trim().to_string()
}

/// A server whose sandboxes' DNS goes to a resolver in a namespace of the test's own.
async fn system_with_resolver() -> (System, TestResolver, TestNamespace) {
    let ns = TestNamespace::new();
    let resolver = TestResolver::start(&ns, ANSWER);
    let system = System::start(&["--dns-resolver", &resolver.addr.to_string()]).await;
    (system, resolver, ns)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_flooding_the_dns_relay_is_held_to_its_budget_and_a_neighbour_still_resolves() {
    let (system, resolver, _ns) = system_with_resolver().await;
    let flooder = system.create_sandbox("base", json!({})).await;
    let neighbour = system.create_sandbox("base", json!({})).await;
    with_client(&system, &flooder).await;
    with_client(&system, &neighbour).await;
    // The positive control: one query, answered by the test's resolver.
    assert_eq!(dns(&system, &flooder, "one a.test").await, format!("rcode=0 ip={ANSWER}"));

    let before = resolver.udp_queries();
    let out = dns(&system, &flooder, "flood 3000").await;
    let relayed = resolver.udp_queries() - before;
    let secs: f64 = out.rsplit("secs=").next().unwrap().parse().unwrap();
    // The relay's budget: a burst of 100, then 50 a second (with a second of slack).
    let bound = 100.0 + 50.0 * (secs + 2.0);
    println!("flood: {out}; {relayed} reached the resolver");
    assert!((relayed as f64) <= bound, "{relayed} queries reached the resolver in {secs:.2} s ({out}); bound {bound}");
    assert!(relayed > 0, "none relayed: {out}");
    // The flood spent the flooder's budget, not its neighbour's.
    assert_eq!(dns(&system, &neighbour, "one b.test").await, format!("rcode=0 ip={ANSWER}"));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dns_relays_tcp_side_carries_dns_queries_and_nothing_else() {
    let (system, resolver, _ns) = system_with_resolver().await;
    let id = system.create_sandbox("base", json!({})).await;
    with_client(&system, &id).await;
    assert_eq!(dns(&system, &id, "junk").await, "answered=0");
    assert_eq!(resolver.tcp_bytes(), 0, "bytes that are not DNS reached the resolver");
    assert_eq!(dns(&system, &id, "tcp c.test").await, format!("rcode=0 ip={ANSWER}"));
    assert!(resolver.tcp_bytes() > 0, "the DNS query went another way");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_without_internet_access_resolves_no_name() {
    let (system, resolver, _ns) = system_with_resolver().await;
    let offline = system.create_sandbox("base", json!({"allowInternetAccess": false})).await;
    let online = system.create_sandbox("base", json!({})).await;
    with_client(&system, &offline).await;
    with_client(&system, &online).await;
    assert_eq!(dns(&system, &offline, "one d.test").await, "rcode=5 ip=-", "REFUSED by the relay");
    assert_eq!(dns(&system, &offline, "tcp d.test").await, "rcode=5 ip=-");
    assert_eq!(
        (resolver.udp_queries(), resolver.tcp_bytes()),
        (0, 0),
        "an offline sandbox's query reached the resolver"
    );
    assert_eq!(dns(&system, &online, "one e.test").await, format!("rcode=0 ip={ANSWER}"));
}

/// Open file descriptors of process `pid`.
fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// Connections one sandbox may have open through its API forwarder
/// (`lizard_node::forward::PER_SANDBOX`).
const FORWARDS_PER_SANDBOX: usize = 64;

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_holding_api_connections_open_costs_the_server_a_bounded_number_of_descriptors() {
    let system = System::start(&[]).await;
    let hog = system.create_sandbox("base", json!({})).await;
    let neighbour = system.create_sandbox("base", json!({})).await;
    let pid = system.pid().unwrap();
    let before = descriptors(pid);
    // 200 connections to the in-sandbox API address, opened and held without a byte.
    let hold = r#"cat > /tmp/hold.py <<'EOF'
import socket, time
socks = []
for i in range(200):
    try:
        socks.append(socket.create_connection(('127.0.0.1', 49171), timeout=1))
    except OSError:
        pass
with open('/tmp/held', 'w') as f:
    f.write(str(len(socks)))
time.sleep(120)
EOF
nohup python3 /tmp/hold.py >/dev/null 2>&1 &
for i in $(seq 600); do [ -s /tmp/held ] && cat /tmp/held && exit 0; sleep 0.1; done; exit 1"#;
    let (code, held, err) = system.exec(&hog, hold).await;
    assert_eq!(code, 0, "the guest opened its connections: {err}");
    let held: usize = held.trim().parse().unwrap();
    assert!(held > 2 * FORWARDS_PER_SANDBOX, "only {held} connections opened: no attack");
    // Let the host take up whatever it takes up.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let during = descriptors(pid);
    let grown = during.saturating_sub(before);
    println!("{held} guest connections held: the server's descriptors grew by {grown} ({before} → {during})");
    assert!(
        grown <= 2 * FORWARDS_PER_SANDBOX + 40,
        "{held} held guest connections cost the server {grown} descriptors"
    );
    // The cap is the hog's alone: its neighbour still reaches the API.
    let (code, _, _) =
        system.exec(&neighbour, "curl -s -o /dev/null --max-time 10 http://127.0.0.1:49171/health").await;
    assert_eq!(code, 0, "the neighbour lost its API access");
}

/// `curl` in the guest with a short bound: exit code and body.
async fn guest_curl(system: &System, id: &str, args: &str) -> (i64, String) {
    let (code, out, _) = system.exec(id, &format!("curl -s --max-time 5 {args}")).await;
    (code, out)
}

#[tokio::test(flavor = "multi_thread")]
async fn with_internet_off_an_allowed_domain_is_reachable_by_name_and_nothing_else() {
    let ns = TestNamespace::new();
    // An address of the test's namespace that no test allowance covers: a private one.
    let private = Ipv4Addr::new(10, 253, ns.addr.octets()[2], ns.addr.octets()[3]);
    ns.add_routed_address(private);
    let resolver = TestResolver::start_with(&ns, &[("private.test", private)], ns.addr);
    let web = lizard_attacks::net::TestWebServer::start(&ns);
    let system = System::start(&[
        "--dns-resolver",
        &resolver.addr.to_string(),
        "--egress-test-allow",
        &format!("{}/32", ns.addr),
    ])
    .await;
    let id = system
        .create_sandbox("base", json!({"allowInternetAccess": false, "allowOut": ["allowed.test", "private.test"]}))
        .await;
    let body = lizard_attacks::net::TestWebServer::BODY;

    // The allowed name, resolved and dialed: it answers.
    assert_eq!(guest_curl(&system, &id, "http://allowed.test/").await, (0, body.to_string()));
    // Whatever address the guest dials, the proxy dials its own resolution of the name.
    let (code, got) = guest_curl(&system, &id, "--resolve allowed.test:80:203.0.113.1 http://allowed.test/").await;
    assert_eq!((code, got.as_str()), (0, body));
    assert_eq!(web.http_hits(), 2);

    // Another name: no answer from DNS, and no connection when dialed by address.
    assert_ne!(guest_curl(&system, &id, "http://other.test/").await.0, 0);
    assert_ne!(guest_curl(&system, &id, &format!("--resolve other.test:80:{} http://other.test/", ns.addr)).await.0, 0);
    // The bare address, which no rule allows.
    assert_ne!(guest_curl(&system, &id, &format!("http://{}/", ns.addr)).await.0, 0);
    // An allowed name that resolves to a private address: never dialed.
    assert_ne!(guest_curl(&system, &id, "http://private.test/").await.0, 0);
    assert_eq!(web.http_hits(), 2, "a refused connection reached the web server");

    // A keep-alive connection for the allowed name turning to another host at the same
    // address (its second request): the first is answered, the second never reaches it.
    let fronting = "exec 3<>/dev/tcp/allowed.test/80; \
                    printf 'GET / HTTP/1.1\\r\\nHost: allowed.test\\r\\n\\r\\n' >&3; sleep 1; \
                    printf 'GET /fronted HTTP/1.1\\r\\nHost: other.test\\r\\n\\r\\n' >&3; \
                    timeout 5 cat <&3";
    let (_, out, _) = system.exec(&id, &format!("bash -c \"{fronting}\"")).await;
    assert_eq!(out.matches(body).count(), 1, "{out}");
    assert_eq!(web.hosts(), ["allowed.test"; 3], "the second Host reached the server");

    // TLS: the ClientHello for the allowed name reaches the server (SNI intact); one for
    // another name does not.
    guest_curl(&system, &id, "-k https://allowed.test/").await;
    guest_curl(&system, &id, &format!("-k --resolve other.test:443:{} https://other.test/", ns.addr)).await;
    let hellos = web.hellos();
    assert_eq!(hellos.len(), 1, "{} ClientHellos reached the server", hellos.len());
    assert!(hellos[0].windows(12).any(|w| w == b"allowed.test"), "the server name was not passed on");
}

#[tokio::test(flavor = "multi_thread")]
async fn names_sent_to_the_egress_proxy_spend_the_sandboxs_dns_budget() {
    let ns = TestNamespace::new();
    let resolver = TestResolver::start(&ns, ns.addr);
    let web = lizard_attacks::net::TestWebServer::start(&ns);
    let system = System::start(&[
        "--dns-resolver",
        &resolver.addr.to_string(),
        "--egress-test-allow",
        &format!("{}/32", ns.addr),
    ])
    .await;
    let id = system.create_sandbox("base", json!({"allowInternetAccess": false, "allowOut": ["*.allowed.test"]})).await;
    // Each connection names another host under the allowed domain: an exfiltration channel
    // through the proxy's own lookups if they were free. Dialed by address, so the guest
    // itself asks DNS nothing.
    let script = r#"cat > /tmp/hosts.py <<'EOF'
import socket, sys, time
names = sys.argv[1:] if len(sys.argv) > 1 else ['x%d.exfil.allowed.test' % i for i in range(400)]
start = time.time()
ok = 0
for name in names:
    s = socket.create_connection(('203.0.113.1', 80), timeout=5)
    s.sendall(b'GET / HTTP/1.1\r\nHost: ' + name.encode() + b'\r\nConnection: close\r\n\r\n')
    try:
        ok += s.recv(65536).startswith(b'HTTP/1')
    except OSError:
        pass
    s.close()
print('answered=%d secs=%.2f' % (ok, time.time() - start))
EOF
echo ready"#;
    let (code, out, err) = system.exec(&id, script).await;
    assert_eq!((code, out.trim()), (0, "ready"), "{err}");
    let before = resolver.udp_queries();
    let (code, out, err) = system.exec(&id, "python3 /tmp/hosts.py").await;
    assert_eq!(code, 0, "{err}");
    let looked_up = resolver.udp_queries() - before;
    let secs: f64 = out.trim().rsplit("secs=").next().unwrap().parse().unwrap();
    let answered: usize = out.trim().strip_prefix("answered=").unwrap().split(' ').next().unwrap().parse().unwrap();
    println!("400 names: {}; {looked_up} lookups reached the resolver", out.trim());
    // The relay's budget: a burst of 100, then 50 a second (with two seconds of slack).
    let bound = 100.0 + 50.0 * (secs + 2.0);
    assert!((looked_up as f64) <= bound, "{looked_up} lookups in {secs:.2} s (bound {bound}); before: 400 in 1.2 s");
    assert!(answered > 0 && answered == web.http_hits(), "{answered} answered, {} hits", web.http_hits());
    // One name again and again: looked up once, then cached.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let before = resolver.udp_queries();
    let same = vec!["same.allowed.test"; 20].join(" ");
    let (code, out, _) = system.exec(&id, &format!("python3 /tmp/hosts.py {same}")).await;
    assert_eq!((code, out.trim().starts_with("answered=20 ")), (0, true), "{out}");
    assert_eq!(resolver.udp_queries() - before, 1, "20 connections to one name, one lookup");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_address_behind_a_denied_name_is_refused_when_dialed_directly() {
    let ns = TestNamespace::new();
    // Two public-looking addresses of the test's namespace: one is `blocked.test`'s.
    let octets = ns.addr.octets();
    let (blocked, other) =
        (Ipv4Addr::new(198, 19, octets[2], octets[3]), Ipv4Addr::new(198, 19, octets[2], octets[3] + 1));
    ns.add_routed_address(blocked);
    ns.add_routed_address(other);
    let resolver = TestResolver::start_with(&ns, &[("blocked.test", blocked)], other);
    let web = lizard_attacks::net::TestWebServer::start(&ns);
    let system = System::start(&["--dns-resolver", &resolver.addr.to_string()]).await;
    let id = system.create_sandbox("base", json!({"denyOut": ["blocked.test"]})).await;
    let body = lizard_attacks::net::TestWebServer::BODY;
    // The control: internet access is on, another address answers.
    assert_eq!(guest_curl(&system, &id, &format!("http://{other}:80/")).await, (0, body.to_string()));
    // The denied name's address, dialed by address whatever the port (80 here goes through the egress proxy, as a bare address).
    // Before: it answered (only the name was refused).
    assert_ne!(guest_curl(&system, &id, &format!("http://{blocked}:80/")).await.0, 0);
    assert_eq!(web.http_hits(), 1, "the denied name's address was reached");
}

/// The issue's case: with internet access off and only the package registry's domain
/// allowed, `npm` reaches its registry (through the egress proxy, which dials the
/// registry's public addresses itself). The registry's name is read from npm's own
/// configuration in a sandbox with internet access.
#[tokio::test(flavor = "multi_thread")]
async fn npm_reaches_its_registry_with_only_that_domain_allowed_and_internet_off() {
    let system = System::start(&[]).await;
    let probe = system.create_sandbox("base", json!({})).await;
    let (code, registry, err) = system.exec(&probe, "npm config get registry").await;
    assert_eq!(code, 0, "{err}");
    let host = registry.trim().split("://").nth(1).and_then(|rest| rest.split(['/', ':']).next()).unwrap().to_string();
    let id = system.create_sandbox("base", json!({"allowInternetAccess": false, "allowOut": [host]})).await;
    let (status, r) = system
        .call(
            reqwest::Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"cmd": "npm view left-pad version", "timeoutMs": 150_000})),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["exitCode"], 0, "npm view failed: {r}");
    let version = r["stdout"].as_str().unwrap().trim();
    assert!(version.split('.').count() == 3 && version.split('.').all(|p| p.parse::<u32>().is_ok()), "{version:?}");
}
