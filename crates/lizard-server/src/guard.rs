//! What each API key may take of the server: a token bucket
//! ([`TrafficLimits::rate_per_sec`], [`TrafficLimits::burst`]) and a cap on its requests
//! in flight ([`TrafficLimits::concurrent_per_key`]), kept apart per key so that one
//! key's flood never slows another. [`crate::front_door`] applies them to requests.

use crate::config::TrafficLimits;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Per-key counters. Keys idle long enough to have a full bucket and nothing in flight
/// are forgotten, so the maps stay as large as the set of active keys.
pub struct Guard {
    limits: TrafficLimits,
    keys: Mutex<HashMap<String, KeyState>>,
}

struct KeyState {
    bucket: TokenBucket,
    in_flight: Arc<Semaphore>,
}

/// A token bucket: `burst` tokens, refilled at `rate` per second.
#[derive(Debug, Clone)]
struct TokenBucket {
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    fn full(burst: u32) -> TokenBucket {
        TokenBucket { tokens: f64::from(burst), last: Instant::now() }
    }

    /// Take a token at `now`, or say how long until one is there.
    fn take(&mut self, now: Instant, rate: u32, burst: u32) -> Result<(), Duration> {
        let rate = f64::from(rate.max(1));
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(f64::from(burst.max(1)));
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / rate))
        }
    }
}

/// Why a key's request was not let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Out of tokens: retry after this long.
    Rate(Duration),
    /// Too many of its requests in flight.
    Concurrency,
}

impl Guard {
    pub fn new(limits: TrafficLimits) -> Guard {
        Guard { limits, keys: Mutex::new(HashMap::new()) }
    }

    /// Let one request of key `key_id` in (the permit is held while it is served).
    pub fn admit(&self, key_id: &str) -> Result<OwnedSemaphorePermit, Refusal> {
        let mut keys = self.keys.lock().expect("guard poisoned");
        if keys.len() > 10_000 {
            self.forget_idle(&mut keys);
        }
        let limits = &self.limits;
        let state = keys.entry(key_id.to_owned()).or_insert_with(|| KeyState {
            bucket: TokenBucket::full(limits.burst),
            in_flight: Arc::new(Semaphore::new(usize::try_from(limits.concurrent_per_key).unwrap_or(usize::MAX))),
        });
        let permit = state.in_flight.clone().try_acquire_owned().map_err(|_| Refusal::Concurrency)?;
        state.bucket.take(Instant::now(), limits.rate_per_sec, limits.burst).map_err(Refusal::Rate)?;
        Ok(permit)
    }

    fn forget_idle(&self, keys: &mut HashMap<String, KeyState>) {
        let now = Instant::now();
        let refill = Duration::from_secs_f64(f64::from(self.limits.burst) / f64::from(self.limits.rate_per_sec.max(1)));
        keys.retain(|_, k| {
            Arc::strong_count(&k.in_flight) > 1 || now.saturating_duration_since(k.bucket.last) < refill
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_lets_a_burst_through_then_the_rate() {
        let mut b = TokenBucket::full(3);
        let t0 = b.last;
        for _ in 0..3 {
            assert!(b.take(t0, 10, 3).is_ok());
        }
        let wait = b.take(t0, 10, 3).unwrap_err();
        assert!(wait > Duration::from_millis(90) && wait <= Duration::from_millis(100), "{wait:?}");
        assert!(b.take(t0 + Duration::from_millis(100), 10, 3).is_ok(), "refilled at the rate");
        assert!(b.take(t0 + Duration::from_secs(60), 10, 3).is_ok());
        assert!(b.tokens <= 3.0, "never more than the burst");
    }

    #[test]
    fn one_key_out_of_tokens_or_slots_does_not_touch_another() {
        let guard =
            Guard::new(TrafficLimits { rate_per_sec: 1, burst: 2, concurrent_per_key: 2, ..Default::default() });
        let a1 = guard.admit("a").unwrap();
        let _a2 = guard.admit("a").unwrap();
        assert_eq!(guard.admit("a").unwrap_err(), Refusal::Concurrency);
        drop(a1);
        assert!(matches!(guard.admit("a").unwrap_err(), Refusal::Rate(_)), "slots free, tokens spent");
        assert!(guard.admit("b").is_ok(), "another key has its own bucket");
    }
}
