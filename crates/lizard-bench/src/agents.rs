//! The coding-agent templates through the API: create → the agent's first `--version`
//! returns, as a user's first `sandbox.process.exec("claude --version")` sees it. The
//! agents are large native binaries (Claude Code's is ≈ 400 MB): this is the cost of the
//! first page-in of one from the template's disk, on top of a create.

use crate::api::Bench;
use crate::ms;
use anyhow::{ensure, Result};
use std::time::Instant;

/// What [`Bench::agent_versions`] measured, in milliseconds.
pub struct AgentTimes {
    /// The template's first create, which makes its snapshot.
    pub first: f64,
    /// Each later create → the `--version` command returns.
    pub creates: Vec<f64>,
}

impl Bench {
    /// Create a sandbox of `template` and run `command` (its agent's version) in it, `n`
    /// times after one create that makes the template's snapshot; each sandbox is killed
    /// after.
    pub async fn agent_versions(&self, template: &str, command: &str, n: usize) -> Result<AgentTimes> {
        let first = self.agent_version(template, command).await?;
        let mut creates = vec![];
        for i in 0..n {
            let took = self.agent_version(template, command).await?;
            creates.push(took);
            eprintln!("{template}: create → `{command}` {}/{n}: {took:.0} ms", i + 1);
        }
        Ok(AgentTimes { first, creates })
    }

    async fn agent_version(&self, template: &str, command: &str) -> Result<f64> {
        let t = Instant::now();
        let id = self.create(template).await?;
        let out = self.exec(&id, command).await?;
        let took = ms(t.elapsed());
        ensure!(!out.trim().is_empty(), "`{command}` printed nothing");
        self.kill(&id).await?;
        Ok(took)
    }
}
