//! Billing (account-wide: unscoped keys only) and usage metrics (scoped).
//!
//! Money is integer **nano-dollars** (`…Nanos`, 10⁻⁹ USD) everywhere, never floating
//! point: the smallest sandbox costs 2 500 n$ a second ($0.009 an hour), which micro-dollars
//! could not state exactly. Each amount also comes as a decimal string in dollars
//! (`"10.00"`, `"0.0000025"`), formatted from the integer, for display.

use serde::{Deserialize, Serialize};

/// Nano-dollars in a dollar.
pub const NANOS_PER_USD: i64 = 1_000_000_000;

/// `nanos` as dollars: at least two decimals, at most nine, no trailing zeros beyond two
/// (`-1.5` → `"-1.50"`, `2500` → `"0.0000025"`).
pub fn format_usd(nanos: i64) -> String {
    let sign = if nanos < 0 { "-" } else { "" };
    let abs = nanos.unsigned_abs();
    let whole = abs / NANOS_PER_USD as u64;
    let frac = format!("{:09}", abs % NANOS_PER_USD as u64);
    let trimmed = frac.trim_end_matches('0');
    let frac = if trimmed.len() < 2 { &frac[..2] } else { trimmed };
    format!("{sign}{whole}.{frac}")
}

/// Why a dollar amount did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmountError {
    #[error("amount {0:?} is not a decimal number of dollars (e.g. 25 or 0.50)")]
    Syntax(String),
    #[error("amount {0:?} has more than 9 decimals (the ledger counts nano-dollars)")]
    TooPrecise(String),
    #[error("amount {0:?} is too large")]
    TooLarge(String),
}

/// Parse dollars (`"25"`, `"0.50"`, `"-3.000000001"`, an optional leading `$`) into
/// nano-dollars, exactly: no floating point on the way.
pub fn parse_usd(s: &str) -> Result<i64, AmountError> {
    let err = || AmountError::Syntax(s.to_string());
    let t = s.trim();
    let (neg, t) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t),
    };
    let t = t.strip_prefix('$').unwrap_or(t);
    let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
    if whole.is_empty() && frac.is_empty() {
        return Err(err());
    }
    if !whole.chars().all(|c| c.is_ascii_digit()) || !frac.chars().all(|c| c.is_ascii_digit()) {
        return Err(err());
    }
    if frac.len() > 9 {
        return Err(AmountError::TooPrecise(s.to_string()));
    }
    let whole: i64 =
        if whole.is_empty() { 0 } else { whole.parse().map_err(|_| AmountError::TooLarge(s.to_string()))? };
    let frac: i64 = if frac.is_empty() { 0 } else { format!("{frac:0<9}").parse().map_err(|_| err())? };
    let nanos = whole
        .checked_mul(NANOS_PER_USD)
        .and_then(|w| w.checked_add(frac))
        .ok_or_else(|| AmountError::TooLarge(s.to_string()))?;
    Ok(if neg { -nanos } else { nanos })
}

/// `GET /v1/billing/balance`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Balance {
    /// The sum of every ledger entry of the account, in nano-dollars.
    pub balance_nanos: i64,
    /// The same, in dollars.
    pub balance: String,
    pub currency: String,
    /// Since when the balance has been at or below zero (RFC 3339); absent while positive.
    /// Running sandboxes are paused a grace period after this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depleted_since: Option<String>,
}

/// What a ledger entry is.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum TransactionKind {
    /// The free credits a new account starts with.
    SignupCredit,
    /// Credits an operator added (`lizard billing credit`).
    Credit,
    /// Metered use: compute of a running sandbox, or storage of a paused one.
    Usage,
}

/// What metered use a usage entry charges.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum UsageKind {
    /// A running sandbox's vCPUs and memory.
    Compute,
    /// A paused sandbox's saved state.
    PausedStorage,
    /// A volume's disk, from its create to its delete (`--volume-price`).
    VolumeStorage,
}

/// One ledger entry. Entries are never changed or removed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Transaction {
    pub id: String,
    pub kind: TransactionKind,
    /// Signed: credits are positive, usage negative.
    pub amount_nanos: i64,
    /// The same, in dollars.
    pub amount: String,
    pub description: String,
    /// RFC 3339.
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_kind: Option<UsageKind>,
    /// Usage: the metered interval [periodStart, periodEnd), RFC 3339 with milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_start: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_end: Option<String>,
    /// Usage: milliseconds metered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantity_ms: Option<i64>,
    /// Usage: the price it was metered at, nano-dollars per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nanos_per_second: Option<i64>,
    /// Credits: the operator's idempotency key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

/// `GET /v1/billing/transactions`: newest first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct TransactionPage {
    pub items: Vec<Transaction>,
    /// Pass as `cursor` for the next (older) page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// Usage of one project within a period.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ProjectSpend {
    pub project_id: String,
    /// Charged, as a positive number of nano-dollars.
    pub usage_nanos: i64,
    pub usage: String,
    /// Running sandbox time metered.
    pub sandbox_ms: i64,
}

/// Usage of one workspace within a period, by project.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceSpend {
    pub workspace_id: String,
    pub usage_nanos: i64,
    pub usage: String,
    pub sandbox_ms: i64,
    pub projects: Vec<ProjectSpend>,
}

/// Totals of one period (a calendar month or day, UTC).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SummaryPeriod {
    /// `2026-11` (months) or `2026-11-30` (days).
    pub period: String,
    /// Credits added (signup and operator), nano-dollars.
    pub credits_nanos: i64,
    pub credits: String,
    /// Usage charged, as a positive number of nano-dollars.
    pub usage_nanos: i64,
    pub usage: String,
    pub workspaces: Vec<WorkspaceSpend>,
}

/// `GET /v1/billing/summary`: newest period first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct BillingSummary {
    /// `month` or `day`.
    pub granularity: String,
    pub periods: Vec<SummaryPeriod>,
}

/// A sandbox that accrues charges now.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct LiveSandbox {
    pub sandbox_id: String,
    pub workspace_id: String,
    pub project_id: String,
    /// `running` or `paused`.
    pub state: String,
    pub vcpus: u32,
    pub memory_mib: u32,
    /// What it costs now, per second.
    pub nanos_per_second: i64,
    /// Accrued since the last metering tick, not yet in the ledger.
    pub unbilled_nanos: i64,
}

/// `GET /v1/billing/sandboxes?ids=`: what one sandbox has cost so far.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SandboxCost {
    pub sandbox_id: String,
    /// Charged to the account so far: the sum of its ledger entries (positive).
    pub charged_nanos: i64,
    /// Accrued since the last metering tick, not yet in the ledger (0 once it ended).
    pub unbilled_nanos: i64,
    /// `chargedNanos + unbilledNanos`.
    pub cost_nanos: i64,
    /// The same, in dollars.
    pub cost: String,
}

/// Most sandbox ids one `GET /v1/billing/sandboxes` may name.
pub const MAX_COST_IDS: usize = 200;

/// `GET /v1/billing/live`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct LiveBilling {
    pub sandboxes: Vec<LiveSandbox>,
    /// Sum of the sandboxes' rates.
    pub burn_nanos_per_second: i64,
    /// The same, in dollars per hour.
    pub burn_per_hour: String,
}

/// Usage of one workspace or project, all time or within `from..to`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct UsageMetrics {
    pub workspace_id: String,
    /// Absent on a workspace's total.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    /// Running sandbox time metered, whole seconds (rounded down).
    pub sandbox_seconds: i64,
    pub sandbox_ms: i64,
    /// Charged, as a positive number of nano-dollars.
    pub cost_nanos: i64,
    pub cost: String,
    /// Sandboxes running now.
    pub running: u32,
}

/// `GET /v1/metrics`: usage within the key's scope.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Metrics {
    /// Totals of the workspaces the key reaches whole (absent for project-only keys).
    pub workspaces: Vec<UsageMetrics>,
    /// Every project the key reaches that has used anything or runs sandboxes.
    pub projects: Vec<UsageMetrics>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usd_formats_exactly() {
        assert_eq!(format_usd(10 * NANOS_PER_USD), "10.00");
        assert_eq!(format_usd(2_500), "0.0000025");
        assert_eq!(format_usd(-1_500_000_000), "-1.50");
        assert_eq!(format_usd(0), "0.00");
        assert_eq!(format_usd(1), "0.000000001");
        assert_eq!(format_usd(i64::MIN), "-9223372036.854775808");
    }

    #[test]
    fn usd_parses_exactly() {
        assert_eq!(parse_usd("25"), Ok(25 * NANOS_PER_USD));
        assert_eq!(parse_usd("$0.50"), Ok(500_000_000));
        assert_eq!(parse_usd("-3.000000001"), Ok(-3_000_000_001));
        assert_eq!(parse_usd(".5"), Ok(500_000_000));
        assert_eq!(parse_usd("0.009"), Ok(9_000_000));
        assert!(matches!(parse_usd("0.0000000001"), Err(AmountError::TooPrecise(_))));
        for bad in ["", ".", "1e3", "1.2.3", "abc", "1,5", "--1", "99999999999999999999"] {
            assert!(parse_usd(bad).is_err(), "{bad}");
        }
        for n in [0, 1, 2_500, 9_000_000, -7, 10 * NANOS_PER_USD] {
            assert_eq!(parse_usd(&format_usd(n)), Ok(n));
        }
    }
}
