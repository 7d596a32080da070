//! A client against the sandbox-URL proxy: it learns nothing it should not from the guest
//! side (the platform's credentials never reach a guest, forwarding headers are the
//! proxy's), cannot reach another sandbox or the platform's own guest ports by host
//! tricks, cannot hold the listener with slow or idle connections, and cannot use a
//! private sandbox's URLs without that sandbox's token; a guest cannot set the
//! platform's cookies for other sandboxes' hosts.
//!
//! Requests are written by hand over TCP to loopback, so that malformed ones (two `Host`
//! headers, absolute-form targets) reach the server as sent.

#![allow(clippy::unwrap_used)]

use lizard_attacks::system::System;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A guest HTTP server on 127.0.0.1:8000 that answers every GET with the path and headers
/// it received, and appends the path to /tmp/hits (what reached the guest at all). Each
/// answer sets a cookie of its own and tries to set the platform's for the parent domain.
const ECHO_SERVER: &str = r#"cat > /tmp/echo.py <<'EOF'
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open('/tmp/hits', 'a') as f:
            f.write(self.path + '\n')
        body = json.dumps({'path': self.path, 'headers': [[k.lower(), v] for k, v in self.headers.items()]}).encode()
        self.send_response(200)
        self.send_header('content-type', 'application/json')
        self.send_header('content-length', str(len(body)))
        # Its own cookie, and a tossed platform one for every sandbox of the domain.
        self.send_header('set-cookie', 'app=1; Path=/')
        self.send_header('set-cookie', 'Lizard_Signed=1.00; Domain=' + self.headers['host'].split('.', 1)[-1] + '; Path=/')
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(('127.0.0.1', 8000), H).serve_forever()
EOF
nohup python3 /tmp/echo.py >/dev/null 2>&1 &
for i in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:8000/ready && exit 0; sleep 0.1; done; exit 1"#;

/// Start the echo server in `id` and forget the readiness probe's hit.
async fn start_echo(system: &System, id: &str) {
    let (code, _, err) = system.exec(id, ECHO_SERVER).await;
    assert_eq!(code, 0, "the guest's echo server listens: {err}");
    system.exec(id, "rm -f /tmp/hits").await;
}

/// How many requests reached the guest's echo server since [`start_echo`].
async fn guest_hits(system: &System, id: &str) -> usize {
    system.exec(id, "cat /tmp/hits 2>/dev/null").await.1.lines().count()
}

/// The sandbox domain of the server under attack (from a create's answer).
fn host_of(info: &Value, id: &str, port: u16) -> String {
    format!("{id}-{port}.{}", info["domain"].as_str().expect("domain"))
}

/// Send `request` as is and read the answer until the server closes: status and body.
async fn raw(system: &System, request: &str) -> (u16, String) {
    let (status, _, body) = raw_answer(system, request).await;
    (status, body)
}

/// Send `request` as is and read the answer until the server closes: status, head, body.
async fn raw_answer(system: &System, request: &str) -> (u16, String, String) {
    let mut conn = TcpStream::connect(system.proxy).await.unwrap();
    conn.write_all(request.as_bytes()).await.unwrap();
    // Until the server closes; a reset after its answer (it closed with our request
    // unread, as a refusal does) keeps what came before.
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match tokio::time::timeout_at(deadline, conn.read(&mut buf)).await.expect("the proxy answers and closes") {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&answer).to_string();
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (status, head.to_string(), body.to_string())
}

/// A GET of `path` with `headers` (whole lines, `Host` included), closing after.
fn get(path: &str, headers: &[String]) -> String {
    let mut r = format!("GET {path} HTTP/1.1\r\n");
    for h in headers {
        r.push_str(h);
        r.push_str("\r\n");
    }
    r.push_str("Connection: close\r\n\r\n");
    r
}

/// Create a sandbox with `fields`, answering its id and the whole create answer.
async fn create(system: &System, fields: Value) -> (String, Value) {
    let mut body = json!({"template": "base", "projectId": system.project});
    body.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
    let (status, info) = system.call(reqwest::Method::POST, "/v1/sandboxes", Some(body)).await;
    assert_eq!(status, 201, "create: {info}");
    (info["sandboxId"].as_str().unwrap().to_string(), info)
}

/// The header values the guest saw under `name`.
fn seen(echo: &Value, name: &str) -> Vec<String> {
    echo["headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h[0] == name)
        .map(|h| h[1].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_url_passes_no_platform_credential_and_only_the_proxys_forwarding_headers() {
    let system = System::start(&[]).await;
    let (id, info) = create(&system, json!({})).await;
    start_echo(&system, &id).await;
    let host = host_of(&info, &id, 8000);
    let (status, body) = raw(
        &system,
        &get(
            "/echo",
            &[
                format!("Host: {host}"),
                format!("X-API-Key: {}", system.key),
                "Authorization: Bearer the-apps-own".into(),
                "Cookie: app=1; lizard_session=console-secret".into(),
                "X-Forwarded-For: 203.0.113.9".into(),
                "X-Forwarded-Host: evil.example".into(),
                "X-Forwarded-Proto: https".into(),
                "Forwarded: for=203.0.113.9;host=evil.example".into(),
            ],
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let echo: Value = serde_json::from_str(&body).unwrap();
    assert!(seen(&echo, "x-api-key").is_empty(), "the API key reached the guest: {echo}");
    assert!(!body.contains(&system.key) && !body.contains("console-secret"), "a platform credential leaked: {body}");
    assert_eq!(seen(&echo, "authorization"), ["Bearer the-apps-own"], "the app's own credential passes");
    assert_eq!(seen(&echo, "cookie"), ["app=1"]);
    assert_eq!(seen(&echo, "x-forwarded-for"), ["127.0.0.1"], "the client's real address");
    assert_eq!(seen(&echo, "x-forwarded-host"), [host]);
    assert_eq!(seen(&echo, "x-forwarded-proto"), ["http"]);
    assert!(seen(&echo, "forwarded").is_empty(), "{echo}");
}

#[tokio::test(flavor = "multi_thread")]
async fn ambiguous_and_look_alike_hosts_and_platform_ports_reach_no_guest() {
    let system = System::start(&[]).await;
    let (id, info) = create(&system, json!({})).await;
    let (other, _) = create(&system, json!({})).await;
    start_echo(&system, &id).await;
    start_echo(&system, &other).await;
    let domain = info["domain"].as_str().unwrap().to_string();
    let host = host_of(&info, &id, 8000);
    let other_host = format!("{other}-8000.{domain}");

    // Refused as malformed: two hosts, or a target naming another host than Host.
    let ambiguous = [
        get("/", &[format!("Host: {host}"), format!("Host: {other_host}")]),
        get(&format!("http://{other_host}/"), &[format!("Host: {host}")]),
    ];
    for req in &ambiguous {
        let (status, body) = raw(&system, req).await;
        assert_eq!(status, 400, "{req:?}: {body}");
    }
    // Names of no sandbox.
    let upper_domain = domain.to_uppercase();
    let tricks = [
        format!("{id}-8000.{domain}.evil.example"),
        format!("{id}-8000.x{domain}"),
        format!("{id}-8000.{domain}.."),
        format!("x.{id}-8000.{domain}"),
        format!("{id}-0.{domain}"),
        format!("{id}-65536.{domain}"),
        format!("{id}-99999.{domain}"),
        format!("{id}-08000.{domain}"),
        format!("{id}-+8000.{domain}"),
        format!("{id}x-8000.{domain}"),
    ];
    for h in &tricks {
        let (status, body) = raw(&system, &get("/", &[format!("Host: {h}")])).await;
        assert_eq!(status, 404, "{h}: {body}");
    }
    // The platform's own guest ports (the API forwarder, the code service).
    for port in [49171, 49999] {
        let (status, body) = raw(&system, &get("/health", &[format!("Host: {id}-{port}.{domain}")])).await;
        assert_eq!(status, 403, "port {port}: {body}");
    }
    assert_eq!(guest_hits(&system, &id).await, 0, "a refused request reached the guest");
    assert_eq!(guest_hits(&system, &other).await, 0, "a refused request reached the other guest");

    // The same name in other letter case, with one trailing dot, or in absolute form that
    // agrees with Host reaches exactly this sandbox.
    let same = [
        get("/", &[format!("Host: {}-8000.{upper_domain}.", id.to_uppercase())]),
        get(&format!("http://{host}/"), &[format!("Host: {host}")]),
    ];
    for req in &same {
        let (status, body) = raw(&system, req).await;
        assert_eq!(status, 200, "{req:?}: {body}");
    }
    assert_eq!(guest_hits(&system, &id).await, 2);
    assert_eq!(guest_hits(&system, &other).await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_and_idle_clients_are_cut_off_and_connections_beyond_the_cap_are_refused() {
    let system = System::start(&["--proxy-header-timeout", "2", "--proxy-max-connections", "8"]).await;
    // Slowloris: half a request line, then nothing.
    let mut slow = TcpStream::connect(system.proxy).await.unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: a").await.unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 256];
    let read = tokio::time::timeout(Duration::from_secs(15), slow.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(_)) | Ok(Err(_))), "a slow client held its connection for 15 s");
    assert!(started.elapsed() < Duration::from_secs(10), "cut off after {:?}", started.elapsed());

    // The cap: 8 idle connections held, the 9th is answered 503 at once.
    let mut held = vec![];
    for _ in 0..8 {
        held.push(TcpStream::connect(system.proxy).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, _) = raw(&system, &get("/", &["Host: x".into()])).await;
    assert_eq!(status, 503, "a connection beyond the cap was served");
    drop(held);
    // Freed slots serve again (a host of no sandbox: 404).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, _) = raw(&system, &get("/", &["Host: x".into()])).await;
        if status == 404 {
            break;
        }
        assert!(Instant::now() < deadline, "the proxy did not recover its slots: {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_private_sandbox_url_answers_only_to_its_own_token() {
    let system = System::start(&[]).await;
    let (id, info) = create(&system, json!({"publicUrls": false})).await;
    let (other, other_info) = create(&system, json!({"publicUrls": false})).await;
    let token = info["accessToken"].as_str().expect("a private sandbox's create answers its token").to_string();
    let other_token = other_info["accessToken"].as_str().unwrap().to_string();
    assert_ne!(token, other_token);
    // Shown once: a later read does not carry it.
    let (_, again) = system.call(reqwest::Method::GET, &format!("/v1/sandboxes/{id}"), None).await;
    assert!(again.get("accessToken").is_none(), "{again}");
    start_echo(&system, &id).await;
    start_echo(&system, &other).await;
    let host = host_of(&info, &id, 8000);

    let refused = [
        get("/", &[format!("Host: {host}")]),
        get("/", &[format!("Host: {host}"), "X-Lizard-Access-Token: lzat_wrong".into()]),
        get("/", &[format!("Host: {host}"), format!("X-Lizard-Access-Token: {other_token}")]),
        get(&format!("/?lizardAccessToken={other_token}"), &[format!("Host: {host}")]),
        get("/", &[format!("Host: {host}"), format!("X-API-Key: {}", system.key)]),
    ];
    for req in &refused {
        let (status, body) = raw(&system, req).await;
        assert_eq!(status, 403, "{req:?}: {body}");
    }
    assert_eq!(guest_hits(&system, &id).await, 0, "a refused request reached the guest");

    let (status, body) =
        raw(&system, &get("/h", &[format!("Host: {host}"), format!("X-Lizard-Access-Token: {token}")])).await;
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains(&token), "the token reached the guest: {body}");
    let (status, body) =
        raw(&system, &get(&format!("/q?a=1&lizardAccessToken={token}"), &[format!("Host: {host}")])).await;
    assert_eq!(status, 200, "{body}");
    let echo: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echo["path"], "/q?a=1", "the token query parameter reached the guest");
    assert_eq!(guest_hits(&system, &id).await, 2);
    assert_eq!(guest_hits(&system, &other).await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_signed_url_opens_one_port_of_a_private_sandbox_until_it_expires() {
    let system = System::start(&[]).await;
    let (id, info) = create(&system, json!({"publicUrls": false})).await;
    let (other, _) = create(&system, json!({"publicUrls": false})).await;
    start_echo(&system, &id).await;
    let sign = |sandbox: &str, body: Value| {
        let path = format!("/v1/sandboxes/{sandbox}/signed-urls");
        let system = &system;
        async move { system.call(reqwest::Method::POST, &path, Some(body)).await }
    };
    for bad in [
        json!({"port": 0}),
        json!({"port": 8000, "expiresInSeconds": 0}),
        json!({"port": 8000, "expiresInSeconds": 604_801}),
    ] {
        let (status, err) = sign(&id, bad.clone()).await;
        assert_eq!((status, err["code"].as_str()), (422, Some("INVALID_ARGUMENT")), "{bad}: {err}");
    }
    let (status, url) = sign(&id, json!({"port": 8000, "expiresInSeconds": 3})).await;
    assert_eq!(status, 200, "{url}");
    let (host, query) = (url["host"].as_str().unwrap(), url["query"].as_str().unwrap());
    assert_eq!(host, host_of(&info, &id, 8000));
    assert!(url["expiresAt"].is_string() && query.contains("lizardSignature="), "{url}");

    // The URL opens the port: the guest sees neither the proof nor the cookie it sets.
    let (status, head, body) = raw_answer(&system, &get(&format!("/q?a=1&{query}"), &[format!("Host: {host}")])).await;
    assert_eq!(status, 200, "{body}");
    let echo: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echo["path"], "/q?a=1", "the signature reached the guest");
    let set_cookies: Vec<&str> = head
        .lines()
        .filter_map(|l| l.split_once(':').filter(|(n, _)| n.eq_ignore_ascii_case("set-cookie")))
        .map(|(_, v)| v.trim())
        .collect();
    let platform: Vec<&str> = set_cookies.iter().copied().filter(|c| c.to_lowercase().starts_with("lizard_")).collect();
    assert_eq!(platform.len(), 1, "only the proxy sets a platform cookie, the guest's tossed one is dropped: {head}");
    assert!(set_cookies.contains(&"app=1; Path=/"), "the guest's own cookie passes: {head}");
    let cookie = platform[0].split(';').next().unwrap().to_string();
    assert!(cookie.starts_with("lizard_signed=") && !cookie.ends_with("=1.00") && head.contains("HttpOnly"), "{head}");
    let with_cookie = [format!("Host: {host}"), format!("Cookie: {cookie}; app=1")];
    let (status, body) = raw(&system, &get("/asset.js", &with_cookie)).await;
    assert_eq!(status, 200, "the page's later requests ride on the cookie: {body}");
    let echo: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(seen(&echo, "cookie"), ["app=1"], "the platform's cookie reached the guest");
    // A cookie tossed in by another page (a browser sends both) spoils nothing.
    let tossed = [format!("Host: {host}"), format!("Cookie: lizard_signed=1.00; {cookie}")];
    assert_eq!(raw(&system, &get("/tossed", &tossed)).await.0, 200, "a tossed cookie beside a valid one");

    // Not another port, not another sandbox, not a changed expiry or signature.
    let expires = query.split('&').find_map(|p| p.strip_prefix("lizardExpires=")).unwrap();
    let later: u64 = expires.parse::<u64>().unwrap() + 3600;
    let refused = [
        get(&format!("/?{query}"), &[format!("Host: {}", host_of(&info, &id, 8001))]),
        get(&format!("/?{query}"), &[format!("Host: {}", host_of(&info, &other, 8000))]),
        get(
            &format!("/?{}", query.replace(&format!("lizardExpires={expires}"), &format!("lizardExpires={later}"))),
            &[format!("Host: {host}")],
        ),
        get(&format!("/?{}", query.replace("lizardSignature=", "lizardSignature=00")), &[format!("Host: {host}")]),
        get("/", &[format!("Host: {}", host_of(&info, &other, 8000)), format!("Cookie: {cookie}")]),
    ];
    for req in &refused {
        assert_eq!(raw(&system, req).await.0, 403, "{req:?}");
    }
    assert_eq!(guest_hits(&system, &id).await, 3, "a refused request reached the guest");

    // Expired: neither the URL nor its cookie opens anything.
    let until = Instant::now() + Duration::from_secs(5);
    while raw(&system, &get(&format!("/?{query}"), &[format!("Host: {host}")])).await.0 == 200 {
        assert!(Instant::now() < until, "the signed URL outlived its expiry");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (status, body) = raw(&system, &get(&format!("/?{query}"), &[format!("Host: {host}")])).await;
    assert_eq!(status, 403);
    assert!(body.contains("expired"), "{body}");
    assert_eq!(raw(&system, &get("/", &with_cookie)).await.0, 403, "an expired cookie");

    // A sandbox with public URLs needs no proof: its plain host, no expiry.
    let (public, _) = create(&system, json!({})).await;
    let (status, url) = sign(&public, json!({"port": 8000})).await;
    assert_eq!(status, 200, "{url}");
    assert_eq!((url["query"].as_str(), url.get("expiresAt")), (Some(""), None), "{url}");
}
