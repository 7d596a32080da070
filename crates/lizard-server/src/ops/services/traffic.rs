//! What the sandbox-URL proxy knows of a service's traffic, in this process: requests in
//! flight and the last request per instance (draining waits for the first, idle pausing
//! reads the second), the round-robin position per service, and one resume at a time per
//! service (a burst of requests to a paused service resumes one instance, not one each).
//!
//! In memory only: with several replicas each sees its own requests (a known limit).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    in_flight: u32,
    /// Milliseconds since the epoch of the last request's end (or start while one runs).
    last_ms: i64,
}

/// The traffic of every service's instances, shared by the proxy and the reconciler.
#[derive(Default)]
pub struct Traffic {
    seen: Mutex<HashMap<String, Seen>>,
    next: AtomicUsize,
    /// When each instance was last checked, and its timeout last renewed (ms).
    checked: Mutex<HashMap<String, i64>>,
    renewed: Mutex<HashMap<String, i64>>,
    resumes: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// A request in flight to an instance; its drop ends it.
pub struct InFlight {
    traffic: Arc<Traffic>,
    sandbox_id: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut seen = self.traffic.seen.lock().expect("traffic lock");
        let s = seen.entry(self.sandbox_id.clone()).or_default();
        s.in_flight = s.in_flight.saturating_sub(1);
        s.last_ms = lizard_api::ids::now_ms();
    }
}

impl Traffic {
    /// A request to `sandbox_id` begins.
    pub fn begin(self: &Arc<Self>, sandbox_id: &str) -> InFlight {
        let mut seen = self.seen.lock().expect("traffic lock");
        let s = seen.entry(sandbox_id.to_owned()).or_default();
        s.in_flight += 1;
        s.last_ms = lizard_api::ids::now_ms();
        InFlight { traffic: self.clone(), sandbox_id: sandbox_id.to_owned() }
    }

    pub fn in_flight(&self, sandbox_id: &str) -> u32 {
        self.seen.lock().expect("traffic lock").get(sandbox_id).map_or(0, |s| s.in_flight)
    }

    /// When `sandbox_id` last had a request (ms since the epoch), if it had one here.
    pub fn last_request_ms(&self, sandbox_id: &str) -> Option<i64> {
        self.seen.lock().expect("traffic lock").get(sandbox_id).map(|s| s.last_ms)
    }

    /// Forget an instance that stopped.
    pub fn forget(&self, sandbox_id: &str) {
        self.seen.lock().expect("traffic lock").remove(sandbox_id);
        self.checked.lock().expect("traffic lock").remove(sandbox_id);
        self.renewed.lock().expect("traffic lock").remove(sandbox_id);
    }

    /// Whether `every_ms` passed since `sandbox_id`'s last check at `now` (then it counts as
    /// checked now).
    pub fn check_due(&self, sandbox_id: &str, every_ms: u64, now: i64) -> bool {
        due(&self.checked, sandbox_id, every_ms, now)
    }

    /// The same for renewing its sandbox's timeout.
    pub fn renew_due(&self, sandbox_id: &str, every_ms: u64, now: i64) -> bool {
        due(&self.renewed, sandbox_id, every_ms, now)
    }

    /// The next round-robin position.
    pub fn next_index(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// The lock a resume of one of `service_id`'s instances holds.
    pub fn resume_lock(&self, service_id: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.resumes.lock().expect("traffic lock").entry(service_id.to_owned()).or_default().clone()
    }
}

fn due(map: &Mutex<HashMap<String, i64>>, key: &str, every_ms: u64, now: i64) -> bool {
    let mut map = map.lock().expect("traffic lock");
    let every = i64::try_from(every_ms).unwrap_or(i64::MAX);
    match map.get(key) {
        Some(last) if now.saturating_sub(*last) < every => false,
        _ => {
            map.insert(key.to_owned(), now);
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_in_flight_are_counted_until_dropped() {
        let t = Arc::new(Traffic::default());
        assert_eq!((t.in_flight("a"), t.last_request_ms("a")), (0, None));
        let one = t.begin("a");
        let two = t.begin("a");
        assert_eq!(t.in_flight("a"), 2);
        drop(one);
        assert_eq!(t.in_flight("a"), 1);
        drop(two);
        assert_eq!(t.in_flight("a"), 0);
        assert!(t.last_request_ms("a").is_some());
        t.forget("a");
        assert_eq!(t.last_request_ms("a"), None);
        assert!(Arc::ptr_eq(&t.resume_lock("s"), &t.resume_lock("s")));
        assert!(t.check_due("a", 1000, 10_000));
        assert!(!t.check_due("a", 1000, 10_999));
        assert!(t.check_due("a", 1000, 11_000));
    }
}
