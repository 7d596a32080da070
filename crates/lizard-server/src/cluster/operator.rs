//! What the operator sees and changes of the cluster: the nodes (the in-process one with
//! what it says of itself now, remote ones as of their last report), drains, and join
//! tokens. Only an unscoped key of the owner account (the account created at first
//! start) may; any other key is answered 403.

use crate::auth::Principal;
use crate::cluster::credentials;
use crate::error::{ApiResult, AppError};
use crate::placement;
use crate::state::AppState;
use lizard_api::cluster::{CreateNodeTokenRequest, NodeInfo, NodeToken};
use lizard_api::ids;
use lizard_node_client::LOCAL_NODE_ID;
use lizard_store::{ClusterNode, NodeTokenRecord, StoreError};

/// Longest join-token lifetime one may ask for (ten years).
pub const MAX_TOKEN_TTL_SECS: u64 = 10 * 365 * 24 * 3600;
/// A join token's life unless its creator says: an hour, long enough to set a machine up.
pub const DEFAULT_TOKEN_TTL_SECS: u64 = 3600;
/// Most joins one token may allow.
pub const MAX_TOKEN_USES: u32 = 10_000;

/// 403 unless `principal` is an unscoped key of the owner account.
pub async fn require_operator(state: &AppState, principal: &Principal) -> ApiResult<()> {
    let owner = state.server.store.owner_account_id().await?;
    if principal.is_scoped() || owner.as_deref() != Some(principal.account_id.as_str()) {
        return Err(AppError::forbidden("only an unscoped key of the owner account manages nodes"));
    }
    Ok(())
}

/// `node` with its freshest report: the in-process node's from itself now, a joined
/// node's as of its last heartbeat.
fn fresh(state: &AppState, mut node: ClusterNode) -> ClusterNode {
    if let Some(local) = state.nodes.local_node().filter(|_| node.id == LOCAL_NODE_ID) {
        node.report = placement::local_report(local);
    }
    node
}

/// How the operator sees `node` (with its [`fresh`] report).
fn info(node: ClusterNode) -> NodeInfo {
    NodeInfo {
        id: node.id,
        region: node.region,
        address: node.address,
        state: node.state,
        capacity: node.report.capacity,
        usage: node.report.usage,
        templates: node.report.templates,
        last_heartbeat: node.last_heartbeat.map(ids::rfc3339),
        joined_at: ids::rfc3339(node.created_at),
    }
}

/// Every node, oldest first (this server's in-process node included).
pub async fn list(state: &AppState) -> ApiResult<Vec<NodeInfo>> {
    Ok(current(state).await?.into_iter().map(info).collect())
}

/// Every node's record with its [`fresh`] report, oldest first.
pub async fn current(state: &AppState) -> ApiResult<Vec<ClusterNode>> {
    placement::register_home_node(state).await?;
    Ok(state.server.store.list_nodes().await?.into_iter().map(|n| fresh(state, n)).collect())
}

fn not_found(node_id: &str) -> AppError {
    AppError::not_found(format!("node {node_id} not found"))
}

pub async fn get(state: &AppState, node_id: &str) -> ApiResult<NodeInfo> {
    placement::register_home_node(state).await?;
    let node = state.server.store.get_node(node_id).await?.ok_or_else(|| not_found(node_id))?;
    Ok(info(fresh(state, node)))
}

/// Remove a node: its credential is refused from then on (heartbeats, events, anything a
/// machine holding it sends). Only a node with no live sandbox and no volume recorded on
/// it (drain it and let them end first); 409 otherwise, saying what holds it.
pub async fn remove(state: &AppState, node_id: &str) -> ApiResult<()> {
    match state.server.store.remove_node(node_id).await {
        Ok(()) => {
            tracing::info!(node = %node_id, "a node was removed: its credential is refused from now on");
            Ok(())
        }
        Err(StoreError::NotFound(_)) => Err(not_found(node_id)),
        Err(e) => Err(e.into()),
    }
}

/// Drain (no new sandboxes; nothing is stopped) or undrain a node. A down node stays
/// down (drain it once it is back); undraining it is a 409.
pub async fn set_draining(state: &AppState, node_id: &str, draining: bool) -> ApiResult<NodeInfo> {
    placement::register_home_node(state).await?;
    match state.server.store.set_node_draining(node_id, draining).await {
        Ok(node) => {
            tracing::info!(node = %node_id, draining, "node drain changed");
            Ok(info(fresh(state, node)))
        }
        Err(StoreError::NotFound(_)) => Err(not_found(node_id)),
        Err(e) => Err(e.into()),
    }
}

fn token_json(t: NodeTokenRecord, plaintext: Option<String>) -> NodeToken {
    NodeToken {
        id: t.id,
        token: plaintext,
        created_at: ids::rfc3339(t.created_at),
        expires_at: t.expires_at.map(ids::rfc3339),
        uses_left: t.uses_left.and_then(|n| u64::try_from(n).ok()),
    }
}

/// Mint a join token; its plaintext is in this answer only.
pub async fn create_token(state: &AppState, req: CreateNodeTokenRequest) -> ApiResult<NodeToken> {
    let secs = req.ttl_secs.unwrap_or(DEFAULT_TOKEN_TTL_SECS);
    if !(1..=MAX_TOKEN_TTL_SECS).contains(&secs) {
        return Err(AppError::invalid(format!("ttlSecs must be 1..={MAX_TOKEN_TTL_SECS}, got {secs}")));
    }
    // Bounded just above: at most ten years of milliseconds.
    let ttl_ms = i64::try_from(secs * 1000).expect("at most MAX_TOKEN_TTL_SECS");
    let uses = req.uses.unwrap_or(1);
    if !(1..=MAX_TOKEN_USES).contains(&uses) {
        return Err(AppError::invalid(format!("uses must be 1..={MAX_TOKEN_USES}, got {uses}")));
    }
    let (record, plaintext) = credentials::mint(ids::now_ms(), Some(ttl_ms), uses);
    state.server.store.insert_node_token(&record).await?;
    tracing::info!(token = %record.id, "a join token was minted");
    Ok(token_json(record, Some(plaintext)))
}

/// Join tokens that may still be used, oldest first.
pub async fn list_tokens(state: &AppState) -> ApiResult<Vec<NodeToken>> {
    let tokens = state.server.store.list_node_tokens(ids::now_ms()).await?;
    Ok(tokens.into_iter().map(|t| token_json(t, None)).collect())
}

pub async fn revoke_token(state: &AppState, token_id: &str) -> ApiResult<()> {
    match state.server.store.revoke_node_token(token_id, ids::now_ms()).await {
        Ok(()) => Ok(()),
        Err(StoreError::NotFound(_)) => Err(AppError::not_found(format!("node token {token_id} not found"))),
        Err(e) => Err(e.into()),
    }
}
