//! Test harness: the real agent binary in dev mode (`serve --unix`), driven through
//! `lizard-agent-client` over the Unix socket.

// Helpers of these tests unwrap as the tests do (clippy.toml's allow-unwrap-in-tests
// covers only the #[test] functions themselves).
#![allow(clippy::unwrap_used)]
#![allow(dead_code)] // each test binary uses a different part of the harness

use lizard_agent_client::{AgentClient, Secret};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A dev-mode agent process, killed when dropped.
pub struct Agent {
    child: Child,
    pub dir: tempfile::TempDir,
    pub secret: Secret,
    pub socket: PathBuf,
}

impl Agent {
    pub fn start() -> Agent {
        Agent::start_with(&[])
    }

    /// Start with extra `serve` arguments (e.g. `--forward-listen ADDR`).
    pub fn start_with(extra: &[&str]) -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let secret = Secret::generate();
        let secret_file = dir.path().join("secret");
        std::fs::write(&secret_file, secret.to_hex()).unwrap();
        let socket = dir.path().join("agent.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_lizard-agent"))
            .arg("serve")
            .arg("--unix")
            .arg(&socket)
            .arg("--secret-file")
            .arg(&secret_file)
            .args(extra)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "agent did not start listening");
            std::thread::sleep(Duration::from_millis(10));
        }
        Agent { child, dir, secret, socket }
    }

    pub async fn connect(&self) -> AgentClient {
        let stream = tokio::net::UnixStream::connect(&self.socket).await.unwrap();
        AgentClient::connect(stream, &self.secret).await.unwrap()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kill the agent now (to test what the client sees when the VM dies).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The agent's peak resident memory, in bytes.
    pub fn peak_rss(&self) -> u64 {
        peak_rss_of(&format!("/proc/{}/status", self.pid()))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `VmHWM` (peak resident set) from a /proc status file, in bytes.
pub fn peak_rss_of(status_file: &str) -> u64 {
    let status = std::fs::read_to_string(status_file).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}
