//! Guest → host connections (see "Forwarded connections" in `lizard_agent_proto::routes`):
//! a listener on the guest's loopback whose connections the host picks up, one per
//! `CONNECT lizard-forward:1` stream it keeps waiting on the agent.
//!
//! The listener lives as long as the agent process, not a session: it is bound at boot,
//! so it is in a template snapshot and every clone restored from it already has it.
//! Connections that arrive while no host request waits queue up (the kernel's backlog
//! behind a small channel) until one does.

use crate::app::AppError;
use crate::tunnel;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use hyper::upgrade::OnUpgrade;
use lizard_agent_proto::types::{AgentError, ErrorCode};
use std::sync::OnceLock;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Mutex};

/// Accepted connections waiting for a host request.
const QUEUE: usize = 16;

/// Why a forward request failed.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// The listener could not be bound (another process holds the port).
    #[error("cannot listen for forwarded connections on {0}")]
    Bind(String),
    /// No listener was started (dev mode without `--forward-listen`).
    #[error("this agent forwards no connections")]
    NotListening,
    /// The request did not arrive over a connection that can carry a stream.
    #[error("this connection cannot carry a forwarded connection")]
    NotUpgradable,
}

impl From<ForwardError> for AgentError {
    fn from(e: ForwardError) -> AgentError {
        let code = match e {
            ForwardError::NotListening => ErrorCode::NotFound,
            ForwardError::Bind(_) | ForwardError::NotUpgradable => ErrorCode::Internal,
        };
        AgentError::new(code, e.to_string())
    }
}

type Queue = Mutex<mpsc::Receiver<TcpStream>>;

static QUEUE_RX: OnceLock<Queue> = OnceLock::new();

/// Bind the listener on `addr` (in a guest: [`lizard_agent_proto::routes::FORWARD_GUEST_ADDR`]) and start accepting.
/// Once per process; call inside the runtime.
pub fn start(addr: &str) -> Result<(), ForwardError> {
    let bind = || -> std::io::Result<TcpListener> {
        let l = std::net::TcpListener::bind(addr)?;
        l.set_nonblocking(true)?;
        TcpListener::from_std(l)
    };
    let listener = bind().map_err(|e| ForwardError::Bind(format!("{addr}: {e}")))?;
    let (tx, rx) = mpsc::channel(QUEUE);
    QUEUE_RX.set(Mutex::new(rx)).map_err(|_| ForwardError::Bind(format!("{addr}: already listening")))?;
    tokio::spawn(accept_loop(listener, tx));
    Ok(())
}

async fn accept_loop(listener: TcpListener, tx: mpsc::Sender<TcpStream>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let _ = stream.set_nodelay(true);
                if tx.send(stream).await.is_err() {
                    return;
                }
            }
            // Out of descriptors and the like: try again shortly rather than spin.
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
}

/// `CONNECT lizard-forward:1`: wait for the next guest connection, answer 200, and pump
/// bytes between it and the stream in a task of its own. A host that gives up (resets
/// the stream) while waiting takes nothing from the queue.
pub async fn handle(mut req: Request) -> Result<Response, AppError> {
    let on_upgrade = req.extensions_mut().remove::<OnUpgrade>().ok_or(ForwardError::NotUpgradable)?;
    let queue = QUEUE_RX.get().ok_or(ForwardError::NotListening)?;
    let guest = {
        let mut rx = queue.lock().await;
        match rx.recv().await {
            Some(s) => s,
            None => return Err(ForwardError::NotListening.into()),
        }
    };
    tokio::spawn(async move {
        if let Ok(host) = on_upgrade.await {
            let _ = tunnel::pump(host, guest).await;
        }
    });
    Ok(StatusCode::OK.into_response())
}
