//! What a real `lizard server` run (no node in process, so no root or QEMU) serves besides
//! the API: the operator's `/metrics` listener — not on the API listener for anyone,
//! behind its token on its own listener, API requests counted by route template only, a
//! joined node's capacity and use as its heartbeats report them —, the web console's
//! pages beside the API, and the sandbox-URL listener's TLS mode.
//! Sandbox operations on real microVMs are scraped in `lizard-cli`'s `observability`
//! test; the console is driven in a browser by `scripts/test-sdk.sh console`.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lizard_api::cluster::{NodeCapacity, NodeReport, NodeUsage};
use lizard_server::config::MetricsListen;
use lizard_server::run::{run, RunOptions};
use lizard_server::ServerConfig;
use serde_json::{json, Value};
use std::time::Duration;

const TOKEN: &str = "scrape-token-for-the-test";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Running {
    api: String,
    metrics: String,
    owner: String,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Running {
    async fn start() -> Running {
        Self::start_with(|_, _| {}).await
    }

    /// A server whose run options `configure` changes first (given the data directory).
    async fn start_with(configure: impl FnOnce(&mut RunOptions, &std::path::Path)) -> Running {
        let dir = tempfile::tempdir().unwrap();
        let (api_port, metrics_port) = (free_port(), free_port());
        let mut server = ServerConfig::new(dir.path());
        server.listen = format!("127.0.0.1:{api_port}").parse().unwrap();
        server.metrics = Some(MetricsListen {
            addr: format!("127.0.0.1:{metrics_port}").parse().unwrap(),
            token: Some(TOKEN.into()),
        });
        // The first open makes the owner and hands its key here; `run` then finds it made.
        let owner = lizard_server::open(server.clone()).await.unwrap().initial_key().unwrap().to_string();
        let mut opts = RunOptions {
            server,
            node: lizard_node::NodeConfig::new(dir.path().join("node")),
            proxy_listen: None,
            proxy_tls: None,
            proxy_limits: Default::default(),
            local_node: false,
            node_connector: None,
            faces: Default::default(),
        };
        configure(&mut opts, dir.path());
        // `run`'s future is not `Send` (the store's higher-ranked borrows): a thread and a
        // runtime of its own, ended with the test process.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(run(opts, std::future::pending())).unwrap();
        });
        let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(30)).build().unwrap();
        let api = format!("http://127.0.0.1:{api_port}");
        for _ in 0..300 {
            if http.get(format!("{api}/health")).send().await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Running { api, metrics: format!("http://127.0.0.1:{metrics_port}/metrics"), owner, http, _dir: dir }
    }

    async fn call(&self, method: reqwest::Method, path: &str, key: Option<&str>, body: Option<Value>) -> (u16, Value) {
        let mut req = self.http.request(method, format!("{}{path}", self.api));
        if let Some(k) = key {
            req = req.header("X-API-Key", k);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn scrape(&self) -> String {
        let resp = self.http.get(&self.metrics).bearer_auth(TOKEN).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let content_type = resp.headers()["content-type"].to_str().unwrap().to_string();
        assert!(content_type.starts_with("application/openmetrics-text"), "{content_type}");
        resp.text().await.unwrap()
    }
}

/// The value of the series `name{labels}` exactly, if present.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

#[tokio::test]
async fn metrics_are_served_only_on_their_listener_behind_the_token() {
    let s = Running::start().await;
    let (_, ws) = s.call(reqwest::Method::POST, "/v1/workspaces", Some(&s.owner), Some(json!({"name": "t"}))).await;
    let (status, scoped) = s
        .call(
            reqwest::Method::POST,
            "/v1/api-keys",
            Some(&s.owner),
            Some(json!({"name": "tenant", "workspaces": [ws["id"]]})),
        )
        .await;
    assert_eq!(status, 201, "{scoped}");
    let tenant = scoped["key"].as_str().unwrap();
    // The API listener has no /metrics: anonymous, a tenant's key and even the owner's.
    for key in [None, Some(tenant), Some(s.owner.as_str())] {
        let (status, body) = s.call(reqwest::Method::GET, "/metrics", key, None).await;
        assert_eq!(status, 404, "{key:?}: {body}");
        assert_eq!(body["code"], "NOT_FOUND");
    }
    // The metrics listener: nothing without the token, nor with an API key as one.
    let anonymous = s.http.get(&s.metrics).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    assert_eq!(anonymous.headers()["www-authenticate"], "Bearer");
    for wrong in ["nope", tenant, s.owner.as_str(), &TOKEN[..TOKEN.len() - 1]] {
        let resp = s.http.get(&s.metrics).bearer_auth(wrong).send().await.unwrap();
        assert_eq!(resp.status(), 401, "{wrong}");
        assert!(!resp.text().await.unwrap().contains("lizard_"));
    }
    let other = s.http.get(s.metrics.replace("/metrics", "/v1/whoami")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(other.status(), 404, "the metrics listener serves nothing else");
    let text = s.scrape().await;
    assert_eq!(value(&text, r#"lizard_sandboxes{state="running"}"#), Some(0.0), "{text}");
    assert_eq!(value(&text, "lizard_billing_lag_seconds"), Some(0.0), "{text}");
    assert!(text.ends_with("# EOF\n"), "{text}");
}

#[tokio::test]
async fn requests_are_counted_by_route_template_so_paths_make_no_series() {
    let s = Running::start().await;
    let before = s.scrape().await;
    let series = |text: &str| text.lines().filter(|l| l.starts_with("lizard_http_requests_total{")).count();
    for i in 0..40 {
        let (status, _) = s.call(reqwest::Method::GET, &format!("/v1/sandboxes/sbx_{i}"), Some(&s.owner), None).await;
        assert_eq!(status, 404);
        let (status, _) = s.call(reqwest::Method::GET, &format!("/v1/no-such-route-{i}"), None, None).await;
        assert_eq!(status, 404);
        let (status, _) =
            s.call(reqwest::Method::from_bytes(format!("M{i}").as_bytes()).unwrap(), "/health", None, None).await;
        assert_eq!(status, 404, "no such method");
    }
    let text = s.scrape().await;
    assert!(!text.contains("sbx_") && !text.contains("no-such-route"), "a raw path became a label:\n{text}");
    assert_eq!(
        value(&text, r#"lizard_http_requests_total{route="/v1/sandboxes/{id}",method="GET",status="404"}"#),
        Some(40.0),
        "{text}"
    );
    assert_eq!(value(&text, r#"lizard_http_requests_total{route="unmatched",method="GET",status="404"}"#), Some(40.0));
    assert_eq!(
        value(&text, r#"lizard_http_requests_total{route="/health",method="OTHER",status="404"}"#),
        Some(40.0),
        "{text}"
    );
    assert!(
        value(&text, r#"lizard_http_request_duration_seconds_count{route="/v1/sandboxes/{id}",method="GET"}"#)
            == Some(40.0),
        "{text}"
    );
    // 120 requests on 40 distinct paths and methods made three series (and the health
    // checks of the start).
    assert!(series(&text) <= series(&before) + 3, "{text}");
}

#[tokio::test]
async fn a_joined_nodes_capacity_and_use_come_from_its_heartbeats() {
    let s = Running::start().await;
    let (status, token) =
        s.call(reqwest::Method::POST, lizard_api::routes::path::NODE_TOKENS, Some(&s.owner), Some(json!({}))).await;
    assert_eq!(status, 201, "{token}");
    let report = |vcpus_used: u32, sandboxes: u32| NodeReport {
        capacity: NodeCapacity { vcpus: 16, memory_mib: 24_576, disk_gib: 100 },
        usage: NodeUsage { vcpus: vcpus_used, memory_mib: u64::from(vcpus_used) * 512, sandboxes },
        templates: Vec::new(),
        sandboxes: Vec::new(),
    };
    // Never called: the node is only a record here.
    let join = json!({"region": "local", "address": "http://127.0.0.1:9", "report": report(0, 0)});
    let resp = s
        .http
        .post(format!("{}{}", s.api, lizard_api::routes::path::CLUSTER_JOIN))
        .bearer_auth(token["token"].as_str().unwrap())
        .json(&join)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let joined: Value = resp.json().await.unwrap();
    let node = joined["nodeId"].as_str().unwrap();
    let labels = format!(r#"{{node="{node}",region="local"}}"#);
    let text = s.scrape().await;
    assert_eq!(value(&text, &format!("lizard_node_capacity_vcpus{labels}")), Some(16.0), "{text}");
    assert_eq!(value(&text, &format!("lizard_node_capacity_memory_bytes{labels}")), Some(24_576.0 * 1_048_576.0));
    assert_eq!(value(&text, &format!("lizard_node_capacity_disk_bytes{labels}")), Some(100.0 * 1_073_741_824.0));
    assert_eq!(value(&text, &format!("lizard_node_used_vcpus{labels}")), Some(0.0));
    assert_eq!(value(&text, &format!(r#"lizard_node_state{{node="{node}",state="up"}}"#)), Some(1.0), "{text}");

    let path = lizard_api::routes::path::CLUSTER_HEARTBEAT.replace("{id}", node);
    let resp = s
        .http
        .post(format!("{}{path}", s.api))
        .bearer_auth(joined["credential"].as_str().unwrap())
        .json(&report(3, 3))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    let text = s.scrape().await;
    assert_eq!(value(&text, &format!("lizard_node_used_vcpus{labels}")), Some(3.0), "{text}");
    assert_eq!(value(&text, &format!("lizard_node_used_memory_bytes{labels}")), Some(1536.0 * 1_048_576.0));
    assert_eq!(value(&text, &format!("lizard_node_sandboxes{labels}")), Some(3.0));
    let age = value(&text, &format!("lizard_node_heartbeat_age_seconds{labels}")).unwrap();
    assert!((0.0..10.0).contains(&age), "{age}");
}

#[tokio::test]
async fn the_console_is_served_beside_the_api_and_needs_no_key() {
    let s = Running::start().await;
    let no_redirects =
        reqwest::Client::builder().no_proxy().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let root = no_redirects.get(format!("{}/", s.api)).send().await.unwrap();
    assert_eq!(root.status(), 308);
    assert_eq!(root.headers()["location"], "/console/");
    let page = s.http.get(format!("{}/console/", s.api)).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(page.headers()["content-security-policy"], lizard_console::CSP);
    assert!(page.text().await.unwrap().contains("/console/app.js"));
    let settings: Value =
        s.http.get(format!("{}/console/settings.json", s.api)).send().await.unwrap().json().await.unwrap();
    assert_eq!(settings, json!({"sandboxUrlPort": null}), "this server runs no proxy");
}

/// A local CA and a certificate it signed for `names`: (CA PEM, certificate PEM, key PEM).
fn minted(names: &[&str]) -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name.push(rcgen::DnType::CommonName, "test CA");
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let cert = rcgen::CertificateParams::new(names).unwrap().signed_by(&key, &ca, &ca_key).unwrap();
    (ca.pem(), cert.pem(), key.serialize_pem())
}

/// A TLS client that trusts `ca_pem` and offers `alpn`.
fn tls_client(ca_pem: &str, alpn: &[&[u8]]) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls::pki_types::CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap()).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
}

#[tokio::test]
async fn sandbox_urls_are_served_over_tls_with_the_operators_certificate() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let domain = "sandbox.local.lizard.localhost";
    let (ca, cert, key) = minted(&[&format!("*.{domain}")]);
    let (plain_port, tls_port) = (free_port(), free_port());
    let s = Running::start_with(|opts, dir| {
        std::fs::write(dir.join("cert.pem"), &cert).unwrap();
        std::fs::write(dir.join("key.pem"), &key).unwrap();
        opts.proxy_listen = Some(format!("127.0.0.1:{plain_port}").parse().unwrap());
        opts.proxy_tls = Some(lizard_server::run::ProxyTls {
            listen: format!("127.0.0.1:{tls_port}").parse().unwrap(),
            files: lizard_server::proxy::tls::TlsFiles { cert: dir.join("cert.pem"), key: dir.join("key.pem") },
        });
        opts.proxy_limits.header_read_timeout = Duration::from_secs(1);
        opts.server.public_proxy_tls_port = Some(tls_port);
    })
    .await;
    let host = format!("sbxnosuch-8000.{domain}");
    let server_name = rustls::pki_types::ServerName::try_from(host.clone()).unwrap();
    let connect = || tokio::net::TcpStream::connect(("127.0.0.1", tls_port));

    // A client that trusts the CA gets HTTP/1.1 (it offered h2 first) and the proxy's own
    // answer: this host names no sandbox.
    let tcp = connect().await.unwrap();
    let mut tls = tls_client(&ca, &[b"h2", b"http/1.1"]).connect(server_name.clone(), tcp).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let request = format!("GET /index.html HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tls.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    assert!(answer.contains("NOT_FOUND"), "{answer}");

    // A client that trusts another CA refuses the certificate.
    let (other_ca, _, _) = minted(&["other.example"]);
    let refused = tls_client(&other_ca, &[]).connect(server_name.clone(), connect().await.unwrap()).await;
    assert!(refused.is_err(), "a certificate under another CA was accepted");

    // Plain HTTP on the TLS port gets no HTTP answer, and a client that never says hello
    // is cut off after the header-read timeout.
    let mut plain = connect().await.unwrap();
    plain.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), plain.read_to_end(&mut answer)).await.unwrap();
    assert!(!answer.starts_with(b"HTTP/"), "{}", String::from_utf8_lossy(&answer));
    let mut silent = connect().await.unwrap();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "a silent connection was kept: {read:?}");

    // The plain listener serves beside it.
    let plain = s.http.get(format!("http://127.0.0.1:{plain_port}/")).header("Host", &host).send().await.unwrap();
    assert_eq!(plain.status(), 404);
}
