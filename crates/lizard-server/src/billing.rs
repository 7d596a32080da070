//! Per-second billing: prices, the metering task, the 402 guard, and pausing at zero.
//!
//! The ledger and the meters live in the store ([`lizard_store::billing`]); this module
//! holds the policy around them:
//! - [`Pricing`]: what a sandbox of a given size costs a second, in nano-dollars, fixed
//!   on its meter when it is created;
//! - [`run_metering`]: every [`BillingConfig::tick`] it bills each open meter up to now
//!   (one transaction), then pauses the running sandboxes of accounts whose balance has
//!   been at or below zero for [`BillingConfig::grace`];
//! - [`require_funds`]: 402 `PAYMENT_REQUIRED` for creates (sandboxes, volumes) and
//!   resumes at zero balance.
//!
//! **Crash bound.** Metered time reaches the ledger at each tick; a process that dies
//! loses what its sandboxes ran since the last tick (at most one tick, by default 5 s per
//! sandbox), and never bills a millisecond twice (see [`lizard_store::billing`]).

use crate::error::{ApiResult, AppError};
use async_trait::async_trait;
use lizard_api::{ErrorCode, NANOS_PER_USD};
use lizard_store::billing::{MeterRecord, MeterSpec, MeterState};
use lizard_store::Store;
use std::sync::Arc;
use std::time::Duration;

/// Prices, in nano-dollars per second. A size's rate is
/// `vcpus × vcpu + ⌈memory_mib × gib / 1024⌉` (whole nano-dollars a second, so N seconds
/// cost exactly N × rate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pricing {
    /// Per vCPU per second while running. Default 2 000 n$ ($0.0072 an hour).
    pub vcpu_nanos_per_second: i64,
    /// Per GiB of memory per second while running. Default 1 000 n$ ($0.0036 an hour).
    pub gib_nanos_per_second: i64,
    /// Per GiB of memory per second while paused (its saved state). Default 0.
    pub paused_gib_nanos_per_second: i64,
    /// Per GiB of volume per second, from a volume's create to its delete. Default 0.
    pub volume_gib_nanos_per_second: i64,
}

impl Default for Pricing {
    fn default() -> Self {
        Pricing {
            vcpu_nanos_per_second: 2_000,
            gib_nanos_per_second: 1_000,
            paused_gib_nanos_per_second: 0,
            volume_gib_nanos_per_second: 0,
        }
    }
}

fn per_mib(gib_rate: i64, memory_mib: u32) -> i64 {
    (memory_mib as i64 * gib_rate + 1023).div_euclid(1024)
}

impl Pricing {
    /// Nano-dollars a second for a running sandbox of this size.
    pub fn running_rate(&self, vcpus: u32, memory_mib: u32) -> i64 {
        vcpus as i64 * self.vcpu_nanos_per_second + per_mib(self.gib_nanos_per_second, memory_mib)
    }

    /// Nano-dollars a second for a paused sandbox of this size.
    pub fn paused_rate(&self, memory_mib: u32) -> i64 {
        per_mib(self.paused_gib_nanos_per_second, memory_mib)
    }

    /// Nano-dollars a second for a volume of `size_gb`.
    pub fn volume_rate(&self, size_gb: u32) -> i64 {
        i64::from(size_gb).saturating_mul(self.volume_gib_nanos_per_second)
    }

    /// The meter of a new sandbox of this size.
    pub fn meter(&self, vcpus: u32, memory_mib: u32) -> MeterSpec {
        MeterSpec {
            vcpus,
            memory_mib,
            running_nanos_per_sec: self.running_rate(vcpus, memory_mib),
            paused_nanos_per_sec: self.paused_rate(memory_mib),
        }
    }

    /// Refuse negative prices.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("vcpu", self.vcpu_nanos_per_second),
            ("memory", self.gib_nanos_per_second),
            ("paused memory", self.paused_gib_nanos_per_second),
            ("volume", self.volume_gib_nanos_per_second),
        ] {
            if v < 0 {
                return Err(format!("the {name} price must not be negative, got {v}"));
            }
        }
        Ok(())
    }
}

/// Billing settings of a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BillingConfig {
    pub pricing: Pricing,
    /// Free credits every new account starts with (nano-dollars). Default $10.
    pub signup_credit_nanos: i64,
    /// How often running time is written to the ledger; also the most a crash can lose
    /// per sandbox. Default 5 s.
    pub tick: Duration,
    /// How long an account may stay at or below zero before its running sandboxes are
    /// paused. Default 5 minutes.
    pub grace: Duration,
}

impl Default for BillingConfig {
    fn default() -> Self {
        BillingConfig {
            pricing: Pricing::default(),
            signup_credit_nanos: 10 * NANOS_PER_USD,
            tick: Duration::from_secs(5),
            grace: Duration::from_secs(300),
        }
    }
}

/// 402 `PAYMENT_REQUIRED` when the account's balance is zero or below: no new sandbox may
/// start (create) or run again (resume) on it, and no new volume be made.
pub async fn require_funds(store: &dyn Store, account_id: &str) -> ApiResult<()> {
    let b = store.balance(account_id).await?;
    if b.balance_nanos <= 0 {
        return Err(AppError::new(
            ErrorCode::PaymentRequired,
            format!(
                "the account's balance is {} USD: creating sandboxes and volumes and resuming \
                 sandboxes needs credits; ask the operator to add some (lizard billing credit)",
                lizard_api::format_usd(b.balance_nanos)
            ),
        ));
    }
    Ok(())
}

/// Pauses a running sandbox when its account ran out of credits (the sandbox routes'
/// pause: its VM state saved, nothing destroyed).
#[async_trait]
pub trait SandboxPauser: Send + Sync + 'static {
    async fn pause(&self, sandbox_id: &str) -> Result<(), String>;
}

/// The running sandboxes to pause: those of accounts in `depleted` (depleted for longer
/// than the grace period, as [`lizard_store::BillingStore::depleted_accounts`] answers).
pub fn due_for_pause<'a>(depleted: &[String], meters: &'a [MeterRecord]) -> Vec<&'a MeterRecord> {
    meters.iter().filter(|m| m.state == MeterState::Running && depleted.contains(&m.account_id)).collect()
}

/// One metering step at `now`: bill every open meter, then pause what is due. Returns the
/// ids it asked `pauser` to pause.
pub async fn meter_once(
    store: &dyn Store,
    config: &BillingConfig,
    pauser: &dyn SandboxPauser,
    now: i64,
) -> Vec<String> {
    if let Err(e) = store.bill_meters(now).await {
        tracing::warn!("metering: {e}");
    }
    let grace = i64::try_from(config.grace.as_millis()).unwrap_or(i64::MAX);
    let depleted = match store.depleted_accounts(now.saturating_sub(grace)).await {
        Ok(d) if d.is_empty() => return Vec::new(),
        Ok(d) => d,
        Err(e) => {
            tracing::warn!("metering: depleted accounts: {e}");
            return Vec::new();
        }
    };
    let meters = match store.open_meters(None).await {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!("metering: open meters: {e}");
            return Vec::new();
        }
    };
    let mut paused = Vec::new();
    for m in due_for_pause(&depleted, &meters) {
        tracing::info!(sandbox = %m.sandbox_id, account = %m.account_id, "balance at zero past the grace period: pausing");
        match pauser.pause(&m.sandbox_id).await {
            Ok(()) => paused.push(m.sandbox_id.clone()),
            Err(e) => tracing::warn!(sandbox = %m.sandbox_id, "cannot pause at zero balance: {e}"),
        }
    }
    paused
}

/// Meter until the process ends (spawn it). Meters a dead process left open must have
/// been closed first ([`lizard_store::BillingStore::close_meters_at_watermark`]).
pub async fn run_metering(store: Arc<dyn Store>, config: BillingConfig, pauser: Arc<dyn SandboxPauser>) {
    let mut tick = tokio::time::interval(config.tick.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        meter_once(store.as_ref(), &config, pauser.as_ref(), lizard_api::ids::now_ms()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_size_costs_0_009_an_hour() {
        let p = Pricing::default();
        assert_eq!(p.running_rate(1, 512), 2_500);
        assert_eq!(p.running_rate(1, 512) * 3600, 9_000_000, "$0.009 an hour");
        // docs/billing.md's size table.
        for (v, m, rate) in [(1, 1024, 3_000), (2, 1024, 5_000), (2, 2048, 6_000), (4, 4096, 12_000), (8, 8192, 24_000)]
        {
            assert_eq!(p.running_rate(v, m), rate, "{v} vCPU / {m} MiB");
        }
        assert_eq!(p.running_rate(16, 16384), 48_000);
        assert_eq!(p.running_rate(1, 129), 2_000 + 126, "partial nano-dollars round up");
        assert_eq!(p.paused_rate(512), 0);
        let p = Pricing { paused_gib_nanos_per_second: 100, ..p };
        assert_eq!(p.paused_rate(512), 50);
        assert!(p.validate().is_ok());
        assert!(Pricing { vcpu_nanos_per_second: -1, ..p }.validate().is_err());
        assert!(Pricing { volume_gib_nanos_per_second: 1, ..p }.validate().is_ok());
        assert!(Pricing { volume_gib_nanos_per_second: -1, ..p }.validate().is_err());
        assert_eq!(Pricing { volume_gib_nanos_per_second: 7, ..p }.volume_rate(3), 21);
    }

    fn meter(id: &str, account: &str, state: MeterState) -> MeterRecord {
        MeterRecord {
            sandbox_id: id.into(),
            account_id: account.into(),
            workspace_id: "ws".into(),
            project_id: "prj".into(),
            spec: Pricing::default().meter(1, 512),
            state,
            billed_until: Some(0),
            carry: 0,
        }
    }

    #[test]
    fn only_running_sandboxes_of_depleted_accounts_are_paused() {
        let meters = vec![
            meter("a1", "acc_a", MeterState::Running),
            meter("a2", "acc_a", MeterState::Paused),
            meter("b1", "acc_b", MeterState::Running),
        ];
        let due: Vec<&str> = due_for_pause(&["acc_a".into()], &meters).iter().map(|m| m.sandbox_id.as_str()).collect();
        assert_eq!(due, ["a1"]);
        assert!(due_for_pause(&[], &meters).is_empty());
    }

    /// Records what it was asked to pause (the real one saves a VM: see the `vm_` tests).
    #[derive(Default)]
    struct Recorder(std::sync::Mutex<Vec<String>>);

    #[async_trait]
    impl SandboxPauser for Recorder {
        async fn pause(&self, sandbox_id: &str) -> Result<(), String> {
            self.0.lock().unwrap().push(sandbox_id.to_string());
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_tick_bills_then_pauses_only_after_the_grace_period() {
        use lizard_store::{BillingStore, NewSandbox};
        let store = lizard_store::fixture::seeded_store("acc", &[("ws", "prj")]).await;
        // 4 s of credit at 2500 n$/s.
        store.grant_signup_credits(10_000, 0).await.unwrap();
        store
            .insert_sandbox(&NewSandbox {
                id: "sbx".into(),
                project_id: "prj".into(),
                template: "base".into(),
                state: lizard_store::SandboxState::Running,
                created_at: 0,
                timeout_at: None,
                metadata: Default::default(),
                on_timeout: lizard_store::OnTimeout::Kill,
                timeout_ms: None,
                template_ref: None,
                node_id: "node_local".into(),
                meter: Pricing::default().meter(1, 512),
            })
            .await
            .unwrap();
        let config = BillingConfig { grace: Duration::from_secs(10), ..BillingConfig::default() };
        let pauser = Recorder::default();
        assert!(meter_once(&store, &config, &pauser, 3_000).await.is_empty(), "credit left");
        assert!(meter_once(&store, &config, &pauser, 4_000).await.is_empty(), "depleted, in grace");
        assert_eq!(store.balance("acc").await.unwrap().depleted_at, Some(4_000));
        assert!(meter_once(&store, &config, &pauser, 13_999).await.is_empty(), "still in grace");
        assert_eq!(meter_once(&store, &config, &pauser, 14_000).await, ["sbx"]);
        assert_eq!(*pauser.0.lock().unwrap(), ["sbx"]);
        assert_eq!(store.balance("acc").await.unwrap().balance_nanos, 10_000 - 14 * 2_500, "billed to the tick");
        assert!(require_funds(&store, "acc").await.is_err_and(|e| e.code() == ErrorCode::PaymentRequired));
    }

    #[test]
    fn charges_split_any_way_sum_to_the_same() {
        // 1 vCPU / 129 MiB: 2126 n$/s, not a multiple of 1000 per ms.
        let spec = Pricing::default().meter(1, 129);
        let mut m = meter("s", "a", MeterState::Running);
        m.spec = spec;
        let whole = m.charge(10_007).0;
        assert_eq!(whole, 10_007 * 2_126 / 1000);
        let mut total = 0;
        for until in [1, 2, 333, 999, 1_000, 5_555, 10_007] {
            let (amount, carry) = m.charge(until);
            total += amount;
            m.billed_until = Some(until);
            m.carry = carry;
        }
        assert_eq!(total, whole);
    }
}
