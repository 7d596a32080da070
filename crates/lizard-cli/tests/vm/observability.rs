//! A real `lizard server --log-format json --metrics-listen …` process with a real sandbox:
//! after create, exec, pause, resume and kill, its `/metrics` (behind its token) shows the
//! operations' histograms moved, the sandboxes by state, the in-process node's capacity and
//! use, API requests by route template and the metering tick; every line it logged is a
//! JSON object, and no log line carries the API key.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

use crate::common;

use common::{copy_accel_verdict, free_port, link_images, lizard_command};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "metrics-token-of-the-test";

struct Server {
    child: Child,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ok(url: &str, key: &str, args: &[&str]) -> String {
    let o = lizard_command().env("LIZARD_API_URL", url).env("LIZARD_API_KEY", key).args(args).output().unwrap();
    assert!(o.status.success(), "lizard {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

fn scrape(url: &str) -> String {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let client = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(30)).build().unwrap();
        let resp = client.get(url).bearer_auth(TOKEN).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.text().await.unwrap()
    })
}

/// The value of the series `series` exactly (name and labels as written), if present.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

fn count(text: &str, op: &str) -> f64 {
    value(text, &format!(r#"lizard_operation_duration_seconds_count{{operation="{op}",outcome="ok"}}"#)).unwrap_or(0.0)
}

#[test]
fn a_real_server_reports_its_operations_and_logs_json() {
    let data = tempfile::Builder::new().prefix("lizard-observe-").tempdir().unwrap();
    link_images(data.path());
    copy_accel_verdict(data.path());
    let (port, metrics_port) = (free_port(), free_port());
    let log_path = data.path().join("server.log");
    let child = Command::new(env!("CARGO_BIN_EXE_lizard"))
        .env("LIZARD_METRICS_TOKEN", TOKEN)
        .arg("--data-dir")
        .arg(data.path())
        .args(["--log-format", "json", "server", "--no-proxy", "--billing-tick-ms", "200"])
        .args(["--listen", &format!("127.0.0.1:{port}"), "--metrics-listen", &format!("127.0.0.1:{metrics_port}")])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let mut server = Server { child };
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(server.child.stdout.take().unwrap()), &mut line).unwrap();
    let key = line.trim().strip_prefix("LIZARD_API_KEY=").expect("the owner key").to_string();
    let url = format!("http://127.0.0.1:{port}");
    let metrics = format!("http://127.0.0.1:{metrics_port}/metrics");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "lizard server did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }

    let ws = ok(&url, &key, &["workspace", "create", "w"]).trim().to_string();
    ok(&url, &key, &["project", "create", "--workspace", &ws, "p"]);
    let id = ok(&url, &key, &["sandbox", "create", "base", "--project", "p"]).trim().to_string();
    assert_eq!(ok(&url, &key, &["sandbox", "exec", &id, "--", "echo", "hi"]), "hi\n");
    let text = scrape(&metrics);
    assert_eq!(count(&text, "create"), 1.0, "{text}");
    assert_eq!(count(&text, "exec"), 1.0, "{text}");
    assert_eq!(value(&text, r#"lizard_sandboxes{state="running"}"#), Some(1.0), "{text}");
    assert_eq!(value(&text, r#"lizard_sandboxes{state="paused"}"#), Some(0.0));
    let node = r#"{node="node_local",region="local"}"#;
    assert!(value(&text, &format!("lizard_node_capacity_vcpus{node}")).unwrap() >= 1.0, "{text}");
    assert!(value(&text, &format!("lizard_node_capacity_memory_bytes{node}")).unwrap() > 0.0);
    assert_eq!(value(&text, &format!("lizard_node_used_vcpus{node}")), Some(1.0), "{text}");
    assert_eq!(value(&text, &format!("lizard_node_sandboxes{node}")), Some(1.0));
    assert_eq!(value(&text, r#"lizard_node_state{node="node_local",state="up"}"#), Some(1.0));
    assert_eq!(
        value(&text, r#"lizard_http_requests_total{route="/v1/sandboxes",method="POST",status="201"}"#),
        Some(1.0),
        "{text}"
    );
    assert!(value(&text, r#"lizard_http_requests_total{route="/v1/sandboxes/{id}/exec",method="POST",status="200"}"#)
        .is_some());
    // Metering ticks every 200 ms here: a running sandbox is never billed far behind.
    let lag = value(&text, "lizard_billing_lag_seconds").unwrap();
    assert!((0.0..10.0).contains(&lag), "{lag}");
    assert!(value(&text, "lizard_billing_tick_duration_seconds_count").unwrap() >= 1.0, "{text}");

    ok(&url, &key, &["sandbox", "pause", &id]);
    let text = scrape(&metrics);
    assert_eq!(count(&text, "pause"), 1.0, "{text}");
    assert_eq!(value(&text, r#"lizard_sandboxes{state="paused"}"#), Some(1.0), "{text}");
    assert_eq!(value(&text, r#"lizard_sandboxes{state="running"}"#), Some(0.0));
    assert_eq!(value(&text, "lizard_billing_lag_seconds"), Some(0.0), "nothing runs");
    ok(&url, &key, &["sandbox", "resume", &id]);
    assert_eq!(ok(&url, &key, &["sandbox", "exec", &id, "--", "echo", "again"]), "again\n");
    ok(&url, &key, &["sandbox", "kill", &id]);
    let text = scrape(&metrics);
    for (op, n) in [("create", 1.0), ("exec", 2.0), ("pause", 1.0), ("resume", 1.0), ("kill", 1.0)] {
        assert_eq!(count(&text, op), n, "{op}: {text}");
    }
    assert_eq!(value(&text, r#"lizard_sandboxes{state="running"}"#), Some(0.0), "{text}");
    assert_eq!(value(&text, &format!("lizard_node_sandboxes{node}")), Some(0.0));

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(server.child.id() as i32), nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    assert!(server.child.wait().unwrap().success());
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(!log.contains(&key), "the API key is in the log");
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {l}")))
        .collect();
    assert!(lines.iter().all(|l| l["timestamp"].is_string() && l["level"].is_string()), "{log}");
    assert!(
        lines.iter().any(|l| l["fields"]["message"].as_str().is_some_and(|m| m.starts_with("metrics on http://"))),
        "{log}"
    );
}
