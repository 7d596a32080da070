//! What every request handler of a session shares: its state, and the error answer (a
//! stable code and the status that matches it, as JSON).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lizard_agent_proto::handshake::Secret;
use lizard_agent_proto::types::AgentError;
use std::sync::{Arc, RwLock};

/// What every request handler can reach.
#[derive(Clone)]
pub struct AppState {
    /// The secret the handshake checks. Shared and replaceable: after a snapshot restore
    /// each clone will get a fresh identity (and secret) from the host.
    pub secret: Arc<RwLock<Secret>>,
    /// True when the agent is a guest's PID 1: only then does [`lizard_agent_proto::routes::IDENTITY`]
    /// touch the system (hostname, RNG, clock); in dev mode on a host it swaps the
    /// secret alone.
    pub pid1: bool,
}

/// A failed request: the status that matches the code, and the error as JSON.
#[derive(Debug)]
pub struct AppError(pub AgentError);

impl<E: Into<AgentError>> From<E> for AppError {
    fn from(e: E) -> Self {
        AppError(e.into())
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(self.0)).into_response()
    }
}
