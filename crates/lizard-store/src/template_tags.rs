//! Template tags: a name for one ready build of a template (E2B's `name:tag`), which
//! creates naming `name:tag` start from. `default` has no row: it is the current build.
//!
//! A tagged build's node template is kept while any tag names it ([`REF_IN_USE`]).
//! [`super::sql`] implements it.

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
