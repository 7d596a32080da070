//! The sandbox-URL proxy: `{sandboxId}-{port}.sandbox.{region}.{domain}` → that port on
//! 127.0.0.1 inside that sandbox, and `{name}.svc.{region}.{domain}` → the app port of one
//! healthy instance of that service ([`crate::ops::services::route`], which resumes a
//! paused instance first).
//!
//! Routing is by the request's one host ([`host`]: duplicate `Host` headers and an
//! absolute-form target naming another host are refused). Each request opens a TCP
//! tunnel through the sandbox's node ([`crate::ops::sandboxes::open_port`]) and its agent
//! (HTTP/2 CONNECT over the host↔guest channel; guests need no network for this) and
//! speaks HTTP/1.1 to the guest's server over it, bodies streamed both ways. An `Upgrade`
//! request (WebSockets) that the guest answers with 101 becomes a raw byte pipe between
//! client and guest.
//!
//! In order, before any tunnel is opened:
//! 1. a host that names no sandbox of this region answers 404 ([`host::parse_host`]);
//! 2. the platform's own guest ports ([`lizard_api::code::RESERVED_GUEST_PORTS`]: the code
//!    service, the agent's API forward) answer 403: only the authenticated API reaches them;
//! 3. a sandbox that is not recorded and live answers 404, a private one without its token
//!    403 ([`access`]);
//!
//! then the platform's credentials are removed and the forwarding headers replaced
//! ([`headers`]). A port nothing listens on answers 502 `PORT_CLOSED` — never another
//! sandbox: the id is looked up exactly, and the tunnel belongs to that sandbox's own
//! agent. [`listener`] bounds connections and header-read time.
//!
//! - [`host`]: which sandbox port a request names;
//! - [`access`]: private URLs (access tokens) and the guest's view of the target;
//! - [`headers`]: credentials stripped, forwarding headers written;
//! - [`listener`]: the bounded listener;
//! - [`tls`]: its TLS mode's certificate;
//! - this file: the request path tying them together.

pub mod access;
pub mod connection;
pub mod guest;
pub mod headers;
pub mod host;
pub mod listener;
pub mod signed;
pub mod tls;

pub use host::{parse_host, Target};
pub use listener::{serve, ClientConn, ConnectionSlot, Limits};

use crate::error::AppError;
use crate::ops;
use crate::state::{AppState, ProxyRoute};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use guest::{exchange, for_the_guest};

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

/// The proxy as an axum router (without [`listener`]'s bounds): every path and method is
/// forwarded to its sandbox.
pub fn router(state: AppState) -> axum::Router {
    axum::Router::new().fallback(proxy).with_state(state)
}

async fn proxy(State(state): State<AppState>, req: Request) -> Response {
    handle(&state, req).await
}

/// Answer one request: the guest's response, or the error that stopped it.
pub async fn handle(state: &AppState, req: Request) -> Response {
    match forward(state, req).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

/// A 400 with the API's error body: the request itself is malformed.
fn bad_request(message: String) -> AppError {
    AppError::new(lizard_api::ErrorCode::InvalidArgument, message)
}

async fn forward(state: &AppState, req: Request) -> Result<Response, AppError> {
    let faces = &state.server.faces;
    let mut req = match faces.proxy(state, req, ProxyRoute::Arrived).await {
        Ok(answered) => return Ok(answered),
        Err(req) => req,
    };
    let config = &state.server.config;
    let host = match host::request_host(req.headers(), req.uri()) {
        Ok(h) => h,
        Err(e) => return Ok((StatusCode::BAD_REQUEST, axum::Json(bad_request(e.to_string()).0)).into_response()),
    };
    if let Some(name) = host::parse_service_host(&host, &config.service_domain(&config.region)) {
        for_the_guest(&mut req, &host);
        return forward_to_service(state, &name, req).await;
    }
    let Some(target) = parse_host(&host, &config.sandbox_domain(&config.region)) else {
        return match faces.proxy(state, req, ProxyRoute::NoHost).await {
            Ok(answered) => Ok(answered),
            Err(_) => Err(AppError::not_found(format!("{host:?} is not a sandbox or service host of this region"))),
        };
    };
    let route = ProxyRoute::Sandbox { id: &target.sandbox_id, port: target.port };
    let mut req = match faces.proxy(state, req, route).await {
        Ok(answered) => return Ok(answered),
        Err(req) => req,
    };
    check_port(&target)?;
    let admitted = access::check(&state.server, &target, req.headers(), req.uri()).await?;
    if admitted.wakes {
        crate::ops::lifecycle::wake(state, &target.sandbox_id).await?;
    }
    let granted = admitted.granted;
    for_the_guest(&mut req, &host);
    let tunnel = ops::sandboxes::open_port(state, &target.sandbox_id, target.port).await?;
    let mut response = exchange(tunnel, req, target.port).await?;
    if let access::Granted::SignedUrl { set_cookie: Some(cookie) } = granted {
        if let Ok(value) = axum::http::HeaderValue::from_str(&cookie) {
            response.headers_mut().append(axum::http::header::SET_COOKIE, value);
        }
    }
    Ok(response)
}

/// A request to a service: to the instance [`ops::services::route`] picks, counted in
/// flight until its response body ends (draining and idle pausing wait for it). An
/// instance paused or stopped between the pick and the tunnel is picked again, once.
async fn forward_to_service(state: &AppState, name: &str, req: Request) -> Result<Response, AppError> {
    let (mut sandbox_id, mut port) = ops::services::route(state, name).await?;
    let mut in_flight = state.services.begin(&sandbox_id);
    let tunnel = match ops::sandboxes::open_port(state, &sandbox_id, port).await {
        Ok(t) => t,
        Err(e) => {
            tracing::debug!(service = %name, sandbox = %sandbox_id, "instance did not take the request: {}", e.0.message);
            drop(in_flight);
            (sandbox_id, port) = ops::services::route(state, name).await?;
            in_flight = state.services.begin(&sandbox_id);
            ops::sandboxes::open_port(state, &sandbox_id, port).await?
        }
    };
    let resp = exchange(tunnel, req, port).await?;
    Ok(resp.map(|body| {
        use http_body_util::BodyExt;
        Body::new(body.map_frame(move |frame| {
            let _held = &in_flight;
            frame
        }))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::header;
    use utoipa_axum::router::OpenApiRouter;

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
        let state = proxy_state().await;
        let domain = state.server.config.sandbox_domain(&state.server.config.region);
        let req = axum::http::Request::builder()
            .uri("/")
            .header(header::HOST, format!("abc123-49999.{domain}"))
            .body(Body::empty())
            .unwrap();
        let resp = router(state).oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    }

    async fn proxy_state() -> AppState {
        proxy_state_with(crate::state::Faces::default()).await
    }

    async fn proxy_state_with(faces: crate::state::Faces) -> AppState {
        let store = crate::SqlStore::memory().await.unwrap();
        let server = crate::open_with_store(crate::ServerConfig::new("/nonexistent"), std::sync::Arc::new(store))
            .await
            .unwrap()
            .with_faces(faces);
        let nodes = lizard_node_client::Nodes::single(
            lizard_node_client::LOCAL_NODE_ID,
            std::sync::Arc::new(crate::ops::tests::FakeNode::default()),
        );
        server.app_state(nodes)
    }

    #[tokio::test]
    async fn two_host_headers_are_refused_and_an_unrecorded_sandbox_has_no_url() {
        use tower::ServiceExt;
        let state = proxy_state().await;
        let domain = state.server.config.sandbox_domain(&state.server.config.region);
        let req = axum::http::Request::builder()
            .uri("/")
            .header(header::HOST, format!("abc123-3000.{domain}"))
            .header(header::HOST, format!("other1-3000.{domain}"))
            .body(Body::empty())
            .unwrap();
        assert_eq!(router(state.clone()).oneshot(req).await.unwrap().status(), StatusCode::BAD_REQUEST);
        let req = axum::http::Request::builder()
            .uri("/")
            .header(header::HOST, format!("abc123-3000.{domain}"))
            .body(Body::empty())
            .unwrap();
        assert_eq!(router(state).oneshot(req).await.unwrap().status(), StatusCode::NOT_FOUND);
    }

    /// A face that takes requests carrying `x-test-face`, those to hosts that name nothing,
    /// and those to port 4000 of any sandbox, answering which it took.
    #[derive(Default)]
    struct TestFace;

    #[async_trait::async_trait]
    impl crate::state::Face for TestFace {
        fn routes(&self, api: OpenApiRouter<AppState>) -> OpenApiRouter<AppState> {
            api
        }

        fn takes(&self, req: &Request, route: ProxyRoute<'_>) -> bool {
            match route {
                ProxyRoute::Arrived => req.headers().contains_key("x-test-face"),
                ProxyRoute::NoHost => true,
                ProxyRoute::Sandbox { port, .. } => port == 4000,
            }
        }

        async fn answer(&self, _state: &AppState, _req: Request, route: ProxyRoute<'_>) -> Response {
            match route {
                ProxyRoute::Arrived => "arrived".into_response(),
                ProxyRoute::NoHost => "no host".into_response(),
                ProxyRoute::Sandbox { id, port } => format!("{id}:{port}").into_response(),
            }
        }
    }

    #[tokio::test]
    async fn a_face_takes_its_requests_at_each_point_and_hands_back_the_rest() {
        use tower::ServiceExt;
        let faces = crate::state::Faces::new(vec![std::sync::Arc::new(TestFace)]);
        assert!(faces.get::<TestFace>().is_some());
        let state = proxy_state_with(faces).await;
        let domain = state.server.config.sandbox_domain(&state.server.config.region);
        let call = |host: String, marked: bool| {
            let mut req = axum::http::Request::builder().uri("/").header(header::HOST, host);
            if marked {
                req = req.header("x-test-face", "1");
            }
            let answer = router(state.clone()).oneshot(req.body(Body::empty()).unwrap());
            async move {
                let resp = answer.await.unwrap();
                let status = resp.status();
                let body = axum::body::to_bytes(resp.into_body(), 1 << 16).await.unwrap();
                (status, String::from_utf8(body.to_vec()).unwrap())
            }
        };
        let ok = |took: &str| (StatusCode::OK, took.to_string());
        // Before the host is read: even a host that is no host of this region.
        assert_eq!(call("elsewhere.example".into(), true).await, ok("arrived"));
        assert_eq!(call("elsewhere.example".into(), false).await, ok("no host"));
        assert_eq!(call(format!("abc123-4000.{domain}"), false).await, ok("abc123:4000"));
        // Another port of the same sandbox goes the sandbox URLs' way: unrecorded, no URL.
        assert_eq!(call(format!("abc123-3000.{domain}"), false).await.0, StatusCode::NOT_FOUND);
    }
}
