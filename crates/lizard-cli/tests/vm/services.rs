//! Services (`lizard up`) end to end: a real `lizard server` with its proxy, the `lizard
//! up` / `lizard services …` commands, real microVMs for builds and instances.
//!
//! One service lives through the whole test (builds are seconds each under TCG): it is
//! deployed from a directory and answers at its URL; a second version is deployed while
//! a bounded loop of requests runs (none fails, the answers switch from v1 to v2); its
//! app's process is killed and it answers again; it idles into a paused instance (its
//! QEMU kept, stopped) and the next request continues it; a version that fails its
//! health checks is rolled back automatically with the reason while v2 keeps serving;
//! a rollback goes to v1; another workspace's key cannot see or touch it; an agent's
//! sandbox deploys its own directory with the guest's `lizard up`; bad deploys each get a
//! clear error and leave nothing running; `down` leaves no instance or layer.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

use crate::common;

use common::server::{assert_left_nothing, footprint, Server, Tenants};
use common::stderr;
use lizard_api::routes;
use lizard_api::services::{CreateServiceRequest, ServiceSpec};
use lizard_api::templates::{ContextEntry, ContextEntryKind};
use lizard_cli::client::{json_body, Call};
use lizard_vmm::census::live_vmms;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The app: answers its version (from `version.txt`) on every path; `/healthz` answers 500
/// when the version starts with `broken`.
const APP: &str = r#"
import http.server
VERSION = open('version.txt').read().strip()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def do_GET(self):
        code = 500 if self.path == '/healthz' and VERSION.startswith('broken') else 200
        body = VERSION.encode()
        self.send_response(code)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, fmt, *args):
        print('request', fmt % args, flush=True)
print('app', VERSION, 'starting', flush=True)
http.server.ThreadingHTTPServer(('0.0.0.0', 8000), H).serve_forever()
"#;

fn app_dir(parent: &Path, name: &str, version: &str) -> PathBuf {
    let dir = parent.join(name);
    std::fs::create_dir_all(dir.join("node_modules")).unwrap();
    std::fs::write(dir.join("app.py"), APP).unwrap();
    std::fs::write(dir.join("version.txt"), version).unwrap();
    // Left out by .gitignore: never uploaded.
    std::fs::write(dir.join(".gitignore"), "node_modules/\n").unwrap();
    std::fs::write(dir.join("node_modules/big.bin"), vec![0u8; 1 << 20]).unwrap();
    dir
}

/// `lizard up` flags for the app, its checks fast enough for a test.
fn up_args<'a>(dir: &'a Path, name: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["up", dir.to_str().unwrap(), "--name", name, "--project", "pa"];
    a.extend_from_slice(extra);
    a
}

/// The service's answer to `GET /` through the proxy: (status, body), or the error.
fn get(proxy_port: u16, host: &str) -> Result<(u16, String), String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", proxy_port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(s, "GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").map_err(|e| e.to_string())?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).map_err(|e| e.to_string())?;
    let status = answer.split(' ').nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| format!("no status: {answer}"))?;
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Ok((status, body))
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn status(server: &Server, key: &str, name: &str) -> serde_json::Value {
    json(&server.ok(key, &["--json", "services", "status", name]))
}

/// Wait (bounded) until `done` holds for the service's status.
fn until(server: &Server, key: &str, name: &str, what: &str, done: impl Fn(&serde_json::Value) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = status(server, key, name);
        if done(&s) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {s:#}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn instances(s: &serde_json::Value) -> Vec<(String, String)> {
    s["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["sandboxId"].as_str().unwrap().to_owned(), i["state"].as_str().unwrap().to_owned()))
        .collect()
}

#[test]
fn services_end_to_end() {
    let (data, server, Tenants { key_a, key_b, .. }) = Server::with_tenants("lizard-services-");
    let work = tempfile::tempdir().unwrap();
    let clean = footprint(data.path());

    // --- bad deploys: a clear error each, nothing left running or half-deployed -----------
    let bad = app_dir(work.path(), "bad", "v0");
    let e = server.fails(&key_a, &up_args(&bad, "bad", &["--port", "8000"]));
    assert!(e.contains("--cmd"), "{e}");
    let e = server.fails(&key_a, &up_args(&bad, "bad", &["--cmd", "python3 app.py"]));
    assert!(e.contains("--port"), "{e}");
    assert!(!bad.join("lizard.toml").exists(), "a refused first deploy writes no lizard.toml");
    // Nothing listens on the port: the app never gets ready.
    let o = server.lizard(&key_a, &up_args(&bad, "bad", &["--cmd", "sleep 600", "--port", "8000"]));
    assert!(!o.status.success());
    assert!(stderr(&o).contains("START_NOT_READY"), "{}", stderr(&o));
    // The app crashes on start: the same code, and its output.
    let crash = app_dir(work.path(), "crash", "v0");
    let o = server.lizard(&key_a, &up_args(&crash, "crash", &["--cmd", "echo crashing-now; exit 3", "--port", "8000"]));
    assert!(!o.status.success());
    assert!(stderr(&o).contains("START_NOT_READY") && stderr(&o).contains("crashing-now"), "{}", stderr(&o));
    let failed = status(&server, &key_a, "crash");
    assert_eq!((failed["status"].as_str(), instances(&failed).len()), (Some("failed"), 0), "{failed:#}");
    server.ok(&key_a, &["services", "down", "crash"]);
    server.ok(&key_a, &["services", "down", "bad"]);
    // An upload past the size limit (the API's check, before anything is built).
    let spec: ServiceSpec = serde_json::from_str(r#"{"cmd":"python3 app.py","port":8000}"#).unwrap();
    let huge = ContextEntry {
        path: "huge.bin".into(),
        mode: 0o644,
        kind: ContextEntryKind::File,
        sha256: Some("0".repeat(64)),
        size: Some(300 << 20),
        target: None,
    };
    let req = CreateServiceRequest {
        name: "huge".into(),
        project: Some("pa".into()),
        project_id: None,
        spec,
        files: vec![huge],
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let err = rt
        .block_on(
            server.api(&key_a).json::<serde_json::Value>(&Call::new(&routes::CREATE_SERVICE, &[]), json_body(&req)),
        )
        .unwrap_err();
    let err = err.downcast_ref::<lizard_api::ApiError>().cloned().unwrap();
    assert_eq!(err.code, lizard_api::ErrorCode::InvalidArgument, "{err}");
    assert!(err.message.contains("MiB"), "{err}");
    assert_eq!(json(&server.ok(&key_a, &["--json", "services", "list"])), serde_json::json!([]));
    assert_left_nothing(data.path(), &clean, "refused deploys");

    // --- v1: deployed from a directory, answering at its URL --------------------------------
    let dir = app_dir(work.path(), "hello", "v1");
    let checks = ["--cmd", "python3 app.py", "--port", "8000", "--health-path", "/healthz", "--idle-after", "8s"];
    let started = Instant::now();
    let o = server.lizard(&key_a, &up_args(&dir, "hello", &checks));
    assert!(o.status.success(), "up: {}", stderr(&o));
    eprintln!("first deploy: {:.1}s", started.elapsed().as_secs_f64());
    let url = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    let host = url.strip_prefix("http://").unwrap().split(':').next().unwrap().to_owned();
    assert_eq!(host, "hello.svc.local.lizard.localhost", "{url}");
    assert!(url.ends_with(&format!(":{}", server.proxy_port)), "{url}");
    let toml = std::fs::read_to_string(dir.join("lizard.toml")).unwrap();
    assert!(toml.contains("name = \"hello\"") && toml.contains("port = 8000"), "{toml}");
    assert_eq!(get(server.proxy_port, &host), Ok((200, "v1".into())));
    // The health checks of lizard.toml: fast, for the test.
    let toml = toml.replace("[health]\n", "[health]\ninterval = \"1s\"\ngrace = \"20s\"\n");
    std::fs::write(dir.join("lizard.toml"), toml).unwrap();

    // --- a taken name, and another workspace's view ----------------------------------------
    let twin = app_dir(work.path(), "twin", "v1");
    let e = server.fails(&key_a, &up_args(&twin, "hello", &["--cmd", "python3 app.py", "--port", "8000"]));
    assert!(e.contains("CONFLICT") && e.contains("taken"), "{e}");
    let flags = ["--cmd", "python3 app.py", "--port", "8000"];
    let e = server
        .fails(&key_b, &[&["up", twin.to_str().unwrap(), "--name", "hello", "--project", "pb"][..], &flags].concat());
    assert!(e.contains("CONFLICT"), "{e}");
    assert_eq!(json(&server.ok(&key_b, &["--json", "services", "list"])), serde_json::json!([]));
    for cmd in [&["services", "status", "hello"][..], &["services", "down", "hello"], &["services", "logs", "hello"]] {
        assert!(server.fails(&key_b, cmd).contains("NOT_FOUND"), "{cmd:?}");
    }

    // --- v2 while requests run: none fails, the answers switch ------------------------------
    std::fs::write(dir.join("version.txt"), "v2").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let looping = {
        let (stop, host, port) = (stop.clone(), host.clone(), server.proxy_port);
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(300);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline && seen.len() < 5000 {
                seen.push(get(port, &host));
                std::thread::sleep(Duration::from_millis(50));
            }
            seen
        })
    };
    let o = server.lizard(&key_a, &["up", dir.to_str().unwrap()]);
    assert!(o.status.success(), "up v2: {}", stderr(&o));
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = looping.join().unwrap();
    let failures: Vec<_> = seen.iter().filter(|r| !matches!(r, Ok((200, _)))).collect();
    assert!(
        failures.is_empty(),
        "{} of {} requests failed: {:?}",
        failures.len(),
        seen.len(),
        &failures[..failures.len().min(5)]
    );
    let bodies: Vec<&str> = seen.iter().map(|r| r.as_ref().unwrap().1.as_str()).collect();
    let first_v2 = bodies.iter().position(|b| *b == "v2").expect("v2 answered");
    assert!(first_v2 > 0 && bodies[..first_v2].iter().all(|b| *b == "v1"), "{bodies:?}");
    assert!(bodies[first_v2..].iter().all(|b| *b == "v2"), "once v2, always v2: {bodies:?}");
    eprintln!("{} requests during the rollout, none failed", seen.len());
    let s = status(&server, &key_a, "hello");
    assert_eq!(s["liveVersion"], 2, "{s:#}");
    until(&server, &key_a, "hello", "v1's instance drains and stops", |s| instances(s).len() == 1);

    // --- logs: the app's output, per instance -----------------------------------------------
    let logs = server.ok(&key_a, &["services", "logs", "hello"]);
    assert!(logs.contains("app v2 starting") && logs.contains("request"), "{logs}");

    // --- the app's process killed: restarted, answering again --------------------------------
    let (instance, _) = instances(&s).into_iter().next().unwrap();
    server.ok(&key_a, &["sandbox", "exec", &instance, "--shell", "pkill -f '^python3 app.py'"]);
    until(&server, &key_a, "hello", "the instance is restarted", |s| {
        instances(s).iter().any(|(id, state)| id != &instance && state == "healthy")
    });
    assert_eq!(get(server.proxy_port, &host), Ok((200, "v2".into())));

    // --- idle: paused, the next request resumes it ----------------------------------------
    until(&server, &key_a, "hello", "the idle instance is paused", |s| {
        instances(s).iter().all(|(_, st)| st == "paused")
    });
    let (paused, _) = instances(&status(&server, &key_a, "hello")).into_iter().next().unwrap();
    // Its QEMU stays a while, stopped (the server's default `--keep-paused-vm`): the request
    // continues that very process rather than restoring the save into a new one.
    let kept = live_vmms(&paused);
    assert_eq!(kept.len(), 1, "{kept:?}");
    let resumed = Instant::now();
    assert_eq!(get(server.proxy_port, &host), Ok((200, "v2".into())));
    eprintln!("request to a paused service: {} ms", resumed.elapsed().as_millis());
    assert_eq!(live_vmms(&paused), kept, "the kept QEMU continued");

    // --- a version failing its health checks: rolled back, the reason shown -----------------
    std::fs::write(dir.join("version.txt"), "broken-v3").unwrap();
    let toml = std::fs::read_to_string(dir.join("lizard.toml")).unwrap().replace("grace = \"20s\"", "grace = \"4s\"");
    std::fs::write(dir.join("lizard.toml"), toml).unwrap();
    let o = server.lizard(&key_a, &["up", dir.to_str().unwrap()]);
    assert!(!o.status.success(), "a failing version fails the deploy");
    assert!(stderr(&o).contains("UNHEALTHY") && stderr(&o).contains("500"), "{}", stderr(&o));
    let s = status(&server, &key_a, "hello");
    let v3 = s["versions"].as_array().unwrap().iter().find(|v| v["version"] == 3).unwrap();
    assert_eq!((v3["status"].as_str(), v3["error"]["code"].as_str()), (Some("failed"), Some("UNHEALTHY")), "{s:#}");
    assert_eq!((s["liveVersion"].as_u64(), s["status"].as_str()), (Some(2), Some("live")), "{s:#}");
    assert_eq!(get(server.proxy_port, &host), Ok((200, "v2".into())));

    // --- rollback to v1 --------------------------------------------------------------------
    let o = server.lizard(&key_a, &["services", "rollback", "hello", "--version", "1"]);
    assert!(o.status.success(), "rollback: {}", stderr(&o));
    assert_eq!(get(server.proxy_port, &host), Ok((200, "v1".into())));
    until(&server, &key_a, "hello", "v2's instance drains and stops", |s| {
        instances(s).len() == 1 && s["liveVersion"] == 1
    });

    // --- down: no instance, no layer, the name free -----------------------------------------
    server.ok(&key_a, &["services", "down", "hello"]);
    assert!(server.fails(&key_a, &["services", "status", "hello"]).contains("NOT_FOUND"));
    assert_eq!(get(server.proxy_port, &host).map(|r| r.0), Ok(404));
    assert_left_nothing(data.path(), &clean, "a service taken down");

    // --- from inside a sandbox (last: its `base` sandbox leaves the node's pool for `base`) --
    // An agent's directory deployed with the guest's `lizard up`, within its key's scope.
    let created =
        json(&server.ok(&key_a, &["--json", "sandbox", "create", "base", "--project", "pa", "--lizard-token", &key_a]));
    let agent = created["sandboxId"].as_str().unwrap().to_owned();
    let script = "mkdir -p /root/app && cd /root/app && echo from-a-guest > index.html && \
                  lizard up --name from-guest --cmd 'python3 -m http.server 8000' --port 8000 --project pa";
    let url = server.ok(&key_a, &["sandbox", "exec", &agent, "--timeout", "300000", "--shell", script]);
    assert!(url.trim().starts_with("http://from-guest.svc."), "{url}");
    let inside = "from-guest.svc.local.lizard.localhost";
    let mut s = std::net::TcpStream::connect(("127.0.0.1", server.proxy_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(s, "GET /index.html HTTP/1.1\r\nHost: {inside}\r\nConnection: close\r\n\r\n").unwrap();
    let mut page = String::new();
    s.read_to_string(&mut page).unwrap();
    assert!(page.contains(" 200 ") && page.contains("from-a-guest"), "{page}");
    assert!(server.fails(&key_b, &["services", "status", "from-guest"]).contains("NOT_FOUND"));
    let instance = status(&server, &key_a, "from-guest")["instances"][0]["sandboxId"].as_str().unwrap().to_owned();
    server.ok(&key_a, &["services", "down", "from-guest"]);
    assert!(server.fails(&key_a, &["sandbox", "get", &instance]).contains("NOT_FOUND"), "its instance is gone");
    server.ok(&key_a, &["sandbox", "kill", &agent]);
}
