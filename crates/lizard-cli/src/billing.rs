//! `lizard billing …` and `lizard metrics`.
//!
//! `balance`, `transactions`, `summary` and `live` read the account's billing over the API
//! (unscoped keys only); `metrics` reads usage within the key's scope. `credit` is the
//! operator's: it writes to the server's database file directly (`<data-dir>/lizard.db`),
//! because whoever may add money must not be whoever holds an account's API key.

use crate::client::{empty, ApiClient, Call};
use crate::output::{print_fields, print_json, Table};
use anyhow::{bail, Context, Result};
use clap::Subcommand;
#[cfg(feature = "node")]
use lizard_api::parse_usd;
use lizard_api::routes;
use lizard_api::{format_usd, Balance, BillingSummary, LiveBilling, Metrics, TransactionPage};
#[cfg(feature = "node")]
use lizard_store::billing::{CreditOutcome, LedgerKind, NewCredit};
use serde::de::DeserializeOwned;
use serde_json::Value;
#[cfg(feature = "node")]
use std::path::Path;

#[derive(Subcommand, Debug)]
#[command(after_help = "\
balance, transactions, summary and live need an unscoped API key (billing belongs to the
account); `lizard metrics` works with scoped keys too. `credit` is for the server's operator: it
opens <data-dir>/lizard.db itself (run it on the server's machine, as the server's user).")]
pub enum BillingCmd {
    /// The account's balance.
    Balance,
    /// The ledger, newest first.
    Transactions {
        /// Entries per page (1..=1000).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Start after this cursor (printed at the end of a page).
        #[arg(long)]
        cursor: Option<String>,
        /// Also the metered usage entries (one per sandbox per metering tick).
        #[arg(long)]
        include_usage: bool,
        /// Follow the cursor to the end of the ledger.
        #[arg(long)]
        all: bool,
    },
    /// Credits and usage per period, by workspace and project.
    Summary {
        /// month or day.
        #[arg(long, default_value = "month")]
        granularity: String,
        /// How many of the latest periods.
        #[arg(long, default_value_t = 12)]
        periods: u32,
    },
    /// Sandboxes accruing charges now and the burn rate.
    Live,
    /// Operator: add credits to an account, once per idempotency key.
    Credit {
        /// The account id (`lizard whoami` shows it).
        #[arg(long)]
        account: String,
        /// Dollars, e.g. 25 or 0.50 (up to 9 decimals).
        #[arg(long)]
        amount: String,
        /// The same key adds the credit once; reusing it for another amount is refused.
        #[arg(long)]
        idempotency_key: String,
        /// Shown in the ledger.
        #[arg(long, default_value = "credit added by the operator")]
        description: String,
        /// The server's database when it is not SQLite in the data directory (the value of
        /// `lizard server --database`).
        #[arg(long, value_name = "URL", env = "LIZARD_DATABASE", hide_env_values = true)]
        database: Option<String>,
    },
}

fn decode<T: DeserializeOwned>(v: &Value) -> Result<T> {
    serde_json::from_value(v.clone()).context("decode the server's answer")
}

/// `GET /v1/billing/transactions?…`.
pub fn transactions_uri(limit: u32, cursor: Option<&str>, include_usage: bool) -> Call {
    Call::new(&routes::TRANSACTIONS, &[])
        .param("limit", limit)
        .param_opt("cursor", cursor)
        .param_opt("includeUsage", include_usage.then_some(true))
}

fn seconds(ms: i64) -> String {
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

pub async fn run(api: &ApiClient, cmd: BillingCmd, json: bool) -> Result<()> {
    match cmd {
        BillingCmd::Balance => {
            let v: Value = api.json(&Call::new(&routes::BALANCE, &[]), empty()).await?;
            if json {
                return print_json(&v);
            }
            let b: Balance = decode(&v)?;
            let mut fields = vec![("balance", format!("{} {}", b.balance, b.currency))];
            if let Some(d) = b.depleted_since {
                fields.push(("depleted since", d));
            }
            print_fields(&fields);
        }
        BillingCmd::Transactions { limit, cursor, include_usage, all } => {
            let mut cursor = cursor;
            let mut items = Vec::new();
            let mut pages = 0u32;
            loop {
                let v: Value = api.json(&transactions_uri(limit, cursor.as_deref(), include_usage), empty()).await?;
                let page: TransactionPage = decode(&v)?;
                items.extend(page.items);
                cursor = page.next_cursor;
                pages += 1;
                // Bounded: a ledger is finite, a server that loops is not trusted forever.
                if !all || cursor.is_none() || pages >= 100_000 {
                    break;
                }
            }
            if json {
                return print_json(&serde_json::json!({ "items": items, "nextCursor": cursor }));
            }
            let mut t = Table::new(&["ID", "KIND", "AMOUNT", "CREATED", "DESCRIPTION"]);
            for e in items {
                let kind = serde_json::to_value(e.kind)?.as_str().unwrap_or_default().to_string();
                t.row(vec![e.id, kind, e.amount, e.created_at, e.description]);
            }
            t.print();
            if let Some(c) = cursor {
                eprintln!("more: --cursor {c}");
            }
        }
        BillingCmd::Summary { granularity, periods } => {
            let call = Call::new(&routes::SUMMARY, &[]).param("granularity", &granularity).param("periods", periods);
            let v: Value = api.json(&call, empty()).await?;
            if json {
                return print_json(&v);
            }
            let s: BillingSummary = decode(&v)?;
            let mut t = Table::new(&["PERIOD", "WORKSPACE", "PROJECT", "SANDBOX_S", "USAGE", "CREDITS"]);
            for p in s.periods {
                t.row(vec![p.period.clone(), "*".into(), "*".into(), String::new(), p.usage, p.credits]);
                for w in p.workspaces {
                    for prj in w.projects {
                        t.row(vec![
                            p.period.clone(),
                            w.workspace_id.clone(),
                            prj.project_id,
                            seconds(prj.sandbox_ms),
                            prj.usage,
                            String::new(),
                        ]);
                    }
                }
            }
            t.print();
        }
        BillingCmd::Live => {
            let v: Value = api.json(&Call::new(&routes::LIVE, &[]), empty()).await?;
            if json {
                return print_json(&v);
            }
            let l: LiveBilling = decode(&v)?;
            let mut t = Table::new(&["SANDBOX", "STATE", "SIZE", "PER_HOUR", "PROJECT", "WORKSPACE"]);
            for s in l.sandboxes {
                t.row(vec![
                    s.sandbox_id,
                    s.state,
                    format!("{} vCPU / {} MiB", s.vcpus, s.memory_mib),
                    format_usd(s.nanos_per_second.saturating_mul(3600)),
                    s.project_id,
                    s.workspace_id,
                ]);
            }
            t.print();
            println!("burn: {} USD/hour", l.burn_per_hour);
        }
        BillingCmd::Credit { .. } => bail!("`lizard billing credit` runs against the database, not the API"),
    }
    Ok(())
}

/// `lizard billing credit`: append a credit to the ledger in `<data_dir>/lizard.db`, or in
/// the database `--database` names.
#[cfg(feature = "node")]
pub async fn credit(data_dir: &Path, cmd: BillingCmd, json: bool) -> Result<()> {
    let BillingCmd::Credit { account, amount, idempotency_key, description, database } = cmd else {
        bail!("not a credit command");
    };
    let amount_nanos = parse_usd(&amount)?;
    if amount_nanos <= 0 {
        bail!("the amount must be positive, got {amount}");
    }
    if idempotency_key.trim().is_empty() {
        bail!("the idempotency key must not be empty");
    }
    let db = data_dir.join(lizard_store::sql::DB_FILE);
    if database.is_none() && !db.exists() {
        bail!("no Lizard database at {} (pass the server's --data-dir, or its --database)", db.display());
    }
    let store = lizard_store::open_store(database.as_deref(), data_dir).await?;
    let credit = NewCredit {
        account_id: account,
        kind: LedgerKind::Credit,
        amount_nanos,
        description,
        idempotency_key,
        at: lizard_api::ids::now_ms(),
    };
    let outcome = store.add_credit(&credit).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let balance = store.balance(&credit.account_id).await?;
    let e = outcome.entry();
    if json {
        return print_json(&serde_json::json!({
            "added": matches!(outcome, CreditOutcome::Added(_)),
            "transaction": lizard_server::api::billing::transaction_json(e.clone()),
            "balanceNanos": balance.balance_nanos,
        }));
    }
    match outcome {
        CreditOutcome::Added(_) => eprintln!("added {} USD to {} ({})", format_usd(e.amount_nanos), e.account_id, e.id),
        CreditOutcome::AlreadyAdded(_) => {
            eprintln!("idempotency key already used for this credit ({}): nothing added", e.id)
        }
    }
    println!("balance: {} USD", format_usd(balance.balance_nanos));
    Ok(())
}

#[derive(clap::Args, Debug)]
pub struct MetricsArgs {
    /// Only this workspace (id).
    #[arg(long, value_name = "ID")]
    pub workspace: Option<String>,
    /// Only this project (id).
    #[arg(long, value_name = "ID")]
    pub project: Option<String>,
    /// From this instant (RFC 3339, e.g. 2026-11-01T00:00:00Z).
    #[arg(long)]
    pub from: Option<String>,
    /// Before this instant (RFC 3339).
    #[arg(long)]
    pub to: Option<String>,
}

/// `GET /v1/metrics?…`.
pub fn metrics_uri(a: &MetricsArgs) -> Call {
    let mut call = Call::new(&routes::METRICS, &[]);
    for (k, v) in [("workspaceId", &a.workspace), ("projectId", &a.project), ("from", &a.from), ("to", &a.to)] {
        call = call.param_opt(k, v.as_deref());
    }
    call
}

pub async fn metrics(api: &ApiClient, args: MetricsArgs, json: bool) -> Result<()> {
    let v: Value = api.json(&metrics_uri(&args), empty()).await?;
    if json {
        return print_json(&v);
    }
    let m: Metrics = decode(&v)?;
    let mut t = Table::new(&["WORKSPACE", "PROJECT", "SANDBOX_S", "COST", "RUNNING"]);
    for u in m.workspaces.into_iter().chain(m.projects) {
        t.row(vec![
            u.workspace_id,
            u.project_id.unwrap_or_else(|| "*".into()),
            seconds(u.sandbox_ms),
            u.cost,
            u.running.to_string(),
        ]);
    }
    t.print();
    Ok(())
}
