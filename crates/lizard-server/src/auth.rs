//! Who is calling, and what they may reach.
//!
//! Every route but `/health` and `/openapi.json` takes a [`Principal`] extractor, which
//! reads `X-API-Key` (or a WebSocket's key subprotocol, [`presented_key`]), finds the key
//! by its lookup prefix, compares hashes in constant time and refuses revoked keys.
//! Missing, malformed, unknown and revoked keys all answer the same 401
//! `UNAUTHENTICATED`, so the answer does not tell which.
//!
//! Authorization helpers for handlers (here and in the sandbox routes built on top):
//!
//! - [`require_account_scope`]: account-wide routes (billing, account usage) — 403
//!   `ACCOUNT_SCOPE_REQUIRED` for a scoped key.
//! - [`workspace_for`], [`project_for`], [`sandbox_for`]: fetch by id what the key
//!   reaches, else 404 `NOT_FOUND` — the same answer as for an id that does not exist, so
//!   a scoped key learns nothing about what lies outside its scope.
//! - [`resolve_workspace`], [`resolve_project`]: the same by id, slug or name (what the SDK
//!   accepts as `project: 'my-project'`), among what the key reaches only.

use crate::error::{ApiResult, AppError};
use crate::keys;
use crate::state::ServerState;
use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;
use lizard_store::scope::{self, Scope};
use lizard_store::{ProjectRecord, SandboxRecord, Store, WorkspaceRecord};

/// The header that carries the key (the SDK reference's name).
pub const API_KEY_HEADER: &str = "x-api-key";

/// The key a request presents: `X-API-Key`, or — a browser's WebSocket cannot set
/// headers — a `Sec-WebSocket-Protocol` entry `lizard.key.<key>` of an upgrade request
/// (see [`lizard_api::processes::PTY_KEY_PROTOCOL_PREFIX`]).
pub fn presented_key(headers: &axum::http::HeaderMap) -> Option<String> {
    if let Some(value) = headers.get(API_KEY_HEADER) {
        return value.to_str().ok().map(|v| from_e2b_form(v.trim()));
    }
    headers
        .get_all(axum::http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|p| p.trim().strip_prefix(lizard_api::processes::PTY_KEY_PROTOCOL_PREFIX))
        .map(str::to_owned)
}

/// E2B's SDKs from 2.25 to 2.50 refuse a key that is not `e2b_` and hex: their users send
/// a Lizard key as `e2b_` followed by the hex of its text, taken here as the key itself.
/// Anything else is the key as sent.
fn from_e2b_form(key: &str) -> String {
    key.strip_prefix(E2B_KEY_PREFIX)
        .and_then(|h| hex::decode(h).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .filter(|k| k.starts_with(crate::keys::KEY_PREFIX))
        .unwrap_or_else(|| key.to_owned())
}

/// The prefix of a key in E2B's form (see [`from_e2b_form`]).
pub const E2B_KEY_PREFIX: &str = "e2b_";

/// The authenticated caller: a key of an account, with its scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub account_id: String,
    pub key_id: String,
    pub key_name: String,
    /// `None`: unscoped, full access to the account.
    pub scope: Option<Scope>,
}

impl Principal {
    pub fn is_scoped(&self) -> bool {
        self.scope.is_some()
    }

    pub fn sees_workspace(&self, workspace_id: &str) -> bool {
        scope::sees_workspace(self.scope.as_ref(), workspace_id)
    }

    pub fn sees_project(&self, project: &ProjectRecord) -> bool {
        scope::sees_project(self.scope.as_ref(), &project.workspace_id, &project.id)
    }

    pub fn sees_sandbox(&self, sandbox: &SandboxRecord) -> bool {
        sandbox.account_id == self.account_id
            && scope::sees_project(self.scope.as_ref(), &sandbox.workspace_id, &sandbox.project_id)
    }
}

/// Set by [`crate::front_door`] on a request whose key it found invalid, so that the
/// handler answers 401 without a second lookup.
#[derive(Debug, Clone, Copy)]
pub struct KeyRefused;

fn bad_key() -> AppError {
    AppError::unauthenticated("invalid or revoked API key")
}

/// Check a plaintext key against the store.
pub async fn authenticate(store: &dyn Store, key: &str) -> ApiResult<Principal> {
    let Some(prefix) = keys::lookup_prefix(key) else { return Err(bad_key()) };
    let candidates = store.keys_by_prefix(prefix).await?;
    // Check every candidate (prefixes may collide) without stopping early.
    let mut found = None;
    for k in candidates {
        if keys::verify(key, &k.hash) && found.is_none() {
            found = Some(k);
        }
    }
    match found {
        Some(k) if k.revoked_at.is_none() => {
            Ok(Principal { account_id: k.account_id, key_id: k.id, key_name: k.name, scope: k.scope })
        }
        _ => Err(bad_key()),
    }
}

impl<S> FromRequestParts<S> for Principal
where
    S: Send + Sync,
    ServerState: FromRef<S>,
{
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        if let Some(p) = parts.extensions.get::<Principal>() {
            return Ok(p.clone());
        }
        if parts.extensions.get::<KeyRefused>().is_some()
            || parts.headers.get(API_KEY_HEADER).is_some_and(|v| v.to_str().is_err())
        {
            return Err(bad_key());
        }
        let Some(key) = presented_key(&parts.headers) else {
            return Err(AppError::unauthenticated("missing X-API-Key header"));
        };
        let state = ServerState::from_ref(state);
        let principal = authenticate(state.store.as_ref(), &key).await?;
        parts.extensions.insert(principal.clone());
        Ok(principal)
    }
}

/// Guard for account-wide routes (billing, account usage, account details): a scoped key
/// is refused outright with 403 `ACCOUNT_SCOPE_REQUIRED`.
pub fn require_account_scope(principal: &Principal) -> ApiResult<()> {
    if principal.is_scoped() {
        return Err(AppError::account_scope_required());
    }
    Ok(())
}

/// Guard for creating what no scope can name yet (a new workspace): 403 for a scoped key.
pub fn require_unscoped(principal: &Principal, what: &str) -> ApiResult<()> {
    if principal.is_scoped() {
        return Err(AppError::forbidden(format!("a scoped API key cannot {what}")));
    }
    Ok(())
}

/// The workspace with this id, if the key sees it; else 404.
pub async fn workspace_for(store: &dyn Store, p: &Principal, workspace_id: &str) -> ApiResult<WorkspaceRecord> {
    match store.get_workspace(&p.account_id, workspace_id).await? {
        Some(w) if p.sees_workspace(&w.id) => Ok(w),
        _ => Err(AppError::not_found(format!("workspace {workspace_id} not found"))),
    }
}

/// The project with this id, if the key reaches it; else 404.
pub async fn project_for(store: &dyn Store, p: &Principal, project_id: &str) -> ApiResult<ProjectRecord> {
    match store.get_project(&p.account_id, project_id).await? {
        Some(prj) if p.sees_project(&prj) => Ok(prj),
        _ => Err(AppError::not_found(format!("project {project_id} not found"))),
    }
}

/// The sandbox with this id, if it is the key's account's and in a project the key
/// reaches; else 404. Ended sandboxes are returned too (the caller decides what "ended"
/// answers).
pub async fn sandbox_for(store: &dyn Store, p: &Principal, sandbox_id: &str) -> ApiResult<SandboxRecord> {
    match store.get_sandbox(sandbox_id).await? {
        Some(s) if p.sees_sandbox(&s) => Ok(s),
        _ => Err(AppError::not_found(format!("sandbox {sandbox_id} not found"))),
    }
}

/// Pick by id, then slug, then name; more than one match on slug or name → 409.
fn pick<T>(
    what: &str,
    key: &str,
    items: Vec<T>,
    id: impl Fn(&T) -> &str,
    slug: impl Fn(&T) -> &str,
    name: impl Fn(&T) -> &str,
) -> ApiResult<T> {
    let field_matches = |f: &dyn Fn(&T) -> &str| items.iter().filter(|t| f(t) == key).count();
    let chosen: Option<&dyn Fn(&T) -> &str> = if field_matches(&id) > 0 {
        Some(&id)
    } else if field_matches(&slug) > 0 {
        Some(&slug)
    } else if field_matches(&name) > 0 {
        Some(&name)
    } else {
        None
    };
    let Some(f) = chosen else { return Err(AppError::not_found(format!("{what} {key:?} not found"))) };
    let mut matching: Vec<T> = items.into_iter().filter(|t| f(t) == key).collect();
    if matching.len() > 1 {
        return Err(AppError::conflict(format!("{} {what}s match {key:?}; use the {what}'s id", matching.len())));
    }
    Ok(matching.pop().expect("one match"))
}

/// A workspace the key sees, by id, slug or name.
pub async fn resolve_workspace(store: &dyn Store, p: &Principal, key: &str) -> ApiResult<WorkspaceRecord> {
    let visible: Vec<WorkspaceRecord> =
        store.list_workspaces(&p.account_id).await?.into_iter().filter(|w| p.sees_workspace(&w.id)).collect();
    pick("workspace", key, visible, |w| &w.id, |w| &w.slug, |w| &w.name)
}

/// A project the key reaches, by id, slug or name. Slugs and names are unique within a
/// workspace only: one that matches in two reachable workspaces answers 409.
pub async fn resolve_project(store: &dyn Store, p: &Principal, key: &str) -> ApiResult<ProjectRecord> {
    if key.contains('_') {
        // Ids have an underscore, slugs never: skip the listing.
        if let Ok(prj) = project_for(store, p, key).await {
            return Ok(prj);
        }
    }
    let visible: Vec<ProjectRecord> =
        store.list_projects(&p.account_id, None).await?.into_iter().filter(|x| p.sees_project(x)).collect();
    pick("project", key, visible, |x| &x.id, |x| &x.slug, |x| &x.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_in_e2bs_form_is_the_key_itself() {
        let key = "lz_abcDEF123";
        assert_eq!(from_e2b_form(&format!("e2b_{}", hex::encode(key))), key);
        assert_eq!(from_e2b_form(key), key);
        // Not hex, or hex of something that is no Lizard key: taken as sent (and refused).
        assert_eq!(from_e2b_form("e2b_zz"), "e2b_zz");
        let other = format!("e2b_{}", hex::encode("xx_secret"));
        assert_eq!(from_e2b_form(&other), other);
    }

    #[derive(Debug)]
    struct T(&'static str, &'static str, &'static str);

    fn items() -> Vec<T> {
        vec![T("prj_1", "web", "Web"), T("prj_2", "api", "web"), T("prj_3", "dup", "Dup"), T("prj_4", "dup", "Dup2")]
    }

    fn get(key: &str) -> ApiResult<&'static str> {
        pick("project", key, items(), |t| t.0, |t| t.1, |t| t.2).map(|t| t.0)
    }

    #[test]
    fn pick_prefers_id_then_slug_then_name() {
        assert_eq!(get("prj_2").unwrap(), "prj_2");
        assert_eq!(get("web").unwrap(), "prj_1", "slug beats another project's name");
        assert_eq!(get("Dup2").unwrap(), "prj_4");
        assert_eq!(get("dup").unwrap_err().code(), lizard_api::ErrorCode::Conflict);
        assert_eq!(get("nope").unwrap_err().code(), lizard_api::ErrorCode::NotFound);
    }

    #[test]
    fn account_scope() {
        let mut p = Principal { account_id: "a".into(), key_id: "k".into(), key_name: "n".into(), scope: None };
        assert!(require_account_scope(&p).is_ok());
        p.scope = Some(Scope::default());
        assert_eq!(require_account_scope(&p).unwrap_err().code(), lizard_api::ErrorCode::AccountScopeRequired);
    }
}
