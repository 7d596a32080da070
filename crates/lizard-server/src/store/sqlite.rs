//! [`Store`] on SQLite: one file, `<data_dir>/lizard.db`, the embedded default.
//!
//! **Why sqlx** (and not rusqlite behind `spawn_blocking`): its pool is async, so a
//! handler awaits a connection instead of parking a blocking thread per query; and the
//! same crate speaks PostgreSQL with the same query API, so the later `PgStore` is this
//! file with its SQL dialect adjusted rather than a second database layer. Queries are
//! plain strings (`sqlx::query`, no compile-time macros), so building needs no database.
//!
//! **Settings.** WAL journal (readers never block the writer nor each other), `synchronous
//! = NORMAL` (durable across process crashes; a power cut may lose the last commits, never
//! corrupt), foreign keys on, a 5 s busy timeout. The file is created mode 0600: it holds
//! key hashes and account emails (SQLite gives its `-wal`/`-shm` files the same mode).
//!
//! **Transactions.** Operations that check and then write (delete-if-empty, bootstrap,
//! revoke-unless-last) run in `BEGIN IMMEDIATE` transactions: SQLite then takes the write
//! lock up front. A deferred transaction that reads first and upgrades later can fail
//! with `SQLITE_BUSY` at once in WAL mode, without waiting out the busy timeout.
//!
//! **Migrations** are the files in `crates/lizard-server/migrations/`, compiled in
//! (`NNNN_name.sql`), applied in order at [`SqliteStore::open`], each in its own
//! transaction, and recorded in `lizard_schema`. A database that has a version this build
//! does not know is refused ([`StoreError::SchemaTooNew`]) instead of being misread.

use super::*;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Row, Sqlite, Transaction};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

/// The schema, in order. The version is the file's number.
pub const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "tenancy", include_str!("../../migrations/0001_tenancy.sql")),
    (2, "billing", include_str!("../../migrations/0002_billing.sql")),
    (3, "volumes", include_str!("../../migrations/0003_volumes.sql")),
    (4, "lifecycle", include_str!("../../migrations/0004_lifecycle.sql")),
    (5, "templates", include_str!("../../migrations/0005_templates.sql")),
    (6, "idempotency", include_str!("../../migrations/0006_idempotency.sql")),
    (7, "volume billing", include_str!("../../migrations/0007_volume_billing.sql")),
    (8, "sandbox access", include_str!("../../migrations/0008_sandbox_access.sql")),
    (9, "cluster", include_str!("../../migrations/0009_cluster.sql")),
    (10, "blob content", include_str!("../../migrations/0010_blob_content.sql")),
    (11, "services", include_str!("../../migrations/0011_services.sql")),
    (12, "ledger by sandbox", include_str!("../../migrations/0012_ledger_by_sandbox.sql")),
    (13, "join token uses", include_str!("../../migrations/0013_join_token_uses.sql")),
    (14, "volume quotas", include_str!("../../migrations/0014_volume_quotas.sql")),
    (15, "public urls with a token", include_str!("../../migrations/0015_public_urls_with_token.sql")),
    (16, "sandbox snapshots", include_str!("../../migrations/0016_sandbox_snapshots.sql")),
    (17, "template tags", include_str!("../../migrations/0017_template_tags.sql")),
];

mod access;
mod billing;
mod blob_content;
mod cluster;
mod idempotency;
mod services;
mod templates;
mod volumes;

super::snapshots::impl_snapshot_store!(SqliteStore, sqlx::sqlite::SqliteRow);
super::template_tags::impl_template_tag_store!(SqliteStore, sqlx::sqlite::SqliteRow);
pub use billing::SIGNUP_CREDIT_KEY;

/// The database file's name inside the data directory.
pub const DB_FILE: &str = "lizard.db";

/// SQLite-backed [`Store`].
#[derive(Clone)]
pub struct SqliteStore {
    pub(in crate::store) pool: SqlitePool,
}

fn backend(e: sqlx::Error) -> StoreError {
    StoreError::Backend(Box::new(e))
}

/// How often, and how far apart, an open that found the file locked is tried again.
const OPEN_BUSY_TRIES: u32 = 50;
const OPEN_BUSY_WAIT: Duration = Duration::from_millis(100);

/// Whether `e` is SQLite's "database is locked" (SQLITE_BUSY).
fn is_busy(e: &StoreError) -> bool {
    let StoreError::Backend(source) = e else { return false };
    matches!(source.downcast_ref::<sqlx::Error>(), Some(sqlx::Error::Database(db)) if db.code().as_deref() == Some("5"))
}

/// A unique-constraint violation becomes [`StoreError::Conflict`] with `what`.
fn conflict_or_backend(e: sqlx::Error, what: impl FnOnce() -> String) -> StoreError {
    match &e {
        sqlx::Error::Database(db) if db.is_unique_violation() => StoreError::Conflict(what()),
        _ => backend(e),
    }
}

fn json_err(e: serde_json::Error) -> StoreError {
    StoreError::Backend(Box::new(e))
}

/// The pool of a database file. A connection still inside a transaction when it comes
/// back (its COMMIT or ROLLBACK failed, e.g. on a full disk) is closed instead of being
/// reused: reused, every later transaction on it failed ("non-zero transaction depth")
/// and the server answered 500s and missed billing ticks until it was restarted.
fn file_pool_options() -> SqlitePoolOptions {
    use sqlx::Connection;
    SqlitePoolOptions::new()
        .max_connections(4)
        .after_release(|conn, _| {
            let clean = !conn.is_in_transaction();
            if !clean {
                // Also every transaction dropped on an error path (its ROLLBACK is only
                // queued): common, so not a warning; a failed COMMIT is reported where it fails.
                tracing::debug!("closing a database connection still inside a transaction");
            }
            Box::pin(async move { Ok(clean) })
        })
        .before_acquire(|conn, _| {
            let clean = !conn.is_in_transaction();
            Box::pin(async move { Ok(clean) })
        })
}

impl SqliteStore {
    /// Open (creating if needed) `<data_dir>/lizard.db` and apply pending migrations.
    pub async fn open(data_dir: &Path) -> Result<Self> {
        Self::open_file(&data_dir.join(DB_FILE)).await
    }

    /// Open (creating if needed, with its directory) the database file at `path`, and
    /// apply pending migrations.
    pub async fn open_file(path: &Path) -> Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| StoreError::Backend(Box::new(e)))?;
        }
        {
            // Create it owner-only before SQLite does (SQLite would use the umask).
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| StoreError::Backend(Box::new(e)))?;
        }
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(5));
        // Servers opening a new file at once race to turn it to WAL, which SQLite answers
        // with SQLITE_BUSY at once (no busy handler): the loser tries again, for at most
        // OPEN_BUSY_TRIES × OPEN_BUSY_WAIT.
        let mut tries = 0;
        loop {
            let opened = async {
                let pool = file_pool_options().connect_with(options.clone()).await.map_err(backend)?;
                let store = SqliteStore { pool };
                store.migrate().await?;
                Ok(store)
            };
            match opened.await {
                Err(e) if is_busy(&e) && tries < OPEN_BUSY_TRIES => {
                    tries += 1;
                    tokio::time::sleep(OPEN_BUSY_WAIT).await;
                }
                result => return result,
            }
        }
    }

    /// A private in-memory database (tests): one connection that lives as long as the
    /// store, since the database disappears with its last connection.
    pub async fn memory() -> Result<Self> {
        let options = SqliteConnectOptions::from_str("sqlite::memory:").map_err(backend)?.foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(options)
            .await
            .map_err(backend)?;
        let store = SqliteStore { pool };
        store.migrate().await?;
        Ok(store)
    }

    /// The schema version now in the database (0: empty).
    pub async fn schema_version(&self) -> Result<i64> {
        let v: Option<i64> = sqlx::query_scalar("SELECT MAX(version) FROM lizard_schema")
            .fetch_one(&self.pool)
            .await
            .map_err(backend)?;
        Ok(v.unwrap_or(0))
    }

    async fn migrate(&self) -> Result<()> {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS lizard_schema (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)",
        )
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        let known = MIGRATIONS.last().map(|m| m.0).unwrap_or(0);
        let found = self.schema_version().await?;
        if found > known {
            return Err(StoreError::SchemaTooNew { found, known });
        }
        for &(version, name, sql) in MIGRATIONS {
            let mut tx = self.write().await?;
            // Re-check inside the write lock: another server may have applied it meanwhile.
            let done: Option<i64> = sqlx::query_scalar("SELECT version FROM lizard_schema WHERE version = ?")
                .bind(version)
                .fetch_optional(&mut *tx)
                .await
                .map_err(backend)?;
            if done.is_some() {
                continue;
            }
            sqlx::raw_sql(sql).execute(&mut *tx).await.map_err(backend)?;
            sqlx::query("INSERT INTO lizard_schema (version, name, applied_at) VALUES (?, ?, ?)")
                .bind(version)
                .bind(name)
                .bind(crate::ids::now_ms())
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
            tx.commit().await.map_err(backend)?;
            tracing::info!(version, name, "applied database migration");
        }
        Ok(())
    }

    /// A write transaction holding SQLite's write lock from the start.
    async fn write(&self) -> Result<Transaction<'static, Sqlite>> {
        self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(backend)
    }
}

// --- row mapping --------------------------------------------------------------------

fn account(r: &SqliteRow) -> Result<AccountRecord> {
    Ok(AccountRecord {
        id: r.try_get("id").map_err(backend)?,
        email: r.try_get("email").map_err(backend)?,
        plan: r.try_get("plan").map_err(backend)?,
        created_at: r.try_get("created_at").map_err(backend)?,
    })
}

fn workspace(r: &SqliteRow) -> Result<WorkspaceRecord> {
    Ok(WorkspaceRecord {
        id: r.try_get("id").map_err(backend)?,
        account_id: r.try_get("account_id").map_err(backend)?,
        name: r.try_get("name").map_err(backend)?,
        slug: r.try_get("slug").map_err(backend)?,
        created_at: r.try_get("created_at").map_err(backend)?,
        volume_quota_gb: super::volumes::quota_gb(r.try_get("volume_quota_gb").map_err(backend)?),
    })
}

fn project(r: &SqliteRow) -> Result<ProjectRecord> {
    Ok(ProjectRecord {
        id: r.try_get("id").map_err(backend)?,
        workspace_id: r.try_get("workspace_id").map_err(backend)?,
        name: r.try_get("name").map_err(backend)?,
        slug: r.try_get("slug").map_err(backend)?,
        created_at: r.try_get("created_at").map_err(backend)?,
    })
}

fn key(r: &SqliteRow) -> Result<KeyRecord> {
    let workspaces: Option<String> = r.try_get("workspaces").map_err(backend)?;
    let projects: Option<String> = r.try_get("projects").map_err(backend)?;
    let scope = match (workspaces, projects) {
        (None, None) => None,
        (w, p) => {
            let parse = |s: Option<String>| -> Result<Vec<String>> {
                s.map(|s| serde_json::from_str(&s).map_err(json_err)).transpose().map(Option::unwrap_or_default)
            };
            Some(Scope::new(parse(w)?, parse(p)?))
        }
    };
    Ok(KeyRecord {
        id: r.try_get("id").map_err(backend)?,
        account_id: r.try_get("account_id").map_err(backend)?,
        name: r.try_get("name").map_err(backend)?,
        prefix: r.try_get("prefix").map_err(backend)?,
        hash: r.try_get("hash").map_err(backend)?,
        scope,
        created_at: r.try_get("created_at").map_err(backend)?,
        revoked_at: r.try_get("revoked_at").map_err(backend)?,
    })
}

/// Scope columns of a key: both NULL (unscoped) or both JSON arrays.
fn scope_columns(scope: &Option<Scope>) -> Result<(Option<String>, Option<String>)> {
    match scope {
        None => Ok((None, None)),
        Some(s) => Ok((
            Some(serde_json::to_string(&s.workspaces).map_err(json_err)?),
            Some(serde_json::to_string(&s.projects).map_err(json_err)?),
        )),
    }
}

const SANDBOX_COLUMNS: &str = "s.id, w.account_id, p.workspace_id, s.project_id, s.template, s.state, s.created_at, \
     s.timeout_at, s.ended_at, s.end_reason, s.metadata, s.on_timeout, s.timeout_ms, s.template_ref, \
     COALESCE(s.node_id, 'node_local') AS node_id FROM sandboxes s JOIN projects p ON p.id = s.project_id JOIN workspaces w ON w.id = p.workspace_id";

fn sandbox(r: &SqliteRow) -> Result<SandboxRecord> {
    let metadata: String = r.try_get("metadata").map_err(backend)?;
    Ok(SandboxRecord {
        id: r.try_get("id").map_err(backend)?,
        account_id: r.try_get("account_id").map_err(backend)?,
        workspace_id: r.try_get("workspace_id").map_err(backend)?,
        project_id: r.try_get("project_id").map_err(backend)?,
        template: r.try_get("template").map_err(backend)?,
        state: parse_sandbox_state(&r.try_get::<String, _>("state").map_err(backend)?)?,
        created_at: r.try_get("created_at").map_err(backend)?,
        timeout_at: r.try_get("timeout_at").map_err(backend)?,
        ended_at: r.try_get("ended_at").map_err(backend)?,
        end_reason: r.try_get("end_reason").map_err(backend)?,
        metadata: serde_json::from_str(&metadata).map_err(json_err)?,
        on_timeout: parse_on_timeout(&r.try_get::<String, _>("on_timeout").map_err(backend)?)?,
        timeout_ms: r.try_get("timeout_ms").map_err(backend)?,
        template_ref: r.try_get("template_ref").map_err(backend)?,
        node_id: r.try_get("node_id").map_err(backend)?,
    })
}

const KEY_COLUMNS: &str = "id, account_id, name, prefix, hash, workspaces, projects, created_at, revoked_at";

async fn insert_key_tx(tx: &mut Transaction<'static, Sqlite>, k: &KeyRecord) -> Result<()> {
    let (w, p) = scope_columns(&k.scope)?;
    sqlx::query(&format!("INSERT INTO api_keys ({KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"))
        .bind(&k.id)
        .bind(&k.account_id)
        .bind(&k.name)
        .bind(&k.prefix)
        .bind(&k.hash)
        .bind(w)
        .bind(p)
        .bind(k.created_at)
        .bind(k.revoked_at)
        .execute(&mut **tx)
        .await
        .map_err(|e| conflict_or_backend(e, || format!("key id {} already exists", k.id)))?;
    Ok(())
}

#[async_trait]
impl Store for SqliteStore {
    async fn bootstrap(&self, a: &AccountRecord, k: &KeyRecord) -> Result<bool> {
        let mut tx = self.write().await?;
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM accounts").fetch_one(&mut *tx).await.map_err(backend)?;
        if n > 0 {
            return Ok(false);
        }
        sqlx::query("INSERT INTO accounts (id, email, plan, created_at) VALUES (?, ?, ?, ?)")
            .bind(&a.id)
            .bind(&a.email)
            .bind(&a.plan)
            .bind(a.created_at)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        insert_key_tx(&mut tx, k).await?;
        tx.commit().await.map_err(backend)?;
        Ok(true)
    }

    async fn get_account(&self, account_id: &str) -> Result<Option<AccountRecord>> {
        sqlx::query("SELECT id, email, plan, created_at FROM accounts WHERE id = ?")
            .bind(account_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?
            .as_ref()
            .map(account)
            .transpose()
    }

    async fn insert_workspace(&self, w: &WorkspaceRecord) -> Result<()> {
        sqlx::query("INSERT INTO workspaces (id, account_id, name, slug, created_at) VALUES (?, ?, ?, ?, ?)")
            .bind(&w.id)
            .bind(&w.account_id)
            .bind(&w.name)
            .bind(&w.slug)
            .bind(w.created_at)
            .execute(&self.pool)
            .await
            .map_err(|e| {
                conflict_or_backend(e, || format!("a workspace named {:?} (slug {:?}) already exists", w.name, w.slug))
            })?;
        Ok(())
    }

    async fn get_workspace(&self, account_id: &str, workspace_id: &str) -> Result<Option<WorkspaceRecord>> {
        sqlx::query("SELECT * FROM workspaces WHERE account_id = ? AND id = ?")
            .bind(account_id)
            .bind(workspace_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?
            .as_ref()
            .map(workspace)
            .transpose()
    }

    async fn set_workspace_volume_quota(
        &self,
        account_id: &str,
        workspace_id: &str,
        quota_gb: Option<u32>,
    ) -> Result<WorkspaceRecord> {
        sqlx::query("UPDATE workspaces SET volume_quota_gb = $1 WHERE account_id = $2 AND id = $3")
            .bind(quota_gb.map(i64::from))
            .bind(account_id)
            .bind(workspace_id)
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        self.get_workspace(account_id, workspace_id)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("workspace {workspace_id}")))
    }

    async fn list_workspaces(&self, account_id: &str) -> Result<Vec<WorkspaceRecord>> {
        sqlx::query("SELECT * FROM workspaces WHERE account_id = ? ORDER BY created_at, id")
            .bind(account_id)
            .fetch_all(&self.pool)
            .await
            .map_err(backend)?
            .iter()
            .map(workspace)
            .collect()
    }

    async fn delete_workspace(&self, account_id: &str, workspace_id: &str, force: bool) -> Result<Removed> {
        let mut tx = self.write().await?;
        let exists: Option<String> = sqlx::query_scalar("SELECT id FROM workspaces WHERE account_id = ? AND id = ?")
            .bind(account_id)
            .bind(workspace_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend)?;
        if exists.is_none() {
            return Err(StoreError::NotFound(format!("workspace {workspace_id}")));
        }
        let projects: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM projects WHERE workspace_id = ?")
            .bind(workspace_id)
            .fetch_one(&mut *tx)
            .await
            .map_err(backend)?;
        if projects > 0 && !force {
            return Err(StoreError::NotEmpty(format!(
                "workspace {workspace_id} still has {projects} project(s); delete them first, or delete with force=true to remove everything in it"
            )));
        }
        let live = sqlx::query(&format!(
            "SELECT {SANDBOX_COLUMNS} WHERE p.workspace_id = ? AND s.ended_at IS NULL ORDER BY s.created_at, s.id"
        ))
        .bind(workspace_id)
        .fetch_all(&mut *tx)
        .await
        .map_err(backend)?
        .iter()
        .map(sandbox)
        .collect::<Result<Vec<_>>>()?;
        let vols = sqlx::query(&format!(
            "SELECT {} WHERE p.workspace_id = ? ORDER BY v.created_at, v.id",
            volumes::VOLUME_COLUMNS
        ))
        .bind(workspace_id)
        .fetch_all(&mut *tx)
        .await
        .map_err(backend)?
        .iter()
        .map(volumes::volume)
        .collect::<Result<Vec<_>>>()?;
        let template_refs: Vec<String> = sqlx::query_scalar(
            "SELECT b.template_ref FROM template_builds b JOIN templates t ON t.id = b.template_id \
             WHERE t.workspace_id = ? ORDER BY b.created_at, b.rowid",
        )
        .bind(workspace_id)
        .fetch_all(&mut *tx)
        .await
        .map_err(backend)?;
        // Their storage is billed up to here, then their meters go.
        let now = crate::ids::now_ms();
        for v in &vols {
            billing::close_volume_meter_tx(&mut tx, &v.id, now).await?;
        }
        sqlx::query("DELETE FROM volumes WHERE project_id IN (SELECT id FROM projects WHERE workspace_id = ?)")
            .bind(workspace_id)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        // The live ones stop now: bill them up to here and close their meters.
        for s in &live {
            billing::transition_tx(&mut tx, &s.id, MeterState::Ended, now).await?;
        }
        sqlx::query("DELETE FROM sandboxes WHERE project_id IN (SELECT id FROM projects WHERE workspace_id = ?)")
            .bind(workspace_id)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        sqlx::query("DELETE FROM projects WHERE workspace_id = ?")
            .bind(workspace_id)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        sqlx::query("DELETE FROM workspaces WHERE id = ?")
            .bind(workspace_id)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        Ok(Removed { live_sandboxes: live, volumes: vols, template_refs })
    }

    async fn insert_project(&self, account_id: &str, p: &ProjectRecord) -> Result<()> {
        let mut tx = self.write().await?;
        let ws: Option<String> = sqlx::query_scalar("SELECT id FROM workspaces WHERE account_id = ? AND id = ?")
            .bind(account_id)
            .bind(&p.workspace_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend)?;
        if ws.is_none() {
            return Err(StoreError::NotFound(format!("workspace {}", p.workspace_id)));
        }
        sqlx::query("INSERT INTO projects (id, workspace_id, name, slug, created_at) VALUES (?, ?, ?, ?, ?)")
            .bind(&p.id)
            .bind(&p.workspace_id)
            .bind(&p.name)
            .bind(&p.slug)
            .bind(p.created_at)
            .execute(&mut *tx)
            .await
            .map_err(|e| {
                conflict_or_backend(e, || {
                    format!("a project named {:?} (slug {:?}) already exists in this workspace", p.name, p.slug)
                })
            })?;
        tx.commit().await.map_err(backend)?;
        Ok(())
    }

    async fn get_project(&self, account_id: &str, project_id: &str) -> Result<Option<ProjectRecord>> {
        sqlx::query(
            "SELECT p.* FROM projects p JOIN workspaces w ON w.id = p.workspace_id WHERE w.account_id = ? AND p.id = ?",
        )
        .bind(account_id)
        .bind(project_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(backend)?
        .as_ref()
        .map(project)
        .transpose()
    }

    async fn list_projects(&self, account_id: &str, workspace_id: Option<&str>) -> Result<Vec<ProjectRecord>> {
        sqlx::query(
            "SELECT p.* FROM projects p JOIN workspaces w ON w.id = p.workspace_id \
             WHERE w.account_id = ?1 AND (?2 IS NULL OR p.workspace_id = ?2) ORDER BY p.created_at, p.id",
        )
        .bind(account_id)
        .bind(workspace_id)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?
        .iter()
        .map(project)
        .collect()
    }

    async fn rename_project(&self, account_id: &str, project_id: &str, name: &str) -> Result<ProjectRecord> {
        let mut tx = self.write().await?;
        let row = sqlx::query(
            "SELECT p.* FROM projects p JOIN workspaces w ON w.id = p.workspace_id WHERE w.account_id = ? AND p.id = ?",
        )
        .bind(account_id)
        .bind(project_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(backend)?;
        let Some(mut p) = row.as_ref().map(project).transpose()? else {
            return Err(StoreError::NotFound(format!("project {project_id}")));
        };
        sqlx::query("UPDATE projects SET name = ? WHERE id = ?")
            .bind(name)
            .bind(project_id)
            .execute(&mut *tx)
            .await
            .map_err(|e| {
                conflict_or_backend(e, || format!("a project named {name:?} already exists in this workspace"))
            })?;
        tx.commit().await.map_err(backend)?;
        p.name = name.to_string();
        Ok(p)
    }

    async fn delete_project(&self, account_id: &str, project_id: &str) -> Result<()> {
        let mut tx = self.write().await?;
        let exists: Option<String> = sqlx::query_scalar(
            "SELECT p.id FROM projects p JOIN workspaces w ON w.id = p.workspace_id WHERE w.account_id = ? AND p.id = ?",
        )
        .bind(account_id)
        .bind(project_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(backend)?;
        if exists.is_none() {
            return Err(StoreError::NotFound(format!("project {project_id}")));
        }
        let live: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sandboxes WHERE project_id = ? AND ended_at IS NULL")
            .bind(project_id)
            .fetch_one(&mut *tx)
            .await
            .map_err(backend)?;
        if live > 0 {
            return Err(StoreError::NotEmpty(format!(
                "project {project_id} still has {live} running sandbox(es); kill them first"
            )));
        }
        let vols: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM volumes WHERE project_id = ?")
            .bind(project_id)
            .fetch_one(&mut *tx)
            .await
            .map_err(backend)?;
        if vols > 0 {
            return Err(StoreError::NotEmpty(format!(
                "project {project_id} still has {vols} volume(s); delete them first"
            )));
        }
        sqlx::query("DELETE FROM sandboxes WHERE project_id = ?")
            .bind(project_id)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        sqlx::query("DELETE FROM projects WHERE id = ?").bind(project_id).execute(&mut *tx).await.map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        Ok(())
    }

    async fn insert_key(&self, k: &KeyRecord) -> Result<()> {
        let mut tx = self.write().await?;
        insert_key_tx(&mut tx, k).await?;
        tx.commit().await.map_err(backend)
    }

    async fn keys_by_prefix(&self, prefix: &str) -> Result<Vec<KeyRecord>> {
        sqlx::query(&format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE prefix = ?"))
            .bind(prefix)
            .fetch_all(&self.pool)
            .await
            .map_err(backend)?
            .iter()
            .map(key)
            .collect()
    }

    async fn key_hashes_since(&self, since: i64) -> Result<Vec<Vec<u8>>> {
        sqlx::query_scalar("SELECT hash FROM api_keys WHERE created_at >= ?")
            .bind(since)
            .fetch_all(&self.pool)
            .await
            .map_err(backend)
    }

    async fn get_key(&self, account_id: &str, key_id: &str) -> Result<Option<KeyRecord>> {
        sqlx::query(&format!(
            "SELECT {KEY_COLUMNS} FROM api_keys WHERE account_id = ? AND id = ? AND revoked_at IS NULL"
        ))
        .bind(account_id)
        .bind(key_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(backend)?
        .as_ref()
        .map(key)
        .transpose()
    }

    async fn list_keys(&self, account_id: &str) -> Result<Vec<KeyRecord>> {
        sqlx::query(&format!(
            "SELECT {KEY_COLUMNS} FROM api_keys WHERE account_id = ? AND revoked_at IS NULL ORDER BY created_at, id"
        ))
        .bind(account_id)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?
        .iter()
        .map(key)
        .collect()
    }

    async fn revoke_key(&self, account_id: &str, key_id: &str, at: i64) -> Result<()> {
        let mut tx = self.write().await?;
        let row = sqlx::query(&format!(
            "SELECT {KEY_COLUMNS} FROM api_keys WHERE account_id = ? AND id = ? AND revoked_at IS NULL"
        ))
        .bind(account_id)
        .bind(key_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(backend)?;
        let Some(k) = row.as_ref().map(key).transpose()? else {
            return Err(StoreError::NotFound(format!("api key {key_id}")));
        };
        if k.scope.is_none() {
            let others: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM api_keys WHERE account_id = ? AND id != ? AND revoked_at IS NULL \
                 AND workspaces IS NULL AND projects IS NULL",
            )
            .bind(account_id)
            .bind(key_id)
            .fetch_one(&mut *tx)
            .await
            .map_err(backend)?;
            if others == 0 {
                return Err(StoreError::Conflict(format!(
                    "api key {key_id} is the account's last unscoped key; create another unscoped key before revoking it"
                )));
            }
        }
        sqlx::query("UPDATE api_keys SET revoked_at = ? WHERE id = ?")
            .bind(at)
            .bind(key_id)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        tx.commit().await.map_err(backend)
    }

    async fn insert_sandbox(&self, s: &NewSandbox) -> Result<()> {
        let metadata = serde_json::to_string(&s.metadata).map_err(json_err)?;
        // The record and its meter in one transaction: nothing runs unbilled.
        let mut tx = self.write().await?;
        sqlx::query(
            "INSERT INTO sandboxes (id, project_id, template, state, created_at, timeout_at, metadata, on_timeout, timeout_ms, \
             template_ref, node_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&s.id)
        .bind(&s.project_id)
        .bind(&s.template)
        .bind(sandbox_state_name(s.state))
        .bind(s.created_at)
        .bind(s.timeout_at)
        .bind(metadata)
        .bind(on_timeout_name(s.on_timeout))
        .bind(s.timeout_ms)
        .bind(&s.template_ref)
        .bind(&s.node_id)
        .execute(&mut *tx)
        .await
        .map_err(|e| match &e {
            sqlx::Error::Database(db) if db.is_foreign_key_violation() => {
                StoreError::NotFound(format!("project {}", s.project_id))
            }
            _ => conflict_or_backend(e, || format!("sandbox {} already exists", s.id)),
        })?;
        billing::open_meter_tx(&mut tx, &s.id, &s.project_id, &s.meter, billing::meter_state_of(s.state), s.created_at)
            .await?;
        tx.commit().await.map_err(backend)?;
        Ok(())
    }

    async fn get_sandbox(&self, sandbox_id: &str) -> Result<Option<SandboxRecord>> {
        sqlx::query(&format!("SELECT {SANDBOX_COLUMNS} WHERE s.id = ?"))
            .bind(sandbox_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?
            .as_ref()
            .map(sandbox)
            .transpose()
    }

    async fn list_sandboxes(
        &self,
        account_id: &str,
        scope: Option<&Scope>,
        filter: &SandboxFilter,
    ) -> Result<Vec<SandboxRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {SANDBOX_COLUMNS} WHERE w.account_id = ?1 AND (?2 IS NULL OR p.workspace_id = ?2) \
             AND (?3 IS NULL OR s.project_id = ?3) AND (?4 OR s.ended_at IS NULL) ORDER BY s.created_at, s.id"
        ))
        .bind(account_id)
        .bind(filter.workspace_id.as_deref())
        .bind(filter.project_id.as_deref())
        .bind(filter.include_ended)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let s = sandbox(r)?;
            if crate::scope::sees_project(scope, &s.workspace_id, &s.project_id) {
                out.push(s);
            }
        }
        Ok(out)
    }

    async fn set_sandbox_state(&self, sandbox_id: &str, state: SandboxState) -> Result<()> {
        let mut tx = self.write().await?;
        let r = sqlx::query("UPDATE sandboxes SET state = ? WHERE id = ?")
            .bind(sandbox_state_name(state))
            .bind(sandbox_id)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        if r.rows_affected() == 0 {
            return Err(StoreError::NotFound(format!("sandbox {sandbox_id}")));
        }
        // Bill the state that ends, and meter the new one from now.
        billing::transition_tx(&mut tx, sandbox_id, billing::meter_state_of(state), crate::ids::now_ms()).await?;
        tx.commit().await.map_err(backend)
    }

    async fn set_sandbox_timeout(&self, sandbox_id: &str, timeout_at: Option<i64>) -> Result<()> {
        let r = sqlx::query("UPDATE sandboxes SET timeout_at = ? WHERE id = ?")
            .bind(timeout_at)
            .bind(sandbox_id)
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        if r.rows_affected() == 0 {
            return Err(StoreError::NotFound(format!("sandbox {sandbox_id}")));
        }
        Ok(())
    }

    async fn end_sandbox(&self, sandbox_id: &str, at: i64, reason: &str) -> Result<bool> {
        let mut tx = self.write().await?;
        let ended: Option<Option<i64>> = sqlx::query_scalar("SELECT ended_at FROM sandboxes WHERE id = ?")
            .bind(sandbox_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend)?;
        match ended {
            None => Err(StoreError::NotFound(format!("sandbox {sandbox_id}"))),
            Some(Some(_)) => Ok(false),
            Some(None) => {
                sqlx::query("UPDATE sandboxes SET ended_at = ?, end_reason = ?, state = 'ended' WHERE id = ?")
                    .bind(at)
                    .bind(reason)
                    .bind(sandbox_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(backend)?;
                sqlx::query("UPDATE volumes SET attached_to = NULL WHERE attached_to = ?")
                    .bind(sandbox_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(backend)?;
                billing::transition_tx(&mut tx, sandbox_id, MeterState::Ended, at).await?;
                tx.commit().await.map_err(backend)?;
                Ok(true)
            }
        }
    }

    async fn sandboxes_due(&self, now: i64) -> Result<Vec<SandboxRecord>> {
        sqlx::query(&format!(
            "SELECT {SANDBOX_COLUMNS} WHERE s.ended_at IS NULL AND s.timeout_at IS NOT NULL AND s.timeout_at <= ? \
             ORDER BY s.timeout_at, s.id"
        ))
        .bind(now)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?
        .iter()
        .map(sandbox)
        .collect()
    }
}

// The tests every engine must pass are in `super::tests` (run on SQLite and PostgreSQL);
// here only what is SQLite's own: its pool's handling of a connection left in a transaction.
#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_connection_left_inside_a_transaction_is_not_reused() {
        use sqlx::Connection;
        let dir = tempfile::tempdir().unwrap();
        let s = SqliteStore::open(dir.path()).await.unwrap();
        for _ in 0..4 {
            let mut conn = s.pool.acquire().await.unwrap();
            // A transaction whose end never reached the database (as when COMMIT and
            // ROLLBACK fail on a full disk): the connection goes back still inside it.
            std::mem::forget(conn.begin().await.unwrap());
            drop(conn);
            // The pool takes it back in a task of its own.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let a = AccountRecord { id: "acc_1".into(), email: "o@x".into(), plan: "free".into(), created_at: 1 };
        let key = KeyRecord {
            id: "key_1".into(),
            account_id: "acc_1".into(),
            name: "owner".into(),
            prefix: "lz_key_1".into(),
            hash: vec![7; 32],
            scope: None,
            created_at: 2,
            revoked_at: None,
        };
        s.bootstrap(&a, &key).await.expect("the next transaction gets a clean connection");
    }
}
