//! Two replicas on one database: billing ticks, state changes and ends of both at once,
//! many times. What must hold whatever the interleaving: the ledger is append-only (no
//! row changed or removed), each account's balance is the sum of its ledger, and no
//! millisecond of any meter is billed twice or left out (a meter's usage periods tile its
//! life exactly).

use crate::billing::{LedgerEntry, MeterSpec};
use crate::harness::{TestDb, TestStore};
use crate::store_tests;
use crate::{NewSandbox, Store};

const T0: i64 = 1_000_000;
const ROUNDS: i64 = 60;
const TICK_MS: i64 = 1_000;
/// Rates chosen so that no tick bills a whole number of nano-dollars: the carry matters.
const RATES: [(i64, i64); 4] = [(2_500, 0), (1_333, 7), (997, 3), (10_001, 0)];

fn sandbox(id: &str, running: i64, paused: i64) -> NewSandbox {
    NewSandbox {
        meter: MeterSpec { vcpus: 1, memory_mib: 512, running_nanos_per_sec: running, paused_nanos_per_sec: paused },
        ..crate::fixture::running_sandbox(id, "prj_a", "node_local", T0)
    }
}

async fn ledger(s: &dyn Store) -> Vec<LedgerEntry> {
    let mut all = s.ledger_page("acc_1", None, u32::MAX, true).await.unwrap();
    all.reverse();
    all
}

/// Both replicas' ticks at (nearly) the same time, each in its own task.
async fn tick_both(a: &TestStore, b: &TestStore, now: i64) {
    let (a, b) = (a.clone(), b.clone());
    let (ra, rb) = tokio::join!(
        tokio::spawn(async move { a.bill_meters(now).await }),
        // The other replica's clock is a few ms ahead: overlapping intervals, not equal ones.
        tokio::spawn(async move { b.bill_meters(now + 7).await }),
    );
    ra.unwrap().unwrap();
    rb.unwrap().unwrap();
}

async fn concurrent_replicas_never_bill_twice(db: TestDb) {
    let a = db.seeded("acc_1", &[("ws_a", "prj_a")]).await;
    let b = db.open().await;
    a.grant_signup_credits(1_000_000_000_000, 0).await.unwrap();
    let ids: Vec<String> = (0..RATES.len()).map(|i| format!("sbx_{i}")).collect();
    for (id, &(running, paused)) in ids.iter().zip(&RATES) {
        a.insert_sandbox(&sandbox(id, running, paused)).await.unwrap();
    }

    let mut half = Vec::new();
    for round in 1..=ROUNDS {
        let now = T0 + round * TICK_MS;
        if round == ROUNDS / 3 {
            // A kill on one replica while both tick (after their watermarks, whichever
            // runs first: an end never moves a watermark back).
            let (a2, b2, c) = (a.clone(), b.clone(), a.clone());
            let end = tokio::spawn(async move { c.end_sandbox("sbx_3", now + 300, "killed").await });
            tokio::join!(tick_both(&a2, &b2, now), async { assert!(end.await.unwrap().unwrap()) });
        } else {
            tick_both(&a, &b, now).await;
        }
        if round == ROUNDS / 2 {
            half = ledger(&*a).await;
        }
    }
    let end = T0 + ROUNDS * TICK_MS + 500;
    for id in &ids[..3] {
        let (a2, b2) = (a.clone(), b.clone());
        let (x, y) = tokio::join!(a2.end_sandbox(id, end, "killed"), b2.end_sandbox(id, end, "timeout"));
        assert!(x.unwrap() ^ y.unwrap(), "{id} ends once, by one replica");
    }
    tick_both(&a, &b, end + 10_000).await;

    let all = ledger(&*b).await;
    // Append-only: what the ledger held halfway is still there, row for row, in order.
    assert!(!half.is_empty());
    assert_eq!(&all[..half.len()], &half[..], "no ledger row changed or removed");
    assert!(all.windows(2).all(|w| w[0].seq < w[1].seq));
    // Balance = sum of the ledger, read through either replica.
    for s in [&a, &b] {
        assert_eq!(s.balance("acc_1").await.unwrap().balance_nanos, s.ledger_sum("acc_1").await.unwrap());
    }
    let sum: i64 = all.iter().map(|e| e.amount_nanos).sum();
    assert_eq!(a.ledger_sum("acc_1").await.unwrap(), sum);
    // Each meter's usage periods tile its life: no gap, no overlap, nothing twice.
    for (id, &(running, _)) in ids.iter().zip(&RATES) {
        let usage: Vec<&LedgerEntry> = all.iter().filter(|e| e.sandbox_id.as_deref() == Some(id.as_str())).collect();
        let ended_at = if id == "sbx_3" { T0 + (ROUNDS / 3) * TICK_MS + 300 } else { end };
        let mut at = T0;
        for e in &usage {
            assert_eq!(e.period_start, Some(at), "{id}: periods follow each other exactly: {usage:#?}");
            let stop = e.period_end.unwrap();
            assert!(stop > at);
            assert_eq!(e.quantity_ms, Some(stop - at));
            at = stop;
        }
        assert_eq!(at, ended_at, "{id}: billed up to its end, not beyond");
        let billed_ms: i64 = usage.iter().map(|e| e.quantity_ms.unwrap()).sum();
        assert_eq!(billed_ms, ended_at - T0, "{id}: billed seconds = metered time");
        let charged: i64 = usage.iter().map(|e| -e.amount_nanos).sum();
        assert_eq!(charged, (ended_at - T0) * running / 1000, "{id}: the carry loses nothing, adds nothing");
    }
    assert!(a.open_meters(None).await.unwrap().is_empty());
}

/// Replicas starting at once on a fresh database: the migrations and the first-start
/// bootstrap happen once.
async fn replicas_starting_at_once_migrate_and_bootstrap_once(db: TestDb) {
    use crate::{AccountRecord, KeyRecord};
    // Opened concurrently (one task: an open's future is not `Send` for every lifetime,
    // which a spawned task needs; their queries still interleave at each await).
    let stores = futures_util::future::join_all((0..4).map(|_| db.open())).await;
    let boots: Vec<_> = stores
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let s = s.clone();
            tokio::spawn(async move {
                let account =
                    AccountRecord { id: format!("acc_{i}"), email: "o@x".into(), plan: "free".into(), created_at: 1 };
                let key = KeyRecord {
                    id: format!("key_{i}"),
                    account_id: account.id.clone(),
                    name: "owner".into(),
                    prefix: format!("lz_{i}"),
                    hash: vec![1; 32],
                    scope: None,
                    created_at: 1,
                    revoked_at: None,
                };
                s.bootstrap(&account, &key).await.unwrap()
            })
        })
        .collect();
    let mut booted = 0;
    for b in boots {
        booted += usize::from(b.await.unwrap());
    }
    assert_eq!(booted, 1, "one first start");
    assert_eq!(stores[0].schema_version().await, db.known_version());
}

store_tests!(concurrent_replicas_never_bill_twice, replicas_starting_at_once_migrate_and_bootstrap_once);
