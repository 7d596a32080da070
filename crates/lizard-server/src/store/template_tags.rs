//! Template tags: a name for one ready build of a template (E2B's `name:tag`), which
//! creates naming `name:tag` start from. `default` has no row: it is the current build.
//!
//! A tagged build's node template is kept while any tag names it ([`REF_IN_USE`]). One SQL
//! text serves both engines (sqlx's SQLite driver binds `$N` by number), and
//! [`impl_template_tag_store!`] writes the implementation once for each.

use super::Result;
use async_trait::async_trait;

/// A tag as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagRecord {
    pub tag: String,
    pub build_id: String,
    /// The build's node template.
    pub template_ref: String,
    pub created_at: i64,
}

#[async_trait]
pub trait TemplateTagStore: Send + Sync {
    /// Point each of `tags` of `template_id` at `build_id` (a ready build of it), moving
    /// any that named another build. Returns the node templates of the builds that lost a
    /// tag, for the caller to release if nothing else keeps them.
    async fn assign_tags(&self, template_id: &str, build_id: &str, tags: &[String], at: i64) -> Result<Vec<String>>;
    /// Remove `tags` of `template_id`, all or none: `NotFound` naming the first that is not
    /// there. Returns the node templates of the builds they named.
    async fn remove_tags(&self, template_id: &str, tags: &[String]) -> Result<Vec<String>>;
    /// The template's tags, by name.
    async fn list_tags(&self, template_id: &str) -> Result<Vec<TagRecord>>;
    /// The build `tag` of `template_id` names.
    async fn tagged_build(&self, template_id: &str, tag: &str) -> Result<Option<TagRecord>>;
}

/// Whether a node template is kept: a live sandbox runs from it, a tag names its build, or
/// it is its template's current build. Counts; `$1` is the node template.
pub(super) const REF_IN_USE: &str = "SELECT \
     (SELECT COUNT(*) FROM sandboxes WHERE template_ref = $1 AND ended_at IS NULL) \
     + (SELECT COUNT(*) FROM template_tags t JOIN template_builds b ON b.id = t.build_id WHERE b.template_ref = $1) \
     + (SELECT COUNT(*) FROM templates tp JOIN template_builds b ON b.id = tp.current_build_id \
        WHERE b.template_ref = $1)";

/// The tag columns with the build's node template, from `template_tags t JOIN
/// template_builds b`.
pub(super) const TAG_COLUMNS: &str = "t.tag, t.build_id, b.template_ref, t.created_at";

/// `impl TemplateTagStore for $store` (whose rows are `$row`), in a module where `backend(sqlx::Error) ->
/// StoreError` is in scope and `$store::write` opens the engine's write transaction.
macro_rules! impl_template_tag_store {
    ($store:ty, $row:ty) => {
        fn tag_of(r: &$row) -> $crate::store::Result<$crate::store::template_tags::TagRecord> {
            use sqlx::Row;
            let get = || -> std::result::Result<_, sqlx::Error> {
                Ok($crate::store::template_tags::TagRecord {
                    tag: r.try_get("tag")?,
                    build_id: r.try_get("build_id")?,
                    template_ref: r.try_get("template_ref")?,
                    created_at: r.try_get("created_at")?,
                })
            };
            get().map_err(backend)
        }

        #[async_trait::async_trait]
        impl $crate::store::template_tags::TemplateTagStore for $store {
            async fn assign_tags(
                &self,
                template_id: &str,
                build_id: &str,
                tags: &[String],
                at: i64,
            ) -> $crate::store::Result<Vec<String>> {
                use $crate::store::template_tags::TAG_COLUMNS;
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
                    return Err($crate::store::StoreError::NotFound(format!("ready build {build_id}")));
                }
                let mut released = Vec::new();
                for tag in tags {
                    let old = sqlx::query(&format!(
                        "SELECT {TAG_COLUMNS} FROM template_tags t JOIN template_builds b ON b.id = t.build_id \
                         WHERE t.template_id = $1 AND t.tag = $2"
                    ))
                    .bind(template_id)
                    .bind(tag)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(backend)?
                    .map(|r| tag_of(&r))
                    .transpose()?;
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

            async fn remove_tags(&self, template_id: &str, tags: &[String]) -> $crate::store::Result<Vec<String>> {
                use $crate::store::template_tags::TAG_COLUMNS;
                let mut tx = self.write().await?;
                let mut released = Vec::new();
                for tag in tags {
                    let old = sqlx::query(&format!(
                        "SELECT {TAG_COLUMNS} FROM template_tags t JOIN template_builds b ON b.id = t.build_id \
                         WHERE t.template_id = $1 AND t.tag = $2"
                    ))
                    .bind(template_id)
                    .bind(tag)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(backend)?
                    .map(|r| tag_of(&r))
                    .transpose()?;
                    let Some(old) = old else {
                        return Err($crate::store::StoreError::NotFound(format!("tag {tag}")));
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

            async fn list_tags(
                &self,
                template_id: &str,
            ) -> $crate::store::Result<Vec<$crate::store::template_tags::TagRecord>> {
                use $crate::store::template_tags::TAG_COLUMNS;
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

            async fn tagged_build(
                &self,
                template_id: &str,
                tag: &str,
            ) -> $crate::store::Result<Option<$crate::store::template_tags::TagRecord>> {
                use $crate::store::template_tags::TAG_COLUMNS;
                sqlx::query(&format!(
                    "SELECT {TAG_COLUMNS} FROM template_tags t JOIN template_builds b ON b.id = t.build_id \
                     WHERE t.template_id = $1 AND t.tag = $2"
                ))
                .bind(template_id)
                .bind(tag)
                .fetch_optional(&self.pool)
                .await
                .map_err(backend)?
                .map(|r| tag_of(&r))
                .transpose()
            }
        }
    };
}
pub(super) use impl_template_tag_store;
