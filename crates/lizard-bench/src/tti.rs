//! ComputeSDK's public sandbox benchmark, on this server: time to interactive (TTI), from
//! the create call to the first `node -v` returning in the new sandbox, in its three modes
//! — sequential (each sandbox killed before the next is created), staggered (one launched
//! every 200 ms while the earlier ones still run) and burst (all launched at once). Each
//! sandbox is killed after its `node -v`, untimed. A failed create or command is counted,
//! not retried and not timed: the success rate stands beside the times, as in the public
//! figures that Lizard's can then be put beside (their hosts, not this 2-core TCG machine).

use crate::api::Bench;
use crate::{ms, Summary};
use std::time::{Duration, Instant};

/// Launches in the staggered mode are this far apart (ComputeSDK's figure).
const STAGGER: Duration = Duration::from_millis(200);

/// How the launches of one mode are spread.
#[derive(Clone, Copy)]
enum Mode {
    Sequential,
    Staggered,
    Burst,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Sequential => "sequential",
            Mode::Staggered => "staggered (every 200 ms)",
            Mode::Burst => "burst (all at once)",
        }
    }
}

/// One mode's outcome: the successful runs' times (ms) and the failures.
struct Outcome {
    times: Vec<f64>,
    failures: Vec<String>,
}

/// create → `node -v` returns, timed from the launch; the sandbox killed after.
async fn interactive(b: &Bench, template: &str) -> anyhow::Result<f64> {
    let start = Instant::now();
    let id = b.create(template).await?;
    let version = b.exec(&id, "node -v").await;
    let took = ms(start.elapsed());
    let killed = b.kill(&id).await;
    anyhow::ensure!(version?.starts_with('v'), "node -v printed no version");
    killed?;
    Ok(took)
}

async fn run(b: &Bench, template: &str, n: usize, mode: Mode) -> Outcome {
    let results = match mode {
        Mode::Sequential => {
            let mut results = Vec::with_capacity(n);
            for _ in 0..n {
                results.push(interactive(b, template).await);
            }
            results
        }
        Mode::Staggered | Mode::Burst => {
            let gap = if matches!(mode, Mode::Staggered) { STAGGER } else { Duration::ZERO };
            let launches = (0..n).map(|i| async move {
                tokio::time::sleep(gap * u32::try_from(i).unwrap_or(u32::MAX)).await;
                interactive(b, template).await
            });
            futures_util::future::join_all(launches).await
        }
    };
    let mut outcome = Outcome { times: vec![], failures: vec![] };
    for result in results {
        match result {
            Ok(t) => outcome.times.push(t),
            Err(e) => outcome.failures.push(format!("{e:#}")),
        }
    }
    outcome
}

/// The three modes, `n` sandboxes each, as table rows (success rate and mean in the
/// row's name; the first failure of a mode printed on stderr).
pub async fn rows(b: &Bench, template: &str, n: usize) -> Vec<String> {
    let mut rows = vec![];
    for mode in [Mode::Sequential, Mode::Staggered, Mode::Burst] {
        let outcome = run(b, template, n, mode).await;
        let ok = outcome.times.len();
        if let Some(first) = outcome.failures.first() {
            eprintln!("TTI {}: {} of {n} failed; the first: {first}", mode.name(), outcome.failures.len());
        }
        // At most a few hundred runs: the count converts exactly.
        #[allow(clippy::cast_precision_loss)]
        let mean = if ok == 0 { 0.0 } else { outcome.times.iter().sum::<f64>() / ok as f64 };
        let name = format!(
            "ComputeSDK TTI, {}: create → `node -v` returns ({ok}/{n} succeeded, mean {mean:.0} ms)",
            mode.name()
        );
        rows.push(Summary::new(outcome.times).row(&name, "ms"));
        eprintln!("TTI {}: {ok}/{n} succeeded", mode.name());
    }
    rows
}
