//! Sandboxes that end by themselves (a VMM crash, a guest power-off) posted to the server
//! as they happen, so it stops their meters at once. Posts are retried until accepted;
//! the queue is bounded, and what does not fit is left to the next heartbeats (which
//! list every sandbox the node still holds).

use crate::backoff::Backoff;
use crate::server_api::ServerApi;
use crate::state::NodeState;
use lizard_api::cluster::SandboxEnded;
use lizard_node::{EndReason, Node};
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Ends waiting to be posted.
const QUEUE: usize = 4096;
/// Ends per post.
const BATCH: usize = 256;

/// Start watching `node`'s ends and posting them, until `stop`.
pub fn spawn(node: &Node, api: ServerApi, state: NodeState, stop: CancellationToken) {
    let mut ends = node.ended_sandboxes();
    let (tx, rx) = mpsc::channel(QUEUE);
    let watching = stop.clone();
    tokio::spawn(async move {
        loop {
            let end = tokio::select! {
                () = watching.cancelled() => return,
                end = ends.recv() => end,
            };
            match end {
                // Killed on request: whoever asked records it.
                Ok((_, EndReason::Killed)) => {}
                Ok((id, reason)) => {
                    let ended = SandboxEnded { sandbox_id: id, reason: reason.to_string() };
                    if let Err(e) = tx.try_send(ended) {
                        tracing::warn!("sandbox end not queued (the next heartbeat reports it): {e}");
                    }
                }
                Err(RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "missed sandbox ends; the next heartbeats report what is held")
                }
                Err(RecvError::Closed) => return,
            }
        }
    });
    tokio::spawn(post_all(rx, api, state, stop));
}

async fn post_all(mut rx: mpsc::Receiver<SandboxEnded>, api: ServerApi, state: NodeState, stop: CancellationToken) {
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    loop {
        let first = tokio::select! {
            () = stop.cancelled() => return,
            first = rx.recv() => match first { Some(f) => f, None => return },
        };
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(e) => batch.push(e),
                Err(_) => break,
            }
        }
        loop {
            match api.events(&state.node_id, &state.credential, &batch).await {
                Ok(()) => {
                    backoff.succeeded();
                    break;
                }
                Err(e) if e.is_transient() => {
                    let (wait, log) = backoff.failed();
                    if log {
                        tracing::warn!(ends = batch.len(), "posting sandbox ends failed (retrying): {e}");
                    }
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(wait) => {}
                    }
                }
                Err(e) => {
                    tracing::warn!(ends = batch.len(), "the server refused sandbox ends (dropped): {e}");
                    break;
                }
            }
        }
    }
}
