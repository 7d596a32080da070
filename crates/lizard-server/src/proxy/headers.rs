//! What of a client's request reaches the guest: never the platform's credentials, and
//! forwarding headers the proxy wrote itself.
//!
//! A browser or script that talks to both the API and a sandbox URL may send the same
//! `X-API-Key`, session cookie or access token to both; the guest runs tenant code (maybe
//! untrusted), so those stop here. The user's own `Authorization` and cookies pass: they
//! belong to the guest's application. `X-Forwarded-*` and `Forwarded` from the client are
//! replaced, so a guest that trusts them learns the real client and host.
//!
//! The other way, a guest's response may not set a platform cookie: sandbox hosts share
//! a parent domain, so one sandbox's page could otherwise set a `lizard_signed` cookie
//! for every sandbox (cookie tossing) and spoil their signed-URL sessions.

use axum::http::{header, HeaderMap, HeaderName, HeaderValue};
use std::net::IpAddr;

/// Header carrying a private sandbox's access token (see [`super::access`]).
pub const ACCESS_TOKEN_HEADER: &str = "x-lizard-access-token";
/// The header E2B's clients send a private sandbox's traffic token in.
pub const E2B_TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";
/// Cookies whose names start with this belong to the platform (the console's session
/// cookie is `lizard_session`) and never reach a guest.
pub const PLATFORM_COOKIE_PREFIX: &str = "lizard_";
/// Headers about the hop that only the proxy may write.
const HOP_HEADERS: &[&str] =
    &["forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-forwarded-port", "x-real-ip"];

/// Remove the platform's credentials: the API key header, the access token headers
/// (Lizard's and E2B's traffic token), platform cookies and a WebSocket key subprotocol (`lizard.key.…`).
pub fn strip_platform_credentials(headers: &mut HeaderMap) {
    headers.remove(crate::auth::API_KEY_HEADER);
    headers.remove(ACCESS_TOKEN_HEADER);
    headers.remove(E2B_TRAFFIC_TOKEN_HEADER);
    keep_list_items(headers, header::COOKIE, ';', "; ", |c| {
        let name = c.split_once('=').map_or(c, |(n, _)| n).trim();
        !name.to_ascii_lowercase().starts_with(PLATFORM_COOKIE_PREFIX)
    });
    keep_list_items(headers, header::SEC_WEBSOCKET_PROTOCOL, ',', ", ", |p| {
        !p.starts_with(lizard_api::processes::PTY_KEY_PROTOCOL_PREFIX)
    });
}

/// Remove a guest response's `Set-Cookie` headers that would set a platform cookie
/// (a name starting with [`PLATFORM_COOKIE_PREFIX`], any case); a value that is not
/// text is removed too.
pub fn strip_platform_set_cookies(headers: &mut HeaderMap) {
    let values: Vec<HeaderValue> = headers.get_all(header::SET_COOKIE).iter().cloned().collect();
    headers.remove(header::SET_COOKIE);
    for value in values {
        let Ok(text) = value.to_str() else { continue };
        let name = text.split_once('=').map_or(text, |(n, _)| n).trim();
        if !name.to_ascii_lowercase().starts_with(PLATFORM_COOKIE_PREFIX) {
            headers.append(header::SET_COOKIE, value);
        }
    }
}

/// Keep only the items of the list header `name` (items split at `sep`, trimmed) that
/// `keep` accepts; a value that is not text is dropped whole.
fn keep_list_items(headers: &mut HeaderMap, name: HeaderName, sep: char, join: &str, keep: impl Fn(&str) -> bool) {
    let values: Vec<HeaderValue> = headers.get_all(&name).iter().cloned().collect();
    headers.remove(&name);
    for value in values {
        let Ok(text) = value.to_str() else { continue };
        let kept: Vec<&str> = text.split(sep).map(str::trim).filter(|c| !c.is_empty() && keep(c)).collect();
        if kept.is_empty() {
            continue;
        }
        if let Ok(v) = HeaderValue::from_str(&kept.join(join)) {
            headers.append(name.clone(), v);
        }
    }
}

/// Replace the client's forwarding headers with the proxy's own: `X-Forwarded-For` the
/// client's address (when known), `X-Forwarded-Host` the host it asked for,
/// `X-Forwarded-Proto` `https` when it came over TLS, else `http`.
pub fn set_forwarded(headers: &mut HeaderMap, client: Option<IpAddr>, tls: bool, host: &str) {
    for name in HOP_HEADERS {
        headers.remove(*name);
    }
    let mut set = |name: &'static str, value: &str| {
        if let Ok(v) = HeaderValue::from_str(value) {
            headers.insert(HeaderName::from_static(name), v);
        }
    };
    if let Some(ip) = client {
        set("x-forwarded-for", &ip.to_string());
    }
    set("x-forwarded-host", host);
    set("x-forwarded-proto", if tls { "https" } else { "http" });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn platform_credentials_never_pass_and_the_users_own_do() {
        let mut h = map(&[
            ("x-api-key", "lz_secret"),
            ("X-Lizard-Access-Token", "lzat_secret"),
            ("E2B-Traffic-Access-Token", "traffic"),
            ("authorization", "Bearer users-own"),
            ("cookie", "a=1; lizard_session=s; LIZARD_other=x"),
            ("cookie", "lizard_session=only"),
            ("cookie", "b=2"),
            ("sec-websocket-protocol", "lizard.pty, lizard.key.lz_secret"),
            ("sec-websocket-protocol", "lizard.key.lz_secret"),
            ("sec-websocket-protocol", "chat"),
        ]);
        strip_platform_credentials(&mut h);
        let protocols: Vec<_> = h.get_all("sec-websocket-protocol").iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(protocols, ["lizard.pty", "chat"]);
        assert!(h.get("x-api-key").is_none());
        assert!(h.get(ACCESS_TOKEN_HEADER).is_none());
        assert!(h.get(E2B_TRAFFIC_TOKEN_HEADER).is_none());
        assert_eq!(h.get("authorization").unwrap(), "Bearer users-own");
        let cookies: Vec<_> = h.get_all("cookie").iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
    }

    #[test]
    fn a_guest_sets_its_own_cookies_and_never_the_platforms() {
        let mut h = map(&[
            ("set-cookie", "app=1; Path=/"),
            ("set-cookie", "lizard_signed=1.00; Domain=sandbox.example; Path=/"),
            ("set-cookie", " LIZARD_Session=x"),
            ("set-cookie", "theme=dark"),
        ]);
        strip_platform_set_cookies(&mut h);
        let set: Vec<_> = h.get_all("set-cookie").iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(set, ["app=1; Path=/", "theme=dark"]);
    }

    #[test]
    fn forwarding_headers_are_the_proxys_own() {
        let mut h = map(&[
            ("x-forwarded-for", "203.0.113.9"),
            ("x-forwarded-for", "198.51.100.1"),
            ("x-forwarded-host", "evil.example"),
            ("x-forwarded-proto", "https"),
            ("forwarded", "for=203.0.113.9"),
            ("x-real-ip", "203.0.113.9"),
        ]);
        set_forwarded(&mut h, Some([127, 0, 0, 1].into()), false, "a1-80.sandbox.example");
        assert_eq!(h.get_all("x-forwarded-for").iter().collect::<Vec<_>>(), ["127.0.0.1"]);
        assert_eq!(h.get("x-forwarded-host").unwrap(), "a1-80.sandbox.example");
        assert_eq!(h.get("x-forwarded-proto").unwrap(), "http");
        assert!(h.get("forwarded").is_none() && h.get("x-real-ip").is_none());
        set_forwarded(&mut h, None, true, "a1-80.sandbox.example");
        assert!(h.get("x-forwarded-for").is_none());
        assert_eq!(h.get("x-forwarded-proto").unwrap(), "https");
    }
}
