//! The timeout reaper: once a second, sandboxes whose timeout passed are killed — or
//! paused, those created with `onTimeout: pause`. A paused sandbox's timeout is the
//! operator's retention; past it, it is killed.

use crate::ops::{lifecycle, sandboxes};
use crate::placement;
use crate::state::AppState;
use lizard_api::ids;
use lizard_store::{OnTimeout, SandboxRecord, SandboxState};

/// Reap until the process ends (spawn it).
pub async fn reap_expired(state: AppState) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        reap_once(&state).await;
    }
}

/// One pass over the sandboxes due now.
pub async fn reap_once(state: &AppState) {
    let due = match state.server.store.sandboxes_due(ids::now_ms()).await {
        Ok(due) => due,
        Err(e) => {
            tracing::warn!("timeout reaper: {e}");
            return;
        }
    };
    for s in due {
        expire(state, &s).await;
    }
}

async fn expire(state: &AppState, s: &SandboxRecord) {
    if s.on_timeout == OnTimeout::Pause && s.state == SandboxState::Running {
        tracing::info!(id = %s.id, "sandbox timed out: pausing it");
        match lifecycle::pause(state, &s.id).await {
            Ok(()) => return,
            Err(e) => tracing::warn!(id = %s.id, "pause at timeout failed, killing: {}", e.0.message),
        }
    }
    let why = sandboxes::expiry_reason(s.state);
    tracing::info!(id = %s.id, "sandbox {why}");
    match placement::node_of(state, s).await {
        Ok(node) => {
            let _ = node.kill(&s.id).await;
        }
        // A node that is down or unreachable keeps its VM until it is back: its next
        // heartbeat is told to stop it (the record ends now).
        Err(e) => tracing::info!(id = %s.id, "timeout reaper: cannot reach its node: {}", e.0.message),
    }
    if let Err(e) = state.server.store.end_sandbox(&s.id, ids::now_ms(), why).await {
        tracing::warn!(id = %s.id, "timeout reaper: {e}");
    }
}
