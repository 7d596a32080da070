//! The sandbox-URL proxy: `{sandboxId}-{port}.sandbox.{region}.{domain}` → that port on
//! 127.0.0.1 inside that sandbox.
//!
//! Routing is by the Host header alone. Each request opens a TCP tunnel through the
//! sandbox's node ([`crate::ops::sandboxes::open_port`]) and its agent (HTTP/2 CONNECT over the host↔guest channel; guests need no network
//! for this) and speaks HTTP/1.1 to the guest's server over it, bodies streamed both
//! ways. An `Upgrade` request (WebSockets) that the guest answers with 101 becomes a raw
//! byte pipe between client and guest.
//!
//! A host that names no running sandbox answers 404; a port nothing listens on, 502
//! `PORT_CLOSED` — never another sandbox: the id is looked up exactly, and the tunnel
//! belongs to that sandbox's own agent. The platform's own guest ports
//! ([`lizard_api::code::RESERVED_GUEST_PORTS`]: the code service, the agent's API forward)
//! answer 403 before any tunnel is opened: only the authenticated API reaches them.

use crate::error::AppError;
use crate::ops;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;

/// Where a public host points.
#[derive(Debug, PartialEq, Eq)]
pub struct Target {
    pub sandbox_id: String,
    pub port: u16,
}

/// Parse `{id}-{port}.{sandbox_domain}` (any `:port` suffix and letter case ignored).
pub fn parse_host(host: &str, sandbox_domain: &str) -> Option<Target> {
    let host = host.rsplit_once(':').filter(|(_, p)| p.chars().all(|c| c.is_ascii_digit())).map_or(host, |(h, _)| h);
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let label = host.strip_suffix(&format!(".{}", sandbox_domain.to_ascii_lowercase()))?;
    let (id, port) = label.rsplit_once('-')?;
    let port: u16 = port.parse().ok().filter(|p| *p > 0)?;
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric()) {
        return None;
    }
    Some(Target { sandbox_id: id.to_string(), port })
}

/// Refuse the platform's own guest ports: a sandbox URL must not be a door to them.
pub fn check_port(target: &Target) -> Result<(), AppError> {
    if lizard_api::code::is_reserved_guest_port(target.port) {
        return Err(AppError::forbidden(format!(
            "port {} is reserved for the platform and is not reachable through a sandbox URL",
            target.port
        )));
    }
    Ok(())
}

/// The proxy as an axum router: every path and method is forwarded to its sandbox.
pub fn router(state: AppState) -> axum::Router {
    axum::Router::new().fallback(proxy).with_state(state)
}

async fn proxy(State(state): State<AppState>, req: Request) -> Response {
    match forward(&state, req).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

async fn forward(state: &AppState, mut req: Request) -> Result<Response, AppError> {
    let config = &state.server.config;
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().host())
        .unwrap_or_default()
        .to_string();
    let target = parse_host(&host, &config.sandbox_domain(&config.region))
        .ok_or_else(|| AppError::not_found(format!("{host:?} is not a sandbox host of this region")))?;
    check_port(&target)?;
    let tunnel = ops::sandboxes::open_port(state, &target.sandbox_id, target.port).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tunnel))
        .await
        .map_err(|e| AppError::new(lizard_api::ErrorCode::PortClosed, format!("port {}: {e}", target.port)))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!("proxied connection: {e}");
        }
    });

    let client_upgrade = is_upgrade(req.headers()).then(|| hyper::upgrade::on(&mut req));
    let mut resp = sender
        .send_request(req)
        .await
        .map_err(|e| AppError::new(lizard_api::ErrorCode::PortClosed, format!("port {}: {e}", target.port)))?;

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
            });
        }
    }
    Ok(resp.map(Body::new))
}

fn is_upgrade(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(header::CONNECTION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_map_to_exactly_one_sandbox_port() {
        let d = "sandbox.local.lizard.localhost";
        let t = parse_host("abc123-3000.sandbox.local.lizard.localhost:8080", d).unwrap();
        assert_eq!(t, Target { sandbox_id: "abc123".into(), port: 3000 });
        assert_eq!(parse_host("ABC123-80.Sandbox.Local.Lizard.Localhost.", d).unwrap().port, 80);
        for bad in [
            "abc123-3000.sandbox.other.lizard.localhost",
            "abc123-3000.evil.com",
            "abc123.sandbox.local.lizard.localhost",
            "abc123-0.sandbox.local.lizard.localhost",
            "abc123-99999.sandbox.local.lizard.localhost",
            "a.b-3000.sandbox.local.lizard.localhost",
            "-3000.sandbox.local.lizard.localhost",
            "x.abc123-3000.sandbox.local.lizard.localhost",
            "",
        ] {
            assert_eq!(parse_host(bad, d), None, "{bad}");
        }
    }

    #[test]
    fn reserved_guest_ports_are_refused_before_any_tunnel() {
        let d = "sandbox.local.lizard.localhost";
        for port in [49999, 49171] {
            let t = parse_host(&format!("abc123-{port}.{d}"), d).unwrap();
            let e = check_port(&t).unwrap_err();
            assert_eq!(e.code(), lizard_api::ErrorCode::Forbidden);
            assert!(e.0.message.contains("reserved"), "{e}");
        }
        assert!(check_port(&parse_host(&format!("abc123-3000.{d}"), d).unwrap()).is_ok());
    }

    #[tokio::test]
    async fn the_router_refuses_a_reserved_port_with_403() {
        use tower::ServiceExt;
        let store = crate::SqliteStore::memory().await.unwrap();
        let server =
            crate::open_with_store(crate::ServerConfig::new("/nonexistent"), std::sync::Arc::new(store)).await.unwrap();
        let nodes = crate::nodes::Nodes::single(
            crate::nodes::LOCAL_NODE_ID,
            std::sync::Arc::new(crate::ops::tests::FakeNode::default()),
        );
        let state = server.app_state(nodes);
        let domain = state.server.config.sandbox_domain(&state.server.config.region);
        let req = axum::http::Request::builder()
            .uri("/")
            .header(header::HOST, format!("abc123-49999.{domain}"))
            .body(Body::empty())
            .unwrap();
        let resp = router(state).oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    }
}
