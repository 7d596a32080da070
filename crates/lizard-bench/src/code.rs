//! The code interpreter through the API: create a sandbox of the `interpreter` template
//! and time it to the answer of its first `runCode` (the template snapshot holds a started
//! kernel, so no kernel starts here), then a later run in the same kernel. Over E2B's
//! wire, as its code interpreter add-on sends it: create `code-interpreter-v1`
//! (`/v2/sandboxes`), then a chart's cell through `POST /execute` to port 49999 through
//! the sandbox URL, timed to its PNG (the add-on's target: within 2 s of create).

use crate::api::Bench;
use crate::ms;
use anyhow::{ensure, Result};
use lizard_api::routes;
use serde_json::json;
use std::time::Instant;

pub struct CodeTimes {
    /// create → the first execution's `end`.
    pub create_to_result: Vec<f64>,
    /// A second execution, alone.
    pub run: Vec<f64>,
}

impl Bench {
    /// `n` sandboxes of `interpreter`, each timed from create to its first `1 + 1`.
    pub async fn first_run_code(&self, n: usize) -> Result<CodeTimes> {
        let mut times = CodeTimes { create_to_result: vec![], run: vec![] };
        // The first create of a template makes its snapshot: not what is measured.
        let id = self.create("interpreter").await?;
        self.kill(&id).await?;
        for i in 0..n {
            let t = Instant::now();
            let id = self.create("interpreter").await?;
            let out = self.post_text(&routes::RUN_CODE, &[&id], json!({"code": "1 + 1"})).await?;
            times.create_to_result.push(ms(t.elapsed()));
            ensure!(out.contains(r#""text/plain":"2""#), "unexpected answer {out}");
            let t = Instant::now();
            let out = self.post_text(&routes::RUN_CODE, &[&id], json!({"code": "1 + 1"})).await?;
            times.run.push(ms(t.elapsed()));
            ensure!(out.contains(r#""text/plain":"2""#), "unexpected answer {out}");
            self.kill(&id).await?;
            eprintln!("create → first runCode {}/{n}: {:.0} ms", i + 1, times.create_to_result[i]);
        }
        Ok(times)
    }
}

/// What a chart's cell runs: matplotlib imported and a line plotted, shown as a PNG.
const CHART: &str = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()";

pub struct E2bCodeTimes {
    /// create → the first cell's last line: a chart, its PNG among the lines.
    pub create_to_chart: Vec<f64>,
    /// Then `1 + 1` in the same sandbox → its last line.
    pub run: Vec<f64>,
}

impl Bench {
    /// `n` E2B creates of `code-interpreter-v1`, each timed to the PNG of a matplotlib
    /// chart, its first cell, through `/execute`; then a `1 + 1`. With `pool` machines in
    /// the interpreter's warm pool, each create starts once the pool is full again.
    pub async fn e2b_first_chart(&self, n: usize, pool: usize) -> Result<E2bCodeTimes> {
        let mut times = E2bCodeTimes { create_to_chart: vec![], run: vec![] };
        // The first create of a template makes its snapshot: not what is measured.
        let first = self.e2b_create("code-interpreter-v1").await?;
        self.e2b_kill(first["sandboxID"].as_str().unwrap_or_default()).await?;
        for i in 0..n {
            if pool > 0 {
                self.wait_pool("interpreter", pool, std::time::Duration::from_secs(300)).await?;
            }
            let t = Instant::now();
            let created = self.e2b_create("code-interpreter-v1").await?;
            let id = created["sandboxID"].as_str().unwrap_or_default().to_owned();
            let traffic = created["trafficAccessToken"].as_str().unwrap_or_default().to_owned();
            let execute = |code: &'static str| {
                self.client
                    .post(format!("http://127.0.0.1:{}/execute", self.proxy_port))
                    .header("E2b-Sandbox-Id", &id)
                    .header("E2b-Sandbox-Port", "49999")
                    .header("E2B-Traffic-Access-Token", &traffic)
                    .json(&json!({"code": code}))
                    .send()
            };
            let out = execute(CHART).await?.text().await?;
            times.create_to_chart.push(ms(t.elapsed()));
            ensure!(out.contains(r#""png":"iVBOR"#), "no PNG in {out}");
            let t = Instant::now();
            let out = execute("1 + 1").await?.text().await?;
            times.run.push(ms(t.elapsed()));
            ensure!(out.contains(r#""text":"2""#), "unexpected answer {out}");
            self.e2b_kill(&id).await?;
            eprintln!("E2B create → first chart's PNG {}/{n}: {:.0} ms", i + 1, times.create_to_chart[i]);
        }
        Ok(times)
    }
}
