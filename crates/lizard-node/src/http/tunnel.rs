//! A TCP connection to a guest port over the node API: an HTTP/1.1 upgrade, then raw
//! bytes both ways (the control plane's sandbox-URL proxy speaks HTTP through it).

use super::{AppError, Result};
use crate::Node;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use lizard_api::routes::node::TUNNEL_PROTOCOL;
use lizard_api::{ApiError, ErrorCode};
use std::sync::Arc;

pub async fn connect(
    State(node): State<Arc<Node>>,
    Path((id, port)): Path<(String, String)>,
    mut req: Request,
) -> Result<Response> {
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| AppError(ApiError::new(ErrorCode::InvalidArgument, format!("invalid port {port:?}"))))?;
    let upgrade = req.headers().get(header::UPGRADE).and_then(|v| v.to_str().ok());
    if !upgrade.is_some_and(|u| u.eq_ignore_ascii_case(TUNNEL_PROTOCOL)) {
        return Err(AppError(ApiError::new(
            ErrorCode::InvalidArgument,
            format!("a port tunnel needs `Connection: upgrade` and `Upgrade: {TUNNEL_PROTOCOL}`"),
        )));
    }
    // The guest's port first: a closed port or a gone sandbox is an HTTP answer, not a
    // tunnel that closes at once.
    let mut tunnel = node.get(&id)?.connect_port(port).await?;
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let mut client = hyper_util::rt::TokioIo::new(upgraded);
                if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut tunnel).await {
                    tracing::debug!(sandbox = %id, port, "port tunnel ended: {e}");
                }
            }
            Err(e) => tracing::debug!(sandbox = %id, port, "port tunnel upgrade failed: {e}"),
        }
    });
    let mut resp = StatusCode::SWITCHING_PROTOCOLS.into_response();
    resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    resp.headers_mut().insert(header::UPGRADE, HeaderValue::from_static(TUNNEL_PROTOCOL));
    Ok(resp)
}
