//! The web console `lizard server` serves at `/console/` (and `/`, which redirects there):
//! static pages, built from `web/` at compile time (see `build.rs`) and embedded in the
//! binary. The pages sign in with an API key that the browser keeps in its session storage
//! only, and every call they make is the public API with that key (`X-API-Key`), so the
//! key's scopes apply; the terminal's WebSocket offers the key as a subprotocol, since a
//! browser cannot set headers on one. The key is never in a URL, a cookie or a log line.
//!
//! The assets need no key. Every answer carries a Content-Security-Policy (scripts and
//! connections from this origin only, no inline script; styles from this origin and
//! inline, see [`CSP`]), and is never framed or sniffed.

#![forbid(unsafe_code)]

use axum::extract::{Path, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

mod assets {
    include!(concat!(env!("OUT_DIR"), "/assets.rs"));
}

/// Where the console lives.
pub const BASE: &str = "/console/";

/// The Content-Security-Policy of every answer. Styles may be inline because xterm.js's
/// renderer writes them: `<style>` elements sized to the terminal's font and theme, and
/// `style` attributes on cells with their own colours. Scripts stay this origin's only, so
/// an injected style can restyle a page but not run code or send anything away.
/// (`connect-src 'self'` covers the terminal's `ws:`/`wss:` to this host.)
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                       img-src 'self' data: blob:; font-src 'self'; connect-src 'self'; \
                       frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// What the pages need to know of this server that the API does not say.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    /// The port of the sandbox-URL proxy (links to sandboxes' open ports); `None`
    /// without a proxy.
    pub sandbox_url_port: Option<u16>,
}

/// `/`, `/console`, `/console/`, `/console/settings.json` and the assets. Merge it into
/// the API's router.
pub fn router(settings: Settings) -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::permanent(BASE) }))
        .route("/console", get(|| async { Redirect::permanent(BASE) }))
        .route(BASE, get(|| async { asset("index.html") }))
        .route("/console/settings.json", get(settings_json))
        .route("/console/{file}", get(|Path(file): Path<String>| async move { asset(&file) }))
        .with_state(settings)
}

async fn settings_json(State(settings): State<Settings>) -> Response {
    secured(Json(settings).into_response())
}

/// The embedded file `name`, or 404.
fn asset(name: &str) -> Response {
    let Some((_, content_type, bytes)) = assets::ASSETS.iter().find(|(n, _, _)| *n == name) else {
        return secured((StatusCode::NOT_FOUND, "not found\n").into_response());
    };
    let cache = if name == "index.html" { "no-cache" } else { "public, max-age=300" };
    secured(([(header::CONTENT_TYPE, *content_type), (header::CACHE_CONTROL, cache)], *bytes).into_response())
}

/// The security headers every answer carries.
fn secured(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (HeaderName::from_static("cross-origin-opener-policy"), "same-origin"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// The names of the embedded files.
pub fn asset_names() -> impl Iterator<Item = &'static str> {
    assets::ASSETS.iter().map(|(n, _, _)| *n)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use axum::body::Body;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn get(path: &str) -> Response {
        router(Settings { sandbox_url_port: Some(7172) })
            .oneshot(axum::http::Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap()
    }

    #[test]
    fn the_bundle_is_embedded() {
        let names: Vec<_> = asset_names().collect();
        for n in ["index.html", "app.js", "app.css"] {
            assert!(names.contains(&n), "{names:?}");
        }
        // app.css carries xterm.js's own rules beside the console's.
        let (_, _, css) = assets::ASSETS.iter().find(|(n, _, _)| *n == "app.css").unwrap();
        let css = std::str::from_utf8(css).unwrap();
        assert!(css.contains(".xterm-viewport") && css.contains("#terminal"), "{css}");
    }

    #[tokio::test]
    async fn pages_carry_the_policy_and_need_no_key() {
        let page = get("/console/").await;
        assert_eq!(page.status(), 200);
        assert_eq!(page.headers()[header::CONTENT_SECURITY_POLICY], CSP);
        assert_eq!(page.headers()[header::X_FRAME_OPTIONS], "DENY");
        let html = String::from_utf8(page.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
        assert!(html.contains("app.js") && !html.contains("<script>"), "no inline script: {html}");
        let js = get("/console/app.js").await;
        assert_eq!(js.headers()[header::CONTENT_TYPE], "text/javascript; charset=utf-8");
        assert_eq!(js.headers()[header::CONTENT_SECURITY_POLICY], CSP);
        let root = get("/").await;
        assert_eq!(root.status(), 308);
        assert_eq!(root.headers()[header::LOCATION], BASE);
        assert_eq!(get("/console/nope.js").await.status(), 404);
        assert_eq!(get("/console/..%2Fetc%2Fpasswd").await.status(), 404);
        let settings = get("/console/settings.json").await;
        let body = settings.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], br#"{"sandboxUrlPort":7172}"#);
    }
}
