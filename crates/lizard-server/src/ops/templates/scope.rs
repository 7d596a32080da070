//! Which workspace a template call is about, and the templates and builds a key reaches.
//!
//! A key reaches the templates of the workspaces its scope lists and of the workspaces of
//! the projects it lists (a sandbox in such a project is created from its workspace's
//! templates); an unscoped key, those of every workspace of its account. Anything else
//! answers 404, like what does not exist.

use crate::auth::{self, Principal};
use crate::error::{ApiResult, AppError};
use lizard_store::{BuildRecord, Store, TemplateRecord, WorkspaceRecord};

/// The workspaces whose templates the key reaches: those its scope lists, and those of
/// the projects it lists (a sandbox in such a project is created from its workspace's
/// templates); every workspace of the account for an unscoped key.
pub async fn visible_workspaces(store: &dyn Store, p: &Principal) -> ApiResult<Vec<WorkspaceRecord>> {
    let all = store.list_workspaces(&p.account_id).await?;
    let Some(scope) = &p.scope else { return Ok(all) };
    let mut via_projects = std::collections::BTreeSet::new();
    for id in &scope.projects {
        if let Some(prj) = store.get_project(&p.account_id, id).await? {
            via_projects.insert(prj.workspace_id);
        }
    }
    Ok(all.into_iter().filter(|w| scope.workspaces.contains(&w.id) || via_projects.contains(&w.id)).collect())
}

/// The workspace a call is about: `workspace` (id, slug or name) or `project`'s, else
/// the only one the key reaches. One the key does not reach answers 404.
pub async fn target_workspace(
    store: &dyn Store,
    p: &Principal,
    workspace: Option<&str>,
    project: Option<&str>,
) -> ApiResult<WorkspaceRecord> {
    let mut visible = visible_workspaces(store, p).await?;
    match (workspace, project) {
        (Some(key), _) => {
            let matching: Vec<usize> = [
                visible.iter().position(|w| w.id == key),
                visible.iter().position(|w| w.slug == key),
                visible.iter().position(|w| w.name == key),
            ]
            .into_iter()
            .flatten()
            .collect();
            match matching.first() {
                Some(&i) => Ok(visible.swap_remove(i)),
                None => Err(AppError::not_found(format!("workspace {key:?} not found"))),
            }
        }
        (None, Some(key)) => {
            let prj = auth::resolve_project(store, p, key).await?;
            visible
                .into_iter()
                .find(|w| w.id == prj.workspace_id)
                .ok_or_else(|| AppError::not_found(format!("workspace {} not found", prj.workspace_id)))
        }
        (None, None) if visible.len() == 1 => Ok(visible.remove(0)),
        (None, None) => Err(AppError::invalid(
            "a workspace is required: pass workspace (id, slug or name) or project (id, slug or name)",
        )),
    }
}

/// The template `name` the key reaches: in `workspace` when given, else in any of its
/// workspaces (409 when it is in several). Another workspace's template answers 404,
/// like one that does not exist.
pub async fn find(
    store: &dyn Store,
    p: &Principal,
    name: &str,
    workspace: Option<&WorkspaceRecord>,
) -> ApiResult<TemplateRecord> {
    let not_found = || AppError::not_found(format!("template {name} not found"));
    if let Some(w) = workspace {
        return store.find_template(&w.id, name).await?.ok_or_else(not_found);
    }
    let mut found = Vec::new();
    for w in visible_workspaces(store, p).await? {
        if let Some(t) = store.find_template(&w.id, name).await? {
            found.push(t);
        }
    }
    match found.len() {
        0 => Err(not_found()),
        1 => Ok(found.remove(0)),
        n => Err(AppError::conflict(format!(
            "{n} of your workspaces have a template named {name}; pass workspace to say which"
        ))),
    }
}

/// The build `build_id` of the template `template`, else 404.
pub async fn find_build(store: &dyn Store, template: &TemplateRecord, build_id: &str) -> ApiResult<BuildRecord> {
    match store.get_build(build_id).await? {
        Some(b) if b.template_id == template.id => Ok(b),
        _ => Err(AppError::not_found(format!("build {build_id} of template {} not found", template.name))),
    }
}
