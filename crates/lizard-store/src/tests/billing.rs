//! The ledger, balances and meters (one replica; two at once: [`super::replicas`]).

use crate::billing::*;
use crate::harness::{TestDb, TestStore};
use crate::store_tests;
use crate::{NewSandbox, SandboxState, Store, StoreError};

const RATE: i64 = 2_500;

async fn seeded(db: &TestDb) -> TestStore {
    db.seeded("acc_1", &[("ws_a", "prj_a"), ("ws_b", "prj_b")]).await
}

fn sbx(id: &str, project: &str, at: i64, paused_rate: i64) -> NewSandbox {
    NewSandbox {
        meter: MeterSpec { vcpus: 1, memory_mib: 512, running_nanos_per_sec: RATE, paused_nanos_per_sec: paused_rate },
        ..crate::fixture::running_sandbox(id, project, "node_local", at)
    }
}

async fn usage_of(s: &dyn Store, sandbox: &str) -> Vec<LedgerEntry> {
    let mut all = s.ledger_page("acc_1", None, 1000, true).await.unwrap();
    all.retain(|e| e.sandbox_id.as_deref() == Some(sandbox));
    all.reverse();
    all
}

async fn assert_balanced(s: &dyn Store) {
    assert_eq!(s.balance("acc_1").await.unwrap().balance_nanos, s.ledger_sum("acc_1").await.unwrap());
}

async fn ledger_is_append_only(db: TestDb) {
    let s = seeded(&db).await;
    s.grant_signup_credits(10, 5).await.unwrap();
    let upd = s.exec("UPDATE ledger SET amount_nanos = 1000000").await;
    assert!(upd.unwrap_err().contains("append-only"));
    let del = s.exec("DELETE FROM ledger").await;
    assert!(del.unwrap_err().contains("append-only"));
    if db.engine() == crate::harness::Engine::Postgres {
        // PostgreSQL also has TRUNCATE, which no row trigger sees (SQLite has none).
        let truncate = s.exec("TRUNCATE ledger").await;
        assert!(truncate.unwrap_err().contains("append-only"));
    }
    assert_eq!(s.ledger_sum("acc_1").await.unwrap(), 10);
}

async fn signup_credits_once_and_idempotent_credits(db: TestDb) {
    let s = seeded(&db).await;
    assert_eq!(s.grant_signup_credits(10_000, 5).await.unwrap(), 1);
    assert_eq!(s.grant_signup_credits(10_000, 6).await.unwrap(), 0, "once per account");
    let c = NewCredit {
        account_id: "acc_1".into(),
        kind: LedgerKind::Credit,
        amount_nanos: 5_000,
        description: "top-up".into(),
        idempotency_key: "k1".into(),
        at: 7,
    };
    let first = s.add_credit(&c).await.unwrap();
    assert!(matches!(first, CreditOutcome::Added(_)));
    let again = s.add_credit(&c).await.unwrap();
    assert_eq!(again, CreditOutcome::AlreadyAdded(first.entry().clone()));
    let other = NewCredit { amount_nanos: 6_000, ..c.clone() };
    assert!(matches!(s.add_credit(&other).await, Err(StoreError::Conflict(_))));
    let nobody = NewCredit { account_id: "acc_x".into(), ..c.clone() };
    assert!(matches!(s.add_credit(&nobody).await, Err(StoreError::NotFound(_))));
    assert_eq!(s.balance("acc_1").await.unwrap(), BalanceRecord { balance_nanos: 15_000, depleted_at: None });
    assert_balanced(&*s).await;
}

async fn ticks_and_end_bill_each_millisecond_once(db: TestDb) {
    let s = seeded(&db).await;
    s.grant_signup_credits(1_000_000_000, 0).await.unwrap();
    s.insert_sandbox(&sbx("sbx_1", "prj_a", 10_000, 0)).await.unwrap();
    assert_eq!(s.bill_meters(13_000).await.unwrap(), 1);
    assert_eq!(s.bill_meters(13_000).await.unwrap(), 0, "nothing accrued since");
    assert_eq!(s.bill_meters(12_000).await.unwrap(), 0, "time going back bills nothing");
    s.bill_meters(14_500).await.unwrap();
    assert!(s.end_sandbox("sbx_1", 20_000, "killed").await.unwrap());
    s.bill_meters(100_000).await.unwrap();
    assert!(!s.end_sandbox("sbx_1", 30_000, "again").await.unwrap());
    let u = usage_of(&*s, "sbx_1").await;
    let periods: Vec<(i64, i64)> = u.iter().map(|e| (e.period_start.unwrap(), e.period_end.unwrap())).collect();
    assert_eq!(periods, [(10_000, 13_000), (13_000, 14_500), (14_500, 20_000)]);
    let charged: i64 = u.iter().map(|e| -e.amount_nanos).sum();
    assert_eq!(charged, 10 * RATE, "10 s at 2500 n$/s");
    assert_eq!(u[0].workspace_id.as_deref(), Some("ws_a"));
    assert_eq!(u[0].usage_kind.as_deref(), Some("compute"));
    assert!(s.open_meters(None).await.unwrap().is_empty());
    assert_balanced(&*s).await;
}

async fn paused_sandboxes_accrue_only_their_storage_price(db: TestDb) {
    let s = seeded(&db).await;
    s.grant_signup_credits(1_000_000_000, 0).await.unwrap();
    let now = lizard_api::ids::now_ms();
    s.insert_sandbox(&sbx("sbx_free", "prj_a", now - 4_000, 0)).await.unwrap();
    s.insert_sandbox(&sbx("sbx_store", "prj_a", now - 4_000, 10)).await.unwrap();
    s.set_sandbox_state("sbx_free", SandboxState::Paused).await.unwrap();
    s.set_sandbox_state("sbx_store", SandboxState::Paused).await.unwrap();
    let paused_at = lizard_api::ids::now_ms();
    s.bill_meters(paused_at + 60_000).await.unwrap();
    let free = usage_of(&*s, "sbx_free").await;
    assert_eq!(free.len(), 1, "the running interval only: {free:?}");
    assert!((4_000..4_000 + 2_000).contains(&free[0].quantity_ms.unwrap()));
    let stored = usage_of(&*s, "sbx_store").await;
    assert_eq!(stored.len(), 2);
    assert_eq!(stored[1].usage_kind.as_deref(), Some("paused_storage"));
    // Resume: running is metered again from then on.
    s.set_sandbox_state("sbx_free", SandboxState::Running).await.unwrap();
    let resumed = s.open_meters(Some("acc_1")).await.unwrap();
    let m = resumed.iter().find(|m| m.sandbox_id == "sbx_free").unwrap();
    assert_eq!(m.state, MeterState::Running);
    assert!(m.billed_until.unwrap() >= paused_at);
    assert_balanced(&*s).await;
}

async fn restart_closes_meters_at_their_watermark(db: TestDb) {
    let s = seeded(&db).await;
    s.grant_signup_credits(1_000_000_000, 0).await.unwrap();
    s.insert_sandbox(&sbx("sbx_1", "prj_a", 1_000, 0)).await.unwrap();
    s.insert_sandbox(&sbx("sbx_paused", "prj_a", 1_000, 10)).await.unwrap();
    s.insert_sandbox(&sbx("sbx_kept", "prj_a", 1_000, 20)).await.unwrap();
    s.set_sandbox_state("sbx_paused", SandboxState::Paused).await.unwrap();
    s.bill_meters(6_000).await.unwrap();
    let kept = ["sbx_kept".to_string()];
    assert_eq!(s.close_meters_at_watermark(&kept).await.unwrap(), 1, "running ones not taken back only");
    let open = s.open_meters(None).await.unwrap();
    let states: Vec<_> = open.iter().map(|m| (m.sandbox_id.as_str(), m.state)).collect();
    assert_eq!(
        states,
        [("sbx_kept", MeterState::Running), ("sbx_paused", MeterState::Paused)],
        "a paused sandbox survives a restart, and so does a running one taken back, with their meters"
    );
    // The one taken back ran all along: its next tick bills the downtime too.
    s.bill_meters(16_000).await.unwrap();
    let kept_usage = usage_of(&*s, "sbx_kept").await;
    assert_eq!(kept_usage.iter().map(|e| e.quantity_ms.unwrap()).sum::<i64>(), 15_000);
    // The records are ended at the restart's time; nothing more is billed.
    s.end_sandbox("sbx_1", 60_000, "lost: the server restarted").await.unwrap();
    s.bill_meters(90_000).await.unwrap();
    let u = usage_of(&*s, "sbx_1").await;
    assert_eq!(u.iter().map(|e| e.quantity_ms.unwrap()).sum::<i64>(), 5_000);
}

async fn forced_workspace_delete_bills_up_to_the_delete(db: TestDb) {
    let s = seeded(&db).await;
    s.grant_signup_credits(1_000_000_000, 0).await.unwrap();
    let start = lizard_api::ids::now_ms() - 3_000;
    s.insert_sandbox(&sbx("sbx_1", "prj_a", start, 0)).await.unwrap();
    s.delete_workspace("acc_1", "ws_a", true).await.unwrap();
    let u = usage_of(&*s, "sbx_1").await;
    assert_eq!(u.len(), 1);
    assert!((3_000..5_000).contains(&u[0].quantity_ms.unwrap()));
    assert!(s.open_meters(None).await.unwrap().is_empty(), "the meter closed with the sandbox row");
}

fn volume(id: &str, project: &str, at: i64, nanos_per_sec: i64) -> crate::NewVolume {
    crate::NewVolume {
        id: id.into(),
        project_id: project.into(),
        name: id.into(),
        size_gb: 2,
        node_id: "node_1".into(),
        region: "local".into(),
        created_at: at,
        nanos_per_sec,
        account_quota_gb: 100,
    }
}

async fn volume_usage(s: &dyn Store) -> Vec<LedgerEntry> {
    let mut all = s.ledger_page("acc_1", None, 1000, true).await.unwrap();
    all.retain(|e| e.usage_kind.as_deref() == Some("volume_storage"));
    all.reverse();
    all
}

async fn volumes_are_billed_for_storage_from_create_to_delete(db: TestDb) {
    use crate::NodeRecord;
    let s = seeded(&db).await;
    s.grant_signup_credits(1_000_000_000, 0).await.unwrap();
    s.upsert_node(&NodeRecord { id: "node_1".into(), region: "local".into(), created_at: 1 }).await.unwrap();
    let start = lizard_api::ids::now_ms() - 10_000;
    // 2 GiB at 1 500 n$ per GiB-second: 3 000 n$ a second.
    s.insert_volume(&volume("vol_1", "prj_a", start, 3_000)).await.unwrap();
    s.insert_volume(&volume("vol_free", "prj_a", start, 0)).await.unwrap();
    s.bill_meters(start + 1_500).await.unwrap();
    let u = volume_usage(&*s).await;
    assert_eq!(u.len(), 1, "a free volume leaves no trace");
    assert_eq!((u[0].amount_nanos, u[0].quantity_ms, u[0].sandbox_id.as_deref()), (-4_500, Some(1_500), None));
    s.bill_meters(start + 1_500).await.unwrap();
    assert_eq!(volume_usage(&*s).await.len(), 1, "each millisecond once");
    s.delete_volume("acc_1", "vol_1").await.unwrap();
    let u = volume_usage(&*s).await;
    assert_eq!(u.len(), 2, "billed up to its delete");
    let billed_ms: i64 = u.iter().map(|e| e.quantity_ms.unwrap()).sum();
    assert!((10_000..12_000).contains(&billed_ms), "{billed_ms}");
    s.bill_meters(lizard_api::ids::now_ms() + 60_000).await.unwrap();
    assert_eq!(volume_usage(&*s).await.len(), 2, "a deleted volume costs nothing more");
    // A forced workspace delete bills its volumes up to the delete too.
    s.insert_volume(&volume("vol_2", "prj_a", lizard_api::ids::now_ms() - 2_000, 3_000)).await.unwrap();
    s.delete_workspace("acc_1", "ws_a", true).await.unwrap();
    assert_eq!(volume_usage(&*s).await.len(), 3);
    s.bill_meters(lizard_api::ids::now_ms() + 60_000).await.unwrap();
    assert_eq!(volume_usage(&*s).await.len(), 3);
    assert_balanced(&*s).await;
}

async fn depletion_is_tracked_and_cleared_by_credits(db: TestDb) {
    let s = seeded(&db).await;
    s.grant_signup_credits(5_000, 0).await.unwrap();
    s.insert_sandbox(&sbx("sbx_1", "prj_a", 1_000, 0)).await.unwrap();
    s.bill_meters(2_000).await.unwrap();
    assert_eq!(s.balance("acc_1").await.unwrap().depleted_at, None);
    s.bill_meters(3_000).await.unwrap();
    assert_eq!(s.balance("acc_1").await.unwrap(), BalanceRecord { balance_nanos: 0, depleted_at: Some(3_000) });
    s.bill_meters(4_000).await.unwrap();
    assert_eq!(s.balance("acc_1").await.unwrap().depleted_at, Some(3_000), "since the first time");
    assert_eq!(s.depleted_accounts(2_999).await.unwrap(), Vec::<String>::new());
    assert_eq!(s.depleted_accounts(3_000).await.unwrap(), ["acc_1"]);
    let c = NewCredit {
        account_id: "acc_1".into(),
        kind: LedgerKind::Credit,
        amount_nanos: 1_000_000,
        description: "top-up".into(),
        idempotency_key: "k".into(),
        at: 5_000,
    };
    s.add_credit(&c).await.unwrap();
    assert_eq!(s.balance("acc_1").await.unwrap().depleted_at, None);
    assert!(s.depleted_accounts(i64::MAX).await.unwrap().is_empty());
    assert_balanced(&*s).await;
}

async fn pages_return_every_entry_once_newest_first(db: TestDb) {
    let s = seeded(&db).await;
    s.grant_signup_credits(1, 0).await.unwrap();
    s.insert_sandbox(&sbx("sbx_1", "prj_a", 0, 0)).await.unwrap();
    for t in 1..=20 {
        s.bill_meters(t * 1_000).await.unwrap();
    }
    let mut seen = Vec::new();
    let mut cursor = None;
    for _ in 0..100 {
        let page = s.ledger_page("acc_1", cursor, 3, true).await.unwrap();
        seen.extend(page.iter().map(|e| e.seq));
        if page.len() < 3 {
            break;
        }
        cursor = page.last().map(|e| e.seq);
    }
    assert_eq!(seen.len(), 21);
    assert!(seen.windows(2).all(|w| w[0] > w[1]), "strictly newest first, no repeats");
    let credits_only = s.ledger_page("acc_1", None, 100, false).await.unwrap();
    assert_eq!(credits_only.len(), 1);
}

async fn usage_by_project_and_period(db: TestDb) {
    let s = seeded(&db).await;
    s.grant_signup_credits(1_000_000_000, 0).await.unwrap();
    s.insert_sandbox(&sbx("sbx_a", "prj_a", 0, 0)).await.unwrap();
    s.insert_sandbox(&sbx("sbx_b", "prj_b", 0, 0)).await.unwrap();
    s.bill_meters(2_000).await.unwrap();
    s.end_sandbox("sbx_b", 4_000, "killed").await.unwrap();
    let by_project = s.usage_by_project("acc_1", None, None).await.unwrap();
    assert_eq!(
        by_project,
        [
            ProjectUsage {
                workspace_id: "ws_a".into(),
                project_id: "prj_a".into(),
                cost_nanos: 2 * RATE,
                sandbox_ms: 2_000,
                running: 1
            },
            ProjectUsage {
                workspace_id: "ws_b".into(),
                project_id: "prj_b".into(),
                cost_nanos: 4 * RATE,
                sandbox_ms: 4_000,
                running: 0
            },
        ]
    );
    let later = s.usage_by_project("acc_1", Some(2_000), None).await.unwrap();
    assert_eq!(later.iter().map(|p| p.sandbox_ms).collect::<Vec<_>>(), [0, 2_000]);
    let rows = s.usage_by_period("acc_1", Granularity::Month, 12).await.unwrap();
    assert!(rows.iter().all(|r| r.period == "1970-01"));
    let credits: i64 = rows.iter().filter(|r| r.workspace_id.is_none()).map(|r| r.amount_nanos).sum();
    assert_eq!(credits, 1_000_000_000);
    let ws_b: i64 = rows.iter().filter(|r| r.workspace_id.as_deref() == Some("ws_b")).map(|r| r.amount_nanos).sum();
    assert_eq!(ws_b, -4 * RATE);
}

async fn charges_sum_each_sandboxs_usage_within_its_account(db: TestDb) {
    let s = seeded(&db).await;
    s.grant_signup_credits(1_000_000_000, 0).await.unwrap();
    s.insert_sandbox(&sbx("sbx_a", "prj_a", 0, 0)).await.unwrap();
    s.insert_sandbox(&sbx("sbx_b", "prj_b", 0, 0)).await.unwrap();
    s.bill_meters(1_000).await.unwrap();
    s.bill_meters(3_000).await.unwrap();
    s.end_sandbox("sbx_b", 4_000, "killed").await.unwrap();
    let ids = |list: &[&str]| list.iter().map(|i| i.to_string()).collect::<Vec<_>>();
    let charged = s.charged_by_sandbox("acc_1", &ids(&["sbx_a", "sbx_b", "sbx_none"])).await.unwrap();
    // Several ticks add up; the credit (no sandbox) counts for none.
    assert_eq!(charged.into_iter().collect::<Vec<_>>(), [("sbx_a".into(), 3 * RATE), ("sbx_b".into(), 4 * RATE)]);
    assert_eq!(usage_of(&*s, "sbx_a").await.len(), 2);
    let one = s.charged_by_sandbox("acc_1", &ids(&["sbx_b"])).await.unwrap();
    assert_eq!(one.into_iter().collect::<Vec<_>>(), [("sbx_b".into(), 4 * RATE)]);
    // Another account's ledger has none of them.
    assert!(s.charged_by_sandbox("acc_other", &ids(&["sbx_a"])).await.unwrap().is_empty());
    assert!(s.charged_by_sandbox("acc_1", &[]).await.unwrap().is_empty());
}

/// A halted sandbox's meter: paused and back, the sandbox's own state untouched; an
/// ended meter is never reopened by a late event.
async fn a_meter_alone_is_paused_and_runs_again(db: TestDb) {
    let s = seeded(&db).await;
    let t0 = lizard_api::ids::now_ms() - 10_000;
    s.insert_sandbox(&sbx("sbx_h", "prj_a", t0, 0)).await.unwrap();
    assert!(s.set_meter_state("sbx_h", MeterState::Paused, t0 + 2_000).await.unwrap());
    assert!(!s.set_meter_state("sbx_h", MeterState::Paused, t0 + 3_000).await.unwrap(), "already paused");
    assert_eq!(s.get_sandbox("sbx_h").await.unwrap().unwrap().state, SandboxState::Running, "the record is untouched");
    assert!(s.set_meter_state("sbx_h", MeterState::Running, t0 + 5_000).await.unwrap());
    s.end_sandbox("sbx_h", t0 + 6_000, "killed").await.unwrap();
    let usage = usage_of(&*s, "sbx_h").await;
    let compute: Vec<_> = usage.iter().map(|e| (e.usage_kind.as_deref(), e.quantity_ms)).collect();
    assert_eq!(compute, [(Some("compute"), Some(2_000)), (Some("compute"), Some(1_000))], "halted time is not compute");
    assert!(!s.set_meter_state("sbx_h", MeterState::Running, t0 + 7_000).await.unwrap(), "an ended meter reopened");
    assert!(!s.set_meter_state("nope", MeterState::Paused, t0).await.unwrap());
    assert!(s.open_meters(Some("acc_1")).await.unwrap().iter().all(|m| m.sandbox_id != "sbx_h"));
    assert_balanced(&*s).await;
}

store_tests!(
    a_meter_alone_is_paused_and_runs_again,
    charges_sum_each_sandboxs_usage_within_its_account,
    ledger_is_append_only,
    signup_credits_once_and_idempotent_credits,
    ticks_and_end_bill_each_millisecond_once,
    paused_sandboxes_accrue_only_their_storage_price,
    restart_closes_meters_at_their_watermark,
    forced_workspace_delete_bills_up_to_the_delete,
    volumes_are_billed_for_storage_from_create_to_delete,
    depletion_is_tracked_and_cleared_by_credits,
    pages_return_every_entry_once_newest_first,
    usage_by_project_and_period
);
