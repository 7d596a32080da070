//! The scope algebra of API keys, as the SDK reference states it.
//!
//! A key either has no scope (`None`: everything its account reaches) or a [`Scope`]: a set
//! of workspace ids and a set of project ids. A scoped key reaches
//!
//! - the workspaces in `workspaces`,
//! - every project inside those workspaces, and
//! - the projects listed in `projects` (wherever they live).
//!
//! Nothing else: in particular a key scoped to a project does *not* see that project's
//! workspace. Anything a key reaches is also what it may touch (rename, delete, run
//! sandboxes in).
//!
//! A key may mint another key only if the new scope is an exact subset of its own: every
//! workspace listed is one of its workspaces, and every project listed is one it reaches.
//! An unscoped key can only be minted by an unscoped key. [`covers`] is that rule; it is
//! pure (project → workspace lookups come in as a closure) so it can be tested on its own
//! and reused by any store.
//!
//! Ids in a scope are never re-resolved: when a workspace or project is deleted its id
//! stays in the scopes that named it and, since ids are random and never reused, grants
//! nothing any more.

use std::collections::BTreeSet;

/// What a scoped key reaches. See the module doc.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Scope {
    pub workspaces: BTreeSet<String>,
    pub projects: BTreeSet<String>,
}

impl Scope {
    pub fn new<W, P>(workspaces: W, projects: P) -> Self
    where
        W: IntoIterator,
        W::Item: Into<String>,
        P: IntoIterator,
        P::Item: Into<String>,
    {
        Scope {
            workspaces: workspaces.into_iter().map(Into::into).collect(),
            projects: projects.into_iter().map(Into::into).collect(),
        }
    }

    /// A scope that reaches nothing at all.
    pub fn is_empty(&self) -> bool {
        self.workspaces.is_empty() && self.projects.is_empty()
    }

    /// Whether the key sees workspace `workspace_id` itself.
    pub fn sees_workspace(&self, workspace_id: &str) -> bool {
        self.workspaces.contains(workspace_id)
    }

    /// Whether the key reaches project `project_id`, which lives in `workspace_id`.
    pub fn sees_project(&self, workspace_id: &str, project_id: &str) -> bool {
        self.workspaces.contains(workspace_id) || self.projects.contains(project_id)
    }
}

/// Whether a key with scope `scope` (`None`: unscoped) sees workspace `workspace_id`.
pub fn sees_workspace(scope: Option<&Scope>, workspace_id: &str) -> bool {
    scope.is_none_or(|s| s.sees_workspace(workspace_id))
}

/// Whether a key with scope `scope` (`None`: unscoped) reaches a project.
pub fn sees_project(scope: Option<&Scope>, workspace_id: &str, project_id: &str) -> bool {
    scope.is_none_or(|s| s.sees_project(workspace_id, project_id))
}

/// Why `child` is not within `parent`: the first offending element.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    /// A scoped key cannot create an unscoped key.
    #[error("a scoped key cannot create an unscoped key")]
    Unscoped,
    /// The workspace is not one of the parent key's workspaces.
    #[error("workspace {0} is outside this key's scope")]
    Workspace(String),
    /// The project is not reachable by the parent key.
    #[error("project {0} is outside this key's scope")]
    Project(String),
}

/// Whether `child` is an exact subset of `parent` (`None` = unscoped), i.e. a key with
/// scope `parent` may mint a key with scope `child`.
///
/// `workspace_of(project_id)` gives the workspace a project lives in, or `None` for a
/// project that does not exist (any more): such a project is within `parent` only when
/// `parent` lists it by id.
pub fn covers(
    parent: Option<&Scope>,
    child: Option<&Scope>,
    mut workspace_of: impl FnMut(&str) -> Option<String>,
) -> Result<(), ScopeError> {
    let Some(parent) = parent else { return Ok(()) };
    let Some(child) = child else { return Err(ScopeError::Unscoped) };
    if let Some(w) = child.workspaces.iter().find(|w| !parent.workspaces.contains(*w)) {
        return Err(ScopeError::Workspace(w.clone()));
    }
    for p in &child.projects {
        let reached = parent.projects.contains(p) || workspace_of(p).is_some_and(|w| parent.workspaces.contains(&w));
        if !reached {
            return Err(ScopeError::Project(p.clone()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn world() -> HashMap<&'static str, &'static str> {
        // project → workspace
        HashMap::from([("p1", "w1"), ("p2", "w1"), ("p3", "w2"), ("p4", "w3")])
    }

    fn ws_of(p: &str) -> Option<String> {
        world().get(p).map(|w| w.to_string())
    }

    fn s(w: &[&str], p: &[&str]) -> Scope {
        Scope::new(w.iter().copied(), p.iter().copied())
    }

    #[test]
    fn unscoped_sees_everything_and_mints_anything() {
        assert!(sees_workspace(None, "w9"));
        assert!(sees_project(None, "w9", "p9"));
        assert_eq!(covers(None, None, ws_of), Ok(()));
        assert_eq!(covers(None, Some(&s(&["w1"], &[])), ws_of), Ok(()));
    }

    #[test]
    fn scoped_sees_its_workspaces_their_projects_and_listed_projects() {
        let k = s(&["w1"], &["p3"]);
        assert!(k.sees_workspace("w1"));
        assert!(!k.sees_workspace("w2"), "a listed project does not reveal its workspace");
        assert!(k.sees_project("w1", "p1") && k.sees_project("w1", "p2"));
        assert!(k.sees_project("w2", "p3"));
        assert!(!k.sees_project("w3", "p4"));
        assert!(!k.sees_project("w2", "p5"), "another project of a listed project's workspace");
    }

    #[test]
    fn scoped_cannot_mint_unscoped() {
        assert_eq!(covers(Some(&s(&["w1"], &[])), None, ws_of), Err(ScopeError::Unscoped));
    }

    #[test]
    fn subset_rules() {
        let parent = s(&["w1"], &["p3"]);
        // Narrower or equal: fine.
        for child in [s(&["w1"], &[]), s(&[], &["p1"]), s(&[], &["p3"]), s(&["w1"], &["p2", "p3"]), parent.clone()] {
            assert_eq!(covers(Some(&parent), Some(&child), ws_of), Ok(()), "{child:?}");
        }
        // A workspace it does not list, even the one holding a listed project.
        assert_eq!(covers(Some(&parent), Some(&s(&["w2"], &[])), ws_of), Err(ScopeError::Workspace("w2".into())));
        // A project elsewhere.
        assert_eq!(covers(Some(&parent), Some(&s(&[], &["p4"])), ws_of), Err(ScopeError::Project("p4".into())));
        // A project that does not exist is reachable only if listed by id.
        assert_eq!(covers(Some(&parent), Some(&s(&[], &["nope"])), ws_of), Err(ScopeError::Project("nope".into())));
        let lists_gone = s(&[], &["gone"]);
        assert_eq!(covers(Some(&lists_gone), Some(&s(&[], &["gone"])), ws_of), Ok(()));
        // The empty scope is within every scope.
        assert_eq!(covers(Some(&parent), Some(&Scope::default()), ws_of), Ok(()));
    }

    #[test]
    fn covers_is_transitive_on_examples() {
        let a = s(&["w1", "w2"], &["p4"]);
        let b = s(&["w1"], &["p3", "p4"]);
        let c = s(&[], &["p1", "p4"]);
        assert!(covers(Some(&a), Some(&b), ws_of).is_ok());
        assert!(covers(Some(&b), Some(&c), ws_of).is_ok());
        assert!(covers(Some(&a), Some(&c), ws_of).is_ok());
        assert!(covers(Some(&c), Some(&b), ws_of).is_err());
    }
}
