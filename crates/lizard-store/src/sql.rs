//! [`Store`] on SQL: SQLite (one file, `<data_dir>/lizard.db`, the embedded default) or
//! PostgreSQL (the state shared by several `lizard server` replicas), one implementation.
//!
//! **One SQL text for both engines**, through sqlx's `Any` driver: statements are plain
//! strings with `$N` parameters (SQLite binds them by number too), rows are `AnyRow`, and
//! [`Engine`] holds the few places the dialects differ: a list bound as one parameter
//! ([`Engine::json_list`]), a timestamp's calendar period ([`Engine::utc_period`]), the
//! append to a JSON array in `add_node_template`, and how a write transaction is taken
//! ([`SqlStore::write`]). Chosen over one implementation per engine (two copies of 160
//! statements had drifted apart in ordering and locking) and over a macro instantiated
//! per engine (every statement twice in the binary, and code that tools cannot follow):
//! `Any` carries only integers, floats, text, bytes and booleans, which is all the schema
//! holds (milliseconds and money as BIGINT, hashes as bytes, JSON as text; the two BOOLEAN
//! columns are read through [`flag`]), and it costs a copy of each row's values, nothing
//! next to a query's round trip (measured, debug build, a workspace read by id 3,000
//! times: 26.6 µs per query through `Any` against 25.9 µs through the SQLite driver
//! directly; on PostgreSQL the difference was inside the run-to-run noise of 150–250 µs).
//! Its options come from a URL, so SQLite's settings are PRAGMAs run on each new
//! connection. Queries are plain strings (no compile-time macros), so building needs no
//! database.
//!
//! **SQLite settings.** WAL journal (readers never block the writer nor each other),
//! `synchronous = NORMAL` (durable across process crashes; a power cut may lose the last
//! commits, never corrupt), foreign keys on, a 5 s busy timeout. The file is created mode
//! 0600: it holds key hashes and account emails (SQLite gives its `-wal`/`-shm` files the
//! same mode).
//!
//! **Write transactions.** Every operation that checks and then writes (delete-if-empty,
//! bootstrap, revoke-unless-last, claim, attach) and every one that touches a meter or the
//! ledger runs in [`SqlStore::write`]'s transaction, so these run one at a time across
//! every replica, in commit order: two replicas' billing ticks never read the same
//! watermark, and `ledger.seq` grows in commit order (the pagination cursor never skips a
//! row committed late). SQLite takes its one write lock up front (`BEGIN IMMEDIATE`: a
//! deferred transaction that reads first and upgrades later can fail with `SQLITE_BUSY`
//! at once in WAL mode, without waiting out the busy timeout); PostgreSQL takes one
//! transaction-scoped advisory lock ([`WRITE_LOCK`]) first, after which READ COMMITTED
//! suffices: each statement sees every earlier holder's commit. Plain reads and
//! single-statement writes take no lock.
//!
//! **Migrations** are the files in `crates/lizard-store/migrations/` (SQLite) and
//! `migrations/postgres/` (the same numbers and meaning: BIGINT for ms timestamps and
//! money, BYTEA for hashes, JSON as TEXT), compiled in, applied in order when a store
//! opens, each in its own write transaction (servers starting at once apply each one
//! once), and recorded in `lizard_schema`. A database with a version this build does not
//! know is refused ([`StoreError::SchemaTooNew`]) instead of being misread.
//!
//! **Secrets.** A PostgreSQL URL's password never reaches a log line or an error: errors
//! name the server by [`super::database::redact`]'s form of the URL.

use super::*;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions, AnyRow};
use sqlx::{Any, AnyPool, Executor, Row, Transaction};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

/// SQLite's schema, in order. The version is the file's number.
pub const SQLITE_MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "tenancy", include_str!("../migrations/0001_tenancy.sql")),
    (2, "billing", include_str!("../migrations/0002_billing.sql")),
    (3, "volumes", include_str!("../migrations/0003_volumes.sql")),
    (4, "lifecycle", include_str!("../migrations/0004_lifecycle.sql")),
    (5, "templates", include_str!("../migrations/0005_templates.sql")),
    (6, "idempotency", include_str!("../migrations/0006_idempotency.sql")),
    (7, "volume billing", include_str!("../migrations/0007_volume_billing.sql")),
    (8, "sandbox access", include_str!("../migrations/0008_sandbox_access.sql")),
    (9, "cluster", include_str!("../migrations/0009_cluster.sql")),
    (10, "blob content", include_str!("../migrations/0010_blob_content.sql")),
    (11, "services", include_str!("../migrations/0011_services.sql")),
    (12, "ledger by sandbox", include_str!("../migrations/0012_ledger_by_sandbox.sql")),
    (13, "join token uses", include_str!("../migrations/0013_join_token_uses.sql")),
    (14, "volume quotas", include_str!("../migrations/0014_volume_quotas.sql")),
    (15, "public urls with a token", include_str!("../migrations/0015_public_urls_with_token.sql")),
    (16, "sandbox snapshots", include_str!("../migrations/0016_sandbox_snapshots.sql")),
    (17, "template tags", include_str!("../migrations/0017_template_tags.sql")),
    (18, "build order", include_str!("../migrations/0018_build_order.sql")),
];

/// PostgreSQL's schema, in order: the same versions as [`SQLITE_MIGRATIONS`].
pub const POSTGRES_MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "tenancy", include_str!("../migrations/postgres/0001_tenancy.sql")),
    (2, "billing", include_str!("../migrations/postgres/0002_billing.sql")),
    (3, "volumes", include_str!("../migrations/postgres/0003_volumes.sql")),
    (4, "lifecycle", include_str!("../migrations/postgres/0004_lifecycle.sql")),
    (5, "templates", include_str!("../migrations/postgres/0005_templates.sql")),
    (6, "idempotency", include_str!("../migrations/postgres/0006_idempotency.sql")),
    (7, "volume billing", include_str!("../migrations/postgres/0007_volume_billing.sql")),
    (8, "sandbox access", include_str!("../migrations/postgres/0008_sandbox_access.sql")),
    (9, "cluster", include_str!("../migrations/postgres/0009_cluster.sql")),
    (10, "blob content", include_str!("../migrations/postgres/0010_blob_content.sql")),
    (11, "services", include_str!("../migrations/postgres/0011_services.sql")),
    (12, "ledger by sandbox", include_str!("../migrations/postgres/0012_ledger_by_sandbox.sql")),
    (13, "join token uses", include_str!("../migrations/postgres/0013_join_token_uses.sql")),
    (14, "volume quotas", include_str!("../migrations/postgres/0014_volume_quotas.sql")),
    (15, "public urls with a token", include_str!("../migrations/postgres/0015_public_urls_with_token.sql")),
    (16, "sandbox snapshots", include_str!("../migrations/postgres/0016_sandbox_snapshots.sql")),
    (17, "template tags", include_str!("../migrations/postgres/0017_template_tags.sql")),
    (18, "build order", include_str!("../migrations/postgres/0018_build_order.sql")),
];

mod access;
mod billing;
mod blob_content;
mod cluster;
mod idempotency;
mod services;
mod snapshots;
mod template_tags;
mod templates;
mod volumes;

pub use billing::SIGNUP_CREDIT_KEY;

/// The database file's name inside the data directory.
pub const DB_FILE: &str = "lizard.db";

/// The key of the advisory lock every PostgreSQL write transaction takes first (see the
/// module doc): "lizard" in ASCII, so an operator can tell it in `pg_locks`.
pub const WRITE_LOCK: i64 = 0x6c69_7a61_7264;

/// Connections per PostgreSQL replica: a handful of handlers' queries at once;
/// PostgreSQL's own limit (100 by default) is shared by every replica.
const POSTGRES_CONNECTIONS: u32 = 10;
/// Connections to a SQLite file: it has one writer anyway.
const SQLITE_CONNECTIONS: u32 = 4;

/// How often, and how far apart, an open that found the SQLite file locked is tried again.
const OPEN_BUSY_TRIES: u32 = 50;
const OPEN_BUSY_WAIT: Duration = Duration::from_millis(100);

/// Which database a [`SqlStore`] speaks to: where their SQL differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    Postgres,
}

impl Engine {
    /// A subquery of the members of the JSON array of text bound as `param` (`"$2"`), for
    /// `x IN …` / `x NOT IN …`: one parameter however long the list ([`json_list`] makes
    /// the value), where a placeholder per member would meet SQLite's limit.
    pub(crate) fn json_list(self, param: &str) -> String {
        match self {
            Engine::Sqlite => format!("(SELECT value FROM json_each({param}))"),
            Engine::Postgres => format!("(SELECT json_array_elements_text(CAST({param} AS json)))"),
        }
    }

    /// The UTC month (`2026-12`) or day (`2026-12-07`) of `ms`, an SQL expression of
    /// milliseconds since the epoch, as text.
    pub(crate) fn utc_period(self, ms: &str, granularity: crate::billing::Granularity) -> String {
        use crate::billing::Granularity;
        match (self, granularity) {
            (Engine::Sqlite, Granularity::Month) => format!("strftime('%Y-%m', {ms} / 1000, 'unixepoch')"),
            (Engine::Sqlite, Granularity::Day) => format!("strftime('%Y-%m-%d', {ms} / 1000, 'unixepoch')"),
            (Engine::Postgres, Granularity::Month) => {
                format!("to_char(to_timestamp({ms} / 1000) AT TIME ZONE 'UTC', 'YYYY-MM')")
            }
            (Engine::Postgres, Granularity::Day) => {
                format!("to_char(to_timestamp({ms} / 1000) AT TIME ZONE 'UTC', 'YYYY-MM-DD')")
            }
        }
    }

    /// Its migrations, in order: `(version, name, sql)`.
    pub fn migrations(self) -> &'static [(i64, &'static str, &'static str)] {
        match self {
            Engine::Sqlite => SQLITE_MIGRATIONS,
            Engine::Postgres => POSTGRES_MIGRATIONS,
        }
    }
}

/// A BOOLEAN column, selected as `CASE WHEN c THEN 1 ELSE 0 END AS c`: `Any` reads no
/// BOOLEAN from SQLite (which keeps it as an integer anyway).
pub(crate) fn flag(r: &AnyRow, column: &str) -> Result<bool> {
    Ok(col::<i64, _>(r, column)? != 0)
}

/// The value to bind for an [`Engine::json_list`] parameter.
pub(crate) fn json_list<S: serde::Serialize>(members: &[S]) -> Result<String> {
    serde_json::to_string(members).map_err(json_err)
}

/// The store, on either engine.
#[derive(Clone)]
pub struct SqlStore {
    pub(crate) pool: AnyPool,
    pub(crate) engine: Engine,
}

/// Column `index` of `row`, decoded; a column that is missing or of another type is a
/// backend error like any other.
fn col<'r, T, I>(row: &'r AnyRow, index: I) -> Result<T>
where
    T: sqlx::Decode<'r, sqlx::Any> + sqlx::Type<sqlx::Any>,
    I: sqlx::ColumnIndex<AnyRow>,
{
    row.try_get(index).map_err(backend)
}

/// A database error; one that says the database cannot be reached now (the pool timed
/// out or closed, an I/O or TLS failure, SQLSTATE class 08, or 57P01–57P03: shutting
/// down or starting) is [`StoreError::Unavailable`].
fn backend(e: sqlx::Error) -> StoreError {
    let unreachable = match &e {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => {
            db.code().is_some_and(|c| c.starts_with("08") || matches!(c.as_ref(), "57P01" | "57P02" | "57P03"))
        }
        _ => false,
    };
    if unreachable {
        StoreError::Unavailable(Box::new(e))
    } else {
        StoreError::Backend(Box::new(e))
    }
}

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

/// An error of opening `url`, with its password out of the text (a driver may quote
/// what it was given); `unavailable` when the server could not be reached.
fn open_error(url: &str, e: impl std::fmt::Display, unavailable: bool) -> StoreError {
    let message = database::scrub(url, &e.to_string());
    let e = format!("PostgreSQL at {}: {message}", database::redact(url)).into();
    if unavailable {
        StoreError::Unavailable(e)
    } else {
        StoreError::Backend(e)
    }
}

/// The settings of each new connection.
fn session_settings(engine: Engine) -> &'static str {
    match engine {
        Engine::Sqlite => {
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; \
             PRAGMA busy_timeout = 5000;"
        }
        // Named in `pg_stat_activity`; and a replica stuck inside a transaction (stopped,
        // not dead: a dead one's session ends) cannot hold the write lock for long.
        Engine::Postgres => "SET application_name = 'lizard-server'; SET idle_in_transaction_session_timeout = '30s';",
    }
}

/// A pool whose every new connection gets `engine`'s [`session_settings`].
fn session_pool_options(engine: Engine) -> AnyPoolOptions {
    AnyPoolOptions::new().after_connect(move |conn, _| {
        Box::pin(async move {
            conn.execute(sqlx::raw_sql(session_settings(engine))).await?;
            Ok(())
        })
    })
}

/// A pool for `engine`. A connection still inside a transaction when it comes back (its
/// COMMIT or ROLLBACK failed, e.g. on a full disk) is closed instead of being reused:
/// reused, every later transaction on it failed ("non-zero transaction depth") and the
/// server answered 500s and missed billing ticks until it was restarted.
fn pool_options(engine: Engine) -> AnyPoolOptions {
    use sqlx::Connection;
    session_pool_options(engine)
        .max_connections(match engine {
            Engine::Sqlite => SQLITE_CONNECTIONS,
            Engine::Postgres => POSTGRES_CONNECTIONS,
        })
        .acquire_timeout(Duration::from_secs(10))
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

/// The drivers `Any` dispatches to, installed once per process.
fn install_drivers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(sqlx::any::install_default_drivers);
}

impl SqlStore {
    /// Open (creating if needed) `<data_dir>/lizard.db` and apply pending migrations.
    pub async fn open_sqlite(data_dir: &Path) -> Result<Self> {
        Self::open_sqlite_file(&data_dir.join(DB_FILE)).await
    }

    /// Open (creating if needed, with its directory) the SQLite file at `path`, and apply
    /// pending migrations.
    pub async fn open_sqlite_file(path: &Path) -> Result<Self> {
        install_drivers();
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
        use sqlx::ConnectOptions;
        let url = sqlx::sqlite::SqliteConnectOptions::new().filename(path).create_if_missing(true).to_url_lossy();
        let options = AnyConnectOptions::from_str(url.as_str()).map_err(backend)?;
        // Servers opening a new file at once race to turn it to WAL, which SQLite answers
        // with SQLITE_BUSY at once (no busy handler): the loser tries again, for at most
        // OPEN_BUSY_TRIES × OPEN_BUSY_WAIT.
        let mut tries = 0;
        loop {
            let opened = async {
                let pool = pool_options(Engine::Sqlite).connect_with(options.clone()).await.map_err(backend)?;
                let store = SqlStore { pool, engine: Engine::Sqlite };
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

    /// A private in-memory SQLite database (tests): one connection that lives as long as
    /// the store, since the database disappears with its last connection.
    pub async fn memory() -> Result<Self> {
        install_drivers();
        let options = AnyConnectOptions::from_str("sqlite::memory:").map_err(backend)?;
        // Not `pool_options`: closing its one connection (as those do one left inside a
        // transaction) would drop the database.
        let pool = session_pool_options(Engine::Sqlite)
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(options)
            .await
            .map_err(backend)?;
        let store = SqlStore { pool, engine: Engine::Sqlite };
        store.migrate().await?;
        Ok(store)
    }

    /// Connect to the PostgreSQL database at `url`
    /// (`postgres://user[:password]@host[:port]/db`) and apply pending migrations. Its
    /// errors name the server, never the password.
    pub async fn open_postgres(url: &str) -> Result<Self> {
        install_drivers();
        let options = AnyConnectOptions::from_str(url).map_err(|e| open_error(url, e, false))?;
        let opened = async {
            // One connection first: its error says why (refused, authentication, no such
            // database), where the pool would only say that it timed out, 10 s later.
            use sqlx::{ConnectOptions, Connection};
            options.connect().await.map_err(backend)?.close().await.map_err(backend)?;
            let pool = pool_options(Engine::Postgres).connect_with(options).await.map_err(backend)?;
            let store = SqlStore { pool, engine: Engine::Postgres };
            store.migrate().await?;
            Ok(store)
        };
        let store = opened.await.map_err(|e| match e {
            StoreError::Backend(e) => open_error(url, e, false),
            StoreError::Unavailable(e) => open_error(url, e, true),
            other => other,
        })?;
        tracing::info!(database = %database::redact(url), "opened the PostgreSQL store");
        Ok(store)
    }

    /// Which engine it speaks to.
    pub fn engine(&self) -> Engine {
        self.engine
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
        {
            // Under the lock: two replicas' CREATE TABLE IF NOT EXISTS at once can collide.
            let mut tx = self.write().await?;
            sqlx::query(
                "CREATE TABLE IF NOT EXISTS lizard_schema (version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)",
            )
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
            tx.commit().await.map_err(backend)?;
        }
        let migrations = self.engine.migrations();
        let known = migrations.last().map(|m| m.0).unwrap_or(0);
        let found = self.schema_version().await?;
        if found > known {
            return Err(StoreError::SchemaTooNew { found, known });
        }
        for &(version, name, sql) in migrations {
            let mut tx = self.write().await?;
            // Re-check inside the lock: another server may have applied it meanwhile.
            let done: Option<i64> = sqlx::query_scalar("SELECT version FROM lizard_schema WHERE version = $1")
                .bind(version)
                .fetch_optional(&mut *tx)
                .await
                .map_err(backend)?;
            if done.is_some() {
                continue;
            }
            sqlx::raw_sql(sql).execute(&mut *tx).await.map_err(backend)?;
            sqlx::query("INSERT INTO lizard_schema (version, name, applied_at) VALUES ($1, $2, $3)")
                .bind(version)
                .bind(name)
                .bind(lizard_api::ids::now_ms())
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
            tx.commit().await.map_err(backend)?;
            tracing::info!(version, name, "applied database migration");
        }
        Ok(())
    }

    /// A write transaction, run one at a time with every other across all replicas (see
    /// the module doc), from its first statement to its end.
    pub(crate) async fn write(&self) -> Result<Transaction<'static, Any>> {
        match self.engine {
            Engine::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(backend),
            Engine::Postgres => {
                let mut tx = self.pool.begin().await.map_err(backend)?;
                sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind(WRITE_LOCK)
                    .execute(&mut *tx)
                    .await
                    .map_err(backend)?;
                Ok(tx)
            }
        }
    }

    /// A transaction that writes rows no other writer's order matters to (content-keyed
    /// blobs): on PostgreSQL it runs beside the [`SqlStore::write`] ones; SQLite has one
    /// writer, taken up front as there.
    pub(crate) async fn begin_write(&self) -> Result<Transaction<'static, Any>> {
        match self.engine {
            Engine::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(backend),
            Engine::Postgres => self.pool.begin().await.map_err(backend),
        }
    }
}

// --- row mapping --------------------------------------------------------------------

fn account(r: &AnyRow) -> Result<AccountRecord> {
    Ok(AccountRecord {
        id: col(r, "id")?,
        email: col(r, "email")?,
        plan: col(r, "plan")?,
        created_at: col(r, "created_at")?,
    })
}

fn workspace(r: &AnyRow) -> Result<WorkspaceRecord> {
    Ok(WorkspaceRecord {
        id: col(r, "id")?,
        account_id: col(r, "account_id")?,
        name: col(r, "name")?,
        slug: col(r, "slug")?,
        created_at: col(r, "created_at")?,
        volume_quota_gb: super::volumes::quota_gb(col(r, "volume_quota_gb")?),
    })
}

fn project(r: &AnyRow) -> Result<ProjectRecord> {
    Ok(ProjectRecord {
        id: col(r, "id")?,
        workspace_id: col(r, "workspace_id")?,
        name: col(r, "name")?,
        slug: col(r, "slug")?,
        created_at: col(r, "created_at")?,
    })
}

fn key(r: &AnyRow) -> Result<KeyRecord> {
    let workspaces: Option<String> = col(r, "workspaces")?;
    let projects: Option<String> = col(r, "projects")?;
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
        id: col(r, "id")?,
        account_id: col(r, "account_id")?,
        name: col(r, "name")?,
        prefix: col(r, "prefix")?,
        hash: col(r, "hash")?,
        scope,
        created_at: col(r, "created_at")?,
        revoked_at: col(r, "revoked_at")?,
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

fn sandbox(r: &AnyRow) -> Result<SandboxRecord> {
    let metadata: String = col(r, "metadata")?;
    Ok(SandboxRecord {
        id: col(r, "id")?,
        account_id: col(r, "account_id")?,
        workspace_id: col(r, "workspace_id")?,
        project_id: col(r, "project_id")?,
        template: col(r, "template")?,
        state: parse_sandbox_state(&col::<String, _>(r, "state")?)?,
        created_at: col(r, "created_at")?,
        timeout_at: col(r, "timeout_at")?,
        ended_at: col(r, "ended_at")?,
        end_reason: col(r, "end_reason")?,
        metadata: serde_json::from_str(&metadata).map_err(json_err)?,
        on_timeout: parse_on_timeout(&col::<String, _>(r, "on_timeout")?)?,
        timeout_ms: col(r, "timeout_ms")?,
        template_ref: col(r, "template_ref")?,
        node_id: col(r, "node_id")?,
    })
}

const KEY_COLUMNS: &str = "id, account_id, name, prefix, hash, workspaces, projects, created_at, revoked_at";

async fn insert_key_tx(tx: &mut Transaction<'static, Any>, k: &KeyRecord) -> Result<()> {
    let (w, p) = scope_columns(&k.scope)?;
    sqlx::query(&format!("INSERT INTO api_keys ({KEY_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"))
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
impl Store for SqlStore {
    async fn bootstrap(&self, a: &AccountRecord, k: &KeyRecord) -> Result<bool> {
        let mut tx = self.write().await?;
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM accounts").fetch_one(&mut *tx).await.map_err(backend)?;
        if n > 0 {
            return Ok(false);
        }
        sqlx::query("INSERT INTO accounts (id, email, plan, created_at) VALUES ($1, $2, $3, $4)")
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
        sqlx::query("SELECT id, email, plan, created_at FROM accounts WHERE id = $1")
            .bind(account_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?
            .as_ref()
            .map(account)
            .transpose()
    }

    async fn insert_workspace(&self, w: &WorkspaceRecord) -> Result<()> {
        sqlx::query("INSERT INTO workspaces (id, account_id, name, slug, created_at) VALUES ($1, $2, $3, $4, $5)")
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
        sqlx::query("SELECT * FROM workspaces WHERE account_id = $1 AND id = $2")
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
        sqlx::query("SELECT * FROM workspaces WHERE account_id = $1 ORDER BY created_at, id")
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
        let exists: Option<String> = sqlx::query_scalar("SELECT id FROM workspaces WHERE account_id = $1 AND id = $2")
            .bind(account_id)
            .bind(workspace_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend)?;
        if exists.is_none() {
            return Err(StoreError::NotFound(format!("workspace {workspace_id}")));
        }
        let projects: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM projects WHERE workspace_id = $1")
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
            "SELECT {SANDBOX_COLUMNS} WHERE p.workspace_id = $1 AND s.ended_at IS NULL ORDER BY s.created_at, s.id"
        ))
        .bind(workspace_id)
        .fetch_all(&mut *tx)
        .await
        .map_err(backend)?
        .iter()
        .map(sandbox)
        .collect::<Result<Vec<_>>>()?;
        let vols = sqlx::query(&format!(
            "SELECT {} WHERE p.workspace_id = $1 ORDER BY v.created_at, v.id",
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
             WHERE t.workspace_id = $1 ORDER BY b.created_at, b.seq",
        )
        .bind(workspace_id)
        .fetch_all(&mut *tx)
        .await
        .map_err(backend)?;
        // Their storage is billed up to here, then their meters go.
        let now = lizard_api::ids::now_ms();
        for v in &vols {
            billing::close_volume_meter_tx(&mut tx, &v.id, now).await?;
        }
        sqlx::query("DELETE FROM volumes WHERE project_id IN (SELECT id FROM projects WHERE workspace_id = $1)")
            .bind(workspace_id)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        // The live ones stop now: bill them up to here and close their meters.
        for s in &live {
            billing::transition_tx(&mut tx, &s.id, MeterState::Ended, now).await?;
        }
        sqlx::query("DELETE FROM sandboxes WHERE project_id IN (SELECT id FROM projects WHERE workspace_id = $1)")
            .bind(workspace_id)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        sqlx::query("DELETE FROM projects WHERE workspace_id = $1")
            .bind(workspace_id)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        sqlx::query("DELETE FROM workspaces WHERE id = $1")
            .bind(workspace_id)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        Ok(Removed { live_sandboxes: live, volumes: vols, template_refs })
    }

    async fn insert_project(&self, account_id: &str, p: &ProjectRecord) -> Result<()> {
        let mut tx = self.write().await?;
        let ws: Option<String> = sqlx::query_scalar("SELECT id FROM workspaces WHERE account_id = $1 AND id = $2")
            .bind(account_id)
            .bind(&p.workspace_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend)?;
        if ws.is_none() {
            return Err(StoreError::NotFound(format!("workspace {}", p.workspace_id)));
        }
        sqlx::query("INSERT INTO projects (id, workspace_id, name, slug, created_at) VALUES ($1, $2, $3, $4, $5)")
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
            "SELECT p.* FROM projects p JOIN workspaces w ON w.id = p.workspace_id WHERE w.account_id = $1 AND p.id = $2",
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
             WHERE w.account_id = $1 AND ($2 IS NULL OR p.workspace_id = $2) ORDER BY p.created_at, p.id",
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
            "SELECT p.* FROM projects p JOIN workspaces w ON w.id = p.workspace_id WHERE w.account_id = $1 AND p.id = $2",
        )
        .bind(account_id)
        .bind(project_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(backend)?;
        let Some(mut p) = row.as_ref().map(project).transpose()? else {
            return Err(StoreError::NotFound(format!("project {project_id}")));
        };
        sqlx::query("UPDATE projects SET name = $1 WHERE id = $2")
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
            "SELECT p.id FROM projects p JOIN workspaces w ON w.id = p.workspace_id WHERE w.account_id = $1 AND p.id = $2",
        )
        .bind(account_id)
        .bind(project_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(backend)?;
        if exists.is_none() {
            return Err(StoreError::NotFound(format!("project {project_id}")));
        }
        let live: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sandboxes WHERE project_id = $1 AND ended_at IS NULL")
            .bind(project_id)
            .fetch_one(&mut *tx)
            .await
            .map_err(backend)?;
        if live > 0 {
            return Err(StoreError::NotEmpty(format!(
                "project {project_id} still has {live} running sandbox(es); kill them first"
            )));
        }
        let vols: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM volumes WHERE project_id = $1")
            .bind(project_id)
            .fetch_one(&mut *tx)
            .await
            .map_err(backend)?;
        if vols > 0 {
            return Err(StoreError::NotEmpty(format!(
                "project {project_id} still has {vols} volume(s); delete them first"
            )));
        }
        sqlx::query("DELETE FROM sandboxes WHERE project_id = $1")
            .bind(project_id)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        sqlx::query("DELETE FROM projects WHERE id = $1").bind(project_id).execute(&mut *tx).await.map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        Ok(())
    }

    async fn insert_key(&self, k: &KeyRecord) -> Result<()> {
        let mut tx = self.write().await?;
        insert_key_tx(&mut tx, k).await?;
        tx.commit().await.map_err(backend)
    }

    async fn keys_by_prefix(&self, prefix: &str) -> Result<Vec<KeyRecord>> {
        sqlx::query(&format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE prefix = $1"))
            .bind(prefix)
            .fetch_all(&self.pool)
            .await
            .map_err(backend)?
            .iter()
            .map(key)
            .collect()
    }

    async fn key_hashes_since(&self, since: i64) -> Result<Vec<Vec<u8>>> {
        sqlx::query_scalar("SELECT hash FROM api_keys WHERE created_at >= $1")
            .bind(since)
            .fetch_all(&self.pool)
            .await
            .map_err(backend)
    }

    async fn get_key(&self, account_id: &str, key_id: &str) -> Result<Option<KeyRecord>> {
        sqlx::query(&format!(
            "SELECT {KEY_COLUMNS} FROM api_keys WHERE account_id = $1 AND id = $2 AND revoked_at IS NULL"
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
            "SELECT {KEY_COLUMNS} FROM api_keys WHERE account_id = $1 AND revoked_at IS NULL ORDER BY created_at, id"
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
            "SELECT {KEY_COLUMNS} FROM api_keys WHERE account_id = $1 AND id = $2 AND revoked_at IS NULL"
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
                "SELECT COUNT(*) FROM api_keys WHERE account_id = $1 AND id != $2 AND revoked_at IS NULL \
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
        sqlx::query("UPDATE api_keys SET revoked_at = $1 WHERE id = $2")
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
             template_ref, node_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
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
        sqlx::query(&format!("SELECT {SANDBOX_COLUMNS} WHERE s.id = $1"))
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
            "SELECT {SANDBOX_COLUMNS} WHERE w.account_id = $1 AND ($2 IS NULL OR p.workspace_id = $2) \
             AND ($3 IS NULL OR s.project_id = $3) AND ($4 OR s.ended_at IS NULL) ORDER BY s.created_at, s.id"
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
        let r = sqlx::query("UPDATE sandboxes SET state = $1 WHERE id = $2")
            .bind(sandbox_state_name(state))
            .bind(sandbox_id)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        if r.rows_affected() == 0 {
            return Err(StoreError::NotFound(format!("sandbox {sandbox_id}")));
        }
        // Bill the state that ends, and meter the new one from now.
        billing::transition_tx(&mut tx, sandbox_id, billing::meter_state_of(state), lizard_api::ids::now_ms()).await?;
        tx.commit().await.map_err(backend)
    }

    async fn set_sandbox_timeout(&self, sandbox_id: &str, timeout_at: Option<i64>) -> Result<()> {
        let r = sqlx::query("UPDATE sandboxes SET timeout_at = $1 WHERE id = $2")
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
        let ended: Option<Option<i64>> = sqlx::query_scalar("SELECT ended_at FROM sandboxes WHERE id = $1")
            .bind(sandbox_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend)?;
        match ended {
            None => Err(StoreError::NotFound(format!("sandbox {sandbox_id}"))),
            Some(Some(_)) => Ok(false),
            Some(None) => {
                sqlx::query("UPDATE sandboxes SET ended_at = $1, end_reason = $2, state = 'ended' WHERE id = $3")
                    .bind(at)
                    .bind(reason)
                    .bind(sandbox_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(backend)?;
                sqlx::query("UPDATE volumes SET attached_to = NULL WHERE attached_to = $1")
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
            "SELECT {SANDBOX_COLUMNS} WHERE s.ended_at IS NULL AND s.timeout_at IS NOT NULL AND s.timeout_at <= $1 \
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

#[cfg(test)]
mod tests {
    // The tests every engine must pass are in `super::tests` (run on SQLite and
    // PostgreSQL); here only the pool's and the error mapping's own.
    use super::*;

    #[test]
    fn an_unreachable_database_is_unavailable_other_failures_are_not() {
        for e in [
            sqlx::Error::PoolTimedOut,
            sqlx::Error::PoolClosed,
            sqlx::Error::Io(std::io::ErrorKind::ConnectionRefused.into()),
        ] {
            assert!(matches!(backend(e), StoreError::Unavailable(_)));
        }
        assert!(matches!(backend(sqlx::Error::RowNotFound), StoreError::Backend(_)));
        assert!(matches!(backend(sqlx::Error::ColumnNotFound("x".into())), StoreError::Backend(_)));
    }

    #[tokio::test]
    async fn a_connection_left_inside_a_transaction_is_not_reused() {
        use sqlx::Connection;
        let dir = tempfile::tempdir().unwrap();
        let s = SqlStore::open_sqlite(dir.path()).await.unwrap();
        for _ in 0..SQLITE_CONNECTIONS {
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
