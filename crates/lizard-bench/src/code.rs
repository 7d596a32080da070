//! The code interpreter through the API: create a sandbox of the `interpreter` template
//! and time it to the answer of its first `runCode` (the template snapshot holds a started
//! kernel, so no kernel starts here), then a later run in the same kernel. The same over
//! E2B's wire, as its code interpreter add-on sends it: create `code-interpreter-v1`
//! (`/v2/sandboxes`), then `POST /execute` to port 49999 through the sandbox URL.

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
    /// create → the first `1 + 1`'s last line.
    pub create_to_result: Vec<f64>,
    /// Then a chart's cell in the same sandbox → its last line (a PNG among them).
    pub chart: Vec<f64>,
}

impl Bench {
    /// `n` E2B creates of `code-interpreter-v1`, each timed to its first `1 + 1` through
    /// `/execute`, then to a matplotlib chart's PNG.
    pub async fn e2b_first_run_code(&self, n: usize) -> Result<E2bCodeTimes> {
        let mut times = E2bCodeTimes { create_to_result: vec![], chart: vec![] };
        // The first create of a template makes its snapshot: not what is measured.
        let first = self.e2b_create("code-interpreter-v1").await?;
        self.e2b_kill(first["sandboxID"].as_str().unwrap_or_default()).await?;
        for i in 0..n {
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
            let out = execute("1 + 1").await?.text().await?;
            times.create_to_result.push(ms(t.elapsed()));
            ensure!(out.contains(r#""text":"2""#), "unexpected answer {out}");
            let t = Instant::now();
            let out = execute(CHART).await?.text().await?;
            times.chart.push(ms(t.elapsed()));
            ensure!(out.contains(r#""png":"iVBOR"#), "no PNG in {out}");
            self.e2b_kill(&id).await?;
            eprintln!(
                "E2B create → first /execute {}/{n}: {:.0} ms, then a chart {:.0} ms",
                i + 1,
                times.create_to_result[i],
                times.chart[i]
            );
        }
        Ok(times)
    }
}
