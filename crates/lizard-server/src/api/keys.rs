//! `/v1/api-keys`: list, mint, revoke.
//!
//! Minting follows [`lizard_store::scope::covers`]: the new key's scope must be an exact subset of
//! the caller's (403 `FORBIDDEN` otherwise, whether or not the named ids exist, so the
//! answer reveals nothing outside the caller's scope). A scoped key lists and revokes only
//! keys within its own scope — keys it could have minted — so it never learns of broader
//! keys. Revocation is immediate: authentication reads the store on every request.

use crate::api::key_json;
use crate::auth::Principal;
use crate::error::{ApiJson, ApiPath, ApiResult, AppError};
use crate::keys as keygen;
use crate::openapi::{Conflict, Forbidden, InvalidArgument, NotFound, Unauthenticated};
use crate::state::ServerState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use lizard_api::ids;
use lizard_api::{ApiKey, CreateApiKeyRequest, CreatedApiKey};
use lizard_store::scope::{self, Scope};
use lizard_store::{KeyRecord, Store};
use std::collections::HashMap;

/// project id → workspace id, for the account (what [`scope::covers`] needs).
async fn project_workspaces(store: &dyn Store, account_id: &str) -> ApiResult<HashMap<String, String>> {
    Ok(store.list_projects(account_id, None).await?.into_iter().map(|p| (p.id, p.workspace_id)).collect())
}

/// Whether the caller may see (and revoke) key `k`: it is within the caller's scope.
fn within(p: &Principal, k: &KeyRecord, ws_of: &HashMap<String, String>) -> bool {
    scope::covers(p.scope.as_ref(), k.scope.as_ref(), |prj| ws_of.get(prj).cloned()).is_ok()
}

/// The keys within the caller's scope (all of the account's for an unscoped key). Never
/// the key itself.
#[utoipa::path(
    get,
    path = lizard_api::routes::LIST_API_KEYS.path,
    tag = "api-keys",
    security(("apiKey" = [])),
    responses((status = 200, description = "Keys", body = Vec<ApiKey>), Unauthenticated)
)]
pub async fn list(State(state): State<ServerState>, p: Principal) -> ApiResult<Json<Vec<ApiKey>>> {
    let keys = state.store.list_keys(&p.account_id).await?;
    let ws_of =
        if p.is_scoped() { project_workspaces(state.store.as_ref(), &p.account_id).await? } else { HashMap::new() };
    Ok(Json(keys.into_iter().filter(|k| within(&p, k, &ws_of)).map(key_json).collect()))
}

/// Mint a key. Omit both `workspaces` and `projects` for an unscoped key (unscoped
/// callers only); otherwise the scope must be a subset of the caller's. The key is in
/// this answer only.
#[utoipa::path(
    post,
    path = lizard_api::routes::CREATE_API_KEY.path,
    tag = "api-keys",
    security(("apiKey" = [])),
    request_body = CreateApiKeyRequest,
    responses(
        (status = 201, description = "Created; `key` is shown this once", body = CreatedApiKey),
        Unauthenticated, Forbidden, NotFound, InvalidArgument
    )
)]
pub async fn create(
    State(state): State<ServerState>,
    p: Principal,
    ApiJson(req): ApiJson<CreateApiKeyRequest>,
) -> ApiResult<(StatusCode, Json<CreatedApiKey>)> {
    let name = ids::check_name(&req.name)?;
    let scope = match (req.workspaces, req.projects) {
        (None, None) => None,
        (w, prj) => {
            let s = Scope::new(w.unwrap_or_default(), prj.unwrap_or_default());
            if s.is_empty() {
                return Err(AppError::invalid(
                    "empty scope: list at least one workspace or project, or omit both for an unscoped key",
                ));
            }
            Some(s)
        }
    };
    let store = state.store.as_ref();
    let ws_of = project_workspaces(store, &p.account_id).await?;
    // Subset first: a scoped caller gets 403 for anything outside its scope, existing or not.
    scope::covers(p.scope.as_ref(), scope.as_ref(), |prj| ws_of.get(prj).cloned())
        .map_err(|e| AppError::forbidden(e.to_string()))?;
    if let Some(s) = &scope {
        for w in &s.workspaces {
            if store.get_workspace(&p.account_id, w).await?.is_none() {
                return Err(AppError::not_found(format!("workspace {w} not found")));
            }
        }
        if let Some(prj) = s.projects.iter().find(|prj| !ws_of.contains_key(*prj)) {
            return Err(AppError::not_found(format!("project {prj} not found")));
        }
    }
    let new = keygen::generate();
    let record = KeyRecord {
        id: ids::new_id("key"),
        account_id: p.account_id.clone(),
        name,
        prefix: new.prefix,
        hash: new.hash.to_vec(),
        scope,
        created_at: ids::now_ms(),
        revoked_at: None,
    };
    store.insert_key(&record).await?;
    state.key_index.vouch(new.hash);
    tracing::info!(key = %record.id, by = %p.key_id, scoped = record.scope.is_some(), "api key created");
    let k = key_json(record);
    let created = CreatedApiKey {
        id: k.id,
        name: k.name,
        prefix: k.prefix,
        workspaces: k.workspaces,
        projects: k.projects,
        created_at: k.created_at,
        key: new.plaintext,
    };
    Ok((StatusCode::CREATED, Json(created)))
}

/// Revoke a key within the caller's scope, at once: its next request answers 401. The
/// account's last unscoped key cannot be revoked (409).
#[utoipa::path(
    delete,
    path = lizard_api::routes::DELETE_API_KEY.path,
    tag = "api-keys",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "Key id")),
    responses((status = 204, description = "Revoked"), Unauthenticated, NotFound, Conflict)
)]
pub async fn delete(
    State(state): State<ServerState>,
    p: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    let store = state.store.as_ref();
    let not_found = || AppError::not_found(format!("api key {id} not found"));
    let k = store.get_key(&p.account_id, &id).await?.ok_or_else(not_found)?;
    let ws_of = if p.is_scoped() { project_workspaces(store, &p.account_id).await? } else { HashMap::new() };
    if !within(&p, &k, &ws_of) {
        return Err(not_found());
    }
    store.revoke_key(&p.account_id, &k.id, ids::now_ms()).await?;
    tracing::info!(key = %k.id, by = %p.key_id, "api key revoked");
    Ok(StatusCode::NO_CONTENT)
}
