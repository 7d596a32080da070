//! The billing half of the store: the append-only ledger, the balance the database keeps
//! beside it, and the per-sandbox meters that turn running time into ledger entries.
//!
//! **Metering.** Every sandbox has a meter (opened by [`super::Store::insert_sandbox`]) in
//! one state — `running`, `paused` or `ended` — with a watermark `billed_until`. Billing an
//! interval appends one usage entry for `[billed_until, t)` at the state's rate and moves the
//! watermark to `t` *in the same transaction*, so no millisecond is ever billed twice, however
//! the process dies. State changes ([`super::Store::set_sandbox_state`],
//! [`super::Store::end_sandbox`], forced deletes) bill up to the change first; the metering
//! task bills every open meter up to now each tick ([`BillingStore::bill_meters`]). At
//! start, meters a dead process left open are closed at their watermark
//! ([`BillingStore::close_meters_at_watermark`]): what ran after the last tick is lost
//! (at most one tick), never billed twice.
//!
//! **Money** is signed nano-dollars. An interval of `ms` milliseconds at `r` n$/s costs
//! `(ms·r + carry) / 1000` with the remainder carried to the meter's next interval, so the
//! total over a sandbox's life is `⌊total_ms · r / 1000⌋` however it was split.

use super::Result;
use async_trait::async_trait;
use std::collections::BTreeMap;

/// What a sandbox costs, fixed when it is created (a price change applies to new
/// sandboxes only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeterSpec {
    pub vcpus: u32,
    pub memory_mib: u32,
    /// Nano-dollars per second while running.
    pub running_nanos_per_sec: i64,
    /// Nano-dollars per second while paused (saved state on disk).
    pub paused_nanos_per_sec: i64,
}

/// Where a meter stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MeterState {
    Running,
    Paused,
    Ended,
}

impl MeterState {
    pub fn as_str(self) -> &'static str {
        match self {
            MeterState::Running => "running",
            MeterState::Paused => "paused",
            MeterState::Ended => "ended",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "running" => Some(MeterState::Running),
            "paused" => Some(MeterState::Paused),
            "ended" => Some(MeterState::Ended),
            _ => None,
        }
    }
}

/// A sandbox's meter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeterRecord {
    pub sandbox_id: String,
    pub account_id: String,
    pub workspace_id: String,
    pub project_id: String,
    pub spec: MeterSpec,
    pub state: MeterState,
    /// Billed up to here; `None` once ended.
    pub billed_until: Option<i64>,
    /// Sub-nano-dollar remainder, in thousandths of a nano-dollar.
    pub carry: i64,
}

impl MeterRecord {
    /// The rate of its current state.
    pub fn rate(&self) -> i64 {
        match self.state {
            MeterState::Running => self.spec.running_nanos_per_sec,
            MeterState::Paused => self.spec.paused_nanos_per_sec,
            MeterState::Ended => 0,
        }
    }

    /// What `[billed_until, until)` costs, and the carry after it: `(amount, carry)`.
    pub fn charge(&self, until: i64) -> (i64, i64) {
        let ms = self.billed_until.map_or(0, |b| (until - b).max(0));
        let total = ms as i128 * self.rate() as i128 + self.carry as i128;
        let amount = i64::try_from(total / 1000).unwrap_or(if total < 0 { i64::MIN } else { i64::MAX });
        let carry = i64::try_from(total % 1000).expect("a remainder of a division by 1000 fits");
        (amount, carry)
    }
}

/// What a ledger entry is (the `kind` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerKind {
    SignupCredit,
    Credit,
    Usage,
}

impl LedgerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LedgerKind::SignupCredit => "signup_credit",
            LedgerKind::Credit => "credit",
            LedgerKind::Usage => "usage",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "signup_credit" => Some(LedgerKind::SignupCredit),
            "credit" => Some(LedgerKind::Credit),
            "usage" => Some(LedgerKind::Usage),
            _ => None,
        }
    }
}

/// One ledger row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEntry {
    /// Position in the ledger: increasing, the pagination cursor.
    pub seq: i64,
    pub id: String,
    pub account_id: String,
    pub kind: LedgerKind,
    pub amount_nanos: i64,
    pub description: String,
    pub workspace_id: Option<String>,
    pub project_id: Option<String>,
    pub sandbox_id: Option<String>,
    /// `compute`, `paused_storage` or `volume_storage` for usage.
    pub usage_kind: Option<String>,
    pub period_start: Option<i64>,
    pub period_end: Option<i64>,
    pub quantity_ms: Option<i64>,
    pub nanos_per_second: Option<i64>,
    pub idempotency_key: Option<String>,
    pub created_at: i64,
}

/// A credit to add (operator credits, signup credits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewCredit {
    pub account_id: String,
    pub kind: LedgerKind,
    pub amount_nanos: i64,
    pub description: String,
    /// The same key for the same account adds the credit once.
    pub idempotency_key: String,
    pub at: i64,
}

/// What [`BillingStore::add_credit`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreditOutcome {
    Added(LedgerEntry),
    /// The idempotency key was used before, with the same amount: nothing added.
    AlreadyAdded(LedgerEntry),
}

impl CreditOutcome {
    pub fn entry(&self) -> &LedgerEntry {
        match self {
            CreditOutcome::Added(e) | CreditOutcome::AlreadyAdded(e) => e,
        }
    }
}

/// An account's balance as the database keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BalanceRecord {
    pub balance_nanos: i64,
    /// When it last reached zero or below; `None` while positive.
    pub depleted_at: Option<i64>,
}

/// Usage (and credits, with `workspace_id` `None`) totals of one period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeriodRow {
    /// `YYYY-MM` or `YYYY-MM-DD` (UTC).
    pub period: String,
    /// `None`: the period's credits (in `amount_nanos`).
    pub workspace_id: Option<String>,
    pub project_id: Option<String>,
    /// Signed sum of the entries.
    pub amount_nanos: i64,
    pub sandbox_ms: i64,
}

/// Usage of one project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectUsage {
    pub workspace_id: String,
    pub project_id: String,
    /// Charged, positive.
    pub cost_nanos: i64,
    pub sandbox_ms: i64,
    pub running: u32,
}

/// Calendar buckets of [`BillingStore::usage_by_period`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Granularity {
    Month,
    Day,
}

/// The ledger and the meters. Part of every [`super::Store`].
#[async_trait]
pub trait BillingStore: Send + Sync + 'static {
    /// Add a credit unless its idempotency key was used before for the account: the same
    /// key and amount is [`CreditOutcome::AlreadyAdded`]; the same key with another amount
    /// or kind is [`super::StoreError::Conflict`]; an unknown account NotFound.
    async fn add_credit(&self, credit: &NewCredit) -> Result<CreditOutcome>;

    /// Give every account that never had one its signup credit of `amount_nanos`
    /// (idempotency key `signup-credit`). Returns how many got one.
    async fn grant_signup_credits(&self, amount_nanos: i64, at: i64) -> Result<u64>;

    /// The balance (zero for an account with no entry yet).
    async fn balance(&self, account_id: &str) -> Result<BalanceRecord>;

    /// `SUM(amount_nanos)` over the account's ledger, computed afresh (checks and tests).
    async fn ledger_sum(&self, account_id: &str) -> Result<i64>;

    /// Up to `limit` entries older than `before_seq` (all when `None`), newest first;
    /// usage entries only when `include_usage`.
    async fn ledger_page(
        &self,
        account_id: &str,
        before_seq: Option<i64>,
        limit: u32,
        include_usage: bool,
    ) -> Result<Vec<LedgerEntry>>;

    /// Bill every open meter up to `now`, one ledger entry per meter that accrued time, in
    /// one transaction — a sandbox on a remote node up to its node's last heartbeat at
    /// most (a lost node's meters then close exactly there). Returns the number of
    /// entries written.
    async fn bill_meters(&self, now: i64) -> Result<u64>;

    /// Close every running meter but those of `running` (sandbox ids) at its watermark
    /// without billing further (start-up: the VMs of a process that died ran unobserved
    /// since its last tick, and died with it). Paused meters stay open: a paused sandbox
    /// is a file that survives a restart; so do the meters of `running`, sandboxes whose
    /// VMs outlived the process and were taken back — they ran all along, and their next
    /// tick bills from the watermark. Only the in-process node's sandboxes: those of
    /// remote nodes live on while this process restarts.
    async fn close_meters_at_watermark(&self, running: &[String]) -> Result<u64>;

    /// Bill an open meter up to `at` and meter it in `state` (running or paused) from
    /// then on, leaving the sandbox's own state alone: a sandbox whose VM stands halted
    /// (a full node disk) is billed as paused until it runs again. Returns whether it
    /// changed; an unknown, ended or already-`state` meter is left as it is.
    async fn set_meter_state(&self, meter_id: &str, state: MeterState, at: i64) -> Result<bool>;

    /// What each of `sandbox_ids` (of the account) has been charged so far: the sum of its
    /// usage entries, positive. Sandboxes without entries are absent.
    async fn charged_by_sandbox(&self, account_id: &str, sandbox_ids: &[String]) -> Result<BTreeMap<String, i64>>;

    /// Meters not ended, of one account or all.
    async fn open_meters(&self, account_id: Option<&str>) -> Result<Vec<MeterRecord>>;

    /// Accounts whose balance has been at or below zero since `depleted_at_or_before`.
    async fn depleted_accounts(&self, depleted_at_or_before: i64) -> Result<Vec<String>>;

    /// Credits per period and usage per period, workspace and project, newest period
    /// first, at most `periods` periods.
    async fn usage_by_period(&self, account_id: &str, granularity: Granularity, periods: u32)
        -> Result<Vec<PeriodRow>>;

    /// Usage per project from the ledger (`from..to` by interval start, ms), with the
    /// count of sandboxes running now; projects that ran nothing and run nothing are absent.
    async fn usage_by_project(&self, account_id: &str, from: Option<i64>, to: Option<i64>)
        -> Result<Vec<ProjectUsage>>;
}
