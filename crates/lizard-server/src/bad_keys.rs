//! The limit on failed authentications: each request presenting a key that is not one
//! (unknown, revoked, malformed) costs the server a hash and a store read, so failures are
//! budgeted before they are paid for.
//!
//! Not by address: every guest's API calls reach the server from loopback through its
//! node's forwarder, so one sandbox flooding bad keys would lock all the others out. By
//! key instead, in two buckets:
//!
//! - a global one ([`TrafficLimits::auth_failure_rate`], [`TrafficLimits::auth_failure_burst`])
//!   bounds what all failures together may cost;
//! - one per presented key ([`PER_KEY_RATE`], [`PER_KEY_BURST`]) keeps a client that
//!   repeats one stale key from spending the global budget alone.
//!
//! Keys that authenticated before (or were created here) are *known* by their SHA-256 and
//! pass both buckets: a flood of bad keys never refuses a key that works. A valid key this
//! process has not seen yet pays as a stranger — and gets its token back once it
//! authenticates — so during a flood it may be refused with `Retry-After` like the rest.
//! A guesser cannot make a known fingerprint without the key itself.

use crate::config::TrafficLimits;
use crate::guard::TokenBucket;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failures per second one presented key may cause, sustained.
pub const PER_KEY_RATE: u32 = 1;
/// Failures one presented key may cause in a row.
pub const PER_KEY_BURST: u32 = 10;
/// Known keys remembered; past it, those unused for [`KNOWN_IDLE`] are forgotten first.
const KNOWN_CAP: usize = 100_000;
const KNOWN_IDLE: Duration = Duration::from_secs(3600);
/// Per-key buckets kept before full ones are dropped.
const STRANGERS_CAP: usize = 10_000;

/// A presented key's SHA-256 ([`crate::keys::hash`]).
pub type Fingerprint = [u8; 32];

/// How a presented key was let through [`BadKeys::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ticket {
    /// It authenticated before: nothing was taken.
    Known,
    /// A token of each bucket was taken; a success gives them back.
    Stranger,
}

/// The buckets and the known keys (see the module doc).
pub struct BadKeys {
    rate: u32,
    burst: u32,
    inner: Mutex<Inner>,
}

struct Inner {
    global: TokenBucket,
    strangers: HashMap<Fingerprint, TokenBucket>,
    known: HashMap<Fingerprint, Instant>,
}

impl BadKeys {
    pub fn new(limits: &TrafficLimits) -> BadKeys {
        let (rate, burst) = (limits.auth_failure_rate.max(1), limits.auth_failure_burst.max(1));
        BadKeys {
            rate,
            burst,
            inner: Mutex::new(Inner {
                global: TokenBucket::full(burst),
                strangers: HashMap::new(),
                known: HashMap::new(),
            }),
        }
    }

    /// Whether the key with this fingerprint may be checked now; else how long to wait.
    pub fn admit(&self, key: &Fingerprint) -> Result<Ticket, Duration> {
        let now = Instant::now();
        let mut inner = self.inner.lock().expect("bad-key limiter poisoned");
        if let Some(seen) = inner.known.get_mut(key) {
            *seen = now;
            return Ok(Ticket::Known);
        }
        if let Some(own) = inner.strangers.get_mut(key) {
            own.peek(now, PER_KEY_RATE, PER_KEY_BURST)?;
        }
        inner.global.take(now, self.rate, self.burst)?;
        if inner.strangers.len() >= STRANGERS_CAP {
            let refill = Duration::from_secs(u64::from(PER_KEY_BURST / PER_KEY_RATE));
            inner.strangers.retain(|_, b| now.saturating_duration_since(b.last()) < refill);
        }
        let own = inner.strangers.entry(*key).or_insert_with(|| TokenBucket::full(PER_KEY_BURST));
        // Peeked above (or full): this take succeeds.
        let _ = own.take(now, PER_KEY_RATE, PER_KEY_BURST);
        Ok(Ticket::Stranger)
    }

    /// The key authenticated: known from now on, and a stranger's tokens come back.
    pub fn succeeded(&self, key: &Fingerprint, ticket: Ticket) {
        let mut inner = self.inner.lock().expect("bad-key limiter poisoned");
        if ticket == Ticket::Stranger {
            inner.global.give_back(self.burst);
            inner.strangers.remove(key);
        }
        remember(&mut inner.known, *key);
    }

    /// The key was refused: no longer known (a revoked key pays as a stranger from now on).
    /// A stranger's tokens stay spent.
    pub fn failed(&self, key: &Fingerprint) {
        self.inner.lock().expect("bad-key limiter poisoned").known.remove(key);
    }

    /// The check itself failed (the store did not answer): not the key's fault.
    pub fn undecided(&self, key: &Fingerprint, ticket: Ticket) {
        if ticket == Ticket::Stranger {
            let mut inner = self.inner.lock().expect("bad-key limiter poisoned");
            inner.global.give_back(self.burst);
            if let Some(own) = inner.strangers.get_mut(key) {
                own.give_back(PER_KEY_BURST);
            }
        }
    }

    /// A key created here: known before its first use.
    pub fn vouch(&self, key: &Fingerprint) {
        remember(&mut self.inner.lock().expect("bad-key limiter poisoned").known, *key);
    }
}

fn remember(known: &mut HashMap<Fingerprint, Instant>, key: Fingerprint) {
    let now = Instant::now();
    if known.len() >= KNOWN_CAP {
        known.retain(|_, seen| now.saturating_duration_since(*seen) < KNOWN_IDLE);
        if known.len() >= KNOWN_CAP {
            known.clear();
        }
    }
    known.insert(key, now);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(rate: u32, burst: u32) -> BadKeys {
        BadKeys::new(&TrafficLimits { auth_failure_rate: rate, auth_failure_burst: burst, ..Default::default() })
    }

    fn fail(limiter: &BadKeys, key: &Fingerprint) -> Result<(), Duration> {
        limiter.admit(key).map(|_| limiter.failed(key))
    }

    #[test]
    fn a_flood_of_strangers_is_held_to_the_global_budget_and_a_known_key_still_passes() {
        let l = limiter(1, 5);
        let good = [0xAA; 32];
        let t = l.admit(&good).unwrap();
        l.succeeded(&good, t);
        let refused = (0u8..50).filter(|i| fail(&l, &[*i; 32]).is_err()).count();
        assert_eq!(refused, 45, "5 failures in the burst, then none within the same second");
        assert_eq!(l.admit(&good), Ok(Ticket::Known), "the known key is not refused");
        let wait = l.admit(&[0xBB; 32]).unwrap_err();
        assert!(wait <= Duration::from_secs(1), "{wait:?}");
    }

    #[test]
    fn one_repeated_bad_key_is_held_to_its_own_bucket_and_leaves_the_rest() {
        let l = limiter(1000, 1000);
        let stale = [1; 32];
        let refused = (0..30).filter(|_| fail(&l, &stale).is_err()).count();
        assert_eq!(refused, 30 - PER_KEY_BURST as usize);
        assert!(l.admit(&[2; 32]).is_ok(), "another key is still checked");
    }

    #[test]
    fn a_success_gives_its_tokens_back_and_a_revoked_key_pays_again() {
        let l = limiter(1, 1);
        let key = [3; 32];
        let t = l.admit(&key).unwrap();
        assert_eq!(t, Ticket::Stranger);
        l.succeeded(&key, t);
        assert!(l.admit(&[4; 32]).is_ok(), "the global token came back");
        // Revoked: refused once as known, then a stranger in an empty budget.
        assert_eq!(l.admit(&key), Ok(Ticket::Known));
        l.failed(&key);
        assert!(l.admit(&key).is_err());
    }

    #[test]
    fn a_vouched_key_passes_an_empty_budget() {
        let l = limiter(1, 1);
        fail(&l, &[5; 32]).unwrap();
        l.vouch(&[6; 32]);
        assert_eq!(l.admit(&[6; 32]), Ok(Ticket::Known));
    }
}
