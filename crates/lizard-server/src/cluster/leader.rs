//! Leader leases: each background job that must run once across replicas (the metering
//! tick, the timeout reaper, node-lease expiry) runs only on the replica holding its
//! named lease in the store. The holder renews it every period; the lease lasts three
//! periods, so a replica that dies (or loses the store) is replaced by another within
//! that, and one that finds the lease taken skips the job until it lapses.
//!
//! Billing never depends on this alone: two ticks that overlap (a holder stalled past
//! its lease) still bill each interval once, the store's guarantee.

use lizard_store::Store;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// The lease of the metering tick.
pub const METERING: &str = "metering";
/// The lease of the timeout reaper.
pub const TIMEOUTS: &str = "timeouts";
/// The lease of node-lease expiry.
pub const NODE_EXPIRY: &str = "node-expiry";
/// The lease of the service reconciler ([`crate::ops::services::reconcile`]).
pub const SERVICES: &str = "services";

/// How many periods a lease outlives its last renewal.
pub const TTL_PERIODS: u32 = 3;

/// One named lease, as one replica contends for it.
#[derive(Clone)]
pub struct Lease {
    store: Arc<dyn Store>,
    name: &'static str,
    holder: String,
    ttl_ms: i64,
}

impl Lease {
    pub fn new(store: Arc<dyn Store>, name: &'static str, holder: impl Into<String>, ttl: Duration) -> Lease {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        Lease { store, name, holder: holder.into(), ttl_ms }
    }

    /// Take or renew it at `now`; whether this replica holds it (a store error: not).
    pub async fn hold(&self, now: i64) -> bool {
        match self.store.acquire_lease(self.name, &self.holder, now, self.ttl_ms).await {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(lease = self.name, "cannot renew a leader lease: {e}");
                false
            }
        }
    }

    /// Hand it over now (a clean shutdown), if held.
    pub async fn release(&self) {
        if let Err(e) = self.store.release_lease(self.name, &self.holder).await {
            tracing::debug!(lease = self.name, "cannot release a leader lease: {e}");
        }
    }
}

/// Run `job` every `period` while holding the lease `name` (ttl: [`TTL_PERIODS`]
/// periods) as `holder`, until the task is aborted.
pub async fn run_as_leader<F, Fut>(
    store: Arc<dyn Store>,
    name: &'static str,
    holder: String,
    period: Duration,
    mut job: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let lease = Lease::new(store, name, holder, period * TTL_PERIODS);
    let mut tick = tokio::time::interval(period.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut held = false;
    loop {
        tick.tick().await;
        let now_held = lease.hold(lizard_api::ids::now_ms()).await;
        match (held, now_held) {
            (false, true) => tracing::info!(lease = name, "this replica now runs {name}"),
            (true, false) => tracing::info!(lease = name, "another replica runs {name} now"),
            _ => {}
        }
        held = now_held;
        if held {
            job().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lizard_store::sql::SqlStore;

    #[tokio::test]
    async fn two_contenders_never_hold_one_lease_and_a_lapsed_holder_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        // A file database with a pool: the two replicas' statements really interleave.
        let store: Arc<dyn Store> = Arc::new(SqlStore::open_sqlite(dir.path()).await.unwrap());
        let ttl = Duration::from_millis(3_000);
        let a = Lease::new(store.clone(), METERING, "replica_a", ttl);
        let b = Lease::new(store.clone(), METERING, "replica_b", ttl);
        for round in 0..50i64 {
            let now = round * 100;
            let (ha, hb) = tokio::join!(a.hold(now), b.hold(now));
            assert!(!(ha && hb), "both held the lease at {now}");
            assert!(ha || hb, "nobody held a free or renewed lease at {now}");
        }
        let first = if a.hold(5_000).await { (&a, &b) } else { (&b, &a) };
        let (holder, other) = first;
        assert!(holder.hold(5_000).await);
        assert!(!other.hold(8_000).await, "not lapsed at the ttl's end");
        assert!(other.hold(8_001).await, "a lapsed holder is replaced");
        assert!(!holder.hold(8_002).await, "the old holder has lost it");
        other.release().await;
        assert!(holder.hold(8_003).await, "a released lease is free at once");
        // Another lease is independent.
        assert!(Lease::new(store.clone(), TIMEOUTS, "replica_c", ttl).hold(8_004).await);
    }

    #[tokio::test]
    async fn the_job_runs_only_while_the_lease_is_held() {
        let store: Arc<dyn Store> = Arc::new(SqlStore::memory().await.unwrap());
        // Someone else holds it far into the future.
        assert!(store.acquire_lease(NODE_EXPIRY, "other", lizard_api::ids::now_ms(), 60_000).await.unwrap());
        let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = runs.clone();
        let task = tokio::spawn(run_as_leader(
            store.clone(),
            NODE_EXPIRY,
            "me".into(),
            Duration::from_millis(20),
            move || {
                let counted = counted.clone();
                async move {
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            },
        ));
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 0, "not the holder: never ran");
        store.release_lease(NODE_EXPIRY, "other").await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(runs.load(std::sync::atomic::Ordering::SeqCst) > 0, "took the free lease and ran");
        task.abort();
    }
}
