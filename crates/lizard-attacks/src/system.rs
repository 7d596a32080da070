//! A `lizard server` process under attack: started on a data directory, loopback ports
//! and network prefix of its own, with an owner key and one project ready, and driven
//! over HTTP as any client would.

use reqwest::Method;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long the server may take to listen (it restarts nothing and builds no image).
const LISTEN_DEADLINE: Duration = Duration::from_secs(60);

/// The data directory of the machine's one image store (outside the checkout: a fresh
/// clone reuses its images).
pub use lizard_node::shared_image_root as image_root;

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port").local_addr().expect("bound").port()
}

/// This crate's `lizard-under-attack` binary: Cargo builds a package's binaries before
/// its integration tests and puts them one level above the tests' executables
/// (`target/<profile>/deps/…`); `CARGO_BIN_EXE_*` would reach only the tests themselves.
fn server_binary() -> PathBuf {
    let test_exe = std::env::current_exe().expect("the test's executable");
    let profile_dir = test_exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>");
    profile_dir.join("lizard-under-attack")
}

/// A running `lizard server`.
pub struct System {
    /// Its command line (for a restart).
    args: Vec<std::ffi::OsString>,
    child: Option<Child>,
    data: tempfile::TempDir,
    /// Base URL of the API, e.g. `http://127.0.0.1:40123`.
    pub api: String,
    /// Address of the sandbox-URL proxy.
    pub proxy: std::net::SocketAddr,
    /// The owner key the first start printed.
    pub key: String,
    /// Prefix of this server's network namespaces and host links.
    pub net_prefix: String,
    /// The project sandboxes are created in (its id).
    pub project: String,
    pub http: reqwest::Client,
}

impl System {
    /// A server with the defaults a user gets, less pre-spawned VMMs (they would make
    /// process counts depend on timing), plus `extra` server arguments.
    pub async fn start(extra: &[&str]) -> System {
        Self::start_prepared(extra, |_| {}).await
    }

    /// [`System::start`], with `prepare` given the data directory before the server
    /// first starts in it (to mount a filesystem of the test's own at [`System::node_dir`],
    /// say).
    pub async fn start_prepared(extra: &[&str], prepare: impl FnOnce(&Path)) -> System {
        let data = tempfile::Builder::new().prefix("lizard-attack-").tempdir().expect("temp dir");
        prepare(data.path());
        let images = image_root().canonicalize().expect("the image store exists").join("images");
        std::os::unix::fs::symlink(images, data.path().join("images")).expect("link images");
        let verdict = image_root().join("accel.json");
        if verdict.exists() {
            std::fs::copy(verdict, data.path().join("accel.json")).expect("copy accel verdict");
        }
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let net_prefix = format!("lza{}-{}", std::process::id() % 10_000, NEXT.fetch_add(1, Ordering::SeqCst) % 100);
        let (api_port, proxy_port) = (free_port(), free_port());
        let args = server_args(data.path(), api_port, proxy_port, &net_prefix, extra);
        let mut child = spawn(data.path(), &args);
        let stdout = child.stdout.take().expect("piped stdout");
        let key = tokio::task::spawn_blocking(move || {
            use std::io::BufRead;
            let mut line = String::new();
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
            line.trim().strip_prefix("LIZARD_API_KEY=").map(str::to_string)
        });
        let key = tokio::time::timeout(LISTEN_DEADLINE, key)
            .await
            .expect("the first start prints the owner key in time")
            .expect("reader thread")
            .expect("the first start prints the owner key");
        let api = format!("http://127.0.0.1:{api_port}");
        wait_listening(api_port).await;
        let mut system = System {
            args,
            child: Some(child),
            data,
            api,
            proxy: ([127, 0, 0, 1], proxy_port).into(),
            key,
            net_prefix,
            project: String::new(),
            http: reqwest::Client::new(),
        };
        let (status, ws) = system.call(Method::POST, "/v1/workspaces", Some(json!({"name": "attack"}))).await;
        assert_eq!(status, 201, "{ws}");
        let ws = ws["id"].as_str().expect("workspace id").to_string();
        let (status, p) =
            system.call(Method::POST, "/v1/projects", Some(json!({"workspaceId": ws, "name": "p"}))).await;
        assert_eq!(status, 201, "{p}");
        system.project = p["id"].as_str().expect("project id").to_string();
        system
    }

    /// The server's data directory.
    pub fn data_dir(&self) -> &Path {
        self.data.path()
    }

    /// The node's data directory (sandboxes, snapshots, volumes).
    pub fn node_dir(&self) -> PathBuf {
        self.data.path().join("server")
    }

    /// The server's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// What the server wrote to stderr so far (its operator log).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data.path().join("server.log")).unwrap_or_default()
    }

    /// A request with the owner key.
    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.request_as(&self.key, method, path)
    }

    /// A request with `key`.
    pub fn request_as(&self, key: &str, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, format!("{}{path}", self.api)).header("x-api-key", key)
    }

    /// A JSON call with the owner key: status and body (`null` when empty or not JSON).
    pub async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        send(self.request(method, path), body).await
    }

    /// A JSON call with `key`.
    pub async fn call_as(&self, key: &str, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        send(self.request_as(key, method, path), body).await
    }

    /// Create a sandbox of `template` in the harness's project, with `fields` merged into
    /// the request; its id.
    pub async fn create_sandbox(&self, template: &str, fields: Value) -> String {
        let mut body = json!({"template": template, "projectId": self.project});
        if let (Some(body), Some(fields)) = (body.as_object_mut(), fields.as_object()) {
            body.extend(fields.clone());
        }
        let (status, info) = self.call(Method::POST, "/v1/sandboxes", Some(body)).await;
        assert_eq!(status, 201, "create {template}: {info}");
        info["sandboxId"].as_str().expect("sandboxId").to_string()
    }

    /// Run `cmd` (a shell line) in sandbox `id`: exit code, stdout, stderr.
    /// Write `text` to `path` in sandbox `id` (through the files API).
    pub async fn write_file(&self, id: &str, path: &str, text: &str) {
        let url = format!("/v1/sandboxes/{id}/files?path={path}");
        let put = self.request(Method::PUT, &url).body(text.to_string()).send().await.expect("the files API answers");
        assert_eq!(put.status(), 200, "write {path} in {id}");
    }

    pub async fn exec(&self, id: &str, cmd: &str) -> (i64, String, String) {
        let (status, r) = self.call(Method::POST, &format!("/v1/sandboxes/{id}/exec"), Some(json!({"cmd": cmd}))).await;
        assert_eq!(status, 200, "exec {cmd:?}: {r}");
        let text = |k: &str| r[k].as_str().unwrap_or_default().to_string();
        (r["exitCode"].as_i64().expect("exitCode"), text("stdout"), text("stderr"))
    }

    /// SIGKILL the server (its VMMs run on in their own process groups, as after a crash).
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start the server again (after [`System::kill9`] or with it still running: then
    /// SIGKILL first), on the same data directory, ports and arguments.
    pub async fn restart(&mut self) {
        self.kill9();
        self.child = Some(spawn(self.data.path(), &self.args));
        let port = self.api.rsplit(':').next().and_then(|p| p.parse().ok()).expect("the API URL has a port");
        wait_listening(port).await;
    }
}

/// The server's command line.
fn server_args(
    data: &Path,
    api_port: u16,
    proxy_port: u16,
    net_prefix: &str,
    extra: &[&str],
) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = vec!["--data-dir".into(), data.into(), "server".into()];
    for a in [
        "--listen",
        &format!("127.0.0.1:{api_port}"),
        "--proxy-listen",
        &format!("127.0.0.1:{proxy_port}"),
        "--net-prefix",
        net_prefix,
        "--prespawn",
        "0",
    ] {
        args.push(a.into());
    }
    if let Some(agent) = std::env::var_os("LIZARD_AGENT_BIN") {
        args.push("--agent".into());
        args.push(agent);
    }
    args.extend(extra.iter().map(Into::into));
    args
}

/// The server process, with none of the caller's LIZARD_* variables, its stderr
/// appended to `server.log` in `data`.
fn spawn(data: &Path, args: &[std::ffi::OsString]) -> Child {
    let mut cmd = Command::new(server_binary());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("LIZARD_") {
            cmd.env_remove(k);
        }
    }
    let log =
        std::fs::OpenOptions::new().create(true).append(true).open(data.join("server.log")).expect("open server.log");
    cmd.args(args).stdout(Stdio::piped()).stderr(log).spawn().expect("start lizard-under-attack")
}

async fn wait_listening(port: u16) {
    let deadline = Instant::now() + LISTEN_DEADLINE;
    while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        assert!(Instant::now() < deadline, "lizard server did not listen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn send(req: reqwest::RequestBuilder, body: Option<Value>) -> (u16, Value) {
    let req = match body {
        Some(b) => req.json(&b),
        None => req,
    };
    let resp = req.send().await.expect("the server answers");
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.expect("a whole body");
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

impl System {
    /// SIGTERM, as an operator stops the server (it stops its sandboxes), and wait for it
    /// to exit (SIGKILL after 30 s).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for System {
    /// [`System::stop`], then whatever is left of its VMMs.
    fn drop(&mut self) {
        self.stop();
        for pid in crate::leftovers::vmm_pids(self.data.path()) {
            if let Ok(pid) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
        }
    }
}
