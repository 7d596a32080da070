//! Lizard's E2B face: E2B's published SDKs, pointed at Lizard by `E2B_API_URL` and
//! `E2B_SANDBOX_URL` alone, drive Lizard's sandboxes unchanged. It is one more client of
//! the same operations, never a side door: the same keys, scopes, limits, admission and
//! billing as `/v1`. [`E2bFace`] is the [`lizard_server::state::Face`] that `lizard server`
//! installs; the wire it speaks is `lizard-e2b`'s.
//!
//! - [`control`]: the control plane (`/v2/sandboxes`, `/sandboxes/{id}`…) on the API's
//!   listener, beside `/v1` (no path collides), behind `X-API-KEY` — a Lizard key.
//! - [`envd`]: what the SDKs send to the sandbox URL, routed by `E2b-Sandbox-Id` and
//!   `E2b-Sandbox-Port: 49983` on the sandbox-URL proxy's listener, and translated onto
//!   the node's process and file operations: one implementation of running a process or
//!   writing a file, a second protocol in front of it.
//! - [`snapshots`]: `create_snapshot`, `list_snapshots`, `delete_snapshot`, and creates
//!   whose template is a snapshot.
//! - [`templates`]: the Template SDK's builds, on Lizard's template builder (its steps
//!   made a recipe in `template_steps`, its uploads read in `template_files`).
//!
//! A sandbox made through E2B has an access token whose hash is stored, whether its URLs
//! are public (E2B's default) or private (`network.allowPublicTraffic: false`). Its envd
//! token ([`envd_token`]) and traffic token ([`traffic_token`]) are derived from that
//! hash, as a signed URL's proof is: connect can answer them again without any plaintext
//! being stored, and they die with the sandbox.

mod code;
pub mod control;
pub mod envd;
mod network;
pub mod pending;
pub mod snapshots;
mod tags;
mod template_files;
mod template_steps;
pub mod templates;
mod users;
mod watch;

use async_trait::async_trait;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, Mac};
use lizard_server::error::AppError;
use lizard_server::proxy::headers::E2B_TRAFFIC_TOKEN_HEADER;
use lizard_server::state::{AppState, Face, ProxyRoute};
use sha2::Sha256;
use subtle::ConstantTimeEq;
use utoipa_axum::router::OpenApiRouter;

/// The face: E2B's control plane beside `/v1`, envd's protocol on the sandbox URLs, and
/// what this process keeps between the calls of an E2B template build.
#[derive(Default)]
pub struct E2bFace {
    templates: TemplateMap,
    pending: pending::Pending,
}

impl E2bFace {
    pub fn new(templates: TemplateMap) -> E2bFace {
        E2bFace { templates, pending: Default::default() }
    }
}

/// The installed face (its routes run only where it is installed).
fn face(state: &AppState) -> &E2bFace {
    state.server.faces.get::<E2bFace>().expect("the E2B face is installed where its routes run")
}

/// The template E2B's code-interpreter add-on creates.
pub const CODE_INTERPRETER: &str = "code-interpreter-v1";

/// E2B template names and the template each stands for in an E2B create and as an E2B
/// template's base (`lizard server --e2b-template NAME=TEMPLATE`). By default E2B's `base`
/// is Lizard's `code-interpreter-v1` (`base` with pip, venv and `python`, as E2B's base
/// image has them), and `code-interpreter-v1`, E2B's code interpreter, is Lizard's
/// `interpreter`, whose code service speaks the add-on's protocol through this face.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateMap(std::collections::BTreeMap<String, String>);

impl Default for TemplateMap {
    fn default() -> Self {
        TemplateMap(std::collections::BTreeMap::from([
            ("base".to_owned(), "code-interpreter-v1".to_owned()),
            (CODE_INTERPRETER.to_owned(), "interpreter".to_owned()),
        ]))
    }
}

impl TemplateMap {
    /// Map `name` to `template`; an empty `template` removes the mapping.
    pub fn set(&mut self, name: &str, template: &str) {
        if template.is_empty() {
            self.0.remove(name);
        } else {
            self.0.insert(name.to_owned(), template.to_owned());
        }
    }

    /// The template an E2B create that names `template` gets.
    pub fn get<'a>(&'a self, template: &'a str) -> &'a str {
        self.0.get(template).map_or(template, String::as_str)
    }

    /// Whether `template` is what E2B's code interpreter (`code-interpreter-v1`) maps to:
    /// its port 49999 runs code (private by default; public only when its create asked).
    pub fn is_code_interpreter(&self, template: &str) -> bool {
        self.0.get(CODE_INTERPRETER).is_some_and(|t| t == template)
    }
}

#[async_trait]
impl Face for E2bFace {
    fn routes(&self, api: OpenApiRouter<AppState>) -> OpenApiRouter<AppState> {
        templates::routes(snapshots::routes(control::routes(api)))
    }

    fn idempotent_paths(&self) -> &'static [&'static str] {
        &control::IDEMPOTENT_PATHS
    }

    /// envd's requests: named by header (`E2b-Sandbox-Id`), by host (`49983-{id}.{domain}`),
    /// or a signed `/files` URL on a host that names no sandbox.
    fn takes(&self, req: &Request, route: ProxyRoute<'_>) -> bool {
        match route {
            ProxyRoute::Arrived => envd::is_e2b(req.headers()),
            ProxyRoute::NoHost => envd::is_signed_file_url(req.uri()),
            ProxyRoute::Sandbox { port, .. } => port == lizard_e2b::ENVD_PORT,
        }
    }

    async fn answer(&self, state: &AppState, req: Request, route: ProxyRoute<'_>) -> Response {
        match route {
            ProxyRoute::Sandbox { id, .. } => envd::handle_for(state, id, req).await,
            ProxyRoute::Arrived | ProxyRoute::NoHost => envd::handle(state, req).await,
        }
    }

    /// The traffic token (`e2b-traffic-access-token`) of a sandbox made through E2B.
    fn url_access(&self, headers: &HeaderMap, sandbox_id: &str, access_hash: &[u8]) -> Option<bool> {
        let token = lizard_server::proxy::access::single_header(headers, E2B_TRAFFIC_TOKEN_HEADER)?;
        Some(traffic_token_matches(access_hash, sandbox_id, &token))
    }
}

/// An error in E2B's shape: `{"code": <the HTTP status>, "message"}` (its JS SDK branches
/// on the body's code), the message Lizard's own.
pub struct E2bError(pub AppError);

impl From<AppError> for E2bError {
    fn from(e: AppError) -> Self {
        E2bError(e)
    }
}

impl From<lizard_store::StoreError> for E2bError {
    fn from(e: lizard_store::StoreError) -> Self {
        E2bError(e.into())
    }
}

/// E2B's Python SDK retries any call answered 429, 502, 503 or 504 unless the answer says
/// `Should-Retry: false`. A fork's copies may stand by the time it fails (recorded, then
/// their timeout not set), and a snapshot taken again is a second one: their failures say
/// so. A create is all or nothing (and answered once per `Idempotency-Key`): its retry is
/// safe.
pub(crate) async fn no_retry(mut response: Response) -> Response {
    if matches!(response.status().as_u16(), 429 | 502 | 503 | 504) {
        response.headers_mut().insert("should-retry", axum::http::HeaderValue::from_static("false"));
    }
    response
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let status = self.0 .0.code.status();
        let body = lizard_e2b::rest::Error { code: status, message: self.0 .0.message };
        (StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), axum::Json(body)).into_response()
    }
}

pub type E2bResult<T> = Result<T, E2bError>;

/// A token only the holder of the sandbox's access-token hash can make, for `purpose`.
fn derived_token(access_hash: &[u8], sandbox_id: &str, purpose: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(access_hash).expect("HMAC takes a key of any length");
    mac.update(format!("lizard-e2b-{purpose}-v1\n{sandbox_id}").as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

fn same(expected: &str, presented: &str) -> bool {
    expected.len() == presented.len() && bool::from(expected.as_bytes().ct_eq(presented.as_bytes()))
}

/// The envd access token of `sandbox_id`, whose access token hashes to `access_hash`:
/// everything envd does (processes, files) and every port.
pub fn envd_token(access_hash: &[u8], sandbox_id: &str) -> String {
    derived_token(access_hash, sandbox_id, "envd")
}

/// Whether `presented` is `sandbox_id`'s envd token (constant-time).
pub fn envd_token_matches(access_hash: &[u8], sandbox_id: &str, presented: &str) -> bool {
    same(&envd_token(access_hash, sandbox_id), presented)
}

/// The traffic access token of `sandbox_id`: its ports (not envd) when its URLs are
/// private, E2B's `trafficAccessToken`.
pub fn traffic_token(access_hash: &[u8], sandbox_id: &str) -> String {
    derived_token(access_hash, sandbox_id, "traffic")
}

/// Whether `presented` is `sandbox_id`'s traffic token (constant-time).
pub fn traffic_token_matches(access_hash: &[u8], sandbox_id: &str, presented: &str) -> bool {
    same(&traffic_token(access_hash, sandbox_id), presented)
}

#[cfg(test)]
mod tests {
    #[test]
    fn e2bs_base_has_pip_and_only_its_code_interpreter_is_one() {
        let mut map = super::TemplateMap::default();
        assert_eq!(map.get("base"), "code-interpreter-v1");
        assert_eq!(map.get(super::CODE_INTERPRETER), "interpreter");
        assert_eq!(map.get("desktop"), "desktop");
        assert!(map.is_code_interpreter("interpreter"));
        // E2B's base is mapped too, but runs no code service on 49999.
        assert!(!map.is_code_interpreter("code-interpreter-v1"));
        map.set("desktop", "my-desktop");
        map.set("base", "");
        assert_eq!((map.get("desktop"), map.get("base")), ("my-desktop", "base"));
    }

    #[tokio::test]
    async fn a_failure_that_a_retry_could_repeat_says_not_to_retry() {
        use axum::response::IntoResponse;
        for (status, marked) in [(503, true), (502, true), (429, true), (504, true), (500, false), (201, false)] {
            let response = axum::http::StatusCode::from_u16(status).unwrap().into_response();
            let answered = crate::no_retry(response).await;
            let header = answered.headers().get("should-retry").map(|v| v.to_str().unwrap().to_owned());
            assert_eq!(header, marked.then(|| "false".to_owned()), "{status}");
        }
    }

    use super::*;

    #[test]
    fn an_envd_token_opens_only_its_own_sandbox() {
        let hash = [7u8; 32];
        let token = envd_token(&hash, "sbx_a");
        assert!(envd_token_matches(&hash, "sbx_a", &token));
        assert!(!envd_token_matches(&hash, "sbx_b", &token));
        assert!(!envd_token_matches(&[8u8; 32], "sbx_a", &token));
        assert!(!envd_token_matches(&hash, "sbx_a", &token[1..]));
        let traffic = traffic_token(&hash, "sbx_a");
        assert!(traffic_token_matches(&hash, "sbx_a", &traffic));
        assert!(!traffic_token_matches(&hash, "sbx_b", &traffic));
        // Neither opens what the other does.
        assert!(!envd_token_matches(&hash, "sbx_a", &traffic));
        assert!(!traffic_token_matches(&hash, "sbx_a", &token));
    }
}
