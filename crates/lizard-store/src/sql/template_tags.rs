//! [`TemplateTagStore`] on either engine.

use super::{backend, SqlStore};
use crate::template_tags::{TagRecord, TemplateTagStore, TAG_COLUMNS};
use crate::Result;
use sqlx::any::AnyRow;

fn tag_of(r: &AnyRow) -> Result<TagRecord> {
    use sqlx::Row;
    let get = || -> std::result::Result<_, sqlx::Error> {
        Ok(TagRecord {
            tag: r.try_get("tag")?,
            build_id: r.try_get("build_id")?,
            template_ref: r.try_get("template_ref")?,
            created_at: r.try_get("created_at")?,
        })
    };
    get().map_err(backend)
}

/// The tag `tag` of `template_id`, read through `db` (the pool, or a transaction).
async fn tag_named<'e>(
    db: impl sqlx::Executor<'e, Database = sqlx::Any>,
    template_id: &str,
    tag: &str,
) -> Result<Option<TagRecord>> {
    sqlx::query(&format!(
        "SELECT {TAG_COLUMNS} FROM template_tags t JOIN template_builds b ON b.id = t.build_id \
         WHERE t.template_id = $1 AND t.tag = $2"
    ))
    .bind(template_id)
    .bind(tag)
    .fetch_optional(db)
    .await
    .map_err(backend)?
    .map(|r| tag_of(&r))
    .transpose()
}

#[async_trait::async_trait]
impl TemplateTagStore for SqlStore {
    async fn assign_tags(&self, template_id: &str, build_id: &str, tags: &[String], at: i64) -> Result<Vec<String>> {
        let mut tx = self.write().await?;
        let ready: Option<String> = sqlx::query_scalar(
            "SELECT id FROM template_builds WHERE id = $1 AND template_id = $2 AND status = 'ready'",
        )
        .bind(build_id)
        .bind(template_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(backend)?;
        if ready.is_none() {
            return Err(crate::StoreError::NotFound(format!("ready build {build_id}")));
        }
        let mut released = Vec::new();
        for tag in tags {
            let old = tag_named(&mut *tx, template_id, tag).await?;
            if let Some(old) = old.filter(|o| o.build_id != build_id) {
                released.push(old.template_ref);
            }
            sqlx::query(
                "INSERT INTO template_tags (template_id, tag, build_id, created_at) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (template_id, tag) DO UPDATE SET build_id = excluded.build_id, \
                 created_at = excluded.created_at",
            )
            .bind(template_id)
            .bind(tag)
            .bind(build_id)
            .bind(at)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        }
        tx.commit().await.map_err(backend)?;
        released.sort();
        released.dedup();
        Ok(released)
    }

    async fn remove_tags(&self, template_id: &str, tags: &[String]) -> Result<Vec<String>> {
        let mut tx = self.write().await?;
        let mut released = Vec::new();
        for tag in tags {
            let old = tag_named(&mut *tx, template_id, tag).await?;
            let Some(old) = old else {
                return Err(crate::StoreError::NotFound(format!("tag {tag}")));
            };
            sqlx::query("DELETE FROM template_tags WHERE template_id = $1 AND tag = $2")
                .bind(template_id)
                .bind(tag)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
            released.push(old.template_ref);
        }
        tx.commit().await.map_err(backend)?;
        released.sort();
        released.dedup();
        Ok(released)
    }

    async fn list_tags(&self, template_id: &str) -> Result<Vec<TagRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {TAG_COLUMNS} FROM template_tags t JOIN template_builds b ON b.id = t.build_id \
             WHERE t.template_id = $1 ORDER BY t.tag"
        ))
        .bind(template_id)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        rows.iter().map(tag_of).collect()
    }

    async fn tagged_build(&self, template_id: &str, tag: &str) -> Result<Option<TagRecord>> {
        tag_named(&self.pool, template_id, tag).await
    }
}
