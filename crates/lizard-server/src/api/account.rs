//! `GET /v1/whoami` (any key) and `GET /v1/account` (unscoped keys only).
//!
//! A scoped key may be readable by whatever runs where it was put (a user's machine, a
//! sandbox), so it learns only its own identity and scopes: never the account's email,
//! plan or balance. `/v1/account` is the first account-wide route and shows the guard
//! that billing and account usage will use, [`crate::auth::require_account_scope`].

use crate::auth::{require_account_scope, Principal};
use crate::error::{ApiResult, AppError};
use crate::openapi::{AccountScopeRequired, Unauthenticated};
use crate::state::ServerState;
use axum::extract::State;
use axum::Json;
use lizard_api::{Account, WhoAmI};

/// The identity behind the key. Unscoped: the account's email and plan too. Scoped:
/// identity and the key's own scopes only.
#[utoipa::path(
    get,
    path = lizard_api::routes::WHOAMI.path,
    tag = "account",
    security(("apiKey" = [])),
    responses((status = 200, description = "Identity", body = WhoAmI), Unauthenticated)
)]
pub async fn whoami(State(state): State<ServerState>, p: Principal) -> ApiResult<Json<WhoAmI>> {
    let mut me = WhoAmI {
        account_id: p.account_id.clone(),
        key_id: p.key_id.clone(),
        key_name: p.key_name.clone(),
        scoped: p.is_scoped(),
        email: None,
        plan: None,
        workspaces: None,
        projects: None,
    };
    match &p.scope {
        Some(s) => {
            me.workspaces = Some(s.workspaces.iter().cloned().collect());
            me.projects = Some(s.projects.iter().cloned().collect());
        }
        None => {
            let a =
                state.store.get_account(&p.account_id).await?.ok_or_else(|| {
                    AppError::internal(format!("account {} of key {} missing", p.account_id, p.key_id))
                })?;
            me.email = Some(a.email);
            me.plan = Some(a.plan);
        }
    }
    Ok(Json(me))
}

/// The account (id, email, plan). Account-wide: unscoped keys only.
#[utoipa::path(
    get,
    path = lizard_api::routes::ACCOUNT.path,
    tag = "account",
    security(("apiKey" = [])),
    responses((status = 200, description = "The account", body = Account), Unauthenticated, AccountScopeRequired)
)]
pub async fn account(State(state): State<ServerState>, p: Principal) -> ApiResult<Json<Account>> {
    require_account_scope(&p)?;
    let a = state
        .store
        .get_account(&p.account_id)
        .await?
        .ok_or_else(|| AppError::internal(format!("account {} missing", p.account_id)))?;
    Ok(Json(Account { id: a.id, email: a.email, plan: a.plan, created_at: lizard_api::ids::rfc3339(a.created_at) }))
}
