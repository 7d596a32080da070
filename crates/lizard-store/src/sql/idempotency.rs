//! [`IdempotencyStore`] on either engine.

use super::{backend, col, SqlStore};
use crate::idempotency::*;
use crate::Result;
use async_trait::async_trait;
use sqlx::Row;

#[async_trait]
impl IdempotencyStore for SqlStore {
    async fn claim_idempotent(
        &self,
        id: &IdempotencyId,
        request_hash: &[u8],
        now: i64,
        expired_before: i64,
    ) -> Result<Option<IdempotencyEntry>> {
        let mut tx = self.write().await?;
        sqlx::query("DELETE FROM idempotency WHERE created_at < $1")
            .bind(expired_before)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        let row = sqlx::query(
            "SELECT request_hash, status, content_type, body FROM idempotency \
             WHERE key_id = $1 AND route = $2 AND idem_key = $3",
        )
        .bind(&id.key_id)
        .bind(&id.route)
        .bind(&id.idem_key)
        .fetch_optional(&mut *tx)
        .await
        .map_err(backend)?;
        let entry = match row {
            Some(r) => {
                let request_hash: Vec<u8> = col(&r, "request_hash")?;
                let status: Option<i64> = col(&r, "status")?;
                Some(match status {
                    None => IdempotencyEntry::InProgress { request_hash },
                    Some(status) => IdempotencyEntry::Done {
                        request_hash,
                        answer: StoredAnswer {
                            status: u16::try_from(status).map_err(|e| crate::StoreError::Backend(Box::new(e)))?,
                            content_type: col(&r, "content_type")?,
                            body: r.try_get::<Option<Vec<u8>>, _>("body").map_err(backend)?.unwrap_or_default(),
                        },
                    },
                })
            }
            None => {
                sqlx::query(
                    "INSERT INTO idempotency (key_id, route, idem_key, request_hash, created_at) VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(&id.key_id)
                .bind(&id.route)
                .bind(&id.idem_key)
                .bind(request_hash)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
                None
            }
        };
        tx.commit().await.map_err(backend)?;
        Ok(entry)
    }

    async fn finish_idempotent(&self, id: &IdempotencyId, answer: &StoredAnswer) -> Result<()> {
        sqlx::query(
            "UPDATE idempotency SET status = $1, content_type = $2, body = $3 \
             WHERE key_id = $4 AND route = $5 AND idem_key = $6",
        )
        .bind(i64::from(answer.status))
        .bind(&answer.content_type)
        .bind(&answer.body)
        .bind(&id.key_id)
        .bind(&id.route)
        .bind(&id.idem_key)
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn release_idempotent(&self, id: &IdempotencyId) -> Result<()> {
        sqlx::query("DELETE FROM idempotency WHERE key_id = $1 AND route = $2 AND idem_key = $3 AND status IS NULL")
            .bind(&id.key_id)
            .bind(&id.route)
            .bind(&id.idem_key)
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        Ok(())
    }
}
