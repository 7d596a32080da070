//! The node credential on TCP: every route but `/health` needs `Authorization: Bearer
//! <credential>`, compared in constant time (a timing side channel would leak it byte by
//! byte to anyone who can reach the port).

use super::AppError;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use lizard_api::routes::node as table;
use lizard_api::{ApiError, ErrorCode};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The bearer token the node accepts.
#[derive(Clone)]
pub struct Credential(Arc<str>);

impl Credential {
    pub fn new(credential: impl Into<String>) -> Credential {
        Credential(Arc::from(credential.into()))
    }

    /// Whether `authorization` (a header's value) carries this credential (the scheme
    /// in any case, as HTTP has it).
    pub fn admits(&self, authorization: Option<&[u8]>) -> bool {
        let Some(value) = authorization else { return false };
        let Some(space) = value.iter().position(|b| *b == b' ') else { return false };
        let (scheme, token) = (&value[..space], value[space + 1..].trim_ascii());
        scheme.eq_ignore_ascii_case(b"bearer") && bool::from(token.ct_eq(self.0.as_bytes()))
    }
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credential(…)")
    }
}

/// Middleware: the request goes on only with the credential (or to `/health`).
pub async fn require_credential(State(credential): State<Credential>, req: Request, next: Next) -> Response {
    if req.uri().path() == table::HEALTH.path {
        return next.run(req).await;
    }
    let given = req.headers().get(axum::http::header::AUTHORIZATION).map(|v| v.as_bytes());
    if credential.admits(given) {
        return next.run(req).await;
    }
    AppError(ApiError::new(
        ErrorCode::Unauthenticated,
        "this node's API needs its credential (Authorization: Bearer …)",
    ))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_bearer_token_is_admitted() {
        let c = Credential::new("abc123");
        for good in [&b"Bearer abc123"[..], b"bearer abc123", b"BEARER  abc123 "] {
            assert!(c.admits(Some(good)), "{}", String::from_utf8_lossy(good));
        }
        for bad in [&b"Bearer abc12"[..], b"Bearer abc1234", b"Bearerabc123", b"abc123", b"Bearer ", b"Basic abc123"] {
            assert!(!c.admits(Some(bad)), "{}", String::from_utf8_lossy(bad));
        }
        assert!(!c.admits(None));
        assert_eq!(format!("{c:?}"), "Credential(…)", "never in a log");
    }
}
