//! Sandboxes that end by themselves (a VMM crash, a guest power-off) posted to the server
//! as they happen, so it stops their meters at once; and sandboxes whose VM a full disk
//! halts or that run again, so it bills them as paused meanwhile. Posts are retried until
//! accepted; the queue is bounded, and an end that does not fit is left to the next
//! heartbeats (which list every sandbox the node still holds).

use crate::backoff::Backoff;
use crate::server_api::ServerApi;
use crate::state::NodeState;
use lizard_api::cluster::{SandboxEnded, SandboxHalt};
use lizard_node::{EndReason, Node};
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Ends waiting to be posted.
const QUEUE: usize = 4096;
/// Ends per post.
const BATCH: usize = 256;

/// What is posted, in the order it happened.
enum Event {
    Ended(SandboxEnded),
    Halt(SandboxHalt),
}

/// Start watching `node`'s ends and halts and posting them, until `stop`.
pub fn spawn(node: &Node, api: ServerApi, state: NodeState, stop: CancellationToken) {
    let mut ends = node.ended_sandboxes();
    let mut halts = node.halted_sandboxes();
    let (tx, rx) = mpsc::channel(QUEUE);
    let watching = stop.clone();
    tokio::spawn(async move {
        loop {
            let event = tokio::select! {
                () = watching.cancelled() => return,
                end = ends.recv() => match end {
                    // Killed on request: whoever asked records it.
                    Ok((_, EndReason::Killed)) => continue,
                    Ok((id, reason)) => Event::Ended(SandboxEnded { sandbox_id: id, reason: reason.to_string() }),
                    Err(RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "missed sandbox ends; the next heartbeats report what is held");
                        continue;
                    }
                    Err(RecvError::Closed) => return,
                },
                halt = halts.recv() => match halt {
                    Ok((id, halted)) => Event::Halt(SandboxHalt { sandbox_id: id, halted }),
                    Err(RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "missed sandbox halts: their meters stay as they were");
                        continue;
                    }
                    Err(RecvError::Closed) => return,
                },
            };
            if let Err(e) = tx.try_send(event) {
                tracing::warn!("sandbox event not queued (an end is reported by the next heartbeat): {e}");
            }
        }
    });
    tokio::spawn(post_all(rx, api, state, stop));
}

/// Post a batch: its ends, then its halts.
async fn post(api: &ServerApi, state: &NodeState, batch: &[Event]) -> Result<(), crate::server_api::CallError> {
    let ended: Vec<SandboxEnded> =
        batch.iter().filter_map(|e| if let Event::Ended(e) = e { Some(e.clone()) } else { None }).collect();
    let halts: Vec<SandboxHalt> =
        batch.iter().filter_map(|e| if let Event::Halt(h) = e { Some(h.clone()) } else { None }).collect();
    if !ended.is_empty() {
        api.events(&state.node_id, &state.credential, &ended).await?;
    }
    if !halts.is_empty() {
        api.halts(&state.node_id, &state.credential, &halts).await?;
    }
    Ok(())
}

async fn post_all(mut rx: mpsc::Receiver<Event>, api: ServerApi, state: NodeState, stop: CancellationToken) {
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
            match post(&api, &state, &batch).await {
                Ok(()) => {
                    backoff.succeeded();
                    break;
                }
                Err(e) if e.is_transient() => {
                    let (wait, log) = backoff.failed();
                    if log {
                        tracing::warn!(events = batch.len(), "posting sandbox events failed (retrying): {e}");
                    }
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(wait) => {}
                    }
                }
                Err(e) => {
                    tracing::warn!(events = batch.len(), "the server refused sandbox events (dropped): {e}");
                    break;
                }
            }
        }
    }
}
