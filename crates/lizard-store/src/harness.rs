//! Fresh databases of either engine for the store tests, and the few things a test does
//! beside the [`Store`] trait (raw SQL to corrupt or inspect rows, the schema version).

// Test support: a failure here is the calling test's failure, so it panics.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub use crate::sql::Engine;
use crate::sql::SqlStore;
use crate::Store;
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, Executor};
use std::future::Future;
use std::ops::Deref;
use std::str::FromStr;
use std::sync::Arc;

/// The server the PostgreSQL tests make their databases on.
pub const POSTGRES_URL_VAR: &str = "LIZARD_TEST_POSTGRES_URL";
/// `1`: a missing [`POSTGRES_URL_VAR`] fails the PostgreSQL tests instead of skipping them.
pub const REQUIRE_POSTGRES_VAR: &str = "LIZARD_REQUIRE_POSTGRES";

/// One test's own database, empty until the first [`TestDb::open`] migrates it.
#[derive(Clone)]
pub struct TestDb(Arc<Inner>);

enum Inner {
    Sqlite(tempfile::TempDir),
    Postgres { server: Box<PgConnectOptions>, database: String },
}

/// Run `test` on a fresh database of `engine`, then drop that database.
pub async fn run<F, Fut>(engine: Engine, test: F)
where
    F: FnOnce(TestDb) -> Fut,
    Fut: Future<Output = ()>,
{
    let Some(db) = TestDb::new(engine).await else { return };
    test(db.clone()).await;
    db.drop_database().await;
}

impl TestDb {
    /// A fresh database; `None` when PostgreSQL is not configured and not required.
    pub async fn new(engine: Engine) -> Option<TestDb> {
        match engine {
            Engine::Sqlite => Some(TestDb(Arc::new(Inner::Sqlite(tempfile::tempdir().unwrap())))),
            Engine::Postgres => {
                let Ok(url) = std::env::var(POSTGRES_URL_VAR) else {
                    if std::env::var(REQUIRE_POSTGRES_VAR).as_deref() == Ok("1") {
                        panic!(
                            "{REQUIRE_POSTGRES_VAR}=1 but {POSTGRES_URL_VAR} is not set: run scripts/postgres.sh \
                             and export its URL as {POSTGRES_URL_VAR}"
                        );
                    }
                    eprintln!("PostgreSQL skipped: {POSTGRES_URL_VAR} is not set (only SQLite ran)");
                    return None;
                };
                let server = PgConnectOptions::from_str(&url).expect("LIZARD_TEST_POSTGRES_URL is a PostgreSQL URL");
                let database =
                    format!("lizard_test_{}", lizard_api::ids::new_id("db").to_lowercase().replace('-', "_"));
                let mut admin = sqlx::PgConnection::connect_with(&server).await.expect("connect to the test server");
                admin.execute(format!("CREATE DATABASE \"{database}\"").as_str()).await.expect("CREATE DATABASE");
                admin.close().await.ok();
                Some(TestDb(Arc::new(Inner::Postgres { server: Box::new(server), database })))
            }
        }
    }

    pub fn engine(&self) -> Engine {
        match &*self.0 {
            Inner::Sqlite(_) => Engine::Sqlite,
            Inner::Postgres { .. } => Engine::Postgres,
        }
    }

    /// A new handle on this database (a second one is another replica), migrated.
    pub async fn open(&self) -> TestStore {
        self.try_open().await.unwrap()
    }

    pub async fn try_open(&self) -> crate::Result<TestStore> {
        Ok(match &*self.0 {
            Inner::Sqlite(dir) => TestStore(SqlStore::open_sqlite(dir.path()).await?),
            Inner::Postgres { .. } => {
                TestStore(SqlStore::open_postgres(&self.postgres_url().expect("a PostgreSQL database's URL")).await?)
            }
        })
    }

    /// The SQLite file (none on PostgreSQL).
    pub fn sqlite_file(&self) -> Option<std::path::PathBuf> {
        match &*self.0 {
            Inner::Sqlite(dir) => Some(dir.path().join(crate::sql::DB_FILE)),
            Inner::Postgres { .. } => None,
        }
    }

    /// Run raw SQL (several statements) on the database without migrating it first.
    pub async fn raw(&self, sql: &str) {
        match &*self.0 {
            Inner::Sqlite(dir) => {
                let options = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(dir.path().join(crate::sql::DB_FILE))
                    .create_if_missing(true)
                    .foreign_keys(true);
                let mut conn = sqlx::SqliteConnection::connect_with(&options).await.unwrap();
                sqlx::raw_sql(sql).execute(&mut conn).await.unwrap();
                conn.close().await.unwrap();
            }
            Inner::Postgres { server, database } => {
                let mut conn =
                    sqlx::PgConnection::connect_with(&server.as_ref().clone().database(database)).await.unwrap();
                sqlx::raw_sql(sql).execute(&mut conn).await.unwrap();
                conn.close().await.unwrap();
            }
        }
    }

    /// The engine's migrations, in order: `(version, name, sql)`.
    pub fn migrations(&self) -> &'static [(i64, &'static str, &'static str)] {
        self.engine().migrations()
    }

    /// The newest schema version this build knows.
    pub fn known_version(&self) -> i64 {
        self.migrations().last().map(|m| m.0).unwrap_or(0)
    }

    /// A migrated store with `account` (and its owner key `key_owner`) and, for each
    /// `(workspace, project)` pair, that workspace holding that project. Ids double as
    /// names and slugs.
    pub async fn seeded(&self, account: &str, projects: &[(&str, &str)]) -> TestStore {
        let store = self.open().await;
        crate::fixture::seed(&*store, account, projects).await;
        store
    }

    /// The URL of this PostgreSQL database: [`POSTGRES_URL_VAR`]'s with its database name
    /// replaced (none on SQLite).
    pub fn postgres_url(&self) -> Option<String> {
        let Inner::Postgres { database, .. } = &*self.0 else { return None };
        let server = std::env::var(POSTGRES_URL_VAR).ok()?;
        let (base, query) = server.split_once('?').map_or((server.as_str(), None), |(b, q)| (b, Some(q)));
        let (scheme, rest) = base.split_once("://")?;
        let authority = rest.split('/').next()?;
        Some(format!("{scheme}://{authority}/{database}{}", query.map(|q| format!("?{q}")).unwrap_or_default()))
    }

    pub async fn drop_database(&self) {
        if let Inner::Postgres { server, database } = &*self.0 {
            let mut admin =
                sqlx::PgConnection::connect_with(server.as_ref()).await.expect("connect to the test server");
            admin
                .execute(format!("DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)").as_str())
                .await
                .expect("DROP DATABASE");
            admin.close().await.ok();
        }
    }
}

/// An open store of either engine: a [`Store`] (by `Deref`) plus raw SQL for tests.
#[derive(Clone)]
pub struct TestStore(SqlStore);

impl Deref for TestStore {
    type Target = dyn Store;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl TestStore {
    /// The store itself (to serve it).
    pub fn into_inner(self) -> SqlStore {
        self.0
    }

    /// Run one statement written the same in both dialects (literal values, no binds);
    /// the rows it changed, or the database's refusal as text.
    pub async fn exec(&self, sql: &str) -> Result<u64, String> {
        sqlx::query(sql).execute(&self.0.pool).await.map(|r| r.rows_affected()).map_err(|e| e.to_string())
    }

    /// The rows of a query whose every column is text (or NULL, read as "NULL").
    pub async fn text_rows(&self, sql: &str) -> Vec<Vec<String>> {
        use sqlx::Row;
        let rows = sqlx::query(sql).fetch_all(&self.0.pool).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        rows.iter()
            .map(|r| {
                (0..r.len())
                    .map(|i| r.try_get::<Option<String>, _>(i).unwrap().unwrap_or_else(|| "NULL".into()))
                    .collect()
            })
            .collect()
    }

    pub async fn schema_version(&self) -> i64 {
        self.0.schema_version().await.unwrap()
    }

    /// Close its connections (a replica going away).
    pub async fn close(&self) {
        self.0.pool.close().await
    }
}

/// `store_tests!(a, b)`: for each `async fn a(db: TestDb)` of the calling module, a
/// `sqlite::a` and a `postgres::a` test.
#[macro_export]
macro_rules! store_tests {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    $crate::harness::run($crate::harness::Engine::Sqlite, super::$name).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    $crate::harness::run($crate::harness::Engine::Postgres, super::$name).await
                }
            )*
        }
    };
}
