//! The limit on failed authentications: each request presenting a key that is not one
//! (unknown, revoked, malformed) costs the server a hash and a store read, so failures are
//! budgeted before they are paid for.
//!
//! Not by address: every guest's API calls reach the server from loopback through its
//! node's forwarder, so one sandbox flooding bad keys would lock all the others out. By
//! key instead:
//!
//! - a global bucket ([`TrafficLimits::auth_failure_rate`], [`TrafficLimits::auth_failure_burst`])
//!   bounds what the failures of keys not seen before may cost together: past it, 429;
//! - a key refused once is *refused* by its SHA-256 for [`REFUSED_FOR`]: presented again it
//!   is answered 401 at once, with no store read and nothing taken from the bucket, so a
//!   client repeating one stale key neither costs the server nor spends the others' budget,
//!   and keeps hearing why it fails. (A key refused once cannot become good: keys are
//!   random, and a revoked one stays revoked.)
//!
//! Keys that authenticated before (or were created here) are *known* by their SHA-256 and
//! pass: a flood of bad keys never refuses a key that works. A valid key this process has
//! not seen yet pays as a stranger — and gets its token back once it authenticates — so
//! during a flood it may be refused with `Retry-After` like the rest. A guesser cannot make
//! a known fingerprint without the key itself.

use crate::config::TrafficLimits;
use crate::guard::TokenBucket;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a refused key is answered 401 without a store read.
pub const REFUSED_FOR: Duration = Duration::from_secs(300);
/// Known keys remembered; past it, those unused for [`KNOWN_IDLE`] are forgotten first.
const KNOWN_CAP: usize = 100_000;
const KNOWN_IDLE: Duration = Duration::from_secs(3600);
/// Refused keys remembered; past it, the expired ones, then all, are forgotten.
const REFUSED_CAP: usize = 100_000;

/// A presented key's SHA-256 ([`crate::keys::hash`]).
pub type Fingerprint = [u8; 32];

/// How a presented key was let through [`BadKeys::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ticket {
    /// It authenticated before: nothing was taken.
    Known,
    /// A token of the bucket was taken; a success gives it back.
    Stranger,
}

/// Why a presented key is not checked now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotChecked {
    /// It was refused within [`REFUSED_FOR`]: answer 401 without checking again.
    Refused,
    /// The budget is spent: 429, retry after this long.
    OverBudget(Duration),
}

/// The bucket, the known keys and the refused ones (see the module doc).
pub struct BadKeys {
    rate: u32,
    burst: u32,
    inner: Mutex<Inner>,
}

struct Inner {
    global: TokenBucket,
    known: HashMap<Fingerprint, Instant>,
    refused: HashMap<Fingerprint, Instant>,
}

impl BadKeys {
    pub fn new(limits: &TrafficLimits) -> BadKeys {
        let (rate, burst) = (limits.auth_failure_rate.max(1), limits.auth_failure_burst.max(1));
        BadKeys {
            rate,
            burst,
            inner: Mutex::new(Inner {
                global: TokenBucket::full(burst),
                known: HashMap::new(),
                refused: HashMap::new(),
            }),
        }
    }

    /// Whether the key with this fingerprint may be checked now, or why not.
    pub fn admit(&self, key: &Fingerprint) -> Result<Ticket, NotChecked> {
        let now = Instant::now();
        let mut inner = self.inner.lock().expect("bad-key limiter poisoned");
        if let Some(seen) = inner.known.get_mut(key) {
            *seen = now;
            return Ok(Ticket::Known);
        }
        if inner.refused.get(key).is_some_and(|at| now.saturating_duration_since(*at) < REFUSED_FOR) {
            return Err(NotChecked::Refused);
        }
        inner.global.take(now, self.rate, self.burst).map_err(NotChecked::OverBudget)?;
        Ok(Ticket::Stranger)
    }

    /// The key authenticated: known from now on, and a stranger's token comes back.
    pub fn succeeded(&self, key: &Fingerprint, ticket: Ticket) {
        let mut inner = self.inner.lock().expect("bad-key limiter poisoned");
        if ticket == Ticket::Stranger {
            inner.global.give_back(self.burst);
        }
        inner.refused.remove(key);
        remember(&mut inner.known, *key, KNOWN_CAP, KNOWN_IDLE);
    }

    /// The key was refused: no longer known, and answered 401 without a check for a while.
    pub fn failed(&self, key: &Fingerprint) {
        let mut inner = self.inner.lock().expect("bad-key limiter poisoned");
        inner.known.remove(key);
        remember(&mut inner.refused, *key, REFUSED_CAP, REFUSED_FOR);
    }

    /// The check itself failed (the store did not answer): not the key's fault.
    pub fn undecided(&self, ticket: Ticket) {
        if ticket == Ticket::Stranger {
            self.inner.lock().expect("bad-key limiter poisoned").global.give_back(self.burst);
        }
    }

    /// A key created here: known before its first use.
    pub fn vouch(&self, key: &Fingerprint) {
        remember(&mut self.inner.lock().expect("bad-key limiter poisoned").known, *key, KNOWN_CAP, KNOWN_IDLE);
    }
}

/// Note `key` as seen now in `map`, which keeps at most `cap` keys (those older than
/// `stale` go first; if that is not enough, all).
fn remember(map: &mut HashMap<Fingerprint, Instant>, key: Fingerprint, cap: usize, stale: Duration) {
    let now = Instant::now();
    if map.len() >= cap {
        map.retain(|_, seen| now.saturating_duration_since(*seen) < stale);
        if map.len() >= cap {
            map.clear();
        }
    }
    map.insert(key, now);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(rate: u32, burst: u32) -> BadKeys {
        BadKeys::new(&TrafficLimits { auth_failure_rate: rate, auth_failure_burst: burst, ..Default::default() })
    }

    fn fail(limiter: &BadKeys, key: &Fingerprint) -> Result<(), NotChecked> {
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
        let Err(NotChecked::OverBudget(wait)) = l.admit(&[0xBB; 32]) else { panic!("over budget") };
        assert!(wait <= Duration::from_secs(1), "{wait:?}");
    }

    #[test]
    fn a_repeated_bad_key_is_refused_from_memory_and_spends_no_budget() {
        let l = limiter(1, 2);
        let stale = [1; 32];
        fail(&l, &stale).unwrap();
        for _ in 0..30 {
            assert_eq!(l.admit(&stale), Err(NotChecked::Refused));
        }
        assert!(l.admit(&[2; 32]).is_ok(), "another key is still checked: the budget is untouched");
    }

    #[test]
    fn a_success_gives_its_token_back_and_a_revoked_key_is_refused_from_then_on() {
        let l = limiter(1, 1);
        let key = [3; 32];
        let t = l.admit(&key).unwrap();
        assert_eq!(t, Ticket::Stranger);
        l.succeeded(&key, t);
        assert!(l.admit(&[4; 32]).is_ok(), "the global token came back");
        // Revoked: checked once as known, refused, then refused without a check.
        assert_eq!(l.admit(&key), Ok(Ticket::Known));
        l.failed(&key);
        assert_eq!(l.admit(&key), Err(NotChecked::Refused));
    }

    #[test]
    fn a_vouched_key_passes_an_empty_budget() {
        let l = limiter(1, 1);
        fail(&l, &[5; 32]).unwrap();
        l.vouch(&[6; 32]);
        assert_eq!(l.admit(&[6; 32]), Ok(Ticket::Known));
    }

    #[test]
    fn an_undecided_check_gives_the_token_back() {
        let l = limiter(1, 1);
        let t = l.admit(&[7; 32]).unwrap();
        l.undecided(t);
        assert!(l.admit(&[8; 32]).is_ok());
    }
}
