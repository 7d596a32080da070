//! Benchmarks through the control plane's HTTP API, as an SDK sees it: an in-process
//! `lizard server` (SQLite file, node in-process — or a node agent that joined it over TCP,
//! as on many machines) on a loopback port, driven by an HTTP client. Creates from a template snapshot against cold boots, a burst of concurrent
//! creates, pause and resume of a sandbox holding 256 MiB of touched memory, host
//! memory per idle sandbox, and forks.

use crate::ms;
use anyhow::{ensure, Context, Result};
use lizard_api::routes::{self, Route};
use lizard_server::api;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One server with its own data directory.
pub struct Bench {
    base: String,
    /// The sandbox-URL proxy's port (sandbox and service hosts).
    pub(crate) proxy_port: u16,
    key: String,
    pub(crate) client: reqwest::Client,
    runs: Runs,
    dir: tempfile::TempDir,
}

/// What runs a bench server's sandboxes.
enum Runs {
    /// The node in the server's process.
    InProcess(std::sync::Arc<lizard_node::Node>),
    /// A node agent that joined over TCP (its API and the server's on loopback); it stops
    /// when told.
    Joined { stop: tokio::sync::oneshot::Sender<()>, agent: tokio::task::JoinHandle<()> },
}

impl Bench {
    pub async fn start(image_root: &Path, snapshots: bool) -> Result<Bench> {
        Self::start_with(image_root, snapshots, |_| {}).await
    }

    /// [`Bench::start`], with `tweak` applied to the node's config (pools).
    pub async fn start_with(
        image_root: &Path,
        snapshots: bool,
        tweak: impl FnOnce(&mut lizard_node::NodeConfig),
    ) -> Result<Bench> {
        let dir = tempfile::Builder::new().prefix("lizard-bench-api-").tempdir()?;
        let mut config = lizard_server::ServerConfig::new(dir.path());
        config.listen = "127.0.0.1:0".parse()?;
        let server = lizard_server::open(config).await?.with_faces(faces());
        let key = server.initial_key().context("first start prints a key")?.to_string();
        let mut node_config = lizard_node::NodeConfig::new(dir.path().join("node"));
        node_config.image_root = image_root.to_path_buf();
        node_config.snapshots = snapshots;
        crate::admit_everything(&mut node_config);
        tweak(&mut node_config);
        let node = lizard_node::Node::start(node_config).await?;
        let state = server.app_state(lizard_node_client::Nodes::local(node.clone()));
        Self::serve(server, state, key, Runs::InProcess(node), dir).await
    }

    /// A server without a node of its own, and a node agent on loopback that joins it with
    /// a join token, as `lizard node join` does: every sandbox call crosses the node
    /// channel (HTTP with the node's credential).
    pub async fn start_joined(image_root: &Path) -> Result<Bench> {
        let dir = tempfile::Builder::new().prefix("lizard-bench-joined-").tempdir()?;
        let mut config = lizard_server::ServerConfig::new(dir.path());
        config.listen = "127.0.0.1:0".parse()?;
        let server = lizard_server::open(config).await?.with_faces(faces());
        let key = server.initial_key().context("first start prints a key")?.to_string();
        let cluster_key = lizard_server::cluster::credentials::load_key(server.state().store.as_ref()).await?;
        let connector: std::sync::Arc<dyn lizard_node_client::NodeConnector> =
            std::sync::Arc::new(lizard_node_client::remote::HttpConnector);
        let nodes = lizard_node_client::Nodes::none().with_remote(cluster_key, Some(connector));
        let state = server.app_state(nodes);
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let placeholder = Runs::Joined { stop, agent: tokio::spawn(async {}) };
        let mut b = Self::serve(server, state, key, placeholder, dir).await?;
        let token = b.call(&routes::CREATE_NODE_TOKEN, &[], Some(json!({}))).await?;
        let token = token["token"].as_str().context("a join token")?.to_string();
        let mut node = lizard_node::NodeConfig::new(b.dir.path().join("node"));
        node.image_root = image_root.to_path_buf();
        crate::admit_everything(&mut node);
        let listen = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let agent = lizard_node_agent::AgentConfig {
            node,
            server: b.base.clone(),
            token: Some(token),
            region: "local".into(),
            listen,
            advertise: None,
        };
        let agent = tokio::spawn(async move {
            if let Err(e) = lizard_node_agent::run(agent, async move {
                let _ = stopped.await;
            })
            .await
            {
                eprintln!("node agent: {e}");
            }
        });
        if let Runs::Joined { agent: slot, .. } = &mut b.runs {
            *slot = agent;
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let nodes = b.call(&routes::LIST_NODES, &[], None).await?;
            if nodes.as_array().is_some_and(|n| n.iter().any(|n| n["state"] == "up")) {
                return Ok(b);
            }
            ensure!(Instant::now() < deadline, "the node agent did not join within 60 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Serve `state`'s API on a loopback port, with a workspace and a project made.
    async fn serve(
        server: lizard_server::Server,
        state: lizard_server::state::AppState,
        key: String,
        runs: Runs,
        dir: tempfile::TempDir,
    ) -> Result<Bench> {
        let listener = server.bind().await?;
        let base = format!("http://{}", listener.local_addr()?);
        // The proxy and the service reconciler, as `lizard server` runs them.
        let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let proxy_port = proxy.local_addr()?.port();
        tokio::spawn(lizard_server::proxy::serve(
            proxy,
            state.clone(),
            Default::default(),
            None,
            std::future::pending(),
        ));
        let reconciled = state.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                lizard_server::ops::services::reconcile::reconcile_once(&reconciled).await;
            }
        });
        let router = lizard_server::build_router(state.clone(), state.server.faces.routes(api::all_routes()));
        tokio::spawn(lizard_server::serve(listener, router, std::future::pending()));
        let client = reqwest::Client::builder().no_proxy().build()?;
        let b = Bench { base, proxy_port, key, client, runs, dir };
        let ws = b.call(&routes::CREATE_WORKSPACE, &[], Some(json!({"name": "bench"}))).await?;
        b.call(&routes::CREATE_PROJECT, &[], Some(json!({"workspaceId": ws["id"], "name": "bench"}))).await?;
        Ok(b)
    }

    /// The in-process node (the benchmarks that read VMM processes or pools need it).
    fn node(&self) -> Result<&std::sync::Arc<lizard_node::Node>> {
        match &self.runs {
            Runs::InProcess(node) => Ok(node),
            Runs::Joined { .. } => anyhow::bail!("this benchmark needs the node in the server's process"),
        }
    }

    /// Shut the node down: its sandboxes and pool's machines are killed with it.
    pub async fn stop(self) {
        match self.runs {
            Runs::InProcess(node) => node.shutdown().await,
            Runs::Joined { stop, agent } => {
                let _ = stop.send(());
                let _ = agent.await;
            }
        }
    }

    /// One request on `route` (method and path from the route table), `args` filling its
    /// path parameters.
    pub(crate) async fn call(&self, route: &Route, args: &[&str], body: Option<Value>) -> Result<Value> {
        self.send(route, args, "", |req| match body {
            Some(b) => req.json(&b),
            None => req,
        })
        .await
    }

    /// [`Bench::call`] about the bench's project (`?project=bench`).
    pub(crate) async fn call_in_project(&self, route: &Route, args: &[&str], body: Option<Value>) -> Result<Value> {
        self.send(route, args, "?project=bench", |req| match body {
            Some(b) => req.json(&b),
            None => req,
        })
        .await
    }

    /// `bytes` as the raw body of `route`, about the bench's project.
    pub(crate) async fn upload(&self, route: &Route, args: &[&str], bytes: Vec<u8>) -> Result<Value> {
        self.send(route, args, "?project=bench", |req| req.body(bytes)).await
    }

    /// A POST of `body` on `route` whose answer is not one JSON value (NDJSON): its text.
    pub(crate) async fn post_text(&self, route: &Route, args: &[&str], body: Value) -> Result<String> {
        let path = route.uri(args);
        let resp =
            self.client.post(format!("{}{path}", self.base)).header("x-api-key", &self.key).json(&body).send().await?;
        let status = resp.status();
        let text = resp.text().await?;
        ensure!(status.is_success(), "POST {path}: {status} {text}");
        Ok(text)
    }

    async fn send(
        &self,
        route: &Route,
        args: &[&str],
        query: &str,
        body: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    ) -> Result<Value> {
        let (method, path) = (route.method.as_str(), route.uri(args));
        let req =
            self.client.request(method.parse()?, format!("{}{path}{query}", self.base)).header("x-api-key", &self.key);
        let req = body(req);
        let resp = req.send().await?;
        let status = resp.status();
        let bytes = resp.bytes().await?;
        ensure!(status.is_success(), "{method} {path}: {status} {}", String::from_utf8_lossy(&bytes));
        Ok(if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes)? })
    }

    /// The HTTP client, base URL and API key, for rows that make their own requests.
    pub(crate) fn http(&self) -> (&reqwest::Client, &str, &str) {
        (&self.client, &self.base, &self.key)
    }

    pub async fn create(&self, template: &str) -> Result<String> {
        let body = json!({"template": template, "project": "bench", "timeoutMs": 3_600_000});
        let s = self.call(&routes::CREATE_SANDBOX, &[], Some(body)).await?;
        Ok(s["sandboxId"].as_str().context("no id")?.to_string())
    }

    pub async fn exec(&self, id: &str, cmd: &str) -> Result<String> {
        let r = self.call(&routes::EXEC, &[id], Some(json!({ "cmd": cmd }))).await?;
        ensure!(r["exitCode"] == 0, "{cmd}: {r}");
        Ok(r["stdout"].as_str().unwrap_or_default().to_string())
    }

    pub async fn kill(&self, id: &str) -> Result<()> {
        self.call(&routes::KILL_SANDBOX, &[id], None).await.map(drop)
    }

    async fn post(&self, id: &str, route: &Route, body: Value) -> Result<Value> {
        self.call(route, &[id], Some(body)).await
    }

    /// create → first `echo hi` over E2B's wire — what its SDKs send: `POST /v2/sandboxes`,
    /// then envd's `process.Process/Start` through the sandbox URL, its stream read to the
    /// end — `n` times, each beside one of Lizard's own (create, exec) so that both see the
    /// same machine: (E2B's times, Lizard's times), each sandbox killed after. Both run
    /// `sh -c 'echo hi'`, so the rows differ by the face alone (E2B's SDKs run commands in
    /// `bash -l -c`, whose login start costs the guest more whatever the face). Lizard's
    /// creates name the template E2B's name stands for (E2B's `base` is Lizard's
    /// `code-interpreter-v1`), whose snapshot one untimed E2B create makes first.
    pub async fn e2b_creates(&self, template: &str, n: usize) -> Result<(Vec<f64>, Vec<f64>)> {
        let (mut e2b, mut own) = (vec![], vec![]);
        let mapped = lizard_e2b_face::TemplateMap::default();
        let own_template = mapped.get(template);
        let warm_up = self.e2b_create(template).await?;
        self.e2b_kill(warm_up["sandboxID"].as_str().context("no id")?).await?;
        let start = lizard_e2b::connect::envelope(&json!({
            "process": {"cmd": "/bin/sh", "args": ["-c", "echo hi"]},
            "stdin": false,
        }));
        for i in 0..n {
            let t = Instant::now();
            let created = self.e2b_create(template).await?;
            let (id, token) = (created["sandboxID"].as_str().context("no id")?, created["envdAccessToken"].as_str());
            let ran = self
                .client
                .post(format!("http://127.0.0.1:{}/process.Process/Start", self.proxy_port))
                .header("E2b-Sandbox-Id", id)
                .header("E2b-Sandbox-Port", "49983")
                .header("X-Access-Token", token.context("no envd token")?)
                .header("Content-Type", lizard_e2b::connect::STREAM_CONTENT_TYPE)
                .body(start.clone())
                .send()
                .await?
                .bytes()
                .await?;
            e2b.push(ms(t.elapsed()));
            // "hi\n" in base64, in a data event.
            ensure!(String::from_utf8_lossy(&ran).contains("aGkK"), "E2B run: {}", String::from_utf8_lossy(&ran));
            self.e2b_kill(id).await?;
            own.extend(self.creates(own_template, 1, "API restored create (beside E2B's)").await?);
            if (i + 1) % 10 == 0 || i + 1 == n {
                eprintln!("E2B create {}/{n}: last {:.0} ms", i + 1, e2b[i]);
            }
        }
        Ok((e2b, own))
    }

    /// An E2B create (`POST /v2/sandboxes`) of `template` in the bench's project: the
    /// answer (id and tokens).
    pub(crate) async fn e2b_create(&self, template: &str) -> Result<Value> {
        let created = self
            .client
            .post(format!("{}/v2/sandboxes", self.base))
            .header("x-api-key", &self.key)
            .json(&json!({"templateID": template, "timeout": 3600, "metadata": {"lizardProject": "bench"}}))
            .send()
            .await?;
        ensure!(created.status() == 201, "E2B create: {}", created.text().await?);
        Ok(created.json().await?)
    }

    /// An E2B kill (`DELETE /sandboxes/{id}`).
    pub(crate) async fn e2b_kill(&self, id: &str) -> Result<()> {
        let killed =
            self.client.delete(format!("{}/sandboxes/{id}", self.base)).header("x-api-key", &self.key).send().await?;
        ensure!(killed.status() == 204, "E2B kill: {}", killed.status());
        Ok(())
    }

    /// create → first `echo hi` returns, `n` times (each sandbox killed after).
    pub async fn creates(&self, template: &str, n: usize, what: &str) -> Result<Vec<f64>> {
        let mut times = vec![];
        for i in 0..n {
            let t = Instant::now();
            let id = self.create(template).await?;
            let out = self.exec(&id, "echo hi").await?;
            let took = ms(t.elapsed());
            times.push(took);
            ensure!(out == "hi\n", "unexpected output {out:?}");
            self.kill(&id).await?;
            if (i + 1) % 10 == 0 || i + 1 == n {
                eprintln!("{what} {}/{n}: last {took:.0} ms", i + 1);
            }
        }
        Ok(times)
    }

    /// create → first `echo hi` returns, `n` times, each create started once `template`'s
    /// pool holds `ready` machines again (waiting untimed, at most 2 minutes): what a
    /// create costs while the pool has one.
    pub async fn pooled_creates(&self, template: &str, n: usize, ready: usize, what: &str) -> Result<Vec<f64>> {
        let mut times = vec![];
        for _ in 0..n {
            self.wait_pool(template, ready, Duration::from_secs(120)).await?;
            times.extend(self.creates(template, 1, what).await?);
        }
        Ok(times)
    }

    /// Wait until `template`'s pool holds `ready` machines; how long that took (ms).
    pub async fn wait_pool(&self, template: &str, ready: usize, limit: Duration) -> Result<f64> {
        let start = Instant::now();
        while self.node()?.pool_ready(template) < ready {
            ensure!(start.elapsed() < limit, "the pool of {template} did not refill in {limit:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(ms(start.elapsed()))
    }

    /// `n` creates at once, each timed from the burst's start to its own first `echo hi`.
    pub async fn burst(&self, template: &str, n: usize) -> Result<Vec<f64>> {
        let (times, ids) = self.burst_keep(template, n).await?;
        for id in ids {
            self.kill(&id).await?;
        }
        Ok(times)
    }

    /// [`Bench::burst`], leaving the sandboxes running: their times and ids.
    pub async fn burst_keep(&self, template: &str, n: usize) -> Result<(Vec<f64>, Vec<String>)> {
        let start = Instant::now();
        let runs = (0..n).map(|_| async {
            let id = self.create(template).await?;
            let out = self.exec(&id, "echo hi").await?;
            ensure!(out == "hi\n", "unexpected output {out:?}");
            anyhow::Ok((id, ms(start.elapsed())))
        });
        let results = futures_util::future::join_all(runs).await;
        let (mut times, mut ids) = (vec![], vec![]);
        for r in results {
            let (id, t) = r?;
            times.push(t);
            ids.push(id);
        }
        Ok((times, ids))
    }

    /// A sandbox with `mib` MiB of non-zero memory held by a running process; then
    /// `cycles` × (pause, resume), each timed by its HTTP call. The first pause of a template
    /// clone (its first memory delta) is reported apart. At the end the sandbox is paused once
    /// more and its directory measured.
    pub async fn pause_resume(&self, template: &str, mib: u32, cycles: usize) -> Result<PauseTimes> {
        let id = self.create(template).await?;
        let hold = format!(
            "nohup node -e \"const b=Buffer.alloc({mib}*1048576,0xa5); require('fs').writeFileSync('/tmp/held.pid',String(process.pid)); require('fs').writeFileSync('/tmp/held','ok'); setInterval(()=>b[0]++,1000)\" >/dev/null 2>&1 &"
        );
        self.exec(&id, &hold).await?;
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.exec(&id, "cat /tmp/held 2>/dev/null || true").await? != "ok" {
            ensure!(Instant::now() < deadline, "the memory holder did not start");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let rss = self.exec(&id, "grep VmRSS /proc/$(cat /tmp/held.pid)/status").await?;
        eprintln!("memory holder: {}", rss.trim());
        let mut out = PauseTimes::default();
        for i in 0..cycles {
            let t = Instant::now();
            self.post(&id, &routes::PAUSE, json!({})).await?;
            let pause = ms(t.elapsed());
            let t = Instant::now();
            self.post(&id, &routes::RESUME, json!({})).await?;
            let resume = ms(t.elapsed());
            // The holder is still there, with its memory.
            self.exec(&id, "kill -0 $(cat /tmp/held.pid)").await?;
            if i == 0 {
                out.first_pause = pause;
                out.first_resume = resume;
            } else {
                out.pause.push(pause);
                out.resume.push(resume);
            }
            eprintln!("pause/resume {}/{cycles}: {pause:.0} / {resume:.0} ms", i + 1);
        }
        self.post(&id, &routes::PAUSE, json!({})).await?;
        out.state_mib = dir_mib(&self.sandbox_dir(&id));
        self.kill(&id).await?;
        Ok(out)
    }

    /// The VMM process of a running sandbox.
    pub(crate) fn vmm_pid(&self, id: &str) -> Result<u32> {
        Ok(self.node()?.get(id)?.live()?.vm().pid())
    }

    fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.dir.path().join("node/sandboxes").join(id)
    }

    /// Proportional set size of each of `n` idle sandboxes' VMM processes (MiB).
    pub async fn idle_pss(&self, template: &str, n: usize) -> Result<Vec<f64>> {
        let mut ids = vec![];
        for i in 0..n {
            ids.push(self.create(template).await?);
            if (i + 1) % 10 == 0 {
                eprintln!("idle sandboxes: {}/{n}", i + 1);
            }
        }
        // Let them settle (the guests' post-restore work ends).
        tokio::time::sleep(Duration::from_secs(5)).await;
        let mut pss = vec![];
        for id in &ids {
            let sandbox = self.node()?.get(id)?;
            let pid = sandbox.live()?.vm().pid();
            pss.push(pss_mib(pid)?);
        }
        for id in &ids {
            self.kill(id).await?;
        }
        Ok(pss)
    }

    /// Time of `fork` into `copies` copies of a running sandbox, `rounds` times.
    pub async fn forks(&self, template: &str, copies: u32, rounds: usize) -> Result<Vec<f64>> {
        let id = self.create(template).await?;
        self.exec(&id, "nohup sh -c 'while true; do sleep 1; done' >/dev/null 2>&1 &").await?;
        let mut times = vec![];
        for _ in 0..rounds {
            let t = Instant::now();
            let made = self.post(&id, &routes::FORK, json!({ "count": copies })).await?;
            let took = ms(t.elapsed());
            times.push(took);
            let made = made.as_array().context("a list")?;
            ensure!(made.len() == copies as usize, "{made:?}");
            for c in made {
                let c = c["sandboxId"].as_str().context("id")?;
                ensure!(self.exec(c, "echo hi").await? == "hi\n");
                self.kill(c).await?;
            }
            eprintln!("fork ×{copies}: {took:.0} ms");
        }
        self.kill(&id).await?;
        Ok(times)
    }
}

#[derive(Default)]
pub struct PauseTimes {
    pub first_pause: f64,
    pub first_resume: f64,
    pub pause: Vec<f64>,
    pub resume: Vec<f64>,
    /// What the paused sandbox's directory held at the end (disk overlay, memory delta and
    /// device state), without the link to the template's memory that all its clones share.
    pub state_mib: f64,
}

/// `Pss:` of /proc/PID/smaps_rollup, in MiB.
pub(crate) fn pss_mib(pid: u32) -> Result<f64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))?;
    let kib: f64 = rollup
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no Pss line")?;
    Ok(kib / 1024.0)
}

/// Allocated (not apparent) size of the files in a sandbox's directory, in MiB, without
/// `base-memory`: a hard link to the template's memory, which every clone shares.
fn dir_mib(dir: &Path) -> f64 {
    use std::os::unix::fs::MetadataExt;
    let blocks: u64 = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name() != "base-memory")
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.blocks())
                .sum()
        })
        .unwrap_or(0);
    blocks as f64 * 512.0 / 1048576.0
}

/// The faces `lizard server` installs (E2B's: the bench measures its create path too).
fn faces() -> lizard_server::state::Faces {
    lizard_server::state::Faces::new(vec![std::sync::Arc::new(lizard_e2b_face::E2bFace::default())])
}
