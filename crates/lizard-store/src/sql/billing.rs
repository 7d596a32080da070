//! [`BillingStore`] on either engine, and the meter steps the sandbox writes of
//! [`super::SqlStore`] run inside their own transactions.
//!
//! The balance is not computed here: the `ledger_balance` trigger (migration 0002) updates
//! `account_balances` in the very statement that appends a ledger row, and triggers refuse
//! any UPDATE or DELETE of the ledger (and, on PostgreSQL, TRUNCATE).
//!
//! **Replicas.** Every step that reads a watermark and bills from it runs inside a
//! write transaction ([`super::SqlStore::write`]): two replicas' ticks (or a tick and a state
//! change) run one after the other, and the second reads the watermark the first moved,
//! so it bills only what accrued since — never an interval twice (tested by
//! `store::tests::replicas`).

use super::{backend, col, SqlStore};
use crate::billing::*;
use crate::{Result, SandboxState, StoreError};
use async_trait::async_trait;
use sqlx::any::AnyRow;
use sqlx::{Any, Transaction};
use std::collections::BTreeMap;

/// Idempotency key of the free credits every account starts with.
pub const SIGNUP_CREDIT_KEY: &str = "signup-credit";

const LEDGER_COLUMNS: &str = "seq, id, account_id, kind, amount_nanos, description, workspace_id, project_id, \
     sandbox_id, usage_kind, period_start, period_end, quantity_ms, nanos_per_second, idempotency_key, created_at";

const METER_COLUMNS: &str = "sandbox_id, account_id, workspace_id, project_id, vcpus, memory_mib, \
     running_nanos_per_sec, paused_nanos_per_sec, state, billed_until, carry";

fn entry(r: &AnyRow) -> Result<LedgerEntry> {
    let kind: String = col(r, "kind")?;
    Ok(LedgerEntry {
        seq: col(r, "seq")?,
        id: col(r, "id")?,
        account_id: col(r, "account_id")?,
        kind: LedgerKind::parse(&kind).ok_or_else(|| StoreError::Backend(format!("ledger kind {kind:?}").into()))?,
        amount_nanos: col(r, "amount_nanos")?,
        description: col(r, "description")?,
        workspace_id: col(r, "workspace_id")?,
        project_id: col(r, "project_id")?,
        sandbox_id: col(r, "sandbox_id")?,
        usage_kind: col(r, "usage_kind")?,
        period_start: col(r, "period_start")?,
        period_end: col(r, "period_end")?,
        quantity_ms: col(r, "quantity_ms")?,
        nanos_per_second: col(r, "nanos_per_second")?,
        idempotency_key: col(r, "idempotency_key")?,
        created_at: col(r, "created_at")?,
    })
}

fn meter(r: &AnyRow) -> Result<MeterRecord> {
    let state: String = col(r, "state")?;
    let vcpus: i64 = col(r, "vcpus")?;
    let memory_mib: i64 = col(r, "memory_mib")?;
    Ok(MeterRecord {
        sandbox_id: col(r, "sandbox_id")?,
        account_id: col(r, "account_id")?,
        workspace_id: col(r, "workspace_id")?,
        project_id: col(r, "project_id")?,
        spec: MeterSpec {
            vcpus: u32::try_from(vcpus)
                .map_err(|_| StoreError::UnknownValue { what: "meter vcpus", value: vcpus.to_string() })?,
            memory_mib: u32::try_from(memory_mib)
                .map_err(|_| StoreError::UnknownValue { what: "meter memory", value: memory_mib.to_string() })?,
            running_nanos_per_sec: col(r, "running_nanos_per_sec")?,
            paused_nanos_per_sec: col(r, "paused_nanos_per_sec")?,
        },
        state: MeterState::parse(&state)
            .ok_or_else(|| StoreError::UnknownValue { what: "meter state", value: state.clone() })?,
        billed_until: col(r, "billed_until")?,
        carry: col(r, "carry")?,
    })
}

/// Open a sandbox's meter, running from `at` (inside `insert_sandbox`'s transaction).
pub(super) async fn open_meter_tx(
    tx: &mut Transaction<'static, Any>,
    sandbox_id: &str,
    project_id: &str,
    spec: &MeterSpec,
    state: MeterState,
    at: i64,
) -> Result<()> {
    let owner: Option<(String, String)> = sqlx::query_as(
        "SELECT w.account_id, p.workspace_id FROM projects p JOIN workspaces w ON w.id = p.workspace_id WHERE p.id = $1",
    )
    .bind(project_id)
    .fetch_optional(&mut **tx)
    .await
    .map_err(backend)?;
    let Some((account_id, workspace_id)) = owner else {
        return Err(StoreError::NotFound(format!("project {project_id}")));
    };
    insert_meter_tx(tx, sandbox_id, (&account_id, &workspace_id, project_id), spec, state, at).await
}

/// Insert meter `id` of `(account, workspace, project)`, in `state` from `at` (a template
/// build's, inside `insert_build`'s transaction, has no project).
pub(super) async fn insert_meter_tx(
    tx: &mut Transaction<'static, Any>,
    id: &str,
    (account_id, workspace_id, project_id): (&str, &str, &str),
    spec: &MeterSpec,
    state: MeterState,
    at: i64,
) -> Result<()> {
    sqlx::query(&format!(
        "INSERT INTO sandbox_meters ({METER_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 0)"
    ))
    .bind(id)
    .bind(account_id)
    .bind(workspace_id)
    .bind(project_id)
    .bind(spec.vcpus as i64)
    .bind(spec.memory_mib as i64)
    .bind(spec.running_nanos_per_sec)
    .bind(spec.paused_nanos_per_sec)
    .bind(state.as_str())
    .bind(at)
    .execute(&mut **tx)
    .await
    .map_err(backend)?;
    Ok(())
}

/// Append the usage entry for `[billed_until, until)` of `m` (none when nothing accrued)
/// and move its watermark to `until`. Returns whether an entry was written.
async fn bill_tx(tx: &mut Transaction<'static, Any>, m: &MeterRecord, until: i64) -> Result<bool> {
    let Some(from) = m.billed_until else { return Ok(false) };
    if until <= from {
        return Ok(false);
    }
    let (amount, carry) = m.charge(until);
    let ms = until - from;
    // A paused sandbox at a zero storage price leaves no trace; running time always
    // does (metrics count sandbox-seconds from the ledger, even when free).
    let write = m.state == MeterState::Running || amount > 0;
    if write {
        let (usage_kind, what) = match m.state {
            MeterState::Running => ("compute", "compute"),
            _ => ("paused_storage", "paused storage"),
        };
        sqlx::query(
            "INSERT INTO ledger (id, account_id, kind, amount_nanos, description, workspace_id, project_id, sandbox_id, \
             usage_kind, period_start, period_end, quantity_ms, nanos_per_second, created_at) \
             VALUES ($1, $2, 'usage', $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
        )
        .bind(lizard_api::ids::new_id("txn"))
        .bind(&m.account_id)
        .bind(-amount)
        .bind(format!(
            "{what} of {} ({} vCPU, {} MiB), {}.{:03} s",
            m.sandbox_id,
            m.spec.vcpus,
            m.spec.memory_mib,
            ms / 1000,
            ms % 1000
        ))
        .bind(&m.workspace_id)
        .bind(&m.project_id)
        .bind(&m.sandbox_id)
        .bind(usage_kind)
        .bind(from)
        .bind(until)
        .bind(ms)
        .bind(m.rate())
        .bind(until)
        .execute(&mut **tx)
        .await
        .map_err(backend)?;
    }
    sqlx::query("UPDATE sandbox_meters SET billed_until = $1, carry = $2 WHERE sandbox_id = $3")
        .bind(until)
        .bind(carry)
        .bind(&m.sandbox_id)
        .execute(&mut **tx)
        .await
        .map_err(backend)?;
    Ok(write)
}

/// Open a volume's storage meter from its `created_at` (inside `insert_volume`'s
/// transaction).
pub(super) async fn open_volume_meter_tx(tx: &mut Transaction<'static, Any>, v: &crate::NewVolume) -> Result<()> {
    sqlx::query(
        "INSERT INTO volume_meters (volume_id, account_id, workspace_id, project_id, size_gb, nanos_per_sec, \
         billed_until) SELECT $1, w.account_id, p.workspace_id, p.id, $2, $3, $4 \
         FROM projects p JOIN workspaces w ON w.id = p.workspace_id WHERE p.id = $5",
    )
    .bind(&v.id)
    .bind(i64::from(v.size_gb))
    .bind(v.nanos_per_sec)
    .bind(v.created_at)
    .bind(&v.project_id)
    .execute(&mut **tx)
    .await
    .map_err(backend)?;
    Ok(())
}

/// A volume's meter as stored.
struct VolumeMeter {
    volume_id: String,
    account_id: String,
    workspace_id: String,
    project_id: String,
    size_gb: i64,
    nanos_per_sec: i64,
    billed_until: i64,
    carry: i64,
}

const VOLUME_METER_COLUMNS: &str =
    "volume_id, account_id, workspace_id, project_id, size_gb, nanos_per_sec, billed_until, carry";

fn volume_meter(r: &AnyRow) -> Result<VolumeMeter> {
    Ok(VolumeMeter {
        volume_id: col(r, "volume_id")?,
        account_id: col(r, "account_id")?,
        workspace_id: col(r, "workspace_id")?,
        project_id: col(r, "project_id")?,
        size_gb: col(r, "size_gb")?,
        nanos_per_sec: col(r, "nanos_per_sec")?,
        billed_until: col(r, "billed_until")?,
        carry: col(r, "carry")?,
    })
}

/// Append the storage entry of `[billed_until, until)` of a volume (none when nothing
/// accrued: a free volume leaves no trace) and move its watermark. Whether it wrote one.
async fn bill_volume_tx(tx: &mut Transaction<'static, Any>, m: &VolumeMeter, until: i64) -> Result<bool> {
    if until <= m.billed_until {
        return Ok(false);
    }
    let ms = until - m.billed_until;
    let total = i128::from(ms) * i128::from(m.nanos_per_sec) + i128::from(m.carry);
    let amount = i64::try_from(total / 1000).unwrap_or(i64::MAX);
    let carry = i64::try_from(total % 1000).expect("a remainder of a division by 1000 fits");
    if amount > 0 {
        sqlx::query(
            "INSERT INTO ledger (id, account_id, kind, amount_nanos, description, workspace_id, project_id, \
             usage_kind, period_start, period_end, quantity_ms, nanos_per_second, created_at) \
             VALUES ($1, $2, 'usage', $3, $4, $5, $6, 'volume_storage', $7, $8, $9, $10, $11)",
        )
        .bind(lizard_api::ids::new_id("txn"))
        .bind(&m.account_id)
        .bind(-amount)
        .bind(format!("storage of volume {} ({} GiB), {}.{:03} s", m.volume_id, m.size_gb, ms / 1000, ms % 1000))
        .bind(&m.workspace_id)
        .bind(&m.project_id)
        .bind(m.billed_until)
        .bind(until)
        .bind(ms)
        .bind(m.nanos_per_sec)
        .bind(until)
        .execute(&mut **tx)
        .await
        .map_err(backend)?;
    }
    sqlx::query("UPDATE volume_meters SET billed_until = $1, carry = $2 WHERE volume_id = $3")
        .bind(until)
        .bind(carry)
        .bind(&m.volume_id)
        .execute(&mut **tx)
        .await
        .map_err(backend)?;
    Ok(amount > 0)
}

/// Bill a volume's storage up to `at` and remove its meter (inside its delete).
pub(super) async fn close_volume_meter_tx(tx: &mut Transaction<'static, Any>, volume_id: &str, at: i64) -> Result<()> {
    let row = sqlx::query(&format!("SELECT {VOLUME_METER_COLUMNS} FROM volume_meters WHERE volume_id = $1"))
        .bind(volume_id)
        .fetch_optional(&mut **tx)
        .await
        .map_err(backend)?;
    if let Some(m) = row.as_ref().map(volume_meter).transpose()? {
        bill_volume_tx(tx, &m, at).await?;
        sqlx::query("DELETE FROM volume_meters WHERE volume_id = $1")
            .bind(volume_id)
            .execute(&mut **tx)
            .await
            .map_err(backend)?;
    }
    Ok(())
}

/// Bill a sandbox's meter up to `at`, then put it in `state` from `at` on (ended: closed
/// for good). A sandbox without a meter (recorded before billing existed) is left alone;
/// an ended meter never reopens.
pub(super) async fn transition_tx(
    tx: &mut Transaction<'static, Any>,
    sandbox_id: &str,
    state: MeterState,
    at: i64,
) -> Result<()> {
    let row = sqlx::query(&format!("SELECT {METER_COLUMNS} FROM sandbox_meters WHERE sandbox_id = $1"))
        .bind(sandbox_id)
        .fetch_optional(&mut **tx)
        .await
        .map_err(backend)?;
    let Some(m) = row.as_ref().map(meter).transpose()? else { return Ok(()) };
    if m.state == MeterState::Ended {
        if state != MeterState::Ended {
            // A sandbox back in a billable state after its meter closed (it cannot happen
            // by design; if it does, it is metered again rather than running free).
            sqlx::query("UPDATE sandbox_meters SET state = $1, billed_until = $2, carry = 0 WHERE sandbox_id = $3")
                .bind(state.as_str())
                .bind(at)
                .bind(sandbox_id)
                .execute(&mut **tx)
                .await
                .map_err(backend)?;
        }
        return Ok(());
    }
    let until = m.billed_until.map_or(at, |b| at.max(b));
    bill_tx(tx, &m, until).await?;
    sqlx::query("UPDATE sandbox_meters SET state = $1, billed_until = $2 WHERE sandbox_id = $3")
        .bind(state.as_str())
        .bind((state != MeterState::Ended).then_some(until))
        .bind(sandbox_id)
        .execute(&mut **tx)
        .await
        .map_err(backend)?;
    Ok(())
}

/// The meter state of a sandbox state.
pub(super) fn meter_state_of(sandbox_state: SandboxState) -> MeterState {
    match sandbox_state {
        SandboxState::Paused => MeterState::Paused,
        SandboxState::Running => MeterState::Running,
        SandboxState::Ended => MeterState::Ended,
    }
}

#[async_trait]
impl BillingStore for SqlStore {
    async fn add_credit(&self, c: &NewCredit) -> Result<CreditOutcome> {
        let mut tx = self.write().await?;
        let exists: Option<String> = sqlx::query_scalar("SELECT id FROM accounts WHERE id = $1")
            .bind(&c.account_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend)?;
        if exists.is_none() {
            return Err(StoreError::NotFound(format!("account {}", c.account_id)));
        }
        let before =
            sqlx::query(&format!("SELECT {LEDGER_COLUMNS} FROM ledger WHERE account_id = $1 AND idempotency_key = $2"))
                .bind(&c.account_id)
                .bind(&c.idempotency_key)
                .fetch_optional(&mut *tx)
                .await
                .map_err(backend)?;
        if let Some(e) = before.as_ref().map(entry).transpose()? {
            if e.amount_nanos != c.amount_nanos || e.kind != c.kind {
                return Err(StoreError::Conflict(format!(
                    "idempotency key {:?} was already used for a {} of {} nano-dollars ({}); use a new key for a different credit",
                    c.idempotency_key,
                    e.kind.as_str(),
                    e.amount_nanos,
                    e.id
                )));
            }
            return Ok(CreditOutcome::AlreadyAdded(e));
        }
        let row = sqlx::query(&format!(
            "INSERT INTO ledger (id, account_id, kind, amount_nanos, description, idempotency_key, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING {LEDGER_COLUMNS}"
        ))
        .bind(lizard_api::ids::new_id("txn"))
        .bind(&c.account_id)
        .bind(c.kind.as_str())
        .bind(c.amount_nanos)
        .bind(&c.description)
        .bind(&c.idempotency_key)
        .bind(c.at)
        .fetch_one(&mut *tx)
        .await
        .map_err(backend)?;
        let e = entry(&row)?;
        tx.commit().await.map_err(backend)?;
        Ok(CreditOutcome::Added(e))
    }

    async fn grant_signup_credits(&self, amount_nanos: i64, at: i64) -> Result<u64> {
        let mut tx = self.write().await?;
        let accounts: Vec<String> = sqlx::query_scalar(
            "SELECT a.id FROM accounts a WHERE NOT EXISTS \
             (SELECT 1 FROM ledger l WHERE l.account_id = a.id AND l.idempotency_key = $1) ORDER BY a.id",
        )
        .bind(SIGNUP_CREDIT_KEY)
        .fetch_all(&mut *tx)
        .await
        .map_err(backend)?;
        for a in &accounts {
            sqlx::query(
                "INSERT INTO ledger (id, account_id, kind, amount_nanos, description, idempotency_key, created_at) \
                 VALUES ($1, $2, 'signup_credit', $3, 'free credits for a new account', $4, $5)",
            )
            .bind(lizard_api::ids::new_id("txn"))
            .bind(a)
            .bind(amount_nanos)
            .bind(SIGNUP_CREDIT_KEY)
            .bind(at)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        }
        tx.commit().await.map_err(backend)?;
        Ok(accounts.len() as u64)
    }

    async fn balance(&self, account_id: &str) -> Result<BalanceRecord> {
        let row: Option<(i64, Option<i64>)> =
            sqlx::query_as("SELECT balance_nanos, depleted_at FROM account_balances WHERE account_id = $1")
                .bind(account_id)
                .fetch_optional(&self.pool)
                .await
                .map_err(backend)?;
        Ok(row.map(|(balance_nanos, depleted_at)| BalanceRecord { balance_nanos, depleted_at }).unwrap_or_default())
    }

    async fn ledger_sum(&self, account_id: &str) -> Result<i64> {
        sqlx::query_scalar("SELECT CAST(COALESCE(SUM(amount_nanos), 0) AS BIGINT) FROM ledger WHERE account_id = $1")
            .bind(account_id)
            .fetch_one(&self.pool)
            .await
            .map_err(backend)
    }

    async fn ledger_page(
        &self,
        account_id: &str,
        before_seq: Option<i64>,
        limit: u32,
        include_usage: bool,
    ) -> Result<Vec<LedgerEntry>> {
        sqlx::query(&format!(
            "SELECT {LEDGER_COLUMNS} FROM ledger WHERE account_id = $1 AND ($2 IS NULL OR seq < $2) \
             AND ($3 OR kind != 'usage') ORDER BY seq DESC LIMIT $4"
        ))
        .bind(account_id)
        .bind(before_seq)
        .bind(include_usage)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?
        .iter()
        .map(entry)
        .collect()
    }

    async fn bill_meters(&self, now: i64) -> Result<u64> {
        let mut tx = self.write().await?;
        let open = sqlx::query(&format!(
            "SELECT {METER_COLUMNS} FROM sandbox_meters WHERE state != 'ended' AND billed_until < $1 ORDER BY sandbox_id"
        ))
        .bind(now)
        .fetch_all(&mut *tx)
        .await
        .map_err(backend)?
        .iter()
        .map(meter)
        .collect::<Result<Vec<_>>>()?;
        // A sandbox on a remote node is billed no further than its node's last heartbeat:
        // if the node is then lost, its meter closes exactly there.
        let heard: std::collections::HashMap<String, i64> = sqlx::query(
            "SELECT s.id, n.last_heartbeat FROM sandboxes s JOIN nodes n ON n.id = s.node_id \
             WHERE s.ended_at IS NULL AND n.address IS NOT NULL AND n.last_heartbeat IS NOT NULL",
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(backend)?
        .iter()
        .map(|r| Ok((col::<String, _>(r, 0)?, col::<i64, _>(r, 1)?)))
        .collect::<Result<_>>()?;
        let mut written = 0;
        for m in &open {
            let until = heard.get(&m.sandbox_id).map_or(now, |&at| at.min(now));
            if bill_tx(&mut tx, m, until).await? {
                written += 1;
            }
        }
        let volumes = sqlx::query(&format!(
            "SELECT {VOLUME_METER_COLUMNS} FROM volume_meters WHERE billed_until < $1 ORDER BY volume_id"
        ))
        .bind(now)
        .fetch_all(&mut *tx)
        .await
        .map_err(backend)?
        .iter()
        .map(volume_meter)
        .collect::<Result<Vec<_>>>()?;
        for m in &volumes {
            if bill_volume_tx(&mut tx, m, now).await? {
                written += 1;
            }
        }
        tx.commit().await.map_err(backend)?;
        Ok(written)
    }

    async fn set_meter_state(&self, meter_id: &str, state: MeterState, at: i64) -> Result<bool> {
        let mut tx = self.write().await?;
        let current: Option<String> = sqlx::query_scalar("SELECT state FROM sandbox_meters WHERE sandbox_id = $1")
            .bind(meter_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend)?;
        match current.as_deref() {
            Some(now) if now != MeterState::Ended.as_str() && now != state.as_str() => {}
            _ => return Ok(false),
        }
        transition_tx(&mut tx, meter_id, state, at).await?;
        tx.commit().await.map_err(backend)?;
        Ok(true)
    }

    async fn close_meters_at_watermark(&self, running: &[String]) -> Result<u64> {
        // Under the lock: a tick of another replica must not bill a meter this closes.
        let running = super::json_list(running)?;
        let mut tx = self.write().await?;
        let r = sqlx::query(&format!(
            "UPDATE sandbox_meters SET state = 'ended', billed_until = NULL WHERE state = 'running' \
             AND sandbox_id NOT IN {} \
             AND sandbox_id NOT IN (SELECT id FROM sandboxes WHERE node_id IS NOT NULL AND node_id != 'node_local')",
            self.engine.json_list("$1")
        ))
        .bind(running)
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        Ok(r.rows_affected())
    }

    async fn charged_by_sandbox(&self, account_id: &str, sandbox_ids: &[String]) -> Result<BTreeMap<String, i64>> {
        let rows: Vec<(String, i64)> = sqlx::query_as(&format!(
            "SELECT sandbox_id, CAST(-SUM(amount_nanos) AS BIGINT) FROM ledger WHERE account_id = $1 AND kind = 'usage' \
             AND sandbox_id IN {} GROUP BY sandbox_id",
            self.engine.json_list("$2")
        ))
        .bind(account_id)
        .bind(super::json_list(sandbox_ids)?)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        Ok(rows.into_iter().collect())
    }

    async fn open_meters(&self, account_id: Option<&str>) -> Result<Vec<MeterRecord>> {
        sqlx::query(&format!(
            "SELECT {METER_COLUMNS} FROM sandbox_meters WHERE state != 'ended' AND ($1 IS NULL OR account_id = $1) \
             ORDER BY sandbox_id"
        ))
        .bind(account_id)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?
        .iter()
        .map(meter)
        .collect()
    }

    async fn depleted_accounts(&self, depleted_at_or_before: i64) -> Result<Vec<String>> {
        sqlx::query_scalar(
            "SELECT account_id FROM account_balances WHERE depleted_at IS NOT NULL AND depleted_at <= $1 ORDER BY account_id",
        )
        .bind(depleted_at_or_before)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)
    }

    async fn usage_by_period(
        &self,
        account_id: &str,
        granularity: Granularity,
        periods: u32,
    ) -> Result<Vec<PeriodRow>> {
        // Usage counts in the period its interval started in; credits when added.
        let rows: Vec<(String, Option<String>, Option<String>, i64, i64)> = sqlx::query_as(&format!(
            "WITH e AS (SELECT {} AS period, \
                    kind, usage_kind, workspace_id, project_id, amount_nanos, quantity_ms FROM ledger WHERE account_id = $1), \
                  recent AS (SELECT DISTINCT period FROM e ORDER BY period DESC LIMIT $2) \
             SELECT period, workspace_id, project_id, CAST(SUM(amount_nanos) AS BIGINT), \
                    CAST(SUM(CASE WHEN usage_kind = 'compute' THEN quantity_ms ELSE 0 END) AS BIGINT) \
             FROM e WHERE period IN (SELECT period FROM recent) \
             GROUP BY period, kind = 'usage', workspace_id, project_id \
             ORDER BY period DESC, workspace_id, project_id",
            self.engine.utc_period("COALESCE(period_start, created_at)", granularity)
        ))
        .bind(account_id)
        .bind(periods as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        Ok(rows
            .into_iter()
            .map(|(period, workspace_id, project_id, amount_nanos, sandbox_ms)| PeriodRow {
                period,
                workspace_id,
                project_id,
                amount_nanos,
                sandbox_ms,
            })
            .collect())
    }

    async fn usage_by_project(
        &self,
        account_id: &str,
        from: Option<i64>,
        to: Option<i64>,
    ) -> Result<Vec<ProjectUsage>> {
        let rows: Vec<(String, String, i64, i64, i64)> = sqlx::query_as(
            "WITH used AS (SELECT workspace_id, project_id, CAST(-SUM(amount_nanos) AS BIGINT) AS cost, \
                    CAST(SUM(CASE WHEN usage_kind = 'compute' THEN quantity_ms ELSE 0 END) AS BIGINT) AS ms \
                  FROM ledger WHERE account_id = $1 AND kind = 'usage' \
                  AND ($2 IS NULL OR period_start >= $2) AND ($3 IS NULL OR period_start < $3) \
                  GROUP BY workspace_id, project_id), \
              live AS (SELECT workspace_id, project_id, COUNT(*) AS running FROM sandbox_meters \
                  WHERE account_id = $1 AND state = 'running' GROUP BY workspace_id, project_id), \
              keys AS (SELECT workspace_id, project_id FROM used UNION SELECT workspace_id, project_id FROM live) \
             SELECT k.workspace_id, k.project_id, COALESCE(u.cost, 0), COALESCE(u.ms, 0), COALESCE(l.running, 0) \
             FROM keys k LEFT JOIN used u ON u.workspace_id = k.workspace_id AND u.project_id = k.project_id \
             LEFT JOIN live l ON l.workspace_id = k.workspace_id AND l.project_id = k.project_id \
             ORDER BY k.workspace_id, k.project_id",
        )
        .bind(account_id)
        .bind(from)
        .bind(to)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        Ok(rows
            .into_iter()
            .map(|(workspace_id, project_id, cost_nanos, sandbox_ms, running)| ProjectUsage {
                workspace_id,
                project_id,
                cost_nanos,
                sandbox_ms,
                running: u32::try_from(running).unwrap_or(u32::MAX),
            })
            .collect())
    }
}
