//! A token bucket: the relay's per-sandbox query budget. Without one a guest relays as
//! many queries as it can send (≈1,600/s measured) through the host's resolvers, on the
//! host's address.

use std::time::Instant;

/// Queries a sandbox may send per second, sustained.
pub const QUERIES_PER_SECOND: u32 = 50;
/// Queries it may send at once after a quiet spell.
pub const BURST: u32 = 100;

/// Tokens refilled continuously up to a cap; one per query.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    capacity: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// Full, refilled at `per_second` up to `burst`.
    pub fn new(per_second: u32, burst: u32) -> TokenBucket {
        TokenBucket {
            rate: f64::from(per_second),
            capacity: f64::from(burst),
            tokens: f64::from(burst),
            last: Instant::now(),
        }
    }

    /// Take one token at `now`: whether the query may go.
    pub fn take_at(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last);
        self.last = now;
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.rate).min(self.capacity);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    pub fn take(&mut self) -> bool {
        self.take_at(Instant::now())
    }
}

impl Default for TokenBucket {
    fn default() -> Self {
        TokenBucket::new(QUERIES_PER_SECOND, BURST)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_burst_then_the_sustained_rate() {
        let mut b = TokenBucket::new(10, 5);
        let t0 = Instant::now();
        assert_eq!((0..20).filter(|_| b.take_at(t0)).count(), 5, "the burst");
        assert!(!b.take_at(t0 + Duration::from_millis(50)), "half a token is none");
        assert!(b.take_at(t0 + Duration::from_millis(100)));
        // A long quiet spell refills to the cap, not beyond.
        let later = t0 + Duration::from_secs(60);
        assert_eq!((0..20).filter(|_| b.take_at(later)).count(), 5);
    }
}
