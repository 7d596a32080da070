//! The code interpreter through the API: create a sandbox of the `interpreter` template
//! and time it to the answer of its first `runCode` (the template snapshot holds a started
//! kernel, so no kernel starts here), then a later run in the same kernel.

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
