//! Who may use a sandbox's URLs.
//!
//! A sandbox's URLs are public by default (the reference's "public URL"). One created
//! with `publicUrls: false` gets an access token, returned once by the create call and
//! stored only as its SHA-256 ([`lizard_store::AccessStore`]); every request through the
//! proxy must then carry it, in the [`ACCESS_TOKEN_HEADER`] header or the
//! [`ACCESS_TOKEN_QUERY`] query parameter (a URL that can be handed to a browser), or a
//! proof in a face's own form ([`crate::state::Face::url_access`]: for a sandbox made
//! through E2B, its traffic token; such a sandbox has a token even when its URLs are
//! public, as E2B's are by default).
//! A [signed URL](super::signed) (or the cookie its first request set) stands in for the
//! token until it expires. Missing, wrong or another sandbox's token, or a signature that
//! does not hold: 403, and no tunnel is opened. Either way the proof is removed before the
//! request reaches the guest.
//!
//! Only recorded, live sandboxes are reachable at all: a VM the control plane has not
//! recorded (a create still booting, or one being undone) has no URL.

use super::headers::ACCESS_TOKEN_HEADER;
use super::host::Target;
use super::signed;
use crate::error::AppError;
use crate::state::Faces;
use crate::state::ServerState;
use axum::http::{HeaderMap, Uri};
use subtle::ConstantTimeEq;

/// Query parameter carrying a private sandbox's access token.
pub const ACCESS_TOKEN_QUERY: &str = "lizardAccessToken";

/// How a request to a sandbox's URL was let through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Granted {
    /// Its URLs are public.
    Public,
    /// It carried the access token.
    Token,
    /// It carried a signed URL's proof (`set_cookie`: the first request, in the query) or
    /// the cookie that proof set.
    SignedUrl { set_cookie: Option<String> },
}

/// A request let through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    pub granted: Granted,
    /// The sandbox is paused and a request resumes it (E2B's `autoResume`).
    pub wakes: bool,
}

/// Allow the request to `target` or refuse it: 404 unless the sandbox is recorded and
/// live, 403 when its URLs are private and the request carries no matching token or
/// signature.
pub async fn check(
    server: &ServerState,
    target: &Target,
    headers: &HeaderMap,
    uri: &Uri,
) -> Result<Admitted, AppError> {
    let store = server.store.as_ref();
    let not_running = || AppError::not_found(format!("sandbox {} is not running", target.sandbox_id));
    let record = store.get_sandbox(&target.sandbox_id).await?.ok_or_else(not_running)?;
    if record.ended_at.is_some() {
        return Err(not_running());
    }
    let access = store.sandbox_access(&target.sandbox_id).await?;
    let wakes =
        record.state == lizard_api::SandboxState::Paused && access.as_ref().is_some_and(|a| a.resume_on_request);
    let granted = match access {
        Some(access) if !access.urls_public => {
            granted(&server.faces, &target.sandbox_id, &access.token_hash, target, headers, uri)?
        }
        _ => Granted::Public,
    };
    Ok(Admitted { granted, wakes })
}

/// How a request to a private sandbox's URLs proves access, or why it does not.
fn granted(
    faces: &Faces,
    id: &str,
    required: &[u8],
    target: &Target,
    headers: &HeaderMap,
    uri: &Uri,
) -> Result<Granted, AppError> {
    if let Some(valid) = faces.url_access(headers, id, required) {
        return match valid {
            true => Ok(Granted::Token),
            false => Err(AppError::forbidden("wrong traffic access token for this sandbox's URLs")),
        };
    }
    if let Some(token) = single_header(headers, ACCESS_TOKEN_HEADER).or_else(|| query_value(uri, ACCESS_TOKEN_QUERY)) {
        return match bool::from(crate::keys::hash(&token).ct_eq(required)) {
            true => Ok(Granted::Token),
            false => Err(AppError::forbidden("wrong access token for this sandbox's URLs")),
        };
    }
    let now = signed::now();
    let in_query = query_value(uri, signed::EXPIRES_QUERY).zip(query_value(uri, signed::SIGNATURE_QUERY));
    if let Some((expires, signature)) = in_query {
        let expires = expires.parse().map_err(|_| AppError::forbidden("this signed URL's expiry is not a number"))?;
        signed::verify(required, target, expires, &signature, now).map_err(|e| AppError::forbidden(e.to_string()))?;
        return Ok(Granted::SignedUrl { set_cookie: Some(signed::cookie(expires, &signature, now)) });
    }
    // Any valid one among several cookies of the name grants: a browser sends every
    // cookie that matches, and a stale or foreign one must not spoil a valid one.
    let mut first_error = None;
    for (expires, signature) in cookie_values(headers, signed::COOKIE).filter_map(|c| signed::parse_cookie(&c)) {
        match signed::verify(required, target, expires, &signature, now) {
            Ok(()) => return Ok(Granted::SignedUrl { set_cookie: None }),
            Err(e) => first_error = first_error.or(Some(e)),
        }
    }
    if let Some(e) = first_error {
        return Err(AppError::forbidden(e.to_string()));
    }
    Err(AppError::forbidden(format!(
        "this sandbox's URLs are private: send its access token in the {ACCESS_TOKEN_HEADER} header \
         or the {ACCESS_TOKEN_QUERY} query parameter, or use a signed URL"
    )))
}

/// The values of every cookie called `name`, in the order sent.
fn cookie_values<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = String> + 'a {
    headers.get_all(axum::http::header::COOKIE).iter().filter_map(|v| v.to_str().ok()).flat_map(move |v| {
        v.split(';')
            .filter_map(move |c| c.trim().split_once('=').filter(|(n, _)| *n == name).map(|(_, v)| v.to_string()))
    })
}

/// The header's value, when there is exactly one readable one.
pub fn single_header(headers: &HeaderMap, name: &str) -> Option<String> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(v), None) => v.to_str().ok().map(str::to_string),
        _ => None,
    }
}

/// The first value of the query parameter `name`.
fn query_value(uri: &Uri, name: &str) -> Option<String> {
    uri.query()?
        .split('&')
        .find_map(|pair| pair.split_once('=').filter(|(k, _)| *k == name).map(|(_, v)| v.to_string()))
}

/// Query parameters that prove access: the platform's, never the guest's.
const PROOF_QUERY: &[&str] = &[ACCESS_TOKEN_QUERY, signed::EXPIRES_QUERY, signed::SIGNATURE_QUERY];

/// The path and query the guest sees: origin form (never the client's absolute form),
/// without the token's or a signed URL's query parameters.
pub fn guest_target(uri: &Uri) -> Uri {
    let path = uri.path();
    let path = if path.is_empty() { "/" } else { path };
    let query: Vec<&str> = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty() && !PROOF_QUERY.contains(&pair.split_once('=').map_or(*pair, |(k, _)| k)))
        .collect();
    let target = if query.is_empty() { path.to_string() } else { format!("{path}?{}", query.join("&")) };
    // Built from an already-parsed URI's path and query: it parses again.
    target.parse().unwrap_or_else(|_| Uri::from_static("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guest_sees_origin_form_without_the_token() {
        let t = |s: &str| guest_target(&s.parse().unwrap()).to_string();
        assert_eq!(t("http://a1-80.x.example/p?a=1&lizardAccessToken=t&b=2"), "/p?a=1&b=2");
        assert_eq!(t("/p?lizardAccessToken=t"), "/p");
        assert_eq!(t("http://a1-80.x.example"), "/");
        assert_eq!(t("/p?x=lizardAccessToken"), "/p?x=lizardAccessToken");
        let uri: Uri = "/p?a=1&lizardAccessToken=tok".parse().unwrap();
        assert_eq!(query_value(&uri, ACCESS_TOKEN_QUERY).as_deref(), Some("tok"));
        assert_eq!(t("/p?lizardExpires=1&a=1&lizardSignature=ab"), "/p?a=1");
    }

    #[test]
    fn every_cookie_of_a_name_is_found_across_headers() {
        let mut h = HeaderMap::new();
        h.append("cookie", "lizard_signed=1.00; app=x".parse().unwrap());
        h.append("cookie", "lizard_signedx=no;lizard_signed=2.ab".parse().unwrap());
        assert_eq!(cookie_values(&h, "lizard_signed").collect::<Vec<_>>(), ["1.00", "2.ab"]);
    }
}
