//! `/v1/billing/*`: the account's balance, ledger, spend per period and live burn.
//!
//! Billing belongs to the account, shared by every workspace, so every route here is for
//! unscoped keys only: a scoped key (handed to a user, put in a sandbox) gets 403
//! `ACCOUNT_SCOPE_REQUIRED` and learns nothing. Per-scope spend is `/v1/metrics`, and what
//! the key's own sandboxes cost is `/v1/billing/sandboxes`, open to every key.

use crate::auth::{require_account_scope, Principal};
use crate::error::{ApiQuery, ApiResult, AppError};
use crate::openapi::{AccountScopeRequired, InvalidArgument, Unauthenticated};
use crate::state::ServerState;
use axum::extract::State;
use axum::Json;
use lizard_api::ids;
use lizard_api::{
    format_usd, Balance, BillingSummary, LiveBilling, LiveSandbox, ProjectSpend, SandboxCost, SummaryPeriod,
    Transaction, TransactionKind, TransactionPage, UsageKind, WorkspaceSpend, MAX_COST_IDS,
};
use lizard_store::billing::{Granularity, LedgerEntry, LedgerKind, MeterState};
use serde::Deserialize;
use std::collections::BTreeMap;

/// The balance: the sum of every ledger entry.
#[utoipa::path(
    get,
    path = lizard_api::routes::BALANCE.path,
    tag = "billing",
    security(("apiKey" = [])),
    responses((status = 200, description = "The account's balance", body = Balance), Unauthenticated, AccountScopeRequired)
)]
pub async fn balance(State(state): State<ServerState>, p: Principal) -> ApiResult<Json<Balance>> {
    require_account_scope(&p)?;
    let b = state.store.balance(&p.account_id).await?;
    Ok(Json(Balance {
        balance_nanos: b.balance_nanos,
        balance: format_usd(b.balance_nanos),
        currency: "USD".into(),
        depleted_since: b.depleted_at.map(ids::rfc3339),
    }))
}

/// Most entries one page returns.
pub const MAX_PAGE: u32 = 1000;
const DEFAULT_PAGE: u32 = 50;

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TransactionsQuery {
    /// Entries per page, 1..=1000 (default 50).
    limit: Option<u32>,
    /// `nextCursor` of the previous page.
    cursor: Option<String>,
    /// Also metered usage (one entry per sandbox per metering tick); default: credits only.
    #[serde(default)]
    include_usage: bool,
}

/// A ledger row as the API shows it.
pub fn transaction_json(e: LedgerEntry) -> Transaction {
    Transaction {
        id: e.id,
        kind: match e.kind {
            LedgerKind::SignupCredit => TransactionKind::SignupCredit,
            LedgerKind::Credit => TransactionKind::Credit,
            LedgerKind::Usage => TransactionKind::Usage,
        },
        amount_nanos: e.amount_nanos,
        amount: format_usd(e.amount_nanos),
        description: e.description,
        created_at: ids::rfc3339(e.created_at),
        workspace_id: e.workspace_id,
        project_id: e.project_id,
        sandbox_id: e.sandbox_id,
        usage_kind: e.usage_kind.as_deref().map(|k| match k {
            "paused_storage" => UsageKind::PausedStorage,
            "volume_storage" => UsageKind::VolumeStorage,
            _ => UsageKind::Compute,
        }),
        period_start: e.period_start.map(ids::rfc3339),
        period_end: e.period_end.map(ids::rfc3339),
        quantity_ms: e.quantity_ms,
        nanos_per_second: e.nanos_per_second,
        idempotency_key: e.idempotency_key,
    }
}

/// The ledger, newest first, a page at a time.
#[utoipa::path(
    get,
    path = lizard_api::routes::TRANSACTIONS.path,
    tag = "billing",
    security(("apiKey" = [])),
    params(TransactionsQuery),
    responses((status = 200, description = "A page of ledger entries", body = TransactionPage), Unauthenticated, AccountScopeRequired, InvalidArgument)
)]
pub async fn transactions(
    State(state): State<ServerState>,
    p: Principal,
    ApiQuery(q): ApiQuery<TransactionsQuery>,
) -> ApiResult<Json<TransactionPage>> {
    require_account_scope(&p)?;
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(AppError::invalid(format!("limit must be 1..={MAX_PAGE}, got {limit}")));
    }
    let before = match q.cursor.as_deref() {
        None | Some("") => None,
        Some(c) => Some(c.parse::<i64>().ok().filter(|s| *s > 0).ok_or_else(|| {
            AppError::invalid(format!("cursor {c:?} is not one this server gave out (use nextCursor as is)"))
        })?),
    };
    let entries = state.store.ledger_page(&p.account_id, before, limit, q.include_usage).await?;
    let next_cursor = (entries.len() == limit as usize).then(|| entries.last().map(|e| e.seq.to_string())).flatten();
    Ok(Json(TransactionPage { items: entries.into_iter().map(transaction_json).collect(), next_cursor }))
}

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SummaryQuery {
    /// `month` (default) or `day`, UTC calendar periods.
    granularity: Option<String>,
    /// How many of the latest periods with activity, 1..=366 (default 12).
    periods: Option<u32>,
}

/// Credits and usage per period, usage broken down by workspace and project.
#[utoipa::path(
    get,
    path = lizard_api::routes::SUMMARY.path,
    tag = "billing",
    security(("apiKey" = [])),
    params(SummaryQuery),
    responses((status = 200, description = "Totals per period", body = BillingSummary), Unauthenticated, AccountScopeRequired, InvalidArgument)
)]
pub async fn summary(
    State(state): State<ServerState>,
    p: Principal,
    ApiQuery(q): ApiQuery<SummaryQuery>,
) -> ApiResult<Json<BillingSummary>> {
    require_account_scope(&p)?;
    let granularity = match q.granularity.as_deref() {
        None | Some("month") => Granularity::Month,
        Some("day") => Granularity::Day,
        Some(other) => return Err(AppError::invalid(format!("granularity must be month or day, got {other:?}"))),
    };
    let periods = q.periods.unwrap_or(12);
    if !(1..=366).contains(&periods) {
        return Err(AppError::invalid(format!("periods must be 1..=366, got {periods}")));
    }
    let rows = state.store.usage_by_period(&p.account_id, granularity, periods).await?;
    // period → (credits, workspace → project → (usage, ms)); BTreeMaps keep the order stable.
    type Projects = BTreeMap<String, (i64, i64)>;
    let mut by_period: BTreeMap<String, (i64, BTreeMap<String, Projects>)> = BTreeMap::new();
    for r in rows {
        let slot = by_period.entry(r.period).or_default();
        match (r.workspace_id, r.project_id) {
            (Some(w), Some(prj)) => {
                let e = slot.1.entry(w).or_default().entry(prj).or_default();
                e.0 += -r.amount_nanos;
                e.1 += r.sandbox_ms;
            }
            _ => slot.0 += r.amount_nanos,
        }
    }
    let periods = by_period
        .into_iter()
        .rev()
        .map(|(period, (credits, workspaces))| {
            let workspaces: Vec<WorkspaceSpend> = workspaces
                .into_iter()
                .map(|(workspace_id, projects)| {
                    let projects: Vec<ProjectSpend> = projects
                        .into_iter()
                        .map(|(project_id, (usage, ms))| ProjectSpend {
                            project_id,
                            usage_nanos: usage,
                            usage: format_usd(usage),
                            sandbox_ms: ms,
                        })
                        .collect();
                    let usage = projects.iter().map(|p| p.usage_nanos).sum();
                    WorkspaceSpend {
                        workspace_id,
                        usage_nanos: usage,
                        usage: format_usd(usage),
                        sandbox_ms: projects.iter().map(|p| p.sandbox_ms).sum(),
                        projects,
                    }
                })
                .collect();
            let usage = workspaces.iter().map(|w| w.usage_nanos).sum();
            SummaryPeriod {
                period,
                credits_nanos: credits,
                credits: format_usd(credits),
                usage_nanos: usage,
                usage: format_usd(usage),
                workspaces,
            }
        })
        .collect();
    let granularity = match granularity {
        Granularity::Month => "month",
        Granularity::Day => "day",
    };
    Ok(Json(BillingSummary { granularity: granularity.into(), periods }))
}

/// The sandboxes accruing charges now and the account's burn rate.
#[utoipa::path(
    get,
    path = lizard_api::routes::LIVE.path,
    tag = "billing",
    security(("apiKey" = [])),
    responses((status = 200, description = "Running and paused sandboxes with their rates", body = LiveBilling), Unauthenticated, AccountScopeRequired)
)]
pub async fn live(State(state): State<ServerState>, p: Principal) -> ApiResult<Json<LiveBilling>> {
    require_account_scope(&p)?;
    let now = ids::now_ms();
    let meters = state.store.open_meters(Some(&p.account_id)).await?;
    let sandboxes: Vec<LiveSandbox> = meters
        .iter()
        .map(|m| LiveSandbox {
            sandbox_id: m.sandbox_id.clone(),
            workspace_id: m.workspace_id.clone(),
            project_id: m.project_id.clone(),
            state: match m.state {
                MeterState::Paused => "paused",
                _ => "running",
            }
            .into(),
            vcpus: m.spec.vcpus,
            memory_mib: m.spec.memory_mib,
            nanos_per_second: m.rate(),
            unbilled_nanos: m.charge(now).0,
        })
        .collect();
    let burn: i64 = sandboxes.iter().map(|s| s.nanos_per_second).sum();
    Ok(Json(LiveBilling {
        sandboxes,
        burn_nanos_per_second: burn,
        burn_per_hour: format_usd(burn.saturating_mul(3600)),
    }))
}

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SandboxCostsQuery {
    /// Sandbox ids, comma-separated (at most 200).
    ids: String,
}

/// What each sandbox has cost so far: its ledger entries plus what it accrued since the
/// last metering tick. Every key may ask; ids the key does not reach (another workspace's,
/// unknown ones) are left out, as if they did not exist.
#[utoipa::path(
    get,
    path = lizard_api::routes::SANDBOX_COSTS.path,
    tag = "billing",
    security(("apiKey" = [])),
    params(SandboxCostsQuery),
    responses((status = 200, description = "Cost so far of each sandbox the key reaches, in the order asked", body = Vec<SandboxCost>), Unauthenticated, InvalidArgument)
)]
pub async fn sandbox_costs(
    State(state): State<ServerState>,
    p: Principal,
    ApiQuery(q): ApiQuery<SandboxCostsQuery>,
) -> ApiResult<Json<Vec<SandboxCost>>> {
    let mut seen = std::collections::HashSet::new();
    let asked: Vec<&str> = q.ids.split(',').map(str::trim).filter(|i| !i.is_empty() && seen.insert(*i)).collect();
    if asked.is_empty() || asked.len() > MAX_COST_IDS {
        return Err(AppError::invalid(format!("ids must name 1..={MAX_COST_IDS} sandboxes, got {}", asked.len())));
    }
    let mut reached = Vec::with_capacity(asked.len());
    for id in asked {
        if state.store.get_sandbox(id).await?.is_some_and(|s| p.sees_sandbox(&s)) {
            reached.push(id.to_string());
        }
    }
    let now = ids::now_ms();
    let charged = state.store.charged_by_sandbox(&p.account_id, &reached).await?;
    let unbilled: BTreeMap<String, i64> = state
        .store
        .open_meters(Some(&p.account_id))
        .await?
        .into_iter()
        .map(|m| (m.sandbox_id.clone(), m.charge(now).0))
        .collect();
    Ok(Json(
        reached
            .into_iter()
            .map(|id| {
                let charged_nanos = charged.get(&id).copied().unwrap_or(0);
                let unbilled_nanos = unbilled.get(&id).copied().unwrap_or(0);
                let cost_nanos = charged_nanos.saturating_add(unbilled_nanos);
                SandboxCost { sandbox_id: id, charged_nanos, unbilled_nanos, cost_nanos, cost: format_usd(cost_nanos) }
            })
            .collect(),
    ))
}
