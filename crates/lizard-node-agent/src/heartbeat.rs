//! The heartbeat loop: the node's report every `heartbeatMs`, and what the answer asks:
//! kill the sandboxes whose records ended meanwhile (`stop`). While the server cannot be
//! reached the node keeps running what it has and tries again, backing off. A server that
//! refuses the node's credential (an operator removed the node) ends the agent.

use crate::backoff::Backoff;
use crate::report;
use crate::server_api::{CallError, ServerApi};
use crate::state::NodeState;
use lizard_api::cluster::{HeartbeatResponse, NodeState as Standing};
use lizard_node::Node;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The longest wait between tries while the server does not answer.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Heartbeat in a task of its own until `stop` is cancelled; a refused credential is set
/// in `removed` (why) and cancels `stop`.
pub fn run_spawned(
    node: Arc<Node>,
    api: ServerApi,
    state: NodeState,
    stop: CancellationToken,
    removed: Arc<std::sync::OnceLock<String>>,
) {
    tokio::spawn(run(node, api, state, stop, removed));
}

/// Heartbeat until `stop` is cancelled (see [`run_spawned`]).
pub async fn run(
    node: Arc<Node>,
    api: ServerApi,
    state: NodeState,
    stop: CancellationToken,
    removed: Arc<std::sync::OnceLock<String>>,
) {
    let interval = Duration::from_millis(state.heartbeat_ms.max(100));
    let mut backoff = Backoff::new(interval.min(MAX_BACKOFF), MAX_BACKOFF);
    let mut standing = None;
    loop {
        let report = report::of_node(&node);
        let wait = match api.heartbeat(&state.node_id, &state.credential, &report).await {
            Ok(answer) => {
                if let Some((failures, outage)) = backoff.succeeded() {
                    tracing::info!(failures, "the server answers heartbeats again after {} s", outage.as_secs());
                }
                apply(&node, &answer, &mut standing);
                interval
            }
            Err(CallError::Refused(e)) if e.code == lizard_api::ErrorCode::Unauthenticated => {
                tracing::error!("the server refuses this node's credential: {}", e.message);
                let _ = removed.set(e.message);
                stop.cancel();
                return;
            }
            Err(e) => {
                let (wait, log) = backoff.failed();
                if log {
                    tracing::warn!("heartbeat failed (trying again, quietly, until it works): {e}");
                } else {
                    tracing::debug!("heartbeat failed: {e}");
                }
                wait
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Act on a heartbeat's answer: note a change of standing, stop what the server ended.
pub fn apply(node: &Arc<Node>, answer: &HeartbeatResponse, standing: &mut Option<Standing>) {
    if *standing != Some(answer.state) {
        tracing::info!(state = ?answer.state, "the server lists this node");
        *standing = Some(answer.state);
    }
    for id in &answer.stop {
        let (node, id) = (node.clone(), id.clone());
        tokio::spawn(async move {
            match node.kill(&id).await {
                Ok(()) => tracing::info!(sandbox = %id, "stopped: its record ended while this node was away"),
                Err(e) => tracing::debug!(sandbox = %id, "stop: {e}"),
            }
        });
    }
}
