//! `lizard sandbox shell` in a real terminal (tmux: keys typed with `send-keys`, the screen
//! read with `capture-pane`) against a real guest in local mode, and `lizard sandbox
//! wait-port`.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

use crate::common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A data directory of the test's own, over the suite's images; its node daemon is
/// killed when dropped.
struct Local {
    data: tempfile::TempDir,
}

impl Local {
    fn new() -> Local {
        let data = tempfile::Builder::new().prefix("lizard-shell-test-").tempdir().unwrap();
        common::link_images(data.path());
        common::copy_accel_verdict(data.path());
        Local { data }
    }

    fn run(&self, args: &[&str]) -> Output {
        common::lizard_command()
            .env("LIZARD_AGENT_BIN", common::agent_bin())
            .arg("--data-dir")
            .arg(self.data.path())
            .args(args)
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(out.status.success(), "lizard {args:?}: {}", common::stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    }
}

impl Local {
    /// The node daemon and VMMs of this data directory, by their command lines.
    fn processes(&self, what: &str) -> Vec<nix::unistd::Pid> {
        common::processes_of(self.data.path(), &[what]).into_iter().map(nix::unistd::Pid::from_raw).collect()
    }
}

impl Drop for Local {
    /// SIGTERM the daemon (it kills its sandboxes and deletes their disks), then make sure.
    fn drop(&mut self) {
        use nix::sys::signal::{kill, Signal};
        for pid in self.processes("node run") {
            let _ = kill(pid, Signal::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.processes("node run").is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        for pid in self.processes("node run").into_iter().chain(self.processes("qemu-system")) {
            let _ = kill(pid, Signal::SIGKILL);
        }
    }
}

/// A tmux server of the test's own (its own socket), killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn cmd(&self, args: &[&str]) -> Output {
        Command::new("tmux").arg("-L").arg(&self.socket).args(args).output().unwrap()
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "t"];
        args.extend_from_slice(keys);
        assert!(self.cmd(&args).status.success());
    }

    fn screen(&self) -> String {
        String::from_utf8(self.cmd(&["capture-pane", "-p", "-t", "t", "-S", "-200"]).stdout).unwrap()
    }

    /// Wait until the screen shows what `done` wants; the screen.
    fn until(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let screen = self.screen();
            if done(&screen) {
                return screen;
            }
            assert!(Instant::now() < deadline, "no {what} on the screen:\n{screen}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

#[test]
fn shell_in_tmux_and_wait_port() {
    let local = Local::new();
    let id = local.ok(&["sandbox", "create", "base"]).trim().to_string();

    // wait-port: a Node server needs seconds to listen under TCG; a free port times out.
    let server =
        r#"nohup node -e "require('http').createServer((_, r) => r.end('ok')).listen(3000)" >/dev/null 2>&1 &"#;
    local.ok(&["sandbox", "exec", &id, "--shell", server]);
    local.ok(&["sandbox", "wait-port", &id, "3000", "--timeout-ms", "60000"]);
    assert_eq!(local.ok(&["sandbox", "exec", &id, "--", "curl", "-s", "127.0.0.1:3000"]), "ok");
    let out = local.run(&["sandbox", "wait-port", &id, "3999", "--timeout-ms", "300"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(common::stderr(&out).contains("TIMED_OUT"), "{}", common::stderr(&out));

    // The shell, in a 100×30 terminal.
    let tmux = Tmux { socket: format!("lizard-test-{}", std::process::id()) };
    let lizard = format!(
        "LIZARD_AGENT_BIN={} {} --data-dir {} sandbox shell {id}; echo SHELL-EXIT-$?; sleep 600",
        common::agent_bin().display(),
        env!("CARGO_BIN_EXE_lizard"),
        local.data.path().display()
    );
    let started = tmux.cmd(&["new-session", "-d", "-s", "t", "-x", "100", "-y", "30", &lizard]);
    assert!(started.status.success(), "{}", common::stderr(&started));
    tmux.keys(&["tty; stty size", "Enter"]);
    tmux.until("tty and size", |s| s.contains("/dev/pts/") && s.contains("30 100"));
    // A resize of the terminal reaches the sandbox's (SIGWINCH → resize).
    assert!(tmux.cmd(&["resize-window", "-t", "t", "-x", "120", "-y", "40"]).status.success());
    std::thread::sleep(Duration::from_millis(500));
    tmux.keys(&["clear; stty size", "Enter"]);
    tmux.until("the new size", |s| s.contains("40 120"));
    // Raw mode: ^C reaches the sandbox's foreground job, not this CLI; job control works.
    tmux.keys(&["sleep 100 &", "Enter", "jobs", "Enter"]);
    tmux.until("the background job", |s| s.contains("Running") && s.contains("sleep 100"));
    tmux.keys(&["sleep 50", "Enter"]);
    std::thread::sleep(Duration::from_millis(1000));
    tmux.keys(&["C-c"]);
    std::thread::sleep(Duration::from_millis(500));
    tmux.keys(&["echo rc=$((1+$?))", "Enter"]);
    tmux.until("the interrupted job's status", |s| s.contains("rc=131"));
    tmux.keys(&["kill %1; exit 4", "Enter"]);
    tmux.until("the shell's exit code", |s| s.contains("SHELL-EXIT-4"));
    local.ok(&["sandbox", "kill", &id]);
}
