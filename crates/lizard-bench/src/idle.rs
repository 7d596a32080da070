//! Idle sandboxes: what each costs the host while it waits (VMM memory and CPU), and how
//! many of them a node holds while creates stay fast (density).
//!
//! Idle CPU is the VMM process's own accounting (`/proc/PID/stat` utime + stime) over a
//! window with nothing asked of the sandboxes: under TCG that is the guest's timer ticks
//! and wake-ups, emulated. Density adds idle sandboxes a step at a time and times a few
//! creates (create → first `echo hi`) after each step, until their median passes twice
//! the empty node's, host memory runs low, or the cap is reached.

use crate::api::Bench;
use crate::ms;
use anyhow::{Context, Result};
use std::time::{Duration, Instant};

/// What `n` idle sandboxes cost, one entry per sandbox.
pub struct IdleCost {
    pub pss_mib: Vec<f64>,
    /// CPU over the window, in % of one core.
    pub cpu_pct: Vec<f64>,
}

/// A density run.
pub struct Density {
    /// Create → first `echo hi` on the node with no idle sandbox (ms).
    pub empty_ms: Vec<f64>,
    /// Idle sandboxes held when the last step still kept creates within 2× (the count).
    pub held: usize,
    /// The creates timed at that count (ms).
    pub held_ms: Vec<f64>,
    /// Why the run stopped.
    pub stop: String,
}

/// Stop adding sandboxes below this much available host memory.
const MIN_AVAILABLE_MIB: f64 = 1024.0;
/// Let restored guests finish their post-restore work before measuring.
const SETTLE: Duration = Duration::from_secs(5);

impl Bench {
    /// `n` idle sandboxes of `template`: PSS of each VMM, then each one's CPU over `window`.
    pub async fn idle_cost(&self, template: &str, n: usize, window: Duration) -> Result<IdleCost> {
        let ids = self.make_idle(template, n).await?;
        tokio::time::sleep(SETTLE).await;
        let pids = ids.iter().map(|id| self.vmm_pid(id)).collect::<Result<Vec<_>>>()?;
        let pss_mib = pids.iter().map(|p| crate::api::pss_mib(*p)).collect::<Result<Vec<_>>>()?;
        let before = pids.iter().map(|p| cpu_ticks(*p)).collect::<Result<Vec<_>>>()?;
        let t = Instant::now();
        tokio::time::sleep(window).await;
        let after = pids.iter().map(|p| cpu_ticks(*p)).collect::<Result<Vec<_>>>()?;
        let seconds = t.elapsed().as_secs_f64();
        let hz = ticks_per_second();
        let cpu_pct = before.iter().zip(&after).map(|(b, a)| (a - b) as f64 / hz / seconds * 100.0).collect();
        for id in &ids {
            self.kill(id).await?;
        }
        Ok(IdleCost { pss_mib, cpu_pct })
    }

    /// Add idle sandboxes `step` at a time, up to `max`, timing `probes` creates after
    /// each step, while their median stays within twice the empty node's.
    pub async fn density(&self, template: &str, step: usize, max: usize, probes: usize) -> Result<Density> {
        let empty_ms = self.creates(template, probes, "density: empty node").await?;
        let bound = 2.0 * median(&empty_ms);
        let mut idle = vec![];
        let (mut held, mut held_ms) = (0, empty_ms.clone());
        let stop = loop {
            if idle.len() >= max {
                break format!("reached the cap of {max}");
            }
            let available = available_mib()?;
            if available < MIN_AVAILABLE_MIB {
                break format!("host memory available fell to {available:.0} MiB");
            }
            idle.extend(self.make_idle(template, step.min(max - idle.len())).await?);
            tokio::time::sleep(SETTLE).await;
            let times = self.creates(template, probes, &format!("density: {} idle", idle.len())).await?;
            let p50 = median(&times);
            eprintln!("density: {} idle, create p50 {p50:.0} ms (bound {bound:.0})", idle.len());
            if p50 > bound {
                break format!("create p50 {p50:.0} ms at {} idle passed 2× the empty node's", idle.len());
            }
            (held, held_ms) = (idle.len(), times);
        };
        for id in &idle {
            self.kill(id).await?;
        }
        Ok(Density { empty_ms, held, held_ms, stop })
    }

    async fn make_idle(&self, template: &str, n: usize) -> Result<Vec<String>> {
        let mut ids = vec![];
        for i in 0..n {
            let t = Instant::now();
            ids.push(self.create(template).await?);
            if (i + 1) % 10 == 0 {
                eprintln!("idle sandboxes: {}/{n} (last create {:.0} ms)", i + 1, ms(t.elapsed()));
            }
        }
        Ok(ids)
    }
}

/// utime + stime of process `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_cpu_ticks(&stat).with_context(|| format!("/proc/{pid}/stat: {stat}"))
}

/// Fields 14 and 15 of a `/proc/PID/stat` line; the command name (field 2) may hold
/// spaces and parentheses, so counting starts after its last `)`.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// The kernel's USER_HZ, which /proc/PID/stat counts in (100 on every Linux we run on).
fn ticks_per_second() -> f64 {
    100.0
}

/// `MemAvailable` of /proc/meminfo, in MiB.
fn available_mib() -> Result<f64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")?;
    let kib: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no MemAvailable line")?;
    Ok(kib / 1024.0)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_past_odd_names() {
        let line = "4242 (qemu (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 37 5 0 0 20 0 3 0 100 0 0";
        assert_eq!(parse_cpu_ticks(line), Some(42));
        assert_eq!(parse_cpu_ticks("4242 (qemu) S 1"), None);
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert!(median(&[]).is_nan());
    }
}
