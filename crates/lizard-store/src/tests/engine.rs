//! `open_store`: the `--database` setting picks the engine, and a password in it shows in
//! no error.

use crate::harness::TestDb;
use crate::{open_store, StoreError};

#[tokio::test]
async fn the_setting_picks_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let default = open_store(None, dir.path()).await.unwrap();
    assert!(default.list_workspaces("acc_x").await.unwrap().is_empty());
    assert!(dir.path().join(crate::sql::DB_FILE).exists(), "absent: SQLite in the data dir");
    let file = dir.path().join("elsewhere/state.db");
    let url = format!("sqlite://{}", file.display());
    open_store(Some(&url), dir.path()).await.unwrap();
    assert!(file.exists(), "sqlite:///path: that file");
    let e = open_store(Some("mysql://u:hunter2@h/d"), dir.path()).await.err().unwrap().to_string();
    assert!(e.contains("unsupported database URL scheme") && !e.contains("hunter2"), "{e}");
}

#[tokio::test]
async fn a_postgres_url_opens_postgres_and_its_password_never_shows() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on port 1: the database is unavailable, and says where without the password.
    let url = "postgres://lizard:hunter2@127.0.0.1:1/lizard";
    let e = open_store(Some(url), dir.path()).await.err().unwrap();
    assert!(matches!(e, StoreError::Unavailable(_)));
    let shown = format!("{e} {e:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("postgres://lizard:***@127.0.0.1:1/lizard"), "{shown}");
    // A real server (when configured): the store is PostgreSQL, not a file in the data dir.
    let Some(db) = TestDb::new(crate::harness::Engine::Postgres).await else { return };
    let url = db.postgres_url().unwrap();
    let store = open_store(Some(&url), dir.path()).await.unwrap();
    assert!(store.list_workspaces("acc_x").await.unwrap().is_empty());
    assert_eq!(db.open().await.schema_version().await, db.known_version(), "it migrated that database");
    assert!(!dir.path().join(crate::sql::DB_FILE).exists());
    drop(store);
    db.drop_database().await;
}
