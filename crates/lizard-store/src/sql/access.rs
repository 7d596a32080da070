//! [`AccessStore`] on either engine.

use super::{backend, col, flag, SqlStore};
use crate::access::{AccessStore, SandboxAccess};
use crate::Result;
use async_trait::async_trait;

#[async_trait]
impl AccessStore for SqlStore {
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
        let row = sqlx::query(
            "SELECT token_hash, CASE WHEN urls_public THEN 1 ELSE 0 END AS urls_public, \
             CASE WHEN resume_on_request THEN 1 ELSE 0 END AS resume_on_request \
             FROM sandbox_access WHERE sandbox_id = $1",
        )
        .bind(sandbox_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(backend)?;
        row.map(|r| {
            Ok(SandboxAccess {
                token_hash: col(&r, "token_hash")?,
                urls_public: flag(&r, "urls_public")?,
                resume_on_request: flag(&r, "resume_on_request")?,
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
