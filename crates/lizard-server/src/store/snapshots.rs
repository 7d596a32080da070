//! Sandbox snapshots: a running sandbox saved on its node under an id of its own, which
//! creates in its project start from (see `lizard_node`'s sandbox snapshots).
//!
//! One SQL text serves both engines (sqlx's SQLite driver binds `$N` by number), and
//! [`impl_snapshot_store!`] writes the implementation once for each.

use super::Result;
use async_trait::async_trait;

/// A snapshot as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRecord {
    pub id: String,
    pub account_id: String,
    pub workspace_id: String,
    pub project_id: String,
    /// The node that holds the save, and the save's id there.
    pub node_id: String,
    pub node_snapshot_id: String,
    /// The sandbox it was last taken of.
    pub source_sandbox_id: String,
    /// That sandbox's template, as its record names it, and its node template.
    pub template: String,
    pub template_ref: Option<String>,
    /// At most one snapshot of a project has a name.
    pub name: Option<String>,
    pub created_at: i64,
}

#[async_trait]
pub trait SnapshotStore: Send + Sync {
    /// Record `snapshot`; with a name that a snapshot of its project has already, that
    /// snapshot takes its save instead (node, save, source, time) and keeps its id. Returns
    /// the record as it now is, and the save it replaced (`(node_id, node_snapshot_id)`),
    /// which the caller deletes.
    async fn put_snapshot(&self, snapshot: &SnapshotRecord) -> Result<(SnapshotRecord, Option<(String, String)>)>;
    /// The account's snapshot `id`.
    async fn get_snapshot(&self, account_id: &str, id: &str) -> Result<Option<SnapshotRecord>>;
    /// The snapshot of `project_id` named `name`.
    async fn snapshot_named(&self, account_id: &str, project_id: &str, name: &str) -> Result<Option<SnapshotRecord>>;
    /// The account's snapshots, oldest first.
    async fn list_snapshots(&self, account_id: &str) -> Result<Vec<SnapshotRecord>>;
    /// Forget the account's snapshot `id`; false when there was none.
    async fn delete_snapshot(&self, account_id: &str, id: &str) -> Result<bool>;
}

/// The columns every query reads, in [`SnapshotRecord`]'s order.
pub(super) const COLUMNS: &str = "id, account_id, workspace_id, project_id, node_id, node_snapshot_id, \
     source_sandbox_id, template, template_ref, name, created_at";

/// `impl SnapshotStore for $store` (whose rows are `$row`), in a module where
/// `backend(sqlx::Error) -> StoreError` is in scope and `$store::write` opens the
/// engine's write transaction.
macro_rules! impl_snapshot_store {
    ($store:ty, $row:ty) => {
        fn snapshot_of(r: &$row) -> $crate::store::Result<$crate::store::snapshots::SnapshotRecord> {
            use sqlx::Row;
            let get = || -> std::result::Result<_, sqlx::Error> {
                Ok($crate::store::snapshots::SnapshotRecord {
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
        impl $crate::store::snapshots::SnapshotStore for $store {
            async fn put_snapshot(
                &self,
                s: &$crate::store::snapshots::SnapshotRecord,
            ) -> $crate::store::Result<($crate::store::snapshots::SnapshotRecord, Option<(String, String)>)> {
                use $crate::store::snapshots::COLUMNS;
                let mut tx = self.write().await?;
                let named = match &s.name {
                    Some(name) => sqlx::query(&format!(
                        "SELECT {COLUMNS} FROM sandbox_snapshots WHERE project_id = $1 AND name = $2"
                    ))
                    .bind(&s.project_id)
                    .bind(name)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(backend)?
                    .map(|r| snapshot_of(&r))
                    .transpose()?,
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
                        ($crate::store::snapshots::SnapshotRecord { id: old.id, ..s.clone() }, Some(replaced))
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

            async fn get_snapshot(
                &self,
                account_id: &str,
                id: &str,
            ) -> $crate::store::Result<Option<$crate::store::snapshots::SnapshotRecord>> {
                use $crate::store::snapshots::COLUMNS;
                sqlx::query(&format!("SELECT {COLUMNS} FROM sandbox_snapshots WHERE account_id = $1 AND id = $2"))
                    .bind(account_id)
                    .bind(id)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(backend)?
                    .map(|r| snapshot_of(&r))
                    .transpose()
            }

            async fn snapshot_named(
                &self,
                account_id: &str,
                project_id: &str,
                name: &str,
            ) -> $crate::store::Result<Option<$crate::store::snapshots::SnapshotRecord>> {
                use $crate::store::snapshots::COLUMNS;
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

            async fn list_snapshots(
                &self,
                account_id: &str,
            ) -> $crate::store::Result<Vec<$crate::store::snapshots::SnapshotRecord>> {
                use $crate::store::snapshots::COLUMNS;
                let rows = sqlx::query(&format!(
                    "SELECT {COLUMNS} FROM sandbox_snapshots WHERE account_id = $1 ORDER BY created_at, id"
                ))
                .bind(account_id)
                .fetch_all(&self.pool)
                .await
                .map_err(backend)?;
                rows.iter().map(snapshot_of).collect()
            }

            async fn delete_snapshot(&self, account_id: &str, id: &str) -> $crate::store::Result<bool> {
                let done = sqlx::query("DELETE FROM sandbox_snapshots WHERE account_id = $1 AND id = $2")
                    .bind(account_id)
                    .bind(id)
                    .execute(&self.pool)
                    .await
                    .map_err(backend)?;
                Ok(done.rows_affected() > 0)
            }
        }
    };
}
pub(super) use impl_snapshot_store;
