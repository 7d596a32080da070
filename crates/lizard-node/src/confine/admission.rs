//! Admission: a node starts a sandbox only if it has the CPUs and memory the sandbox was
//! promised, counting every running sandbox and every start under way, with configurable
//! overcommit ratios (a guest rarely uses all of either all the time).

use std::sync::{Arc, Mutex};

/// What the node can promise in all: host CPUs and memory times the overcommit ratios.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Capacity {
    pub vcpus: u64,
    pub memory_mib: u64,
}

impl Capacity {
    /// The host's CPUs and memory times `cpu_ratio` and `memory_ratio`.
    pub fn of_host(cpu_ratio: f64, memory_ratio: f64) -> Capacity {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let memory_mib = host_memory_mib().unwrap_or(1024);
        Capacity::scaled(u64::try_from(cpus).unwrap_or(u64::MAX), memory_mib, cpu_ratio, memory_ratio)
    }

    fn scaled(cpus: u64, memory_mib: u64, cpu_ratio: f64, memory_ratio: f64) -> Capacity {
        let scale = |n: u64, ratio: f64| -> u64 {
            let r = if ratio.is_finite() && ratio > 0.0 { ratio } else { 1.0 };
            // Host sizes are far below 2^52, so the float is exact enough; the cast
            // saturates (a ratio absurdly large means no bound), it never wraps.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
            let scaled = (n as f64 * r).floor() as u64;
            scaled
        };
        Capacity { vcpus: scale(cpus, cpu_ratio), memory_mib: scale(memory_mib, memory_ratio) }
    }
}

/// MemTotal of /proc/meminfo, in MiB.
fn host_memory_mib() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

/// A refused admission: what was asked, what is in use, what the node has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "this node cannot take a sandbox of {vcpus} vCPUs and {memory_mib} MiB now: \
     {used_vcpus}/{cap_vcpus} vCPUs and {used_memory_mib}/{cap_memory_mib} MiB are promised"
)]
pub struct CapacityExhausted {
    pub vcpus: u32,
    pub memory_mib: u64,
    pub used_vcpus: u64,
    pub cap_vcpus: u64,
    pub used_memory_mib: u64,
    pub cap_memory_mib: u64,
}

/// Starts under way, which no count of running sandboxes shows yet.
#[derive(Debug, Default)]
pub struct Admission {
    in_flight: Arc<Mutex<(u64, u64)>>,
}

/// CPUs and memory held for a start under way; given back when dropped (by then the
/// sandbox is running and counted, or failed).
#[derive(Debug)]
pub struct Reservation {
    in_flight: Arc<Mutex<(u64, u64)>>,
    vcpus: u64,
    memory_mib: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut held = self.in_flight.lock().expect("admission lock poisoned");
        held.0 -= self.vcpus;
        held.1 -= self.memory_mib;
    }
}

impl Admission {
    /// Reserve `vcpus` and `memory_mib` if, with `running` (vCPUs, MiB of the sandboxes
    /// running now) and the starts under way, they fit `capacity`.
    pub fn admit(
        &self,
        capacity: Capacity,
        running: (u64, u64),
        vcpus: u32,
        memory_mib: u64,
    ) -> Result<Reservation, CapacityExhausted> {
        let mut held = self.in_flight.lock().expect("admission lock poisoned");
        let used = (running.0 + held.0, running.1 + held.1);
        let want = u64::from(vcpus);
        if used.0 + want > capacity.vcpus || used.1 + memory_mib > capacity.memory_mib {
            return Err(CapacityExhausted {
                vcpus,
                memory_mib,
                used_vcpus: used.0,
                cap_vcpus: capacity.vcpus,
                used_memory_mib: used.1,
                cap_memory_mib: capacity.memory_mib,
            });
        }
        held.0 += want;
        held.1 += memory_mib;
        Ok(Reservation { in_flight: self.in_flight.clone(), vcpus: want, memory_mib })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_scale_the_host() {
        assert_eq!(Capacity::scaled(2, 24_000, 8.0, 1.5), Capacity { vcpus: 16, memory_mib: 36_000 });
        assert_eq!(Capacity::scaled(2, 1000, f64::NAN, 0.0), Capacity { vcpus: 2, memory_mib: 1000 });
    }

    #[test]
    fn a_sandbox_larger_than_what_is_left_is_refused_until_others_end() {
        let cap = Capacity::scaled(2, 24_000, 8.0, 1.5);
        let a = Admission::default();
        // A 16-vCPU/16 GiB sandbox beside one running 1-vCPU sandbox: 17 > 16 vCPUs.
        let refused = a.admit(cap, (1, 1024), 16, 16_896).unwrap_err();
        assert_eq!((refused.used_vcpus, refused.cap_vcpus), (1, 16));
        let first = a.admit(cap, (0, 0), 8, 8192).unwrap();
        let second = a.admit(cap, (0, 0), 8, 8192).unwrap();
        assert!(a.admit(cap, (0, 0), 1, 128).is_err(), "starts under way count");
        drop((first, second));
        a.admit(cap, (0, 0), 16, 16_896).expect("everything given back");
        // Memory decides as well.
        assert!(a.admit(cap, (0, 30_000), 1, 8192).is_err());
    }
}
