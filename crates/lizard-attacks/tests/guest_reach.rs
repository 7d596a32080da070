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
