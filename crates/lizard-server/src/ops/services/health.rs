//! An instance's health check: `GET {path}` on the app's port, through the node's tunnel
//! to the guest (the same one the proxy uses; the guest needs no network), answered with
//! a status below 400 within the check's timeout.

use crate::ops::sandboxes;
use crate::state::AppState;
use axum::body::Body;
use hyper_util::rt::TokioIo;
use lizard_api::services::HealthSpec;
use std::time::Duration;

/// Why a check failed (for the operator's log and the service's error).
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    #[error("nothing answers on port {port}: {message}")]
    NoAnswer { port: u16, message: String },
    #[error("GET {path} answered {status}")]
    Status { path: String, status: u16 },
    #[error("GET {path} took longer than {timeout_ms} ms")]
    TimedOut { path: String, timeout_ms: u64 },
}

/// Check `sandbox_id`'s app on `port` once.
pub async fn check(state: &AppState, sandbox_id: &str, port: u16, spec: &HealthSpec) -> Result<(), HealthError> {
    let timeout = Duration::from_millis(spec.timeout_ms);
    match tokio::time::timeout(timeout, get(state, sandbox_id, port, &spec.path)).await {
        Err(_) => Err(HealthError::TimedOut { path: spec.path.clone(), timeout_ms: spec.timeout_ms }),
        Ok(Err(e)) => Err(e),
        Ok(Ok(status)) if status < 400 => Ok(()),
        Ok(Ok(status)) => Err(HealthError::Status { path: spec.path.clone(), status }),
    }
}

async fn get(state: &AppState, sandbox_id: &str, port: u16, path: &str) -> Result<u16, HealthError> {
    let no_answer = |message: String| HealthError::NoAnswer { port, message };
    let tunnel = sandboxes::open_port(state, sandbox_id, port).await.map_err(|e| no_answer(e.0.message))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(tunnel)).await.map_err(|e| no_answer(e.to_string()))?;
    let conn = tokio::spawn(conn);
    let req = axum::http::Request::get(path)
        .header(axum::http::header::HOST, "127.0.0.1")
        .header(axum::http::header::USER_AGENT, "lizard-health-check")
        .body(Body::empty())
        .map_err(|e| no_answer(e.to_string()))?;
    let resp = sender.send_request(req).await.map_err(|e| no_answer(e.to_string()));
    conn.abort();
    Ok(resp?.status().as_u16())
}
