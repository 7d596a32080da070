//! Lizard's E2B face: E2B's published SDKs, pointed at Lizard by `E2B_API_URL` and
//! `E2B_SANDBOX_URL` alone, drive Lizard's sandboxes unchanged. It is one more client of
//! the same operations, never a side door: the same keys, scopes, limits, admission and
//! billing as `/v1`.
//!
//! - [`control`]: the control plane (`/v2/sandboxes`, `/sandboxes/{id}`…) on the API's
//!   listener, beside `/v1` (no path collides), behind `X-API-KEY` — a Lizard key.
//! - [`envd`]: what the SDKs send to the sandbox URL, routed by `E2b-Sandbox-Id` and
//!   `E2b-Sandbox-Port: 49983` on the sandbox-URL proxy's listener, and translated onto
//!   the node's process and file operations: one implementation of running a process or
//!   writing a file, a second protocol in front of it.
//!
//! A sandbox made through E2B is private (its URLs need its token), and its envd token
//! ([`envd_token`]) is derived from the stored hash of that access token, as a signed
//! URL's proof is: connect can answer it again without any plaintext being stored, and
//! it dies with the sandbox.

pub mod control;
pub mod envd;
mod tags;
mod watch;

use crate::error::AppError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// An error in E2B's shape: `{"code": <the HTTP status>, "message"}` (its JS SDK branches
/// on the body's code), the message Lizard's own.
pub struct E2bError(pub AppError);

impl From<AppError> for E2bError {
    fn from(e: AppError) -> Self {
        E2bError(e)
    }
}

impl From<crate::store::StoreError> for E2bError {
    fn from(e: crate::store::StoreError) -> Self {
        E2bError(e.into())
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let status = self.0 .0.code.status();
        let body = lizard_e2b::rest::Error { code: status, message: self.0 .0.message };
        (StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), axum::Json(body)).into_response()
    }
}

pub type E2bResult<T> = Result<T, E2bError>;

fn envd_mac(access_hash: &[u8], sandbox_id: &str) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(access_hash).expect("HMAC takes a key of any length");
    mac.update(format!("lizard-e2b-envd-v1\n{sandbox_id}").as_bytes());
    mac
}

/// The envd access token of `sandbox_id`, whose access token hashes to `access_hash`.
pub fn envd_token(access_hash: &[u8], sandbox_id: &str) -> String {
    hex::encode(envd_mac(access_hash, sandbox_id).finalize().into_bytes())
}

/// Whether `presented` is `sandbox_id`'s envd token (constant-time).
pub fn envd_token_matches(access_hash: &[u8], sandbox_id: &str, presented: &str) -> bool {
    let expected = envd_token(access_hash, sandbox_id);
    expected.len() == presented.len() && bool::from(expected.as_bytes().ct_eq(presented.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envd_token_opens_only_its_own_sandbox() {
        let hash = [7u8; 32];
        let token = envd_token(&hash, "sbx_a");
        assert!(envd_token_matches(&hash, "sbx_a", &token));
        assert!(!envd_token_matches(&hash, "sbx_b", &token));
        assert!(!envd_token_matches(&[8u8; 32], "sbx_a", &token));
        assert!(!envd_token_matches(&hash, "sbx_a", &token[1..]));
    }
}
