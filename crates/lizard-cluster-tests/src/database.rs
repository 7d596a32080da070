//! A PostgreSQL database of the test's own, made on the server `LIZARD_TEST_POSTGRES_URL`
//! names (`scripts/postgres.sh` starts one) and dropped when the test ends.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// A fresh, empty database.
pub struct Database {
    /// Where the replicas find it (`--database`).
    pub url: String,
    admin_url: String,
    name: String,
}

impl Database {
    /// Create one. Panics without `LIZARD_TEST_POSTGRES_URL`: this suite is about
    /// PostgreSQL, so it fails rather than skip.
    pub fn create() -> Database {
        let admin_url = std::env::var("LIZARD_TEST_POSTGRES_URL")
            .expect("LIZARD_TEST_POSTGRES_URL names a PostgreSQL server (scripts/postgres.sh starts one)");
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!("lizard_fleet_{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst));
        psql(&admin_url, &format!("CREATE DATABASE {name}"));
        let url = with_database(&admin_url, &name);
        Database { url, admin_url, name }
    }
}

/// `url` with its path (the database name) replaced by `name`, its query kept.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(b, q)| (b, Some(q)));
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[authority_start..].find('/').map_or(base.len(), |i| authority_start + i);
    let mut out = format!("{}/{name}", &base[..path_start]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

fn psql(url: &str, sql: &str) {
    let out = Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-qc", sql])
        .output()
        .expect("run psql (Debian's postgresql-client)");
    assert!(out.status.success(), "psql {sql:?}: {}", String::from_utf8_lossy(&out.stderr));
}

impl Drop for Database {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args([&self.admin_url, "-qc", &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name)])
            .output();
    }
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn replaces_the_database_and_keeps_the_query() {
        assert_eq!(with_database("postgres://u@h:5/postgres", "x"), "postgres://u@h:5/x");
        assert_eq!(with_database("postgres://u@h:5", "x"), "postgres://u@h:5/x");
        assert_eq!(with_database("postgres://u@h/db?sslmode=disable", "x"), "postgres://u@h/x?sslmode=disable");
    }
}
