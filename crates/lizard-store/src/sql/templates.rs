//! [`TemplateStore`] on either engine.

use super::{backend, col, conflict_or_backend, json_err, SqlStore};
use crate::templates::*;
use crate::{Result, StoreError};
use async_trait::async_trait;
use lizard_api::templates::{BuildFailure, BuildStatus};
use sqlx::any::AnyRow;

const TEMPLATE_COLUMNS: &str = "t.id, w.account_id, t.workspace_id, t.name, t.description, t.base, t.start_cmd, \
     t.current_build_id, cb.template_ref AS current_ref, cb.layer_bytes AS layer_bytes, \
     (SELECT b.id FROM template_builds b WHERE b.template_id = t.id ORDER BY b.created_at DESC, b.id DESC LIMIT 1) \
     AS latest_build_id, t.created_at, t.updated_at \
     FROM templates t JOIN workspaces w ON w.id = t.workspace_id \
     LEFT JOIN template_builds cb ON cb.id = t.current_build_id";

const BUILD_COLUMNS: &str = "b.id, b.template_id, t.name AS template_name, t.workspace_id, w.account_id, b.status, \
     b.steps, b.error, b.log, b.events, b.template_ref, b.layer_bytes, b.created_at, b.finished_at \
     FROM template_builds b JOIN templates t ON t.id = b.template_id JOIN workspaces w ON w.id = t.workspace_id";

fn bytes(r: &AnyRow, column: &str) -> Result<Option<u64>> {
    let v: Option<i64> = col(r, column)?;
    v.map(|v| u64::try_from(v).map_err(|e| StoreError::Backend(Box::new(e)))).transpose()
}

fn template(r: &AnyRow) -> Result<TemplateRecord> {
    Ok(TemplateRecord {
        id: col(r, "id")?,
        account_id: col(r, "account_id")?,
        workspace_id: col(r, "workspace_id")?,
        name: col(r, "name")?,
        description: col(r, "description")?,
        base: col(r, "base")?,
        start_cmd: col(r, "start_cmd")?,
        current_build_id: col(r, "current_build_id")?,
        current_ref: col(r, "current_ref")?,
        layer_bytes: bytes(r, "layer_bytes")?,
        latest_build_id: col(r, "latest_build_id")?,
        created_at: col(r, "created_at")?,
        updated_at: col(r, "updated_at")?,
    })
}

fn build(r: &AnyRow) -> Result<BuildRecord> {
    let steps: String = col(r, "steps")?;
    let error: Option<String> = col(r, "error")?;
    Ok(BuildRecord {
        id: col(r, "id")?,
        template_id: col(r, "template_id")?,
        template_name: col(r, "template_name")?,
        workspace_id: col(r, "workspace_id")?,
        account_id: col(r, "account_id")?,
        status: parse_build_status(&col::<String, _>(r, "status")?)?,
        steps: serde_json::from_str(&steps).map_err(json_err)?,
        error: error.map(|e| serde_json::from_str::<BuildFailure>(&e)).transpose().map_err(json_err)?,
        log: col(r, "log")?,
        events: col(r, "events")?,
        template_ref: col(r, "template_ref")?,
        layer_bytes: bytes(r, "layer_bytes")?,
        created_at: col(r, "created_at")?,
        finished_at: col(r, "finished_at")?,
    })
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl SqlStore {
    async fn template_by(&self, filter: &str, a: &str, b: Option<&str>) -> Result<Option<TemplateRecord>> {
        let sql = format!("SELECT {TEMPLATE_COLUMNS} WHERE {filter}");
        let mut q = sqlx::query(&sql).bind(a);
        if let Some(b) = b {
            q = q.bind(b);
        }
        q.fetch_optional(&self.pool).await.map_err(backend)?.as_ref().map(template).transpose()
    }
}

#[async_trait]
impl TemplateStore for SqlStore {
    async fn insert_build(&self, t: &NewTemplate, b: &NewBuild) -> Result<TemplateRecord> {
        let mut tx = self.write().await?;
        let account: Option<String> = sqlx::query_scalar("SELECT account_id FROM workspaces WHERE id = $1")
            .bind(&t.workspace_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend)?;
        let Some(account) = account else {
            return Err(StoreError::NotFound(format!("workspace {}", t.workspace_id)));
        };
        let unfinished: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM template_builds b JOIN templates t ON t.id = b.template_id \
             WHERE t.workspace_id = $1 AND b.status IN ('queued', 'running')",
        )
        .bind(&t.workspace_id)
        .fetch_one(&mut *tx)
        .await
        .map_err(backend)?;
        if unfinished >= i64::from(b.workspace_limit) {
            return Err(StoreError::Conflict(format!(
                "this workspace has {unfinished} template build(s) queued or running, the most it may run at once; \
                 wait for one to end or cancel one"
            )));
        }
        let existing: Option<String> =
            sqlx::query_scalar("SELECT id FROM templates WHERE workspace_id = $1 AND name = $2")
                .bind(&t.workspace_id)
                .bind(&t.name)
                .fetch_optional(&mut *tx)
                .await
                .map_err(backend)?;
        let template_id = match existing {
            Some(id) => {
                let running: Option<String> = sqlx::query_scalar(
                    "SELECT id FROM template_builds WHERE template_id = $1 AND status IN ('queued', 'running') LIMIT 1",
                )
                .bind(&id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(backend)?;
                if let Some(other) = running {
                    return Err(StoreError::Conflict(format!(
                        "template {} is being built (build {other}); wait for it or cancel it",
                        t.name
                    )));
                }
                id
            }
            None => {
                sqlx::query(
                    "INSERT INTO templates (id, workspace_id, name, description, base, start_cmd, created_at, updated_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                )
                .bind(&t.id)
                .bind(&t.workspace_id)
                .bind(&t.name)
                .bind(&t.description)
                .bind(&t.base)
                .bind(&t.start_cmd)
                .bind(t.created_at)
                .bind(t.created_at)
                .execute(&mut *tx)
                .await
                .map_err(|e| conflict_or_backend(e, || format!("template {} already exists", t.name)))?;
                t.id.clone()
            }
        };
        sqlx::query(
            "INSERT INTO template_builds (id, template_id, status, template_ref, created_at) VALUES ($1, $2, 'queued', $3, $4)",
        )
        .bind(&b.id)
        .bind(&template_id)
        .bind(&b.template_ref)
        .bind(b.created_at)
        .execute(&mut *tx)
        .await
        .map_err(|e| conflict_or_backend(e, || format!("build {} already exists", b.id)))?;
        // Billed as a running sandbox of the build VM's size, to the workspace (no project).
        let owner = (account.as_str(), t.workspace_id.as_str(), "");
        super::billing::insert_meter_tx(&mut tx, &b.id, owner, &b.meter, crate::MeterState::Running, b.created_at)
            .await?;
        tx.commit().await.map_err(backend)?;
        self.template_by("t.id = $1", &template_id, None)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("template {}", t.name)))
    }

    async fn find_template(&self, workspace_id: &str, name: &str) -> Result<Option<TemplateRecord>> {
        self.template_by("t.workspace_id = $1 AND t.name = $2", workspace_id, Some(name)).await
    }

    async fn list_templates(&self, account_id: &str) -> Result<Vec<TemplateRecord>> {
        sqlx::query(&format!("SELECT {TEMPLATE_COLUMNS} WHERE w.account_id = $1 ORDER BY t.workspace_id, t.name"))
            .bind(account_id)
            .fetch_all(&self.pool)
            .await
            .map_err(backend)?
            .iter()
            .map(template)
            .collect()
    }

    async fn get_build(&self, build_id: &str) -> Result<Option<BuildRecord>> {
        sqlx::query(&format!("SELECT {BUILD_COLUMNS} WHERE b.id = $1"))
            .bind(build_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?
            .as_ref()
            .map(build)
            .transpose()
    }

    async fn start_build(&self, build_id: &str) -> Result<()> {
        sqlx::query("UPDATE template_builds SET status = 'running' WHERE id = $1 AND status = 'queued'")
            .bind(build_id)
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn record_progress(
        &self,
        build_id: &str,
        steps: &[lizard_api::templates::BuildStepInfo],
        log: &str,
    ) -> Result<()> {
        let steps = serde_json::to_string(steps).map_err(json_err)?;
        sqlx::query("UPDATE template_builds SET steps = $1, log = $2 WHERE id = $3 AND finished_at IS NULL")
            .bind(steps)
            .bind(log)
            .bind(build_id)
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn finish_build(&self, build_id: &str, f: &FinishedBuild) -> Result<Option<String>> {
        let mut tx = self.write().await?;
        let template_id: Option<String> = sqlx::query_scalar("SELECT template_id FROM template_builds WHERE id = $1")
            .bind(build_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend)?;
        let Some(template_id) = template_id else { return Err(StoreError::NotFound(format!("build {build_id}"))) };
        let error = f.error.as_ref().map(serde_json::to_string).transpose().map_err(json_err)?;
        sqlx::query(
            "UPDATE template_builds SET status = $1, steps = $2, error = $3, log = $4, events = $5, layer_bytes = $6, \
             finished_at = $7 WHERE id = $8",
        )
        .bind(build_status_name(f.status))
        .bind(serde_json::to_string(&f.steps).map_err(json_err)?)
        .bind(error)
        .bind(&f.log)
        .bind(&f.events)
        .bind(f.layer_bytes.map(to_i64))
        .bind(f.finished_at)
        .bind(build_id)
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
        let mut replaced = None;
        if f.status == BuildStatus::Ready {
            replaced = sqlx::query_scalar(
                "SELECT b.template_ref FROM templates t JOIN template_builds b ON b.id = t.current_build_id WHERE t.id = $1",
            )
            .bind(&template_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend)?;
            sqlx::query(
                "UPDATE templates SET current_build_id = $1, description = $2, base = $3, start_cmd = $4, updated_at = $5 \
                 WHERE id = $6",
            )
            .bind(build_id)
            .bind(&f.description)
            .bind(&f.base)
            .bind(&f.start_cmd)
            .bind(f.finished_at)
            .bind(&template_id)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        }
        // The build VM is gone: its meter stops where the build ended.
        super::billing::transition_tx(&mut tx, build_id, crate::MeterState::Ended, f.finished_at).await?;
        tx.commit().await.map_err(backend)?;
        Ok(replaced)
    }

    async fn fail_unfinished_builds(&self, error: &BuildFailure, at: i64) -> Result<Vec<String>> {
        let mut tx = self.write().await?;
        let refs: Vec<String> =
            sqlx::query_scalar("SELECT template_ref FROM template_builds WHERE status IN ('queued', 'running')")
                .fetch_all(&mut *tx)
                .await
                .map_err(backend)?;
        sqlx::query(
            "UPDATE template_builds SET status = 'failed', error = $1, finished_at = $2 \
             WHERE status IN ('queued', 'running')",
        )
        .bind(serde_json::to_string(error).map_err(json_err)?)
        .bind(at)
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        Ok(refs)
    }

    async fn delete_template(&self, template_id: &str) -> Result<Vec<String>> {
        let mut tx = self.write().await?;
        let name: Option<String> = sqlx::query_scalar("SELECT name FROM templates WHERE id = $1")
            .bind(template_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend)?;
        let Some(name) = name else { return Err(StoreError::NotFound(format!("template {template_id}"))) };
        let building: Option<String> = sqlx::query_scalar(
            "SELECT id FROM template_builds WHERE template_id = $1 AND status IN ('queued', 'running') LIMIT 1",
        )
        .bind(template_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(backend)?;
        if let Some(b) = building {
            return Err(StoreError::Conflict(format!(
                "template {name} is being built (build {b}); cancel the build first"
            )));
        }
        let user: Option<String> = sqlx::query_scalar(
            "SELECT s.id FROM sandboxes s JOIN template_builds b ON b.template_ref = s.template_ref \
             WHERE b.template_id = $1 AND s.ended_at IS NULL ORDER BY s.created_at LIMIT 1",
        )
        .bind(template_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(backend)?;
        if let Some(s) = user {
            return Err(StoreError::Conflict(format!("template {name} is in use by sandbox {s}")));
        }
        let refs: Vec<String> = sqlx::query_scalar(
            "SELECT template_ref FROM template_builds WHERE template_id = $1 AND status = 'ready' ORDER BY created_at, seq",
        )
        .bind(template_id)
        .fetch_all(&mut *tx)
        .await
        .map_err(backend)?;
        sqlx::query("DELETE FROM template_builds WHERE template_id = $1")
            .bind(template_id)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        sqlx::query("DELETE FROM templates WHERE id = $1")
            .bind(template_id)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        Ok(refs)
    }

    async fn template_ref_in_use(&self, template_ref: &str) -> Result<bool> {
        let n: i64 = sqlx::query_scalar(crate::template_tags::REF_IN_USE)
            .bind(template_ref)
            .fetch_one(&self.pool)
            .await
            .map_err(backend)?;
        Ok(n > 0)
    }

    async fn missing_blobs(&self, workspace_id: &str, sha256: &[String]) -> Result<Vec<String>> {
        let have: std::collections::HashSet<String> = sqlx::query_scalar(&format!(
            "SELECT sha256 FROM template_blobs WHERE workspace_id = $1 AND sha256 IN {}",
            self.engine.json_list("$2")
        ))
        .bind(workspace_id)
        .bind(super::json_list(sha256)?)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?
        .into_iter()
        .collect();
        Ok(sha256.iter().filter(|h| !have.contains(*h)).cloned().collect())
    }

    async fn insert_blob(&self, workspace_id: &str, sha256: &str, size: u64, at: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO template_blobs (workspace_id, sha256, size, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (workspace_id, sha256) DO NOTHING",
        )
        .bind(workspace_id)
        .bind(sha256)
        .bind(to_i64(size))
        .bind(at)
        .execute(&self.pool)
        .await
        .map_err(|e| match &e {
            sqlx::Error::Database(db) if db.is_foreign_key_violation() => {
                StoreError::NotFound(format!("workspace {workspace_id}"))
            }
            _ => backend(e),
        })?;
        Ok(())
    }
}
