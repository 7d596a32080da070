//! A request on its way to a guest's port: what the guest sees of it, and HTTP/1.1 over
//! the tunnel to that port (an upgrade becomes a byte pipe between client and guest).
//! Sandbox URLs, service hosts and E2B's envd routes all end here.

use super::connection::{ClientConn, ConnectionSlot};
use super::{access, headers};
use crate::error::AppError;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::response::Response;
use hyper_util::rt::TokioIo;

/// What the guest sees of a request: no access token in its target, none of the
/// platform's credentials, the proxy's own forwarding headers.
pub fn for_the_guest(req: &mut Request, host: &str) {
    let client = req.extensions().get::<ClientConn>().copied();
    *req.uri_mut() = access::guest_target(req.uri());
    headers::strip_platform_credentials(req.headers_mut());
    headers::set_forwarded(req.headers_mut(), client.map(|c| c.addr.ip()), client.is_some_and(|c| c.tls), host);
}

/// Speak HTTP/1.1 over `tunnel`: send `req`, answer the guest's response (an upgrade
/// becomes a byte pipe between client and guest).
pub async fn exchange(
    tunnel: Box<dyn lizard_node_client::Tunnel>,
    mut req: Request,
    port: u16,
) -> Result<Response, AppError> {
    let slot = req.extensions().get::<ConnectionSlot>().cloned();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tunnel))
        .await
        .map_err(|e| AppError::new(lizard_api::ErrorCode::PortClosed, format!("port {port}: {e}")))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!("proxied connection: {e}");
        }
    });

    let client_upgrade = is_upgrade(req.headers()).then(|| hyper::upgrade::on(&mut req));
    let mut resp = sender
        .send_request(req)
        .await
        .map_err(|e| AppError::new(lizard_api::ErrorCode::PortClosed, format!("port {port}: {e}")))?;

    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_upgrade) = client_upgrade {
            let guest_upgrade = hyper::upgrade::on(&mut resp);
            tokio::spawn(async move {
                match tokio::try_join!(client_upgrade, guest_upgrade) {
                    Ok((client, guest)) => {
                        let _ =
                            tokio::io::copy_bidirectional(&mut TokioIo::new(client), &mut TokioIo::new(guest)).await;
                    }
                    Err(e) => tracing::debug!("upgrade failed: {e}"),
                }
                // The pipe counted against the listener's cap until here.
                drop(slot);
            });
        }
    }
    headers::strip_platform_set_cookies(resp.headers_mut());
    Ok(resp.map(Body::new))
}

fn is_upgrade(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(header::CONNECTION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade")))
}
