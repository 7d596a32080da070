//! [`SnapshotStore`] on either engine.

use super::{backend, SqlStore};
use crate::snapshots::{SnapshotRecord, SnapshotStore, COLUMNS};
use crate::Result;
use sqlx::any::AnyRow;

fn snapshot_of(r: &AnyRow) -> Result<SnapshotRecord> {
    use sqlx::Row;
    let get = || -> std::result::Result<_, sqlx::Error> {
        Ok(SnapshotRecord {
            id: r.try_get("id")?,
            account_id: r.try_get("account_id")?,
            workspace_id: r.try_get("workspace_id")?,
            project_id: r.try_get("project_id")?,
            node_id: r.try_get("node_id")?,
            node_snapshot_id: r.try_get("node_snapshot_id")?,
            source_sandbox_id: r.try_get("source_sandbox_id")?,
            template: r.try_get("template")?,
            template_ref: r.try_get("template_ref")?,
            name: r.try_get("name")?,
            created_at: r.try_get("created_at")?,
        })
    };
    get().map_err(backend)
}

#[async_trait::async_trait]
impl SnapshotStore for SqlStore {
    async fn put_snapshot(&self, s: &SnapshotRecord) -> Result<(SnapshotRecord, Option<(String, String)>)> {
        let mut tx = self.write().await?;
        let named = match &s.name {
            Some(name) => {
                sqlx::query(&format!("SELECT {COLUMNS} FROM sandbox_snapshots WHERE project_id = $1 AND name = $2"))
                    .bind(&s.project_id)
                    .bind(name)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(backend)?
                    .map(|r| snapshot_of(&r))
                    .transpose()?
            }
            None => None,
        };
        let (record, replaced) = match named {
            Some(old) => {
                sqlx::query(
                    "UPDATE sandbox_snapshots SET node_id = $1, node_snapshot_id = $2, source_sandbox_id = $3, \
                     template = $4, template_ref = $5, created_at = $6 WHERE id = $7",
                )
                .bind(&s.node_id)
                .bind(&s.node_snapshot_id)
                .bind(&s.source_sandbox_id)
                .bind(&s.template)
                .bind(&s.template_ref)
                .bind(s.created_at)
                .bind(&old.id)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
                let replaced = (old.node_id.clone(), old.node_snapshot_id.clone());
                (SnapshotRecord { id: old.id, ..s.clone() }, Some(replaced))
            }
            None => {
                sqlx::query(&format!(
                    "INSERT INTO sandbox_snapshots ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
                ))
                .bind(&s.id)
                .bind(&s.account_id)
                .bind(&s.workspace_id)
                .bind(&s.project_id)
                .bind(&s.node_id)
                .bind(&s.node_snapshot_id)
                .bind(&s.source_sandbox_id)
                .bind(&s.template)
                .bind(&s.template_ref)
                .bind(&s.name)
                .bind(s.created_at)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
                (s.clone(), None)
            }
        };
        tx.commit().await.map_err(backend)?;
        Ok((record, replaced))
    }

    async fn get_snapshot(&self, account_id: &str, id: &str) -> Result<Option<SnapshotRecord>> {
        sqlx::query(&format!("SELECT {COLUMNS} FROM sandbox_snapshots WHERE account_id = $1 AND id = $2"))
            .bind(account_id)
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?
            .map(|r| snapshot_of(&r))
            .transpose()
    }

    async fn snapshot_named(&self, account_id: &str, project_id: &str, name: &str) -> Result<Option<SnapshotRecord>> {
        sqlx::query(&format!(
            "SELECT {COLUMNS} FROM sandbox_snapshots WHERE account_id = $1 AND project_id = $2 AND name = $3"
        ))
        .bind(account_id)
        .bind(project_id)
        .bind(name)
        .fetch_optional(&self.pool)
        .await
        .map_err(backend)?
        .map(|r| snapshot_of(&r))
        .transpose()
    }

    async fn list_snapshots(&self, account_id: &str) -> Result<Vec<SnapshotRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM sandbox_snapshots WHERE account_id = $1 ORDER BY created_at, id"
        ))
        .bind(account_id)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        rows.iter().map(snapshot_of).collect()
    }

    async fn delete_snapshot(&self, account_id: &str, id: &str) -> Result<bool> {
        let done = sqlx::query("DELETE FROM sandbox_snapshots WHERE account_id = $1 AND id = $2")
            .bind(account_id)
            .bind(id)
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        Ok(done.rows_affected() > 0)
    }
}
