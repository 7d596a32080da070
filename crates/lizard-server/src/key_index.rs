//! Which presented API keys are worth a store read: the SHA-256 of every key the store
//! holds, kept in memory.
//!
//! A key whose hash is not among them is answered 401 from memory, so a flood of keys
//! nobody holds — random, malformed, from a client or from any guest through its node's
//! forwarder — costs the store nothing, and no budget shared with anyone is spent: a key
//! that works is never refused because others sent bad ones (before, a global budget of
//! failures made a valid key this process had not seen yet get 429 during such a flood,
//! after every restart). A key whose hash is there is authenticated against the store as
//! ever (a revocation counts at once).
//!
//! The index is the store's, read in increments: keys made on this replica go in at once
//! ([`KeyIndex::vouch`]); a key not found sends the index to read the keys created since its
//! last read (with a margin for clocks of other replicas), and is decided by a read that
//! began after it arrived — so a key made a moment ago on another replica works at its first
//! request. Reads are one at a time, at most one per [`MIN_READ_GAP`], and every key that
//! misses meanwhile is decided by the next one: a flood costs at most ten small reads a
//! second.
//!
//! A key found but refused by the store (revoked) is answered 401 from memory for
//! [`REFUSED_FOR`].

use crate::keys;
use lizard_store::{Store, StoreError};
use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

/// A presented key's SHA-256 ([`crate::keys::hash`]).
pub type Fingerprint = [u8; 32];

/// How long a key the store refused is answered 401 without a store read.
pub const REFUSED_FOR: Duration = Duration::from_secs(300);
/// Refused keys remembered; past it, the expired ones, then all, are forgotten.
const REFUSED_CAP: usize = 100_000;
/// Least time between two reads of new keys.
pub const MIN_READ_GAP: Duration = Duration::from_millis(100);
/// How far before the last read's clock a read looks again, for keys stamped by another
/// replica whose clock is behind.
const CLOCK_MARGIN_MS: i64 = 60_000;

/// What to do with a presented key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The store holds a key with its hash: authenticate it.
    Check,
    /// No such key (or the store refused it a moment ago): 401 without a store read.
    Refuse,
}

/// The index (see the module doc).
#[derive(Default)]
pub struct KeyIndex {
    known: RwLock<HashSet<Fingerprint>>,
    refused: Mutex<HashMap<Fingerprint, Instant>>,
    reads: tokio::sync::Mutex<Reads>,
}

#[derive(Default)]
struct Reads {
    /// When the last read began (monotonic), if any.
    began: Option<Instant>,
    /// Its wall clock (ms): the next read takes keys created from a margin before it.
    began_ms: i64,
    /// Reads so far.
    count: u64,
}

impl KeyIndex {
    /// What to do with `key`; a store error only when a read of new keys failed.
    pub async fn check(&self, store: &dyn Store, key: &str) -> Result<Verdict, StoreError> {
        let fingerprint = keys::hash(key);
        if keys::lookup_prefix(key).is_none() || self.refused_lately(&fingerprint) {
            return Ok(Verdict::Refuse);
        }
        if self.holds(&fingerprint) {
            return Ok(Verdict::Check);
        }
        self.read_new_keys(store, Instant::now()).await?;
        Ok(if self.holds(&fingerprint) { Verdict::Check } else { Verdict::Refuse })
    }

    /// A key made here: known before its first use.
    pub fn vouch(&self, hash: Fingerprint) {
        self.known.write().unwrap_or_else(std::sync::PoisonError::into_inner).insert(hash);
    }

    /// The store refused a key the index holds (revoked): 401 from memory for a while.
    pub fn refused(&self, key: &str) {
        let now = Instant::now();
        let mut refused = self.refused.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if refused.len() >= REFUSED_CAP {
            refused.retain(|_, at| now.saturating_duration_since(*at) < REFUSED_FOR);
            if refused.len() >= REFUSED_CAP {
                refused.clear();
            }
        }
        refused.insert(keys::hash(key), now);
    }

    fn holds(&self, fingerprint: &Fingerprint) -> bool {
        self.known.read().unwrap_or_else(std::sync::PoisonError::into_inner).contains(fingerprint)
    }

    fn refused_lately(&self, fingerprint: &Fingerprint) -> bool {
        let refused = self.refused.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        refused.get(fingerprint).is_some_and(|at| at.elapsed() < REFUSED_FOR)
    }

    /// Make sure a read of new keys began after `arrived` and ended.
    async fn read_new_keys(&self, store: &dyn Store, arrived: Instant) -> Result<(), StoreError> {
        let mut reads = self.reads.lock().await;
        if reads.began.is_some_and(|began| began >= arrived) {
            return Ok(());
        }
        if let Some(began) = reads.began {
            tokio::time::sleep_until((began + MIN_READ_GAP).into()).await;
        }
        let (began, began_ms) = (Instant::now(), lizard_api::ids::now_ms());
        let hashes = store.key_hashes_since(reads.began_ms.saturating_sub(CLOCK_MARGIN_MS)).await?;
        let mut known = self.known.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        known.extend(hashes.iter().filter_map(|h| Fingerprint::try_from(h.as_slice()).ok()));
        drop(known);
        *reads = Reads { began: Some(began), began_ms, count: reads.count + 1 };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lizard_store::KeyRecord;
    use std::sync::Arc;

    const ACCOUNT: &str = "acc_1";

    async fn add_key(store: &dyn Store, created_at: i64) -> String {
        let new = keys::generate();
        let record = KeyRecord {
            id: lizard_api::ids::new_id("key"),
            account_id: ACCOUNT.into(),
            name: "k".into(),
            prefix: new.prefix,
            hash: new.hash.to_vec(),
            scope: None,
            created_at,
            revoked_at: None,
        };
        store.insert_key(&record).await.unwrap();
        new.plaintext
    }

    #[tokio::test]
    async fn a_key_in_the_store_is_checked_and_one_nobody_holds_is_refused_from_memory() {
        let store: Arc<dyn Store> = Arc::new(lizard_store::fixture::seeded_store(ACCOUNT, &[]).await);
        let index = KeyIndex::default();
        // Made before the index read anything (another replica, a restart).
        let old = add_key(store.as_ref(), 1).await;
        assert_eq!(index.check(store.as_ref(), &old).await.unwrap(), Verdict::Check);
        let random = keys::generate().plaintext;
        assert_eq!(index.check(store.as_ref(), &random).await.unwrap(), Verdict::Refuse);
        assert_eq!(index.check(store.as_ref(), "lz_short").await.unwrap(), Verdict::Refuse);
        // Made a moment ago elsewhere, stamped by a clock 30 s behind: found at its first use.
        tokio::time::sleep(MIN_READ_GAP).await;
        let fresh = add_key(store.as_ref(), lizard_api::ids::now_ms() - 30_000).await;
        assert_eq!(index.check(store.as_ref(), &fresh).await.unwrap(), Verdict::Check);
        // Refused by the store (revoked): from memory from then on.
        index.refused(&fresh);
        assert_eq!(index.check(store.as_ref(), &fresh).await.unwrap(), Verdict::Refuse);
        // Vouched for: found without a read.
        let made_here = keys::generate();
        index.vouch(made_here.hash);
        assert_eq!(index.check(store.as_ref(), &made_here.plaintext).await.unwrap(), Verdict::Check);
    }

    #[tokio::test]
    async fn a_flood_of_unknown_keys_costs_a_few_reads_and_a_fresh_key_still_works() {
        let store: Arc<dyn Store> = Arc::new(lizard_store::fixture::seeded_store(ACCOUNT, &[]).await);
        let index = Arc::new(KeyIndex::default());
        let started = Instant::now();
        let flood: Vec<_> = (0..2000)
            .map(|_| {
                let (index, store) = (index.clone(), store.clone());
                tokio::spawn(async move { index.check(store.as_ref(), &keys::generate().plaintext).await.unwrap() })
            })
            .collect();
        let fresh = add_key(store.as_ref(), lizard_api::ids::now_ms()).await;
        assert_eq!(index.check(store.as_ref(), &fresh).await.unwrap(), Verdict::Check, "during the flood");
        for answer in flood {
            assert_eq!(answer.await.unwrap(), Verdict::Refuse);
        }
        let reads = index.reads.lock().await.count;
        let gaps = u64::try_from(started.elapsed().as_millis() / MIN_READ_GAP.as_millis()).unwrap() + 1;
        assert!(reads <= gaps + 1, "2001 keys decided by {reads} reads in {gaps} gaps of {MIN_READ_GAP:?}");
    }
}
