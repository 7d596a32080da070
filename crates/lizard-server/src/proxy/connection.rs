//! What the listener puts on each request about its connection: the client's address and
//! whether it came over TLS, and the connection's slot under the cap.

use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::OwnedSemaphorePermit;

/// The client's connection, put on each request for [`super::headers::set_forwarded`].
#[derive(Debug, Clone, Copy)]
pub struct ClientConn {
    pub addr: SocketAddr,
    /// Whether it came over TLS (`X-Forwarded-Proto: https`).
    pub tls: bool,
}

/// The connection's slot under [`super::listener::Limits::max_connections`], put on each request so that
/// an upgraded connection (a WebSocket piped on after its request) keeps holding it.
#[derive(Debug, Clone)]
pub struct ConnectionSlot(pub Arc<OwnedSemaphorePermit>);
