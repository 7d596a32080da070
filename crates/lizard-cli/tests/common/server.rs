//! A real `lizard server` process for a test, driven through the `lizard` binary and the
//! API client, and what VMs, layers and networks it leaves on the host.

#![allow(clippy::unwrap_used)]

use super::{free_port, lizard_command, stderr};
use lizard_cli::client::{ApiClient, Endpoint};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    pub child: Child,
    pub url: String,
    pub proxy_port: u16,
    pub key: String,
}

impl Server {
    pub fn start(data: &Path) -> Server {
        let (port, proxy_port) = (free_port(), free_port());
        let mut child = Command::new(env!("CARGO_BIN_EXE_lizard"))
            .arg("--data-dir")
            .arg(data)
            .args(["server", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--proxy-listen", &format!("127.0.0.1:{proxy_port}")])
            // Namespaces of its own: counted alone, and no sweep of other tests' ones.
            .args(["--net-prefix", &net_prefix()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let key = std::thread::spawn(move || {
            use std::io::BufRead;
            let mut line = String::new();
            std::io::BufReader::new(stdout).read_line(&mut line).ok()?;
            line.trim().strip_prefix("LIZARD_API_KEY=").map(str::to_string)
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "lizard server did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        let key = key.join().unwrap().expect("the first start prints the owner key");
        Server { child, url: format!("http://127.0.0.1:{port}"), proxy_port, key }
    }

    pub fn lizard(&self, key: &str, args: &[&str]) -> Output {
        lizard_command().env("LIZARD_API_URL", &self.url).env("LIZARD_API_KEY", key).args(args).output().unwrap()
    }

    pub fn ok(&self, key: &str, args: &[&str]) -> String {
        let o = self.lizard(key, args);
        assert!(o.status.success(), "lizard {args:?}: {}", stderr(&o));
        String::from_utf8(o.stdout).unwrap()
    }

    /// `lizard …` that must fail; its stderr.
    pub fn fails(&self, key: &str, args: &[&str]) -> String {
        let o = self.lizard(key, args);
        assert!(!o.status.success(), "lizard {args:?} succeeded: {}", String::from_utf8_lossy(&o.stdout));
        stderr(&o)
    }

    pub fn api(&self, key: &str) -> ApiClient {
        ApiClient { endpoint: Endpoint::parse_url(&self.url).unwrap(), api_key: Some(key.to_owned()) }
    }
}

/// Two workspaces (`wa` with project `pa`, `wb` with project `pb`) and a key scoped to each.
pub struct Tenants {
    pub wa: String,
    pub wb: String,
    pub key_a: String,
    pub key_b: String,
}

impl Server {
    /// A server on a data directory of its own (`prefix`), with [`Tenants`].
    pub fn with_tenants(prefix: &str) -> (tempfile::TempDir, Server, Tenants) {
        let data = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
        super::link_images(data.path());
        super::copy_accel_verdict(data.path());
        let server = Server::start(data.path());
        let owner = server.key.clone();
        let wa = server.ok(&owner, &["workspace", "create", "wa"]).trim().to_string();
        let wb = server.ok(&owner, &["workspace", "create", "wb"]).trim().to_string();
        server.ok(&owner, &["project", "create", "--workspace", &wa, "pa"]);
        server.ok(&owner, &["project", "create", "--workspace", &wb, "pb"]);
        let key_of = |ws: &str| {
            let out = server.ok(&owner, &["key", "create", &format!("k-{ws}"), "--workspace", ws]);
            out.trim().strip_prefix("LIZARD_API_KEY=").unwrap().to_owned()
        };
        let (key_a, key_b) = (key_of(&wa), key_of(&wb));
        (data, server, Tenants { wa, wb, key_a, key_b })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap()),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// This test's prefix of network namespaces and host links.
pub fn net_prefix() -> String {
    format!("lzt{}-", std::process::id() % 100_000)
}

/// What a build could leave behind.
#[derive(Debug, PartialEq, Eq)]
pub struct Footprint {
    pub vmms: usize,
    pub layers: BTreeSet<String>,
    pub netns: usize,
}

pub fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

pub fn vmm_processes(data: &Path) -> usize {
    lizard_vmm::census::live_vmms(&data.to_string_lossy()).len()
}

pub fn footprint(data: &Path) -> Footprint {
    Footprint {
        vmms: vmm_processes(data),
        layers: names(&data.join("server/template-layers")),
        netns: names(Path::new("/run/netns")).iter().filter(|n| n.starts_with(&net_prefix())).count(),
    }
}

/// The footprint settles to `expected` (a VM's teardown may take a moment).
pub fn assert_left_nothing(data: &Path, expected: &Footprint, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = footprint(data);
        if &now == expected {
            return;
        }
        assert!(Instant::now() < deadline, "{what} left something behind: {expected:?} → {now:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}
