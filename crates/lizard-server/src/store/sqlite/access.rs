//! [`AccessStore`] on SQLite.

use super::{backend, SqliteStore};
use crate::store::access::AccessStore;
use crate::store::Result;
use async_trait::async_trait;
use sqlx::Row;

#[async_trait]
impl AccessStore for SqliteStore {
    async fn set_sandbox_access(&self, sandbox_id: &str, token_hash: &[u8]) -> Result<()> {
        sqlx::query(
            "INSERT INTO sandbox_access (sandbox_id, token_hash) VALUES (?, ?) \
             ON CONFLICT (sandbox_id) DO UPDATE SET token_hash = excluded.token_hash",
        )
        .bind(sandbox_id)
        .bind(token_hash)
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn sandbox_access(&self, sandbox_id: &str) -> Result<Option<Vec<u8>>> {
        let row = sqlx::query("SELECT token_hash FROM sandbox_access WHERE sandbox_id = ?")
            .bind(sandbox_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?;
        row.map(|r| r.try_get::<Vec<u8>, _>("token_hash").map_err(backend)).transpose()
    }

    async fn copy_sandbox_access(&self, source: &str, copy: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO sandbox_access (sandbox_id, token_hash) \
             SELECT ?, token_hash FROM sandbox_access WHERE sandbox_id = ? \
             ON CONFLICT (sandbox_id) DO UPDATE SET token_hash = excluded.token_hash",
        )
        .bind(copy)
        .bind(source)
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn access_rules_are_kept_hashed_and_copied_to_forks() {
        let s = SqliteStore::memory().await.unwrap();
        assert_eq!(s.sandbox_access("a").await.unwrap(), None);
        s.set_sandbox_access("a", &[1, 2, 3]).await.unwrap();
        assert_eq!(s.sandbox_access("a").await.unwrap(), Some(vec![1, 2, 3]));
        s.copy_sandbox_access("a", "b").await.unwrap();
        assert_eq!(s.sandbox_access("b").await.unwrap(), Some(vec![1, 2, 3]));
        // A public source gives a public copy.
        s.copy_sandbox_access("public", "c").await.unwrap();
        assert_eq!(s.sandbox_access("c").await.unwrap(), None);
    }
}
