//! The host end of guest → API connections (see "Forwarded connections" in
//! `lizard_agent_proto::routes`): a few `accept_forward` calls kept waiting on the agent;
//! each connection a guest process makes is piped to the one configured target, the
//! control plane's API. The guest chooses nothing but the bytes it sends; what it may do
//! is decided by the API key it holds.

use lizard_agent_client::{AgentClient, ClientError, TcpTunnel};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;

/// Guest connections picked up at once; more wait in the agent's queue.
const WAITERS: usize = 4;
/// Guest connections open at once per sandbox (each holds two of the server's file
/// descriptors); more wait in the agent's queue until one closes, so one guest cannot
/// exhaust the control plane's descriptors.
pub const MAX_OPEN_PER_SANDBOX: usize = 64;
/// How long connecting to the target may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Serve `agent`'s forwarded connections until its channel closes.
pub fn spawn(id: String, agent: AgentClient, target: SocketAddr) {
    let open = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_OPEN_PER_SANDBOX));
    for _ in 0..WAITERS {
        let agent = agent.clone();
        let id = id.clone();
        let open = open.clone();
        tokio::spawn(async move {
            loop {
                let slot = tokio::select! {
                    s = open.clone().acquire_owned() => s.expect("the semaphore is never closed"),
                    _ = agent.closed() => return,
                };
                let tunnel = tokio::select! {
                    t = agent.accept_forward() => t,
                    _ = agent.closed() => return,
                };
                match tunnel {
                    Ok(t) => {
                        tokio::spawn(async move {
                            pipe(t, target).await;
                            drop(slot);
                        });
                    }
                    Err(ClientError::Closed) => return,
                    Err(e) => {
                        // An agent without the route, or a listener it could not bind:
                        // this sandbox gets no API access, and says so once per waiter.
                        tracing::warn!(%id, "API forwarding stopped: {e}");
                        return;
                    }
                }
            }
        });
    }
}

/// Copy both ways between a guest connection and a new connection to `target`.
async fn pipe(mut guest: TcpTunnel, target: SocketAddr) {
    let mut upstream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return tracing::debug!("forward to {target}: {e}"),
        Err(_) => return tracing::debug!("forward to {target}: connect timed out"),
    };
    let _ = upstream.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut guest, &mut upstream).await;
}
