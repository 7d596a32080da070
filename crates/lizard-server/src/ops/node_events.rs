//! What the control plane does when a node reports a sandbox that ended by itself (its
//! VMM crashed or was killed, the guest powered off): the record ends at once, with the
//! node's reason, and its meter stops then — a dead VM is never billed until some later
//! call or its timeout notices. A sandbox whose VM a full node disk halted is billed as
//! paused until it runs again.

use crate::ops::sandboxes;
use crate::state::AppState;
use futures_util::StreamExt;
use lizard_api::ids;
use lizard_node_client::NodeEvent;
use lizard_store::{MeterState, StoreError};

/// Follow the in-process node's events until the process ends (spawn it). Subscribe
/// before anything can start sandboxes. Remote nodes post theirs
/// ([`crate::cluster::membership::events`]).
pub fn follow(state: &AppState) -> Vec<tokio::task::JoinHandle<()>> {
    state
        .nodes
        .local_client()
        .map(|node| {
            let state = state.clone();
            let mut events = node.events();
            tokio::spawn(async move {
                while let Some(event) = events.next().await {
                    handle(&state, event).await;
                }
            })
        })
        .into_iter()
        .collect()
}

/// Apply one node event to the store.
pub async fn handle(state: &AppState, event: NodeEvent) {
    match event {
        NodeEvent::Ended { id, reason } => match state.server.store.end_sandbox(&id, ids::now_ms(), &reason).await {
            Ok(true) => tracing::warn!(%id, "sandbox ended by itself: {reason}"),
            // Already ended by whoever stopped it, or never recorded (a create that is
            // still recording checks its VM once recorded).
            Ok(false) | Err(StoreError::NotFound(_)) => {}
            Err(e) => tracing::error!(%id, "cannot end the record of a sandbox whose VM ended: {e}"),
        },
        NodeEvent::Halted { id, halted } => {
            let meter = if halted { MeterState::Paused } else { MeterState::Running };
            match state.server.store.set_meter_state(&id, meter, ids::now_ms()).await {
                Ok(true) if halted => {
                    tracing::warn!(%id, "sandbox halted by a full node disk: billed as paused until it runs")
                }
                Ok(true) => tracing::info!(%id, "halted sandbox runs again: billed as running"),
                // Unmetered, ended meanwhile, or already so.
                Ok(false) => {}
                Err(e) => tracing::error!(%id, "cannot change the meter of a halted sandbox: {e}"),
            }
        }
        NodeEvent::Lagged => {
            tracing::warn!("missed node events: checking every live sandbox");
            sandboxes::end_unrun(state, "its VM stopped unexpectedly").await;
        }
    }
}
