//! [`ServiceStore`] on either engine.

use super::{backend, col, conflict_or_backend, json_err, SqlStore};
use crate::services::{ServiceBody, ServiceRecord, ServiceStore};
use crate::{Result, StoreError};
use async_trait::async_trait;

const COLUMNS: &str = "id, account_id, workspace_id, project_id, name, body, revision, created_at, updated_at";

fn service(r: &sqlx::any::AnyRow) -> Result<ServiceRecord> {
    let body: String = col(r, "body")?;
    Ok(ServiceRecord {
        id: col(r, "id")?,
        account_id: col(r, "account_id")?,
        workspace_id: col(r, "workspace_id")?,
        project_id: col(r, "project_id")?,
        name: col(r, "name")?,
        body: serde_json::from_str::<ServiceBody>(&body).map_err(json_err)?,
        revision: col(r, "revision")?,
        created_at: col(r, "created_at")?,
        updated_at: col(r, "updated_at")?,
    })
}

#[async_trait]
impl ServiceStore for SqlStore {
    async fn insert_service(&self, s: &ServiceRecord) -> Result<()> {
        let body = serde_json::to_string(&s.body).map_err(json_err)?;
        sqlx::query(&format!("INSERT INTO services ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"))
            .bind(&s.id)
            .bind(&s.account_id)
            .bind(&s.workspace_id)
            .bind(&s.project_id)
            .bind(&s.name)
            .bind(body)
            .bind(s.revision)
            .bind(s.created_at)
            .bind(s.updated_at)
            .execute(&self.pool)
            .await
            .map_err(|e| conflict_or_backend(e, || format!("the service name {} is taken", s.name)))?;
        Ok(())
    }

    async fn service_by_name(&self, name: &str) -> Result<Option<ServiceRecord>> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM services WHERE name = $1"))
            .bind(name)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?;
        row.as_ref().map(service).transpose()
    }

    async fn list_services(&self, account_id: Option<&str>) -> Result<Vec<ServiceRecord>> {
        let rows = match account_id {
            Some(a) => {
                sqlx::query(&format!("SELECT {COLUMNS} FROM services WHERE account_id = $1 ORDER BY name"))
                    .bind(a)
                    .fetch_all(&self.pool)
                    .await
            }
            None => sqlx::query(&format!("SELECT {COLUMNS} FROM services ORDER BY name")).fetch_all(&self.pool).await,
        }
        .map_err(backend)?;
        rows.iter().map(service).collect()
    }

    async fn update_service(&self, s: &ServiceRecord) -> Result<ServiceRecord> {
        let body = serde_json::to_string(&s.body).map_err(json_err)?;
        let now = lizard_api::ids::now_ms();
        let done = sqlx::query(
            "UPDATE services SET body = $1, revision = revision + 1, updated_at = $2 WHERE id = $3 AND revision = $4",
        )
        .bind(body)
        .bind(now)
        .bind(&s.id)
        .bind(s.revision)
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        if done.rows_affected() == 0 {
            let exists = sqlx::query("SELECT 1 AS one FROM services WHERE id = $1")
                .bind(&s.id)
                .fetch_optional(&self.pool)
                .await
                .map_err(backend)?;
            return Err(match exists {
                Some(_) => StoreError::Conflict(format!("service {} changed meanwhile", s.name)),
                None => StoreError::NotFound(format!("service {}", s.name)),
            });
        }
        Ok(ServiceRecord { revision: s.revision + 1, updated_at: now, ..s.clone() })
    }

    async fn delete_service(&self, id: &str) -> Result<()> {
        sqlx::query("DELETE FROM services WHERE id = $1").bind(id).execute(&self.pool).await.map_err(backend)?;
        Ok(())
    }
}
