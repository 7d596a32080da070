//! A real `lizard server` process, stopped and started again: a paused sandbox survives
//! with its processes and files; a running one is recorded as stopped. Driven by the
//! `lizard sandbox pause|resume|fork` commands.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

use crate::common;

use common::{copy_accel_verdict, free_port, link_images, lizard_command};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `lizard server` on a free loopback port, over a data directory that outlives it.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    /// The server, and what its first line of output will say: the owner key (a first
    /// start prints it before listening), or `None` once it exits having printed none.
    fn start(data: &Path) -> (Server, std::sync::mpsc::Receiver<Option<String>>) {
        let port = free_port();
        let mut child = Command::new(env!("CARGO_BIN_EXE_lizard"))
            .arg("--data-dir")
            .arg(data)
            .args(["server", "--listen", &format!("127.0.0.1:{port}"), "--no-proxy"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // The first start prints the owner key on its first line; later ones print nothing.
        let stdout = child.stdout.take().unwrap();
        let (key_tx, key_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            let mut line = String::new();
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
            let _ = key_tx.send(line.trim().strip_prefix("LIZARD_API_KEY=").map(str::to_string));
        });
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "lizard server did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        (Server { child, url }, key_rx)
    }

    /// SIGTERM and wait: the graceful path a service manager takes.
    fn stop(mut self) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), nix::sys::signal::Signal::SIGTERM)
            .unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "{status:?}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lizard(url: &str, key: &str, args: &[&str]) -> Output {
    lizard_command().env("LIZARD_API_URL", url).env("LIZARD_API_KEY", key).args(args).output().unwrap()
}

fn ok(url: &str, key: &str, args: &[&str]) -> String {
    let o = lizard(url, key, args);
    assert!(o.status.success(), "lizard {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn a_paused_sandbox_survives_a_server_restart() {
    let data = tempfile::Builder::new().prefix("lizard-restart-").tempdir().unwrap();
    link_images(data.path());
    copy_accel_verdict(data.path());
    let (server, key) = Server::start(data.path());
    let key = key.recv_timeout(Duration::from_secs(60)).ok().flatten().expect("the first start prints the owner key");
    let url = server.url.clone();
    let ws = ok(&url, &key, &["workspace", "create", "w"]).trim().to_string();
    ok(&url, &key, &["project", "create", "--workspace", &ws, "p"]);

    let paused = ok(&url, &key, &["sandbox", "create", "base", "--project", "p"]).trim().to_string();
    let running = ok(&url, &key, &["sandbox", "create", "base", "--project", "p"]).trim().to_string();
    ok(
        &url,
        &key,
        &["sandbox", "exec", &paused, "--shell", "echo kept > /root/note.txt; sleep 1000 >/dev/null 2>&1 &"],
    );
    let sleeper = ok(&url, &key, &["sandbox", "exec", &paused, "--", "pgrep", "-x", "sleep"]);
    let copy = ok(&url, &key, &["sandbox", "fork", &paused, "--count", "1"]).trim().to_string();
    assert!(copy.len() == 20 && copy != paused, "{copy}");
    assert_eq!(ok(&url, &key, &["sandbox", "exec", &copy, "--", "cat", "/root/note.txt"]), "kept\n");
    let o = lizard(&url, &key, &["sandbox", "pause", &paused]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stderr).contains("paused"), "{o:?}");
    let listed = ok(&url, &key, &["sandbox", "list"]);
    assert!(listed.lines().any(|l| l.contains(&paused) && l.contains("paused")), "{listed}");

    server.stop();
    let (server, again) = Server::start(data.path());
    let url = server.url.clone();
    let got: serde_json::Value = serde_json::from_str(&ok(&url, &key, &["sandbox", "get", &paused, "--json"])).unwrap();
    assert_eq!(got["state"], "paused", "{got}");
    // Running sandboxes do not outlive the server: they are recorded as stopped.
    for id in [&running, &copy] {
        let o = lizard(&url, &key, &["sandbox", "get", id]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains("NOT_FOUND") && err.contains("server stopped"), "{err}");
    }
    let o = lizard(&url, &key, &["sandbox", "resume", &paused]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stderr).contains("running"), "{o:?}");
    assert_eq!(ok(&url, &key, &["sandbox", "exec", &paused, "--", "cat", "/root/note.txt"]), "kept\n");
    assert_eq!(
        ok(&url, &key, &["sandbox", "exec", &paused, "--", "pgrep", "-x", "sleep"]),
        sleeper,
        "the same process"
    );
    ok(&url, &key, &["sandbox", "kill", &paused]);
    server.stop();
    let again = again.recv_timeout(Duration::from_secs(10)).expect("the output ends with the server");
    assert_eq!(again, None, "the owner key is shown once");
    let left: Vec<_> =
        std::fs::read_dir(data.path().join("server/sandboxes")).unwrap().flatten().map(|e| e.path()).collect();
    assert!(left.is_empty(), "{left:?}");
}
