//! Signed URLs: a link to one port of a private sandbox that works without its access
//! token until it expires (for a browser, a webhook, a colleague).
//!
//! The proof is an HMAC-SHA256 over the sandbox id, the port and the expiry, keyed by the
//! stored hash of the sandbox's access token: every replica can check it with what it
//! already reads for tokens, no signing key has to be shared or rotated, and it dies with
//! the sandbox. Whoever can read that hash from the database can mint URLs; such a reader
//! already holds every record the token guards.

use super::host::Target;
use crate::error::{ApiResult, AppError};
use hmac::{Hmac, Mac};
use lizard_api::{SignUrlRequest, SignedUrl};
use lizard_store::Store;
use sha2::Sha256;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Query parameter: the URL's expiry, in Unix seconds.
pub const EXPIRES_QUERY: &str = "lizardExpires";
/// Query parameter: the proof, lower-case hex.
pub const SIGNATURE_QUERY: &str = "lizardSignature";
/// Cookie set by the first request through a signed URL (`{expires}.{signature}`), host
/// only, so the page's later requests (scripts, images) need no query.
pub const COOKIE: &str = "lizard_signed";
/// The longest a URL may work.
pub const MAX_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);
/// What a URL works for when the caller does not say.
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);

/// Why a signed URL was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("this signed URL has expired")]
    Expired,
    #[error("this signed URL's signature does not match")]
    Mismatch,
}

/// Seconds since the Unix epoch now.
pub fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn mac(key: &[u8], target: &Target, expires: u64) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(format!("lizard-url-v1\n{}\n{}\n{expires}", target.sandbox_id, target.port).as_bytes());
    mac
}

/// The proof for `target` until `expires`, as hex.
pub fn sign(key: &[u8], target: &Target, expires: u64) -> String {
    hex::encode(mac(key, target, expires).finalize().into_bytes())
}

/// The query a signed URL carries.
pub fn query(key: &[u8], target: &Target, expires: u64) -> String {
    format!("{EXPIRES_QUERY}={expires}&{SIGNATURE_QUERY}={}", sign(key, target, expires))
}

/// Accept `signature` for `target` until `expires` at time `now` (constant-time compare).
pub fn verify(key: &[u8], target: &Target, expires: u64, signature: &str, now: u64) -> Result<(), SignatureError> {
    let bytes = hex::decode(signature).map_err(|_| SignatureError::Mismatch)?;
    mac(key, target, expires).verify_slice(&bytes).map_err(|_| SignatureError::Mismatch)?;
    if expires <= now {
        return Err(SignatureError::Expired);
    }
    Ok(())
}

/// The `Set-Cookie` value that lets later requests to the same host through.
pub fn cookie(expires: u64, signature: &str, now: u64) -> String {
    let max_age = expires.saturating_sub(now);
    format!("{COOKIE}={expires}.{signature}; Max-Age={max_age}; Path=/; HttpOnly; SameSite=Lax")
}

/// Mint a URL to `req.port` of `sandbox_id` (recorded, live, reached by the caller's key)
/// on the proxy's `domain`; 422 for port 0 or a lifetime outside 1 s to a week.
pub async fn mint(store: &dyn Store, domain: &str, sandbox_id: &str, req: &SignUrlRequest) -> ApiResult<SignedUrl> {
    let lifetime = req.expires_in_seconds.unwrap_or(DEFAULT_LIFETIME.as_secs());
    if req.port == 0 || !(1..=MAX_LIFETIME.as_secs()).contains(&lifetime) {
        return Err(AppError::invalid(format!(
            "port must be 1..=65535 and expiresInSeconds 1..={}, got {} and {lifetime}",
            MAX_LIFETIME.as_secs(),
            req.port
        )));
    }
    let target = Target { sandbox_id: sandbox_id.to_string(), port: req.port };
    let host = format!("{sandbox_id}-{}.{domain}", req.port);
    let key = match store.sandbox_access(sandbox_id).await? {
        Some(access) if !access.urls_public => access.token_hash,
        _ => return Ok(SignedUrl { host, query: String::new(), expires_at: None }),
    };
    let expires = now() + lifetime;
    let expires_ms = i64::try_from(expires.saturating_mul(1000)).unwrap_or(i64::MAX);
    Ok(SignedUrl { host, query: query(&key, &target, expires), expires_at: Some(lizard_api::ids::rfc3339(expires_ms)) })
}

/// `(expires, signature)` from a cookie value `{expires}.{signature}`.
pub fn parse_cookie(value: &str) -> Option<(u64, String)> {
    let (expires, signature) = value.split_once('.')?;
    Some((expires.parse().ok()?, signature.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(id: &str, port: u16) -> Target {
        Target { sandbox_id: id.into(), port }
    }

    #[test]
    fn a_signature_holds_for_its_sandbox_port_and_time_only() {
        let (key, t) = ([7u8; 32], target("sbx1", 8080));
        let sig = sign(&key, &t, 1_000);
        assert_eq!(verify(&key, &t, 1_000, &sig, 999), Ok(()));
        assert_eq!(verify(&key, &t, 1_000, &sig, 1_000), Err(SignatureError::Expired));
        assert_eq!(verify(&key, &t, 2_000, &sig, 999), Err(SignatureError::Mismatch), "a later expiry");
        assert_eq!(verify(&key, &target("sbx1", 8081), 1_000, &sig, 0), Err(SignatureError::Mismatch));
        assert_eq!(verify(&key, &target("sbx2", 8080), 1_000, &sig, 0), Err(SignatureError::Mismatch));
        assert_eq!(verify(&[8u8; 32], &t, 1_000, &sig, 0), Err(SignatureError::Mismatch), "another token");
        assert_eq!(verify(&key, &t, 1_000, "zz", 0), Err(SignatureError::Mismatch));
        assert_eq!(verify(&key, &t, 1_000, "", 0), Err(SignatureError::Mismatch));
    }

    #[test]
    fn the_cookie_round_trips_and_lives_as_long_as_the_url() {
        let c = cookie(1_060, "abcd", 1_000);
        assert!(c.starts_with("lizard_signed=1060.abcd;") && c.contains("Max-Age=60") && c.contains("HttpOnly"));
        assert_eq!(parse_cookie("1060.abcd"), Some((1_060, "abcd".into())));
        assert_eq!(parse_cookie("x.abcd"), None);
        assert_eq!(parse_cookie("1060"), None);
    }
}
