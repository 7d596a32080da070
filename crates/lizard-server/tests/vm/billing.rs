//! Billing against a real server: HTTP on loopback, a SQLite file, the node in process,
//! and (in the `vm_` tests) real microVMs: per-second charges, paused sandboxes accruing
//! nothing, 402 at zero balance, pausing at zero, scoped keys kept out of billing and in
//! their own metrics, and pagination. Every test ends by checking that the balance is the
//! sum of the ledger, read through the API.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::Api;
use lizard_server::billing::BillingConfig;
use lizard_store::billing::{LedgerKind, NewCredit};
use lizard_store::{MeterSpec, NewSandbox, OnTimeout, SandboxState};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

fn now_ms() -> i64 {
    lizard_api::ids::now_ms()
}

/// A server with the node in process, the timeout reaper and its metering task running.
async fn start(billing: BillingConfig) -> Api {
    Api::builder("lizard-billing-test-").reaper().metering(billing).start().await
}

/// What these tests ask of the shared harness beyond requests.
trait BillingApi {
    async fn all_transactions(&self, limit: u32) -> Vec<Value>;
    async fn assert_balance_is_ledger_sum(&self);
    async fn tenant(&self, name: &str) -> (String, String, String);
    async fn record_sandbox(&self, id: &str, project: &str, created_at: i64);
    async fn usage_of(&self, sandbox: &str) -> Vec<Value>;
    async fn fails_with(&self, method: &str, path: &str, key: &str, status: u16, code: &str);
}

impl BillingApi for Api {
    /// A request that must fail with `status` and `code`.
    async fn fails_with(&self, method: &str, path: &str, key: &str, status: u16, code: &str) {
        let (s, v) = self.call(method, path, key, None).await;
        assert_eq!((s, v["code"].as_str().unwrap_or("")), (status, code), "{method} {path}: {v}");
    }

    /// Every ledger entry through the API, following cursors (bounded).
    async fn all_transactions(&self, limit: u32) -> Vec<Value> {
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..10_000 {
            let mut uri = format!("/v1/billing/transactions?includeUsage=true&limit={limit}");
            if let Some(c) = &cursor {
                uri.push_str(&format!("&cursor={c}"));
            }
            let page = self.ok("GET", &uri, &self.owner, None).await;
            out.extend(page["items"].as_array().unwrap().iter().cloned());
            match page["nextCursor"].as_str() {
                Some(c) => cursor = Some(c.to_string()),
                None => return out,
            }
        }
        panic!("pagination did not end");
    }

    /// The balance the API reports is the sum of every ledger entry it lists. Metering
    /// may tick between the two reads, so both are read until they are from one instant.
    async fn assert_balance_is_ledger_sum(&self) {
        for _ in 0..20 {
            let before =
                self.ok("GET", "/v1/billing/balance", &self.owner, None).await["balanceNanos"].as_i64().unwrap();
            let sum: i64 = self.all_transactions(1000).await.iter().map(|t| t["amountNanos"].as_i64().unwrap()).sum();
            let after =
                self.ok("GET", "/v1/billing/balance", &self.owner, None).await["balanceNanos"].as_i64().unwrap();
            if before == after {
                assert_eq!(before, sum, "balance is the sum of the ledger");
                let store_sum = self.state.server.store.ledger_sum(&self.account).await.unwrap();
                assert_eq!(store_sum, sum);
                return;
            }
        }
        panic!("the balance never held still");
    }

    /// A workspace, a project in it, and a key scoped to the workspace.
    async fn tenant(&self, name: &str) -> (String, String, String) {
        let w = self.ok("POST", "/v1/workspaces", &self.owner, Some(json!({"name": name}))).await;
        let w = w["id"].as_str().unwrap().to_string();
        let p = self.ok("POST", "/v1/projects", &self.owner, Some(json!({"workspaceId": w, "name": "p"}))).await;
        let p = p["id"].as_str().unwrap().to_string();
        let k = self.ok("POST", "/v1/api-keys", &self.owner, Some(json!({"name": name, "workspaces": [w]}))).await;
        (w, p, k["key"].as_str().unwrap().to_string())
    }

    /// What the sandbox routes record when a sandbox starts, without a VM (for the tests
    /// of what billing does with the records).
    async fn record_sandbox(&self, id: &str, project: &str, created_at: i64) {
        let spec: MeterSpec = self.state.server.config.billing.pricing.meter(1, 512);
        let s = NewSandbox {
            id: id.into(),
            project_id: project.into(),
            template: "base".into(),
            state: SandboxState::Running,
            created_at,
            timeout_at: None,
            metadata: Default::default(),
            on_timeout: OnTimeout::Kill,
            timeout_ms: None,
            meter: spec,
            template_ref: None,
            node_id: "node_local".into(),
        };
        self.state.server.store.insert_sandbox(&s).await.unwrap();
    }

    async fn usage_of(&self, sandbox: &str) -> Vec<Value> {
        let mut u: Vec<Value> =
            self.all_transactions(1000).await.into_iter().filter(|t| t["sandboxId"] == sandbox).collect();
        u.reverse();
        u
    }
}

/// Metering off in practice (an hour between ticks): the tests drive `bill_meters`.
fn manual_metering() -> BillingConfig {
    BillingConfig { tick: Duration::from_secs(3600), ..BillingConfig::default() }
}

fn ids_of(v: &Value, field: &str) -> BTreeSet<String> {
    v.as_array().unwrap().iter().map(|x| x[field].as_str().unwrap().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn new_accounts_start_with_ten_dollars() {
    let api = start(manual_metering()).await;
    let b = api.ok("GET", "/v1/billing/balance", &api.owner, None).await;
    assert_eq!(b, json!({"balanceNanos": 10_000_000_000i64, "balance": "10.00", "currency": "USD"}));
    let t = api.ok("GET", "/v1/billing/transactions", &api.owner, None).await;
    assert_eq!(t["items"][0]["kind"], "signup_credit");
    assert_eq!(t["items"][0]["amount"], "10.00");
    assert!(t.get("nextCursor").is_none());
    api.assert_balance_is_ledger_sum().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn scoped_keys_are_refused_on_billing_and_read_only_their_own_metrics() {
    let api = start(manual_metering()).await;
    let (w1, p1, k1) = api.tenant("u1").await;
    let (w2, p2, _k2) = api.tenant("u2").await;
    let kp2 = api.ok("POST", "/v1/api-keys", &api.owner, Some(json!({"name": "p2only", "projects": [p2]}))).await;
    let kp2 = kp2["key"].as_str().unwrap().to_string();
    let t0 = now_ms() - 5_000;
    api.record_sandbox("sbx_one", &p1, t0).await;
    api.record_sandbox("sbx_two", &p2, t0).await;
    api.state.server.store.end_sandbox("sbx_two", t0 + 2_000, "killed").await.unwrap();
    api.state.server.store.bill_meters(t0 + 5_000).await.unwrap();

    for key in [&k1, &kp2] {
        for path in [
            "/v1/billing/balance",
            "/v1/billing/transactions",
            "/v1/billing/transactions?includeUsage=true&limit=5",
            "/v1/billing/summary",
            "/v1/billing/live",
            "/v1/account",
        ] {
            api.fails_with("GET", path, key, 403, "ACCOUNT_SCOPE_REQUIRED").await;
        }
        let me = api.ok("GET", "/v1/whoami", key, None).await;
        for field in ["email", "plan", "balance", "balanceNanos"] {
            assert!(me.get(field).is_none(), "scoped whoami shows no {field}: {me}");
        }
    }

    // The workspace key: its workspace's total and its project, nothing of u2's.
    let m = api.ok("GET", "/v1/metrics", &k1, None).await;
    assert_eq!(ids_of(&m["workspaces"], "workspaceId"), BTreeSet::from([w1.clone()]));
    assert_eq!(ids_of(&m["projects"], "projectId"), BTreeSet::from([p1.clone()]));
    let p = &m["projects"][0];
    assert_eq!((p["sandboxSeconds"].as_i64(), p["sandboxMs"].as_i64()), (Some(5), Some(5_000)));
    assert_eq!(p["costNanos"], 5 * 2_500);
    assert_eq!(p["running"], 1);
    api.fails_with("GET", &format!("/v1/metrics?workspaceId={w2}"), &k1, 404, "NOT_FOUND").await;
    api.fails_with("GET", &format!("/v1/metrics?projectId={p2}"), &k1, 404, "NOT_FOUND").await;
    let only = api.ok("GET", &format!("/v1/metrics?projectId={p1}"), &k1, None).await;
    assert_eq!(ids_of(&only["projects"], "projectId"), BTreeSet::from([p1.clone()]));

    // The project key: its project only, and no workspace total (it does not see u2's
    // workspace whole), even when filtering on the workspace its project lives in.
    for uri in ["/v1/metrics".to_string(), format!("/v1/metrics?workspaceId={w2}")] {
        let m = api.ok("GET", &uri, &kp2, None).await;
        assert_eq!(m["workspaces"], json!([]));
        assert_eq!(ids_of(&m["projects"], "projectId"), BTreeSet::from([p2.clone()]));
        assert_eq!(m["projects"][0]["sandboxMs"], 2_000);
        assert_eq!(m["projects"][0]["running"], 0);
    }
    api.fails_with("GET", &format!("/v1/metrics?workspaceId={w1}"), &kp2, 404, "NOT_FOUND").await;

    // The owner sees everything, and the account-wide views add up.
    let m = api.ok("GET", "/v1/metrics", &api.owner, None).await;
    assert_eq!(ids_of(&m["workspaces"], "workspaceId"), BTreeSet::from([w1.clone(), w2.clone()]));
    let live = api.ok("GET", "/v1/billing/live", &api.owner, None).await;
    assert_eq!(ids_of(&live["sandboxes"], "sandboxId"), BTreeSet::from(["sbx_one".to_string()]));
    assert_eq!(live["burnNanosPerSecond"], 2_500);
    assert_eq!(live["burnPerHour"], "0.009");
    let s = api.ok("GET", "/v1/billing/summary", &api.owner, None).await;
    assert_eq!(s["granularity"], "month");
    let period = &s["periods"][0];
    assert_eq!(period["usageNanos"], 7 * 2_500);
    assert_eq!(period["creditsNanos"], 10_000_000_000i64);
    assert_eq!(ids_of(&period["workspaces"], "workspaceId"), BTreeSet::from([w1, w2]));
    let day = api.ok("GET", "/v1/billing/summary?granularity=day&periods=1", &api.owner, None).await;
    assert_eq!(day["periods"].as_array().unwrap().len(), 1);
    api.fails_with("GET", "/v1/billing/summary?granularity=week", &api.owner, 422, "INVALID_ARGUMENT").await;
    api.fails_with("GET", "/v1/metrics?from=yesterday", &api.owner, 422, "INVALID_ARGUMENT").await;
    api.assert_balance_is_ledger_sum().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_key_reads_the_cost_so_far_of_its_own_sandboxes_only() {
    let api = start(manual_metering()).await;
    let (_, p1, k1) = api.tenant("c1").await;
    let (_, p2, k2) = api.tenant("c2").await;
    let t0 = now_ms() - 5_000;
    api.record_sandbox("sbx_cost1", &p1, t0).await;
    api.record_sandbox("sbx_cost2", &p2, t0).await;
    let store = &api.state.server.store;
    store.bill_meters(t0 + 1_000).await.unwrap();
    store.bill_meters(t0 + 3_000).await.unwrap();
    store.end_sandbox("sbx_cost2", t0 + 4_000, "killed").await.unwrap();

    // A scoped key: its own sandbox (charged: every tick; unbilled: since the last one);
    // another workspace's and unknown ids are left out, as if they did not exist.
    let costs = api.ok("GET", "/v1/billing/sandboxes?ids=sbx_cost1,sbx_cost2,sbx_nope", &k1, None).await;
    assert_eq!(costs.as_array().unwrap().len(), 1, "{costs}");
    let c = &costs[0];
    assert_eq!((c["sandboxId"].as_str(), c["chargedNanos"].as_i64()), (Some("sbx_cost1"), Some(3 * 2_500)));
    let unbilled = c["unbilledNanos"].as_i64().unwrap();
    assert!(unbilled >= 2 * 2_500, "{c}");
    assert_eq!(c["costNanos"].as_i64(), Some(3 * 2_500 + unbilled));
    assert_eq!(c["cost"], lizard_api::format_usd(3 * 2_500 + unbilled));
    assert_eq!(api.ok("GET", "/v1/billing/sandboxes?ids=sbx_cost1", &k2, None).await, json!([]));
    // The owner: both, in the order asked; an ended sandbox accrues nothing more.
    let costs = api.ok("GET", "/v1/billing/sandboxes?ids=sbx_cost2,sbx_cost1,sbx_cost2", &api.owner, None).await;
    assert_eq!(ids_of(&costs, "sandboxId").len(), 2);
    assert_eq!(
        costs[0],
        json!({"sandboxId": "sbx_cost2", "chargedNanos": 4 * 2_500, "unbilledNanos": 0, "costNanos": 4 * 2_500, "cost": lizard_api::format_usd(4 * 2_500)})
    );
    assert_eq!(costs[1]["sandboxId"], "sbx_cost1");
    // What they cost is what the ledger says.
    let charged: i64 = api.usage_of("sbx_cost2").await.iter().map(|t| -t["amountNanos"].as_i64().unwrap()).sum();
    assert_eq!(charged, 4 * 2_500);

    let many = (0..=lizard_api::MAX_COST_IDS).map(|i| format!("sbx_{i}")).collect::<Vec<_>>().join(",");
    for uri in [
        "/v1/billing/sandboxes?ids=".to_string(),
        "/v1/billing/sandboxes".into(),
        format!("/v1/billing/sandboxes?ids={many}"),
    ] {
        api.fails_with("GET", &uri, &k1, 422, "INVALID_ARGUMENT").await;
    }
    api.fails_with("GET", "/v1/billing/sandboxes?ids=sbx_cost1", "lz_not-a-key", 401, "UNAUTHENTICATED").await;
    api.assert_balance_is_ledger_sum().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pagination_returns_every_transaction_exactly_once() {
    let api = start(manual_metering()).await;
    let (_, p1, _) = api.tenant("u1").await;
    let t0 = now_ms() - 100_000;
    api.record_sandbox("sbx_many", &p1, t0).await;
    for i in 1..=40 {
        api.state.server.store.bill_meters(t0 + i * 1_000).await.unwrap();
    }
    for i in 0..3 {
        let c = NewCredit {
            account_id: api.account.clone(),
            kind: LedgerKind::Credit,
            amount_nanos: 1_000 + i,
            description: "test".into(),
            idempotency_key: format!("k{i}"),
            at: now_ms(),
        };
        api.state.server.store.add_credit(&c).await.unwrap();
    }
    let everything = api.all_transactions(1000).await;
    assert_eq!(everything.len(), 1 + 40 + 3);
    for limit in [1, 7, 43, 44, 45] {
        let paged = api.all_transactions(limit).await;
        let ids: Vec<&str> = paged.iter().map(|t| t["id"].as_str().unwrap()).collect();
        let unique: BTreeSet<&str> = ids.iter().copied().collect();
        assert_eq!((ids.len(), unique.len()), (everything.len(), everything.len()), "limit {limit}");
        assert_eq!(paged, everything, "limit {limit}: same entries in the same order");
    }
    // Without usage: the credits only, newest first.
    let credits = api.ok("GET", "/v1/billing/transactions?limit=2", &api.owner, None).await;
    let kinds: Vec<&str> = credits["items"].as_array().unwrap().iter().map(|t| t["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["credit", "credit"]);
    let rest = api
        .ok(
            "GET",
            &format!("/v1/billing/transactions?limit=2&cursor={}", credits["nextCursor"].as_str().unwrap()),
            &api.owner,
            None,
        )
        .await;
    let kinds: Vec<&str> = rest["items"].as_array().unwrap().iter().map(|t| t["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["credit", "signup_credit"]);
    for bad in ["limit=0", "limit=1001", "cursor=abc", "cursor=-4", "includeUsage=maybe", "page=2"] {
        api.fails_with("GET", &format!("/v1/billing/transactions?{bad}"), &api.owner, 422, "INVALID_ARGUMENT").await;
    }
    api.assert_balance_is_ledger_sum().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn creating_at_zero_balance_is_payment_required_and_starts_nothing() {
    let api = start(BillingConfig { signup_credit_nanos: 0, ..manual_metering() }).await;
    let (_, p1, k1) = api.tenant("u1").await;
    for key in [&api.owner, &k1] {
        let (status, v) =
            api.call("POST", "/v1/sandboxes", key, Some(json!({"template": "base", "projectId": p1}))).await;
        assert_eq!((status, v["code"].as_str()), (402, Some("PAYMENT_REQUIRED")), "{v}");
        assert!(v["message"].as_str().unwrap().contains("balance"), "{v}");
    }
    assert!(api.node.list().is_empty(), "no VM started");
    assert_eq!(api.ok("GET", "/v1/sandboxes", &api.owner, None).await, json!([]));
    // A volume accrues from its create: refused the same way, no record, no disk.
    let (status, v) =
        api.call("POST", "/v1/volumes", &k1, Some(json!({"name": "data", "projectId": p1, "sizeGb": 1}))).await;
    assert_eq!((status, v["code"].as_str()), (402, Some("PAYMENT_REQUIRED")), "{v}");
    assert!(v["message"].as_str().unwrap().contains("volumes"), "{v}");
    assert_eq!(api.ok("GET", "/v1/volumes", &api.owner, None).await, json!([]));
    let disks = std::fs::read_dir(api.dir.path().join("node/volumes")).map(Iterator::count).unwrap_or(0);
    assert_eq!(disks, 0, "no volume disk made");
    let b = api.ok("GET", "/v1/billing/balance", &api.owner, None).await;
    assert_eq!(b["balanceNanos"], 0);
    assert!(b["depletedSince"].is_string(), "{b}");
    api.assert_balance_is_ledger_sum().await;
}

/// Seconds between two instants, in ms.
fn ms_between(a: Instant, b: Instant) -> i64 {
    i64::try_from(b.duration_since(a).as_millis()).expect("a test runs for less than 292 million years")
}

#[tokio::test(flavor = "multi_thread")]
async fn vm_charges_the_seconds_run_and_nothing_while_paused() {
    let api = start(BillingConfig { tick: Duration::from_millis(500), ..BillingConfig::default() }).await;
    let (_, p1, k1) = api.tenant("u1").await;
    let created = api.ok("POST", "/v1/sandboxes", &k1, Some(json!({"template": "base", "projectId": p1}))).await;
    let t_created = Instant::now();
    let id = created["sandboxId"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let t_pause_call = Instant::now();
    let paused = api.ok("POST", &format!("/v1/sandboxes/{id}/pause"), &k1, None).await;
    let t_paused = Instant::now();
    assert_eq!(paused["state"], "paused");
    let ran = api.usage_of(&id).await;
    let ran_ms: i64 = ran.iter().map(|u| u["quantityMs"].as_i64().unwrap()).sum();
    let charged: i64 = ran.iter().map(|u| -u["amountNanos"].as_i64().unwrap()).sum();
    // From create's answer to the pause being recorded, within a second either side.
    let (lo, hi) = (ms_between(t_created, t_pause_call) - 1_000, ms_between(t_created, t_paused) + 1_000);
    assert!((lo..=hi).contains(&ran_ms), "ran {ran_ms} ms, expected {lo}..={hi}");
    assert_eq!(charged, ran_ms * 2_500 / 1_000, "1 vCPU / 512 MiB at 2500 n$/s");
    assert!(ran.iter().all(|u| u["usageKind"] == "compute" && u["nanosPerSecond"] == 2_500));
    // Consecutive, non-overlapping intervals.
    for pair in ran.windows(2) {
        assert_eq!(pair[0]["periodEnd"], pair[1]["periodStart"]);
    }

    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(api.usage_of(&id).await.len(), ran.len(), "a paused sandbox accrues nothing");
    let live = api.ok("GET", "/v1/billing/live", &api.owner, None).await;
    assert_eq!(live["sandboxes"][0]["state"], "paused");
    assert_eq!(live["burnNanosPerSecond"], 0);
    let m = api.ok("GET", &format!("/v1/metrics?projectId={p1}"), &k1, None).await;
    assert_eq!(m["projects"][0]["sandboxMs"], ran_ms);
    assert_eq!(m["projects"][0]["running"], 0);

    api.ok("DELETE", &format!("/v1/sandboxes/{id}"), &k1, None).await;
    assert_eq!(api.usage_of(&id).await.len(), ran.len(), "killing a paused sandbox bills nothing more");
    assert_eq!(api.ok("GET", "/v1/billing/live", &api.owner, None).await["sandboxes"], json!([]));
    api.assert_balance_is_ledger_sum().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn vm_running_sandboxes_are_paused_after_the_grace_period_at_zero() {
    // 2 s of credit at the default size, then 1 s of grace.
    let billing = BillingConfig {
        signup_credit_nanos: 5_000,
        tick: Duration::from_millis(500),
        grace: Duration::from_secs(1),
        ..BillingConfig::default()
    };
    let api = start(billing).await;
    let (_, p1, k1) = api.tenant("u1").await;
    let created = api.ok("POST", "/v1/sandboxes", &k1, Some(json!({"template": "base", "projectId": p1}))).await;
    let id = created["sandboxId"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let live = api.ok("GET", "/v1/billing/live", &api.owner, None).await;
        if live["sandboxes"][0]["state"] == "paused" {
            break;
        }
        assert!(Instant::now() < deadline, "not paused at zero balance: {live}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let b = api.ok("GET", "/v1/billing/balance", &api.owner, None).await;
    assert!(b["balanceNanos"].as_i64().unwrap() <= 0, "{b}");
    let depleted = b["depletedSince"].as_str().expect("depleted");
    assert!(!depleted.is_empty());
    // Paused, not destroyed: the node still has it, saved.
    let info = api.node.get(&id).unwrap().info();
    assert_eq!(info.state, lizard_api::SandboxState::Paused);
    let (status, v) = api.call("POST", "/v1/sandboxes", &k1, Some(json!({"template": "base", "projectId": p1}))).await;
    assert_eq!((status, v["code"].as_str()), (402, Some("PAYMENT_REQUIRED")));
    let resume = format!("/v1/sandboxes/{id}/resume");
    let (status, v) = api.call("POST", &resume, &k1, None).await;
    assert_eq!((status, v["code"].as_str()), (402, Some("PAYMENT_REQUIRED")), "{v}");
    let (status, v) = api.call("POST", &format!("/v1/sandboxes/{id}/connect"), &k1, None).await;
    assert_eq!((status, v["code"].as_str()), (402, Some("PAYMENT_REQUIRED")), "{v}");
    // Nothing accrues while paused, so the debt stops growing.
    let before = api.state.server.store.ledger_sum(&api.account).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(api.state.server.store.ledger_sum(&api.account).await.unwrap(), before);
    // Credits in, and it runs again, metered again.
    let c = NewCredit {
        account_id: api.account.clone(),
        kind: LedgerKind::Credit,
        amount_nanos: 1_000_000_000,
        description: "top-up".into(),
        idempotency_key: "top-up-1".into(),
        at: now_ms(),
    };
    api.state.server.store.add_credit(&c).await.unwrap();
    let resumed = api.ok("POST", &resume, &k1, None).await;
    assert_eq!(resumed["state"], "running");
    let live = api.ok("GET", "/v1/billing/live", &api.owner, None).await;
    assert_eq!(
        (live["sandboxes"][0]["state"].as_str(), live["burnNanosPerSecond"].as_i64()),
        (Some("running"), Some(2_500))
    );
    api.ok("DELETE", &format!("/v1/sandboxes/{id}"), &k1, None).await;
    api.assert_balance_is_ledger_sum().await;
}
