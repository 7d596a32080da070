//! [`BlobContentStore`] on either engine.

use super::{backend, SqlStore};
use crate::blob_content::*;
use crate::{Result, StoreError};
use async_trait::async_trait;
use sqlx::Row;
use std::collections::HashSet;

#[async_trait]
impl BlobContentStore for SqlStore {
    async fn put_blob_chunk(&self, sha256: &str, seq: u32, data: &[u8]) -> Result<()> {
        sqlx::query(
            "INSERT INTO blob_chunks (sha256, seq, data) VALUES ($1, $2, $3) \
             ON CONFLICT (sha256, seq) DO UPDATE SET data = excluded.data",
        )
        .bind(sha256)
        .bind(i64::from(seq))
        .bind(data)
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn complete_blob_content(&self, sha256: &str, content: BlobContent, at: i64) -> Result<()> {
        let size = i64::try_from(content.size).map_err(|e| StoreError::Backend(Box::new(e)))?;
        // Not serialized with the other writers: rows keyed by content never conflict with
        // billing's writes, and a race with a forget heals (the fetch fails, forgets).
        let mut tx = self.begin_write().await?;
        let row = sqlx::query(
            "SELECT COUNT(*) AS n, COALESCE(SUM(LENGTH(data)), 0) AS bytes FROM blob_chunks WHERE sha256 = $1 AND seq < $2",
        )
        .bind(sha256)
        .bind(i64::from(content.chunks))
        .fetch_one(&mut *tx)
        .await
        .map_err(backend)?;
        let (n, bytes): (i64, i64) = (row.get("n"), row.get("bytes"));
        if n != i64::from(content.chunks) || bytes != size {
            return Err(StoreError::Conflict(format!(
                "blob {sha256} has {n} of {} chunks, {bytes} of {size} bytes",
                content.chunks
            )));
        }
        sqlx::query(
            "INSERT INTO blob_contents (sha256, size, chunks, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (sha256) DO NOTHING",
        )
        .bind(sha256)
        .bind(size)
        .bind(i64::from(content.chunks))
        .bind(at)
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        Ok(())
    }

    async fn blob_content(&self, sha256: &str) -> Result<Option<BlobContent>> {
        let row = sqlx::query("SELECT size, chunks FROM blob_contents WHERE sha256 = $1")
            .bind(sha256)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?;
        row.map(|r| content(r.get("size"), r.get("chunks"))).transpose()
    }

    async fn complete_blobs(&self, sha256: &[String]) -> Result<HashSet<String>> {
        let found: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT sha256 FROM blob_contents WHERE sha256 IN {}",
            self.engine.json_list("$1")
        ))
        .bind(super::json_list(sha256)?)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        Ok(found.into_iter().collect())
    }

    async fn blob_chunk(&self, sha256: &str, seq: u32) -> Result<Option<Vec<u8>>> {
        sqlx::query_scalar("SELECT data FROM blob_chunks WHERE sha256 = $1 AND seq = $2")
            .bind(sha256)
            .bind(i64::from(seq))
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)
    }

    async fn forget_blob_content(&self, sha256: &str) -> Result<()> {
        let mut tx = self.begin_write().await?;
        for sql in ["DELETE FROM blob_contents WHERE sha256 = $1", "DELETE FROM blob_chunks WHERE sha256 = $1"] {
            sqlx::query(sql).bind(sha256).execute(&mut *tx).await.map_err(backend)?;
        }
        tx.commit().await.map_err(backend)?;
        Ok(())
    }
}

/// A stored shape; a negative or oversized column is an error, never a guess.
fn content(size: i64, chunks: i64) -> Result<BlobContent> {
    let bad = |what: &'static str, v: i64| StoreError::UnknownValue { what, value: v.to_string() };
    Ok(BlobContent {
        size: u64::try_from(size).map_err(|_| bad("blob size", size))?,
        chunks: u32::try_from(chunks).map_err(|_| bad("blob chunk count", chunks))?,
    })
}
