//! [`AccessStore`] on PostgreSQL.

use super::{backend, PostgresStore};
use crate::store::access::{AccessStore, SandboxAccess};
use crate::store::Result;
use async_trait::async_trait;
use sqlx::Row;

#[async_trait]
impl AccessStore for PostgresStore {
    async fn set_sandbox_access(&self, sandbox_id: &str, access: &SandboxAccess) -> Result<()> {
        sqlx::query(
            "INSERT INTO sandbox_access (sandbox_id, token_hash, urls_public, resume_on_request) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (sandbox_id) DO UPDATE SET token_hash = excluded.token_hash, urls_public = excluded.urls_public, \
             resume_on_request = excluded.resume_on_request",
        )
        .bind(sandbox_id)
        .bind(&access.token_hash)
        .bind(access.urls_public)
        .bind(access.resume_on_request)
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn sandbox_access(&self, sandbox_id: &str) -> Result<Option<SandboxAccess>> {
        let row =
            sqlx::query("SELECT token_hash, urls_public, resume_on_request FROM sandbox_access WHERE sandbox_id = $1")
                .bind(sandbox_id)
                .fetch_optional(&self.pool)
                .await
                .map_err(backend)?;
        row.map(|r| {
            Ok(SandboxAccess {
                token_hash: r.try_get("token_hash").map_err(backend)?,
                urls_public: r.try_get("urls_public").map_err(backend)?,
                resume_on_request: r.try_get("resume_on_request").map_err(backend)?,
            })
        })
        .transpose()
    }

    async fn copy_sandbox_access(&self, source: &str, copy: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO sandbox_access (sandbox_id, token_hash, urls_public, resume_on_request) \
             SELECT $1, token_hash, urls_public, resume_on_request FROM sandbox_access WHERE sandbox_id = $2 \
             ON CONFLICT (sandbox_id) DO UPDATE SET token_hash = excluded.token_hash, urls_public = excluded.urls_public, \
             resume_on_request = excluded.resume_on_request",
        )
        .bind(copy)
        .bind(source)
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        Ok(())
    }
}
