//! Waiting between failed calls to the server, and keeping the log of a long outage
//! short: the first failure and then one line a minute, and a line when it is over.

use std::time::{Duration, Instant};

/// Doubling waits from `first` up to `max`.
#[derive(Debug)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
    failing_since: Option<Instant>,
    last_logged: Option<Instant>,
    failures: u64,
}

/// How often a failure that goes on is logged again.
const LOG_EVERY: Duration = Duration::from_secs(60);

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Backoff {
        Backoff { first, max, next: first, failing_since: None, last_logged: None, failures: 0 }
    }

    /// A failure: how long to wait before the next try, and whether to log this one.
    pub fn failed(&mut self) -> (Duration, bool) {
        let now = Instant::now();
        self.failing_since.get_or_insert(now);
        self.failures += 1;
        let wait = self.next;
        self.next = (self.next * 2).min(self.max);
        let log = self.last_logged.is_none_or(|t| now.duration_since(t) >= LOG_EVERY);
        if log {
            self.last_logged = Some(now);
        }
        (wait, log)
    }

    /// A success: the failures it ends (count, since when), if there were any.
    pub fn succeeded(&mut self) -> Option<(u64, Duration)> {
        self.next = self.first;
        self.last_logged = None;
        let since = self.failing_since.take()?;
        let failures = std::mem::take(&mut self.failures);
        Some((failures, since.elapsed()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_to_the_bound_and_logs_the_first_failure_only() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
        assert_eq!(b.succeeded(), None);
        let waits: Vec<_> = (0..5).map(|_| b.failed()).collect();
        assert_eq!(
            waits,
            [(1, true), (2, false), (4, false), (5, false), (5, false)].map(|(s, log)| (Duration::from_secs(s), log))
        );
        assert_eq!(b.succeeded().map(|(n, _)| n), Some(5));
        assert_eq!(b.failed(), (Duration::from_secs(1), true), "a new outage starts over");
    }
}
