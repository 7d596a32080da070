//! Template tags: `name:tag` names one ready build of a template (E2B's tags), so a
//! create can start from a build other than the latest, and a rebuild does not move what
//! `name:stable` runs. `default` (or no tag) is always the current build; a tag is given
//! to a build when it finishes ready (a build requested with tags), or moved to the build
//! another tag names. A tagged build's node template is kept until its last tag goes.

use super::refs::release_ref;
use crate::error::{ApiResult, AppError};
use crate::state::AppState;
use lizard_api::ids;
use lizard_store::{StoreError, TemplateRecord};

/// The tag that always names the current build.
pub const DEFAULT_TAG: &str = "default";

/// A template reference split: `name` or `name:tag`.
pub fn split_reference(reference: &str) -> (&str, Option<&str>) {
    match reference.split_once(':') {
        Some((name, tag)) => (name, Some(tag)),
        None => (reference, None),
    }
}

/// A tag as a client may give one: 1 to 64 of `[a-z0-9._-]`, starting with a letter or
/// digit; `default` only where it names the current build.
pub fn check_tag(tag: &str) -> ApiResult<()> {
    let ok = (1..=64).contains(&tag.len())
        && tag.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        && tag.as_bytes()[0].is_ascii_alphanumeric();
    if !ok {
        return Err(AppError::invalid(format!(
            "tag {tag:?}: 1 to 64 lower-case letters, digits, '.', '_' and '-', starting with a letter or digit"
        )));
    }
    Ok(())
}

/// Tags to give or take, checked: `default` cannot be, it is always the latest build.
fn check_movable(tags: &[String]) -> ApiResult<()> {
    if tags.is_empty() {
        return Err(AppError::invalid("no tags given"));
    }
    for tag in tags {
        check_tag(tag)?;
        if tag == DEFAULT_TAG {
            return Err(AppError::invalid("the default tag is always the latest ready build: it cannot be moved"));
        }
    }
    Ok(())
}

/// The build `tag` names (none, or `default`: the current one): its id and node template.
pub async fn build_for(state: &AppState, template: &TemplateRecord, tag: Option<&str>) -> ApiResult<(String, String)> {
    let name = &template.name;
    match tag.filter(|t| *t != DEFAULT_TAG) {
        None => match (&template.current_build_id, &template.current_ref) {
            (Some(build), Some(node_ref)) => Ok((build.clone(), node_ref.clone())),
            _ => Err(AppError::not_found(format!("template {name} has no successful build yet"))),
        },
        Some(tag) => match state.server.store.tagged_build(&template.id, tag).await? {
            Some(t) => Ok((t.build_id, t.template_ref)),
            None => Err(AppError::not_found(format!("template {name} has no tag {tag}"))),
        },
    }
}

/// Point `tags` at the build `target_tag` names; its build id.
pub async fn assign(
    state: &AppState,
    template: &TemplateRecord,
    target_tag: Option<&str>,
    tags: &[String],
) -> ApiResult<String> {
    check_movable(tags)?;
    let (build_id, _) = build_for(state, template, target_tag).await?;
    let untagged = state.server.store.assign_tags(&template.id, &build_id, tags, ids::now_ms()).await?;
    for node_ref in untagged {
        release_ref(state, &node_ref).await;
    }
    Ok(build_id)
}

/// Remove `tags` (all, or none when one is not there: 404 naming it).
pub async fn remove(state: &AppState, template: &TemplateRecord, tags: &[String]) -> ApiResult<()> {
    check_movable(tags)?;
    let untagged = state.server.store.remove_tags(&template.id, tags).await.map_err(|e| match e {
        StoreError::NotFound(what) => AppError::not_found(format!("template {}: no {what}", template.name)),
        other => other.into(),
    })?;
    for node_ref in untagged {
        release_ref(state, &node_ref).await;
    }
    Ok(())
}

/// A tag and the build it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagInfo {
    pub tag: String,
    pub build_id: String,
    pub created_at: i64,
}

/// The template's tags: `default` (once it has a ready build), then the others by name.
pub async fn list(state: &AppState, template: &TemplateRecord) -> ApiResult<Vec<TagInfo>> {
    let mut tags = Vec::new();
    if let Some(build_id) = &template.current_build_id {
        tags.push(TagInfo { tag: DEFAULT_TAG.into(), build_id: build_id.clone(), created_at: template.updated_at });
    }
    let stored = state.server.store.list_tags(&template.id).await?;
    tags.extend(stored.into_iter().map(|t| TagInfo { tag: t.tag, build_id: t.build_id, created_at: t.created_at }));
    Ok(tags)
}

/// Give a build that just finished ready the tags it was requested with (`default`
/// needs nothing: it is the current build now); the node templates that lost a tag, for
/// the caller to release. A failure is logged: the build stands, untagged.
pub(super) async fn take(state: &AppState, build_id: &str, tags: &[String]) -> Vec<String> {
    let tags: Vec<String> = tags.iter().filter(|t| *t != DEFAULT_TAG).cloned().collect();
    if tags.is_empty() {
        return Vec::new();
    }
    let store = state.server.store.as_ref();
    let taken = match store.get_build(build_id).await {
        Ok(Some(build)) => store.assign_tags(&build.template_id, build_id, &tags, ids::now_ms()).await,
        Ok(None) => Err(StoreError::NotFound(format!("build {build_id}"))),
        Err(e) => Err(e),
    };
    taken.unwrap_or_else(|e| {
        tracing::warn!(build = build_id, ?tags, "a build finished but cannot take its tags: {e}");
        Vec::new()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_and_tags_are_checked() {
        assert_eq!(split_reference("web"), ("web", None));
        assert_eq!(split_reference("web:v1.2"), ("web", Some("v1.2")));
        for good in ["v1", "stable", "1.0.0-rc_1"] {
            assert!(check_tag(good).is_ok(), "{good}");
        }
        for bad in ["", "V1", "-x", ".x", "a b", "a:b", &"x".repeat(65)] {
            assert!(check_tag(bad).is_err(), "{bad:?}");
        }
        assert!(check_movable(&["default".into()]).is_err());
        assert!(check_movable(&[]).is_err());
        assert!(check_movable(&["prod".into(), "v2".into()]).is_ok());
    }
}
