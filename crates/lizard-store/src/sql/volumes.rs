//! [`VolumeStore`] on either engine.

use super::{backend, col, conflict_or_backend, SqlStore};
use crate::volumes::*;
use crate::{Result, Scope, StoreError};
use async_trait::async_trait;
use sqlx::any::AnyRow;

pub(super) const VOLUME_COLUMNS: &str = "v.id, w.account_id, p.workspace_id, v.project_id, v.name, v.size_gb, \
     v.node_id, v.region, v.created_at, v.attached_to \
     FROM volumes v JOIN projects p ON p.id = v.project_id JOIN workspaces w ON w.id = p.workspace_id";

pub(super) fn volume(r: &AnyRow) -> Result<VolumeRecord> {
    let size: i64 = col(r, "size_gb")?;
    Ok(VolumeRecord {
        id: col(r, "id")?,
        account_id: col(r, "account_id")?,
        workspace_id: col(r, "workspace_id")?,
        project_id: col(r, "project_id")?,
        name: col(r, "name")?,
        size_gb: u32::try_from(size).map_err(|e| StoreError::Backend(Box::new(e)))?,
        node_id: col(r, "node_id")?,
        region: col(r, "region")?,
        created_at: col(r, "created_at")?,
        attached_to: col(r, "attached_to")?,
    })
}

/// The volume that `filter` (a WHERE clause over [`VOLUME_COLUMNS`], one `?` per bind)
/// finds, if any.
async fn one_volume(store: &SqlStore, filter: &str, binds: &[&str]) -> Result<Option<VolumeRecord>> {
    let sql = format!("SELECT {VOLUME_COLUMNS} WHERE {filter}");
    let mut query = sqlx::query(&sql);
    for value in binds {
        query = query.bind(*value);
    }
    query.fetch_optional(&store.pool).await.map_err(backend)?.as_ref().map(volume).transpose()
}

/// "in use by sandbox X" or "in use by a sandbox being created".
pub(super) fn in_use(volume: &str, holder: &str) -> StoreError {
    match holder.strip_prefix(RESERVATION_PREFIX) {
        Some(_) => StoreError::Conflict(format!("volume {volume} is in use by a sandbox being created")),
        None => StoreError::Conflict(format!("volume {volume} is in use by sandbox {holder}")),
    }
}

#[async_trait]
impl VolumeStore for SqlStore {
    async fn upsert_node(&self, n: &NodeRecord) -> Result<()> {
        sqlx::query(
            "INSERT INTO nodes (id, region, created_at) VALUES ($1, $2, $3) ON CONFLICT (id) DO UPDATE SET region = excluded.region",
        )
        .bind(&n.id)
        .bind(&n.region)
        .bind(n.created_at)
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn node_loads(&self) -> Result<Vec<NodeLoad>> {
        let rows = sqlx::query(
            "SELECT n.id, n.region, n.created_at, (SELECT COUNT(*) FROM volumes v WHERE v.node_id = n.id) AS volumes \
             FROM nodes n ORDER BY n.created_at, n.id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        rows.iter()
            .map(|r| {
                let volumes: i64 = col(r, "volumes")?;
                Ok(NodeLoad {
                    node: NodeRecord {
                        id: col(r, "id")?,
                        region: col(r, "region")?,
                        created_at: col(r, "created_at")?,
                    },
                    volumes: volumes.max(0) as u64,
                })
            })
            .collect()
    }

    async fn insert_volume(&self, v: &NewVolume) -> Result<()> {
        let mut tx = self.write().await?;
        let in_use: Option<(Option<i64>, i64, i64)> =
            sqlx::query_as(QUOTA_USE).bind(&v.project_id).fetch_optional(&mut *tx).await.map_err(backend)?;
        let Some((workspace_quota, account_used, workspace_used)) = in_use else {
            return Err(StoreError::NotFound(format!("project {}", v.project_id)));
        };
        let workspace = quota_gb(workspace_quota).map(|q| (q, workspace_used));
        check_quota(v.size_gb, (v.account_quota_gb, account_used), workspace)?;
        sqlx::query(
            "INSERT INTO volumes (id, project_id, name, size_gb, node_id, region, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&v.id)
        .bind(&v.project_id)
        .bind(&v.name)
        .bind(v.size_gb as i64)
        .bind(&v.node_id)
        .bind(&v.region)
        .bind(v.created_at)
        .execute(&mut *tx)
        .await
        .map_err(|e| match &e {
            sqlx::Error::Database(db) if db.is_foreign_key_violation() => {
                StoreError::NotFound(format!("project {} or node {}", v.project_id, v.node_id))
            }
            _ => conflict_or_backend(e, || format!("a volume named {:?} already exists in this project", v.name)),
        })?;
        super::billing::open_volume_meter_tx(&mut tx, v).await?;
        tx.commit().await.map_err(backend)?;
        Ok(())
    }

    async fn get_volume(&self, account_id: &str, volume_id: &str) -> Result<Option<VolumeRecord>> {
        one_volume(self, "w.account_id = $1 AND v.id = $2", &[account_id, volume_id]).await
    }

    async fn find_volume(&self, account_id: &str, project_id: &str, name: &str) -> Result<Option<VolumeRecord>> {
        one_volume(self, "w.account_id = $1 AND v.project_id = $2 AND v.name = $3", &[account_id, project_id, name])
            .await
    }

    async fn list_volumes(
        &self,
        account_id: &str,
        scope: Option<&Scope>,
        project_id: Option<&str>,
    ) -> Result<Vec<VolumeRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {VOLUME_COLUMNS} WHERE w.account_id = $1 AND ($2 IS NULL OR v.project_id = $2) \
             ORDER BY v.created_at, v.id"
        ))
        .bind(account_id)
        .bind(project_id)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let v = volume(r)?;
            if crate::scope::sees_project(scope, &v.workspace_id, &v.project_id) {
                out.push(v);
            }
        }
        Ok(out)
    }

    async fn delete_volume(&self, account_id: &str, volume_id: &str) -> Result<VolumeRecord> {
        let mut tx = self.write().await?;
        let row = sqlx::query(&format!("SELECT {VOLUME_COLUMNS} WHERE w.account_id = $1 AND v.id = $2"))
            .bind(account_id)
            .bind(volume_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend)?;
        let Some(v) = row.as_ref().map(volume).transpose()? else {
            return Err(StoreError::NotFound(format!("volume {volume_id}")));
        };
        if let Some(holder) = &v.attached_to {
            return Err(in_use(&v.name, holder));
        }
        super::billing::close_volume_meter_tx(&mut tx, volume_id, lizard_api::ids::now_ms()).await?;
        sqlx::query("DELETE FROM volumes WHERE id = $1").bind(volume_id).execute(&mut *tx).await.map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        Ok(v)
    }

    async fn attach_volume(&self, volume_id: &str, holder: &str) -> Result<()> {
        let mut tx = self.write().await?;
        let row: Option<(String, Option<String>)> =
            sqlx::query_as("SELECT name, attached_to FROM volumes WHERE id = $1")
                .bind(volume_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(backend)?;
        match row {
            None => Err(StoreError::NotFound(format!("volume {volume_id}"))),
            Some((name, Some(h))) => Err(in_use(&name, &h)),
            Some((_, None)) => {
                sqlx::query("UPDATE volumes SET attached_to = $1 WHERE id = $2")
                    .bind(holder)
                    .bind(volume_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(backend)?;
                tx.commit().await.map_err(backend)
            }
        }
    }

    async fn reassign_volume(&self, volume_id: &str, from: &str, to: &str) -> Result<()> {
        let r = sqlx::query("UPDATE volumes SET attached_to = $1 WHERE id = $2 AND attached_to = $3")
            .bind(to)
            .bind(volume_id)
            .bind(from)
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        if r.rows_affected() == 0 {
            return Err(StoreError::NotFound(format!("volume {volume_id} held by {from}")));
        }
        Ok(())
    }

    async fn release_volume(&self, volume_id: &str, holder: &str) -> Result<()> {
        sqlx::query("UPDATE volumes SET attached_to = NULL WHERE id = $1 AND attached_to = $2")
            .bind(volume_id)
            .bind(holder)
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn release_stale_attachments(&self) -> Result<u64> {
        let r = sqlx::query(
            "UPDATE volumes SET attached_to = NULL WHERE attached_to IS NOT NULL AND NOT EXISTS \
             (SELECT 1 FROM sandboxes s WHERE s.id = volumes.attached_to AND s.ended_at IS NULL)",
        )
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        Ok(r.rows_affected())
    }
}
