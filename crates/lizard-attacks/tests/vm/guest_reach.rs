//! A guest against the host and its neighbours: whatever it dials, it reaches neither the
//! host's services (even one listening on every address), nor the metadata address, nor
//! another sandbox; the in-sandbox API address (its only way to the control plane) works.

#![allow(clippy::unwrap_used)]

use lizard_attacks::leftovers;
use lizard_attacks::system::System;
use std::net::Ipv4Addr;

/// Both ends of every link between the host and this server's sandbox namespaces: the
/// host's end, and the namespace's end (the address the sandbox behind it is known by).
fn link_addresses(prefix: &str) -> Vec<Ipv4Addr> {
    let mut out = vec![];
    for link in leftovers::links(prefix) {
        let o = std::process::Command::new("ip").args(["-o", "-4", "addr", "show", "dev", &link]).output().unwrap();
        for word in String::from_utf8_lossy(&o.stdout).split_whitespace() {
            let Some((addr, len)) = word.split_once('/') else { continue };
            let (Ok(addr), Ok(30)) = (addr.parse::<Ipv4Addr>(), len.parse::<u8>()) else { continue };
            let network = u32::from(addr) & !3;
            out.extend([Ipv4Addr::from(network + 1), Ipv4Addr::from(network + 2)]);
        }
    }
    out
}

/// `curl` from the guest with a short bound: its exit code (0: connected and answered).
async fn guest_curl(system: &System, id: &str, url: &str) -> i64 {
    system.exec(id, &format!("curl -s -o /dev/null --connect-timeout 2 --max-time 3 {url}")).await.0
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_reaches_no_host_service_no_metadata_and_no_neighbour() {
    let system = System::start(&[]).await;
    // A host service listening on every address: only the firewall stands between it and a guest.
    let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let host_port = listener.local_addr().unwrap().port();
    let api_port = system.api.rsplit(':').next().unwrap().to_string();

    let attacker = system.create_sandbox("base", serde_json::json!({})).await;
    let neighbour = system.create_sandbox("base", serde_json::json!({})).await;
    system.exec(&neighbour, "nohup python3 -m http.server 8000 >/dev/null 2>&1 &").await;
    // The neighbour's service answers where it is meant to: inside its own sandbox.
    let (code, _, _) = system
        .exec(
            &neighbour,
            "for i in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:8000/ && exit 0; sleep 0.1; done; exit 1",
        )
        .await;
    assert_eq!(code, 0, "the neighbour's server listens");

    // The positive control: the in-sandbox API address answers, so curl itself works.
    assert_eq!(guest_curl(&system, &attacker, "http://127.0.0.1:49171/health").await, 0);

    let ends = link_addresses(&system.net_prefix);
    assert!(ends.len() >= 4, "the server made a link per sandbox with prefix {}: {ends:?}", system.net_prefix);
    let mut targets = vec![
        format!("http://{}:{host_port}/", lizard_api_gateway()),
        format!("http://{}:{api_port}/health", lizard_api_gateway()),
        "http://169.254.169.254/latest/meta-data/".to_string(),
    ];
    for addr in ends {
        for port in [host_port.to_string(), api_port.clone(), "8000".to_string()] {
            targets.push(format!("http://{addr}:{port}/"));
        }
    }
    for url in targets {
        assert_ne!(guest_curl(&system, &attacker, &url).await, 0, "the guest reached {url}");
    }
    drop(listener);
}

fn lizard_api_gateway() -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 2, 1)
}

/// A private network on this host (a namespace of the test's own, routed from the host):
/// no sandbox reaches it — not with the internet on, not with its range in `allowOut`.
#[tokio::test(flavor = "multi_thread")]
async fn private_targets_stay_unreachable_even_when_allowed_out() {
    let tag = std::process::id() % 10_000;
    let ns = format!("lzatk-priv-{tag}");
    let host_if = format!("lzatkp{tag}");
    let run = |args: &str| {
        let o = std::process::Command::new("ip").args(args.split_whitespace()).output().unwrap();
        assert!(o.status.success(), "ip {args}: {}", String::from_utf8_lossy(&o.stderr));
    };
    // Host 192.168.231.1/30 <-> namespace 192.168.231.2/30, where a web server listens.
    let _ = std::process::Command::new("ip").args(["netns", "del", &ns]).output();
    run(&format!("netns add {ns}"));
    let cleanup = Cleanup(ns.clone());
    run(&format!("link add {host_if} type veth peer name eth0 netns {ns}"));
    run(&format!("addr add 192.168.231.1/30 dev {host_if}"));
    run(&format!("link set {host_if} up"));
    run(&format!("-n {ns} addr add 192.168.231.2/30 dev eth0"));
    run(&format!("-n {ns} link set eth0 up"));
    run(&format!("-n {ns} link set lo up"));
    let mut server = std::process::Command::new("ip")
        .args(["netns", "exec", &ns, "python3", "-m", "http.server", "8731", "--bind", "192.168.231.2"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The positive control: from the host, the private server answers.
    let mut answered = false;
    for _ in 0..50 {
        if std::net::TcpStream::connect_timeout(
            &"192.168.231.2:8731".parse().unwrap(),
            std::time::Duration::from_secs(1),
        )
        .is_ok()
        {
            answered = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(answered, "the test's private server does not answer the host");

    let system = System::start(&[]).await;
    let open = system.create_sandbox("base", serde_json::json!({})).await;
    let allowed = system
        .create_sandbox("base", serde_json::json!({"allowInternetAccess": false, "allowOut": ["192.168.231.0/24"]}))
        .await;
    let allowed_wide = system.create_sandbox("base", serde_json::json!({"allowOut": ["192.168.0.0/16"]})).await;
    for id in [&open, &allowed, &allowed_wide] {
        assert_ne!(guest_curl(&system, id, "http://192.168.231.2:8731/").await, 0, "{id} reached a private target");
        assert_ne!(
            guest_curl(&system, id, "http://192.168.231.1:8731/").await,
            0,
            "{id} reached the host's private end"
        );
    }
    let _ = server.kill();
    let _ = server.wait();
    drop(cleanup);
}

/// Removes the test's namespace (and with it the veth pair) however the test ends.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_desktops_screen_is_served_on_no_tcp_port_but_its_guarded_live_view() {
    let system = System::start(&[]).await;
    let id = system.create_sandbox("desktop", serde_json::json!({})).await;
    let (code, port, err) =
        system.exec(&id, "printf 'attack-suite-secret-0123\\n' | lizard-desktop stream-start").await;
    assert_eq!(code, 0, "{err}");
    // x11vnc (no password: the live view's token guards it) answers on its Unix socket only.
    let as_root = serde_json::json!({"cmd": "ss -Hltnp; echo --; ss -Hlxp", "user": "root"});
    let (status, listening) =
        system.call(reqwest::Method::POST, &format!("/v1/sandboxes/{id}/exec"), Some(as_root)).await;
    assert_eq!(status, 200, "{listening}");
    let (tcp, unix) = listening["stdout"].as_str().unwrap().split_once("--").unwrap();
    assert!(!tcp.contains("x11vnc"), "x11vnc listens on TCP:\n{tcp}");
    assert!(unix.contains("x11vnc") && unix.contains("vnc.sock"), "x11vnc's Unix socket:\n{unix}");
    assert!(tcp.contains(&format!(":{}", port.trim())), "the live view listens on {port}:\n{tcp}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_reaches_no_neighbour_on_the_hosts_own_public_subnet() {
    // The host gets an address on a public-looking /30 whose other end is a web server;
    // a second address of that namespace, routed beyond the subnet, is the control.
    let ns = lizard_attacks::net::TestNamespace::on_a_public_subnet();
    let beyond = Ipv4Addr::new(198, 19, ns.addr.octets()[2], ns.addr.octets()[3]);
    ns.add_routed_address(beyond);
    let web = lizard_attacks::net::TestWebServer::start(&ns);
    let system = System::start(&[]).await;
    let id = system.create_sandbox("base", serde_json::json!({})).await;
    let curl = |addr: Ipv4Addr| format!("curl -s --max-time 5 http://{addr}/");
    let (code, out, _) = system.exec(&id, &curl(beyond)).await;
    assert_eq!((code, out.as_str()), (0, lizard_attacks::net::TestWebServer::BODY), "the public address beyond");
    // Before: the host's neighbour answered too.
    let (code, _, _) = system.exec(&id, &curl(ns.addr)).await;
    assert_ne!(code, 0, "a guest reached {} on the host's own subnet", ns.addr);
    assert_eq!(web.http_hits(), 1);
}
