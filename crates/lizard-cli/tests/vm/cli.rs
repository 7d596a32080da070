//! The `lizard` binary in local mode, end to end: it starts the node daemon, boots a real
//! guest, runs commands and moves files; stopping the daemon leaves nothing behind.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

use crate::common;

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Cli {
    data: tempfile::TempDir,
}

impl Cli {
    fn new() -> Cli {
        let data = tempfile::Builder::new().prefix("lizard-cli-test-").tempdir().unwrap();
        // Share the suite's image cache instead of building images again.
        common::link_images(data.path());
        Cli { data }
    }

    fn run(&self, args: &[&str], stdin: Option<&[u8]>) -> Output {
        let mut child = Command::new(env!("CARGO_BIN_EXE_lizard"))
            .arg("--data-dir")
            .arg(self.data.path())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(bytes) = stdin {
            input.write_all(bytes).unwrap();
        }
        drop(input);
        child.wait_with_output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args, None);
        assert!(out.status.success(), "lizard {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    /// The daemon this CLI started and its VMMs, by their command lines.
    fn daemon_pids(&self) -> Vec<i32> {
        common::processes_of(self.data.path(), &["node run", "qemu-system"])
    }
}

impl Drop for Cli {
    fn drop(&mut self) {
        for pid in self.daemon_pids() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

#[test]
fn local_mode_end_to_end() {
    let cli = Cli::new();
    let id = cli.ok(&["sandbox", "create", "base"]).trim().to_string();
    assert_eq!(id.len(), 20, "{id:?}");

    // Exit codes and both output streams pass through.
    let out = cli.run(&["sandbox", "exec", &id, "--shell", "echo out; echo err >&2; exit 3"], None);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("err\n"));
    let out = cli.run(&["sandbox", "exec", &id, "--", "cat", "/proc/sys/kernel/hostname"], None);
    assert_eq!((out.status.code(), String::from_utf8_lossy(&out.stdout).trim()), (Some(0), id.as_str()));
    let out = cli.run(&["sandbox", "exec", &id, "--stdin", "--", "wc", "-c"], Some(b"12345"));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "5");
    let out = cli.run(&["sandbox", "exec", &id, "--timeout", "1", "--", "sleep", "100"], None);
    assert_eq!(out.status.code(), Some(124));

    // Files: binary-safe round trip through stdin/stdout, listing, mkdir, rm.
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i * 7).to_le_bytes()[0]).collect(); // the low byte
    let out = cli.run(&["sandbox", "fs", "write", &id, "/data/blob.bin"], Some(&payload));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = cli.run(&["sandbox", "fs", "read", &id, "/data/blob.bin"], None);
    assert!(out.stdout == payload, "read back {} bytes, differing", out.stdout.len());
    cli.ok(&["sandbox", "fs", "mkdir", &id, "/data/sub/dir"]);
    let ls = cli.ok(&["sandbox", "fs", "ls", &id, "/data"]);
    assert!(ls.contains("blob.bin") && ls.contains("200000") && ls.contains("sub"), "{ls}");
    cli.ok(&["sandbox", "fs", "rm", &id, "/data/sub"]);
    assert!(!cli.ok(&["sandbox", "fs", "ls", &id, "/data"]).contains("sub"));
    let out = cli.run(&["sandbox", "fs", "read", &id, "/nope"], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("NOT_FOUND"));

    // Listing and errors for ids that do not exist.
    assert!(cli.ok(&["sandbox", "list"]).contains(&id));
    let out = cli.run(&["sandbox", "exec", "nosuchsandbox", "--", "true"], None);
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("NOT_FOUND"));
    let out = cli.run(&["sandbox", "create", "nosuchtemplate"], None);
    assert!(String::from_utf8_lossy(&out.stderr).contains("INVALID_ARGUMENT"));

    // Kill: gone from the list, and its files with it.
    cli.ok(&["sandbox", "kill", &id]);
    assert!(!cli.ok(&["sandbox", "list"]).contains(&id));
    assert!(!cli.data.path().join("sandboxes").join(&id).exists());

    // A sandbox still running when the daemon stops is killed and cleaned up.
    let id2 = cli.ok(&["sandbox", "create", "base"]).trim().to_string();
    let daemons = cli.daemon_pids();
    assert!(daemons.len() >= 2, "expected the daemon and a VMM: {daemons:?}");
    for pid in &daemons {
        let cmd = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if cmd.contains("node") {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), nix::sys::signal::Signal::SIGTERM).unwrap();
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cli.daemon_pids().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(cli.daemon_pids(), Vec::<i32>::new(), "daemon or VMM survived SIGTERM");
    assert!(!cli.data.path().join("sandboxes").join(&id2).exists());
    assert!(!cli.data.path().join("node.sock").exists());
}
