//! `lizard billing …` and `lizard metrics` against a real control plane, and a real
//! `lizard server` process killed with SIGKILL mid-run: the restart takes its running
//! sandbox back, and the ledger holds the sandbox's time — the downtime included, since
//! its VM ran on — each millisecond once.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

use crate::common;

use common::{agent_bin, copy_accel_verdict, free_port, link_images, lizard_command, stderr};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

/// `lizard` with only the LIZARD_* variables given here.
fn lizard(data_dir: &Path, url: Option<&str>, key: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = lizard_command();
    cmd.arg("--data-dir").arg(data_dir);
    if let Some(u) = url {
        cmd.env("LIZARD_API_URL", u);
    }
    if let Some(k) = key {
        cmd.env("LIZARD_API_KEY", k);
    }
    cmd.args(args).stdin(Stdio::null()).output().unwrap()
}

fn ok_json(o: Output) -> Value {
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

/// A `lizard server` process on a free loopback port.
struct ServerProcess {
    child: Child,
    url: String,
}

/// Prints the servers' logs (`server-*.log` in the data directory) when the test fails.
struct LogsOnFailure(std::path::PathBuf);

impl Drop for LogsOnFailure {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for entry in std::fs::read_dir(&self.0).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("server-") && name.ends_with(".log") {
                eprintln!("--- {name}\n{}", std::fs::read_to_string(entry.path()).unwrap_or_default());
            }
        }
    }
}

impl ServerProcess {
    /// Start it on `data_dir` with `extra` flags; returns it and the key it printed (first
    /// start only).
    fn start(data_dir: &Path, extra: &[&str]) -> (ServerProcess, Option<String>) {
        let port = free_port();
        let log = std::fs::File::create(data_dir.join(format!("server-{port}.log"))).unwrap();
        let mut child = lizard_command()
            .arg("--data-dir")
            .arg(data_dir)
            .args(["server", "--no-proxy", "--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let server = ServerProcess { child, url };
        // The key line comes first, on the first start; afterwards stdout stays empty.
        let key = if data_dir.join("key").exists() {
            None
        } else {
            let line = BufReader::new(stdout).lines().next().expect("a first line").unwrap();
            let key = line.strip_prefix("LIZARD_API_KEY=").unwrap_or_else(|| panic!("{line}")).to_string();
            std::fs::write(data_dir.join("key"), &key).unwrap();
            Some(key)
        };
        let key_now = std::fs::read_to_string(data_dir.join("key")).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let o = lizard(data_dir, Some(&server.url), Some(&key_now), &["whoami", "--json"]);
            if o.status.success() {
                break;
            }
            assert!(Instant::now() < deadline, "the server did not answer: {}", stderr(&o));
            std::thread::sleep(Duration::from_millis(100));
        }
        (server, key)
    }

    fn signal(&mut self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = self.child.wait();
        }
    }
}

/// Every ledger entry, through `lizard billing transactions --all`.
fn transactions(dir: &Path, url: &str, key: &str) -> Vec<Value> {
    let v = ok_json(lizard(
        dir,
        Some(url),
        Some(key),
        &["billing", "transactions", "--all", "--include-usage", "--limit", "7", "--json"],
    ));
    v["items"].as_array().unwrap().clone()
}

fn balance(dir: &Path, url: &str, key: &str) -> i64 {
    ok_json(lizard(dir, Some(url), Some(key), &["billing", "balance", "--json"]))["balanceNanos"].as_i64().unwrap()
}

fn assert_balance_is_ledger_sum(dir: &Path, url: &str, key: &str) {
    let sum: i64 = transactions(dir, url, key).iter().map(|t| t["amountNanos"].as_i64().unwrap()).sum();
    assert_eq!(balance(dir, url, key), sum);
}

#[test]
fn operator_credits_are_idempotent_and_scoped_keys_are_kept_out() {
    let dir = tempfile::Builder::new().prefix("lizard-cli-billing-").tempdir().unwrap();
    let d = dir.path();
    let (server, key) = ServerProcess::start(d, &[]);
    let (url, key) = (server.url.clone(), key.unwrap());
    let account =
        ok_json(lizard(d, Some(&url), Some(&key), &["whoami", "--json"]))["accountId"].as_str().unwrap().to_string();
    assert_eq!(balance(d, &url, &key), 10_000_000_000);

    let credit = |amount: &str, idem: &str| {
        let amount = format!("--amount={amount}");
        lizard(d, None, None, &["billing", "credit", "--account", &account, &amount, "--idempotency-key", idem])
    };
    let first = credit("2.50", "invoice-1");
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(stderr(&first).contains("added 2.50 USD"), "{}", stderr(&first));
    assert_eq!(balance(d, &url, &key), 12_500_000_000);
    let again = credit("2.50", "invoice-1");
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(stderr(&again).contains("nothing added"), "{}", stderr(&again));
    assert_eq!(balance(d, &url, &key), 12_500_000_000, "the same key adds once");
    let different = credit("3", "invoice-1");
    assert_eq!(different.status.code(), Some(1));
    assert!(stderr(&different).contains("idempotency key"), "{}", stderr(&different));
    for (amount, idem) in [("0", "z"), ("-1", "n"), ("1.0000000001", "p"), ("lots", "l"), ("1", " ")] {
        let o = credit(amount, idem);
        assert_eq!(o.status.code(), Some(1), "{amount} {idem:?}: {}", stderr(&o));
    }
    let nobody = lizard(
        d,
        None,
        None,
        &["billing", "credit", "--account", "acc_nobody", "--amount", "1", "--idempotency-key", "x"],
    );
    assert_eq!(nobody.status.code(), Some(1));
    assert!(stderr(&nobody).contains("not found"), "{}", stderr(&nobody));
    let elsewhere = tempfile::tempdir().unwrap();
    let missing = lizard(
        elsewhere.path(),
        None,
        None,
        &["billing", "credit", "--account", &account, "--amount", "1", "--idempotency-key", "x"],
    );
    assert!(stderr(&missing).contains("no Lizard database"), "{}", stderr(&missing));
    assert!(!elsewhere.path().join("lizard.db").exists(), "no database is created by a typo");
    assert_eq!(balance(d, &url, &key), 12_500_000_000);
    let credits: Vec<Value> = transactions(d, &url, &key);
    assert_eq!(credits.iter().filter(|t| t["kind"] == "credit").count(), 1);

    // A scoped key: no billing, no account details; its own metrics only.
    let ws = ok_json(lizard(d, Some(&url), Some(&key), &["workspace", "create", "u1", "--json"]));
    let ws = ws["id"].as_str().unwrap().to_string();
    let scoped = ok_json(lizard(d, Some(&url), Some(&key), &["key", "create", "u1", "--workspace", &ws, "--json"]));
    let scoped = scoped["key"].as_str().unwrap().to_string();
    for cmd in
        [&["billing", "balance"][..], &["billing", "transactions"], &["billing", "summary"], &["billing", "live"]]
    {
        let o = lizard(d, Some(&url), Some(&scoped), cmd);
        assert_eq!(o.status.code(), Some(1), "{cmd:?}");
        assert!(stderr(&o).contains("ACCOUNT_SCOPE_REQUIRED"), "{cmd:?}: {}", stderr(&o));
    }
    let me = ok_json(lizard(d, Some(&url), Some(&scoped), &["whoami", "--json"]));
    assert!(me.get("email").is_none() && me.get("plan").is_none() && me.get("balance").is_none(), "{me}");
    let m = ok_json(lizard(d, Some(&url), Some(&scoped), &["metrics", "--json"]));
    assert_eq!(m, serde_json::json!({"workspaces": [], "projects": []}));
    let human = lizard(d, Some(&url), Some(&key), &["billing", "summary"]);
    assert!(String::from_utf8_lossy(&human.stdout).contains("12.50"), "{}", String::from_utf8_lossy(&human.stdout));
    assert_balance_is_ledger_sum(d, &url, &key);
}

/// Milliseconds since the epoch, on the clock the server meters with.
fn wall_ms() -> i64 {
    i64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

fn rfc3339_ms(v: &Value) -> i64 {
    let t = humantime::parse_rfc3339(v.as_str().unwrap()).unwrap();
    i64::try_from(t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

fn alive(pid: i32) -> bool {
    // A zombie is as good as dead (it no longer runs); QEMU is reaped by whoever adopted it.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

#[test]
fn vm_sigkill_mid_run_keeps_the_sandbox_and_bills_each_millisecond_once() {
    let dir = tempfile::Builder::new().prefix("lizard-cli-sigkill-").tempdir().unwrap();
    let d = dir.path();
    let _logs = LogsOnFailure(d.to_path_buf());
    // The shared, content-hashed guest images; this server's database and sandboxes are its own.
    link_images(d);
    copy_accel_verdict(d);
    let agent = agent_bin();
    // A network prefix of its own: a node starting in another test sweeps leftovers with
    // its prefix, and would take this VM's network while no server holds it.
    let prefix = format!("lzcb{}", std::process::id() % 100_000);
    let flags = ["--billing-tick-ms", "1000", "--agent", agent.to_str().unwrap(), "--net-prefix", &prefix];
    let (mut first, key) = ServerProcess::start(d, &flags);
    let key = key.unwrap();
    let url = first.url.clone();
    let ws = ok_json(lizard(d, Some(&url), Some(&key), &["workspace", "create", "crash", "--json"]));
    let prj = ok_json(lizard(
        d,
        Some(&url),
        Some(&key),
        &["project", "create", "--workspace", ws["id"].as_str().unwrap(), "p", "--json"],
    ));
    let prj = prj["id"].as_str().unwrap().to_string();
    let before = wall_ms();
    let sbx = ok_json(lizard(d, Some(&url), Some(&key), &["sandbox", "create", "base", "--project", &prj, "--json"]));
    let created = wall_ms();
    let id = sbx["sandboxId"].as_str().unwrap().to_string();
    let pid: i32 = std::fs::read_to_string(d.join("server/sandboxes").join(&id).join("vmm.pid"))
        .expect("the VM's pid file")
        .trim()
        .parse()
        .unwrap();
    std::thread::sleep(Duration::from_millis(4_500));
    let killed_from = wall_ms();
    first.signal(nix::sys::signal::Signal::SIGKILL);
    let killed = wall_ms();

    // The VM runs on while no server does.
    std::thread::sleep(Duration::from_millis(1_500));
    assert!(alive(pid), "the VM died with the server");
    let (second, again) = ServerProcess::start(d, &flags);
    assert!(again.is_none(), "no new key on a restart");
    let url = second.url.clone();
    let back = ok_json(lizard(d, Some(&url), Some(&key), &["sandbox", "get", &id, "--json"]));
    assert_eq!(back["state"], "running", "the restart took the sandbox back: {back}");
    let live = ok_json(lizard(d, Some(&url), Some(&key), &["billing", "live", "--json"]));
    assert!(live["sandboxes"].as_array().unwrap().iter().any(|s| s["sandboxId"] == id.as_str()), "{live}");
    // A few ticks of the new process, then the sandbox ends.
    std::thread::sleep(Duration::from_millis(2_500));
    let o = lizard(d, Some(&url), Some(&key), &["sandbox", "kill", &id]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ended = wall_ms();
    let deadline = Instant::now() + Duration::from_secs(30);
    while alive(pid) {
        assert!(Instant::now() < deadline, "the killed sandbox's VM (pid {pid}) still runs");
        std::thread::sleep(Duration::from_millis(200));
    }
    let usage: Vec<Value> =
        transactions(d, &url, &key).into_iter().rev().filter(|t| t["sandboxId"] == id.as_str()).collect();
    let ms: i64 = usage.iter().map(|u| u["quantityMs"].as_i64().unwrap()).sum();
    // Metering starts when create answers (between `before` and `created`, same clock as
    // the server's) and runs until the kill, across the crash: the intervals follow each
    // other with no gap and no overlap, the downtime billed once, by the new process.
    for pair in usage.windows(2) {
        assert_eq!(pair[0]["periodEnd"], pair[1]["periodStart"], "intervals follow each other, no gap or overlap");
    }
    let start = rfc3339_ms(&usage[0]["periodStart"]);
    let end = rfc3339_ms(&usage[usage.len() - 1]["periodEnd"]);
    assert_eq!(ms, end - start);
    eprintln!(
        "metered from create+{} ms to kill-{} ms: {ms} ms in {} entries",
        start - before,
        ended - end,
        usage.len()
    );
    assert!((before..=created).contains(&start), "metering starts when create answers");
    assert!(end <= ended, "nothing billed past the kill");
    assert!(end > killed, "the time after the crash is billed too");
    let charged: i64 = usage.iter().map(|u| -u["amountNanos"].as_i64().unwrap()).sum();
    assert_eq!(charged, ms * 2_500 / 1_000);
    assert!(killed_from > start);
    // Ended now: nothing accrues any more.
    let live = ok_json(lizard(d, Some(&url), Some(&key), &["billing", "live", "--json"]));
    assert_eq!(live["sandboxes"], serde_json::json!([]), "{live}");
    std::thread::sleep(Duration::from_millis(2_500));
    let later: Vec<Value> = transactions(d, &url, &key).into_iter().filter(|t| t["sandboxId"] == id.as_str()).collect();
    assert_eq!(later.len(), usage.len(), "nothing billed after the kill");
    assert_balance_is_ledger_sum(d, &url, &key);
    drop(second);
}
