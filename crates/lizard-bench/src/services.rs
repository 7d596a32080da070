//! A service's wake-up: requests through the proxy to a service whose one instance runs,
//! against requests to the same service once its instance was paused for idling (the
//! request resumes it), in the same run. The app is Python's standard-library HTTP
//! server, started in the version's snapshot.

use crate::api::Bench;
use crate::ms;
use anyhow::{bail, ensure, Context as _, Result};
use lizard_api::routes;
use serde_json::json;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

const NAME: &str = "bench-svc";

/// What [`Bench::service_wakeups`] measured (ms per request).
pub struct WakeTimes {
    pub running: Vec<f64>,
    pub paused: Vec<f64>,
}

impl Bench {
    /// Deploy a service that pauses after 1 s idle; then `rounds` times: a request while
    /// its instance runs, then (once it is paused) a request that resumes it.
    pub async fn service_wakeups(&self, rounds: usize) -> Result<WakeTimes> {
        let dir = tempfile::tempdir()?;
        std::fs::write(
            dir.path().join("app.py"),
            "import http.server\nhttp.server.ThreadingHTTPServer(('0.0.0.0', 8000), http.server.SimpleHTTPRequestHandler).serve_forever()\n",
        )?;
        std::fs::write(dir.path().join("index.html"), "awake\n")?;
        let files = self.upload_dir(dir.path()).await?;
        let spec = json!({
            "cmd": "python3 app.py", "port": 8000,
            "health": { "intervalMs": 1000 },
            "scale": { "max": 1, "idle": "pause", "idleAfterMs": 1000 },
        });
        self.call(
            &routes::CREATE_SERVICE,
            &[],
            Some(json!({ "name": NAME, "project": "bench", "spec": spec, "files": files })),
        )
        .await?;
        self.until_instance(|state| state == "healthy", "the service went live").await?;
        let host = format!("{NAME}.svc.local.lizard.localhost");
        let mut times = WakeTimes { running: Vec::new(), paused: Vec::new() };
        for _ in 0..rounds {
            times.running.push(self.timed_get(&host).await?);
            self.until_instance(|state| state == "paused", "the idle instance was paused").await?;
            times.paused.push(self.timed_get(&host).await?);
        }
        self.call(&routes::DELETE_SERVICE, &[NAME], None).await?;
        Ok(times)
    }

    /// Wait (at most 10 min) until the service is live and every instance is in a state
    /// `ok` takes.
    async fn until_instance(&self, ok: impl Fn(&str) -> bool, what: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let s = self.call(&routes::GET_SERVICE, &[NAME], None).await?;
            if s["status"] == "failed" {
                bail!("the bench service failed: {}", s["error"]);
            }
            let states: Vec<&str> =
                s["instances"].as_array().context("instances")?.iter().filter_map(|i| i["state"].as_str()).collect();
            if s["status"] == "live" && !states.is_empty() && states.iter().all(|s| ok(s)) {
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "{what}: not within 10 min ({s})");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One `GET /index.html` through the proxy, timed to the last byte of the answer.
    async fn timed_get(&self, host: &str) -> Result<f64> {
        let (port, host) = (self.proxy_port, host.to_owned());
        tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
            s.set_read_timeout(Some(Duration::from_secs(60)))?;
            write!(s, "GET /index.html HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")?;
            let mut answer = String::new();
            s.read_to_string(&mut answer)?;
            let elapsed = ms(started.elapsed());
            ensure!(
                answer.starts_with("HTTP/1.") && answer.contains(" 200 ") && answer.ends_with("awake\n"),
                "bad answer: {answer}"
            );
            Ok(elapsed)
        })
        .await?
    }
}
