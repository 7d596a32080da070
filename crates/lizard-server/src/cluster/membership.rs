//! What nodes' own calls do: a join (join token → a node row and its credential), a
//! heartbeat (the node's credential → its report stored, a `down` node `up` again, and
//! the sandboxes it must stop), and sandbox-ended events (records ended as the
//! in-process node's events end them).
//!
//! A node proves who it is with its credential (HMAC of the cluster key and its id,
//! [`lizard_node_client::ClusterKey`]) as the bearer token, checked in constant time; a
//! credential names one node, and a node can end only its own sandboxes.

use crate::cluster::credentials::{self, TokenError};
use crate::error::{ApiResult, AppError};
use crate::ops::node_events;
use crate::state::AppState;
use lizard_api::cluster::{HeartbeatResponse, JoinRequest, JoinResponse, NodeReport, SandboxEnded, SandboxHalt};
use lizard_api::ids;
use lizard_api::ErrorCode;
use lizard_node_client::{ClusterKey, NodeEvent};
use lizard_store::{NewNode, StoreError};

/// How long a sandbox a node reports may go unrecorded before the node is told to stop
/// it: a create in flight is recorded within seconds of its boot; an orphan (a create
/// whose replica died between boot and record) is not, ever.
pub const UNRECORDED_GRACE_MS: i64 = 60_000;

/// Longest region name and node address a join may give.
const MAX_FIELD: usize = 256;

fn cluster_key(state: &AppState) -> ApiResult<&ClusterKey> {
    state
        .nodes
        .cluster_key()
        .ok_or_else(|| AppError::new(ErrorCode::Unavailable, "this server does not take remote nodes"))
}

/// Join: a new node row (`up`) and its credential, shown once.
pub async fn join(state: &AppState, bearer: Option<&str>, req: JoinRequest) -> ApiResult<JoinResponse> {
    let key = cluster_key(state)?;
    let store = state.server.store.as_ref();
    let now = ids::now_ms();
    let token = bearer.ok_or_else(|| AppError::unauthenticated("a join needs a join token as the bearer token"))?;
    let region = req.region.trim();
    if region.is_empty() || region.len() > MAX_FIELD || region.chars().any(char::is_control) {
        return Err(AppError::invalid("region must be a non-empty name"));
    }
    let address = req.address.trim().trim_end_matches('/');
    let well_formed = address.len() <= MAX_FIELD
        && (address.starts_with("http://") || address.starts_with("https://"))
        && !address.chars().any(|c| c.is_control() || c.is_whitespace());
    if !well_formed {
        return Err(AppError::invalid("address must be the node API's base URL, e.g. http://10.0.0.5:7180"));
    }
    // Last, so that a join refused for its fields spends nothing.
    match credentials::spend(store, token, now).await {
        Ok(_) => {}
        Err(TokenError::Store(e)) => return Err(e.into()),
        Err(e) => return Err(AppError::unauthenticated(e.to_string())),
    }
    let node_id = ids::new_id("node");
    let node = NewNode {
        id: node_id.clone(),
        region: region.to_owned(),
        address: address.to_owned(),
        report: NodeReport { sandboxes: Vec::new(), ..req.report },
        at: now,
    };
    store.insert_node(&node).await?;
    tracing::info!(node = %node_id, region, address, "a node joined");
    let config = &state.server.config.cluster;
    Ok(JoinResponse {
        credential: key.credential(&node_id),
        node_id,
        heartbeat_ms: config.heartbeat_ms,
        lease_ms: config.lease_ms,
    })
}

/// 401 unless `bearer` is the credential of `node_id`. The credential is an HMAC that
/// outlives its node: each call refuses it too when the store no longer has the node
/// ([`removed`]).
fn authenticate(state: &AppState, node_id: &str, bearer: Option<&str>) -> ApiResult<()> {
    let key = cluster_key(state)?;
    match bearer {
        Some(presented) if key.verify(node_id, presented) => Ok(()),
        Some(_) => Err(AppError::unauthenticated("not this node's credential")),
        None => Err(AppError::unauthenticated("a node call needs the node's credential as the bearer token")),
    }
}

/// A valid credential of a node the store no longer has: an operator removed it.
fn removed(node_id: &str) -> AppError {
    AppError::unauthenticated(format!("node {node_id} was removed: join again with a new token"))
}

fn removed_if_unknown(node_id: &str) -> impl FnOnce(StoreError) -> AppError + '_ {
    move |e| match e {
        StoreError::NotFound(_) => removed(node_id),
        other => other.into(),
    }
}

/// Heartbeat: store the report; answer the node's state and what it must stop.
pub async fn heartbeat(
    state: &AppState,
    node_id: &str,
    bearer: Option<&str>,
    report: NodeReport,
) -> ApiResult<HeartbeatResponse> {
    authenticate(state, node_id, bearer)?;
    let outcome = state
        .server
        .store
        .record_heartbeat(node_id, &report, ids::now_ms(), UNRECORDED_GRACE_MS)
        .await
        .map_err(removed_if_unknown(node_id))?;
    if !outcome.ended.is_empty() {
        tracing::warn!(node = %node_id, ended = ?outcome.ended, "a node no longer has sandboxes it ran: recorded lost");
    }
    if !outcome.stop.is_empty() {
        tracing::info!(node = %node_id, stop = ?outcome.stop, "a node holds sandboxes whose records ended: stopping them");
    }
    Ok(HeartbeatResponse { state: outcome.state, stop: outcome.stop })
}

/// Sandboxes that ended by themselves on `node_id`: their records end with the node's
/// reason. Sandboxes recorded on another node are ignored (logged).
pub async fn events(state: &AppState, node_id: &str, bearer: Option<&str>, ended: Vec<SandboxEnded>) -> ApiResult<()> {
    authenticate(state, node_id, bearer)?;
    let store = state.server.store.as_ref();
    store.get_node(node_id).await?.ok_or_else(|| removed(node_id))?;
    for e in ended {
        match store.get_sandbox(&e.sandbox_id).await? {
            Some(record) if record.node_id == node_id => {
                node_events::handle(state, NodeEvent::Ended { id: e.sandbox_id, reason: e.reason }).await;
            }
            Some(_) => {
                tracing::warn!(node = %node_id, id = %e.sandbox_id, "a node reported the end of another node's sandbox")
            }
            // Never recorded (a create that is still recording checks its VM once recorded).
            None => {}
        }
    }
    Ok(())
}

/// Sandboxes on `node_id` whose VM a full disk halted, or that run again: their meters
/// move as the in-process node's events move them. Others' sandboxes are ignored (logged).
pub async fn halts(state: &AppState, node_id: &str, bearer: Option<&str>, halts: Vec<SandboxHalt>) -> ApiResult<()> {
    authenticate(state, node_id, bearer)?;
    let store = state.server.store.as_ref();
    store.get_node(node_id).await?.ok_or_else(|| removed(node_id))?;
    for h in halts {
        match store.get_sandbox(&h.sandbox_id).await? {
            Some(record) if record.node_id == node_id => {
                node_events::handle(state, NodeEvent::Halted { id: h.sandbox_id, halted: h.halted }).await;
            }
            Some(_) => {
                tracing::warn!(node = %node_id, id = %h.sandbox_id, "a node reported a halt of another node's sandbox")
            }
            None => {}
        }
    }
    Ok(())
}
