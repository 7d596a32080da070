//! [`AccessStore`] on PostgreSQL.

use super::{backend, PostgresStore};
use crate::store::access::AccessStore;
use crate::store::Result;
use async_trait::async_trait;
use sqlx::Row;

#[async_trait]
impl AccessStore for PostgresStore {
    async fn set_sandbox_access(&self, sandbox_id: &str, token_hash: &[u8]) -> Result<()> {
        sqlx::query(
            "INSERT INTO sandbox_access (sandbox_id, token_hash) VALUES ($1, $2) \
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
        let row = sqlx::query("SELECT token_hash FROM sandbox_access WHERE sandbox_id = $1")
            .bind(sandbox_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?;
        row.map(|r| r.try_get::<Vec<u8>, _>("token_hash").map_err(backend)).transpose()
    }

    async fn copy_sandbox_access(&self, source: &str, copy: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO sandbox_access (sandbox_id, token_hash) \
             SELECT $1, token_hash FROM sandbox_access WHERE sandbox_id = $2 \
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
