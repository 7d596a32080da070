//! Who may use a sandbox's URLs.
//!
//! A sandbox's URLs are public by default (the reference's "public URL"). One created
//! with `publicUrls: false` gets an access token, returned once by the create call and
//! stored only as its SHA-256 ([`crate::store::AccessStore`]); every request through the
//! proxy must then carry it, in the [`ACCESS_TOKEN_HEADER`] header or the
//! [`ACCESS_TOKEN_QUERY`] query parameter (a URL that can be handed to a browser).
//! Missing, wrong or another sandbox's token: 403, and no tunnel is opened. Either way the
//! token is removed before the request reaches the guest.
//!
//! Only recorded, live sandboxes are reachable at all: a VM the control plane has not
//! recorded (a create still booting, or one being undone) has no URL.

use super::headers::ACCESS_TOKEN_HEADER;
use super::host::Target;
use crate::error::AppError;
use crate::store::Store;
use axum::http::{HeaderMap, Uri};
use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Query parameter carrying a private sandbox's access token.
pub const ACCESS_TOKEN_QUERY: &str = "lizardAccessToken";
/// Prefix of every access token (so a leaked one is recognizable).
pub const TOKEN_PREFIX: &str = "lzat_";
/// Random bytes in a token.
const TOKEN_BYTES: usize = 32;

/// A new access token: the plaintext, shown once, and the hash that is stored.
pub struct AccessToken {
    pub plaintext: String,
    pub hash: [u8; 32],
}

impl AccessToken {
    pub fn generate() -> AccessToken {
        let mut bytes = [0u8; TOKEN_BYTES];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        let plaintext = format!("{TOKEN_PREFIX}{}", hex::encode(bytes));
        AccessToken { hash: hash(&plaintext), plaintext }
    }
}

/// SHA-256 of a token.
pub fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Allow the request to `target` or refuse it: 404 unless the sandbox is recorded and
/// live, 403 when its URLs are private and the request carries no matching token.
pub async fn check(store: &dyn Store, target: &Target, headers: &HeaderMap, uri: &Uri) -> Result<(), AppError> {
    let not_running = || AppError::not_found(format!("sandbox {} is not running", target.sandbox_id));
    let record = store.get_sandbox(&target.sandbox_id).await?.ok_or_else(not_running)?;
    if record.ended_at.is_some() {
        return Err(not_running());
    }
    let Some(required) = store.sandbox_access(&target.sandbox_id).await? else {
        return Ok(());
    };
    let offered = token_in_headers(headers).or_else(|| token_in_query(uri));
    match offered {
        Some(token) if bool::from(hash(&token).ct_eq(required.as_slice())) => Ok(()),
        Some(_) => Err(AppError::forbidden("wrong access token for this sandbox's URLs")),
        None => Err(AppError::forbidden(format!(
            "this sandbox's URLs are private: send its access token in the {ACCESS_TOKEN_HEADER} header \
             or the {ACCESS_TOKEN_QUERY} query parameter"
        ))),
    }
}

/// The token header's value, when there is exactly one readable one.
fn token_in_headers(headers: &HeaderMap) -> Option<String> {
    let mut values = headers.get_all(ACCESS_TOKEN_HEADER).iter();
    match (values.next(), values.next()) {
        (Some(v), None) => v.to_str().ok().map(str::to_string),
        _ => None,
    }
}

/// The first token query parameter's value.
fn token_in_query(uri: &Uri) -> Option<String> {
    uri.query()?
        .split('&')
        .find_map(|pair| pair.split_once('=').filter(|(k, _)| *k == ACCESS_TOKEN_QUERY).map(|(_, v)| v.to_string()))
}

/// The path and query the guest sees: origin form (never the client's absolute form),
/// without the token query parameter.
pub fn guest_target(uri: &Uri) -> Uri {
    let path = uri.path();
    let path = if path.is_empty() { "/" } else { path };
    let query: Vec<&str> = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty() && pair.split_once('=').map_or(*pair, |(k, _)| k) != ACCESS_TOKEN_QUERY)
        .collect();
    let target = if query.is_empty() { path.to_string() } else { format!("{path}?{}", query.join("&")) };
    // Built from an already-parsed URI's path and query: it parses again.
    target.parse().unwrap_or_else(|_| Uri::from_static("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_distinct_and_hash_to_what_is_stored() {
        let (a, b) = (AccessToken::generate(), AccessToken::generate());
        assert_ne!(a.plaintext, b.plaintext);
        assert!(a.plaintext.starts_with(TOKEN_PREFIX) && a.plaintext.len() == TOKEN_PREFIX.len() + 64);
        assert_eq!(hash(&a.plaintext), a.hash);
    }

    #[test]
    fn the_guest_sees_origin_form_without_the_token() {
        let t = |s: &str| guest_target(&s.parse().unwrap()).to_string();
        assert_eq!(t("http://a1-80.x.example/p?a=1&lizardAccessToken=t&b=2"), "/p?a=1&b=2");
        assert_eq!(t("/p?lizardAccessToken=t"), "/p");
        assert_eq!(t("http://a1-80.x.example"), "/");
        assert_eq!(t("/p?x=lizardAccessToken"), "/p?x=lizardAccessToken");
        let uri: Uri = "/p?a=1&lizardAccessToken=tok".parse().unwrap();
        assert_eq!(token_in_query(&uri).as_deref(), Some("tok"));
    }
}
