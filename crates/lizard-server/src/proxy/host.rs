//! Which sandbox port a request names: `{sandboxId}-{port}.{sandbox_domain}`, or E2B's
//! order `{port}-{sandboxId}.{sandbox_domain}` (a sandbox id starts with a letter, a port
//! with a digit, so the two never read alike), read from exactly one place.
//!
//! A request is refused when the places a hop could read its host from disagree: two
//! `Host` headers, or an absolute-form target (`GET http://h/ HTTP/1.1`, whose authority
//! RFC 9112 says wins over `Host`) naming another host than `Host` does. A proxy in
//! front that routes by one and Lizard by the other would then send one sandbox's
//! traffic (and credentials) to another.
//!
//! The host itself is matched strictly: letter case and one trailing dot (the same
//! name) are ignored, anything else that is not exactly `{id}-{port}.{domain}` (a
//! look-alike suffix, a second label in front, a port outside 1..=65535 or spelled with
//! leading zeros or a sign) names no sandbox.

use axum::http::{header, HeaderMap, Uri};

/// Where a public host points.
#[derive(Debug, PartialEq, Eq)]
pub struct Target {
    pub sandbox_id: String,
    pub port: u16,
}

/// Why a request's host could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HostError {
    /// Neither a `Host` header nor an absolute-form target.
    #[error("the request names no host")]
    Missing,
    /// More than one `Host` header.
    #[error("the request has more than one Host header")]
    Duplicate,
    /// A `Host` header that is not visible ASCII.
    #[error("the Host header is not readable text")]
    Unreadable,
    /// The absolute-form target names another host than the `Host` header.
    #[error("the request target's host differs from its Host header")]
    Mismatch,
}

/// The one host `headers` and `uri` name together.
pub fn request_host(headers: &HeaderMap, uri: &Uri) -> Result<String, HostError> {
    let mut hosts = headers.get_all(header::HOST).iter();
    let from_header = match (hosts.next(), hosts.next()) {
        (Some(_), Some(_)) => return Err(HostError::Duplicate),
        (Some(h), None) => Some(h.to_str().map_err(|_| HostError::Unreadable)?.to_string()),
        (None, _) => None,
    };
    let from_target = uri.authority().map(|a| a.as_str().to_string());
    match (from_header, from_target) {
        (Some(h), Some(t)) if same_host(&h, &t) => Ok(h),
        (Some(_), Some(_)) => Err(HostError::Mismatch),
        (Some(h), None) | (None, Some(h)) => Ok(h),
        (None, None) => Err(HostError::Missing),
    }
}

/// Whether two authorities name the same host (letter case and one trailing dot aside;
/// ports are not part of the name the proxy routes by).
fn same_host(a: &str, b: &str) -> bool {
    let name = |h: &str| {
        let h = strip_port(h);
        h.strip_suffix('.').unwrap_or(h).to_ascii_lowercase()
    };
    name(a) == name(b)
}

/// `h` without a trailing `:digits`.
fn strip_port(h: &str) -> &str {
    h.rsplit_once(':').filter(|(_, p)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())).map_or(h, |(h, _)| h)
}

/// Parse `{id}-{port}.{sandbox_domain}` or `{port}-{id}.{sandbox_domain}` (any `:port`
/// suffix, letter case and one trailing dot ignored).
pub fn parse_host(host: &str, sandbox_domain: &str) -> Option<Target> {
    let host = strip_port(host);
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let label = host.strip_suffix(&format!(".{}", sandbox_domain.to_ascii_lowercase()))?;
    let (id, port) = match label.split_once('-')? {
        (port, id) if port.starts_with(|c: char| c.is_ascii_digit()) => (id, port),
        _ => label.rsplit_once('-')?,
    };
    if !id.starts_with(|c: char| c.is_ascii_alphabetic()) || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    Some(Target { sandbox_id: id.to_string(), port: parse_port(port)? })
}

/// Parse `{name}.{service_domain}` (any `:port` suffix, letter case and one trailing dot
/// ignored): the service's name, when it is one ([`lizard_api::services::is_service_name`]).
pub fn parse_service_host(host: &str, service_domain: &str) -> Option<String> {
    let host = strip_port(host);
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let name = host.strip_suffix(&format!(".{}", service_domain.to_ascii_lowercase()))?;
    lizard_api::services::is_service_name(name).then(|| name.to_owned())
}

/// A port in 1..=65535 written in plain decimal (no sign, no leading zero).
fn parse_port(s: &str) -> Option<u16> {
    if s.is_empty() || s.len() > 5 || s.starts_with('0') || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const D: &str = "sandbox.local.lizard.localhost";

    #[test]
    fn hosts_map_to_exactly_one_sandbox_port() {
        let t = parse_host("abc123-3000.sandbox.local.lizard.localhost:8080", D).unwrap();
        assert_eq!(t, Target { sandbox_id: "abc123".into(), port: 3000 });
        assert_eq!(parse_host("ABC123-80.Sandbox.Local.Lizard.Localhost.", D).unwrap().port, 80);
        assert_eq!(parse_host("abc123-65535.sandbox.local.lizard.localhost", D).unwrap().port, 65535);
        // E2B's order names the same port.
        assert_eq!(parse_host("3000-abc123.sandbox.local.lizard.localhost:7172", D).unwrap(), t);
        assert_eq!(parse_host("49983-ABC123.sandbox.local.lizard.localhost.", D).unwrap().port, 49983);
        for bad in [
            "3000-123abc.sandbox.local.lizard.localhost",
            "3000-abc123-80.sandbox.local.lizard.localhost",
            "03000-abc123.sandbox.local.lizard.localhost",
            "70000-abc123.sandbox.local.lizard.localhost",
            "3000-.sandbox.local.lizard.localhost",
            "abc123-3000.sandbox.other.lizard.localhost",
            "abc123-3000.evil.com",
            "abc123-3000.sandbox.local.lizard.localhost.evil.com",
            "abc123-3000.evilsandbox.local.lizard.localhost",
            "abc123-3000.sandbox.local.lizard.localhost..",
            "abc123.sandbox.local.lizard.localhost",
            "abc123-0.sandbox.local.lizard.localhost",
            "abc123-65536.sandbox.local.lizard.localhost",
            "abc123-99999.sandbox.local.lizard.localhost",
            "abc123-03000.sandbox.local.lizard.localhost",
            "abc123-+3000.sandbox.local.lizard.localhost",
            "abc123-3000 .sandbox.local.lizard.localhost",
            "a.b-3000.sandbox.local.lizard.localhost",
            "a_b-3000.sandbox.local.lizard.localhost",
            "-3000.sandbox.local.lizard.localhost",
            "x.abc123-3000.sandbox.local.lizard.localhost",
            "",
        ] {
            assert_eq!(parse_host(bad, D), None, "{bad}");
        }
    }

    #[test]
    fn service_hosts_name_exactly_one_service() {
        const S: &str = "svc.local.lizard.localhost";
        assert_eq!(parse_service_host("my-app.svc.local.lizard.localhost:7172", S).as_deref(), Some("my-app"));
        assert_eq!(parse_service_host("My-App.SVC.local.lizard.localhost.", S).as_deref(), Some("my-app"));
        for bad in [
            "my-app.svc.other.lizard.localhost",
            "x.my-app.svc.local.lizard.localhost",
            "my_app.svc.local.lizard.localhost",
            "-a.svc.local.lizard.localhost",
            "svc.local.lizard.localhost",
            ".svc.local.lizard.localhost",
            "my-app.svc.local.lizard.localhost.evil.com",
            "abc123-3000.sandbox.local.lizard.localhost",
        ] {
            assert_eq!(parse_service_host(bad, S), None, "{bad}");
        }
    }

    fn headers(hosts: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in hosts {
            h.append(header::HOST, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn the_host_comes_from_one_place_or_the_request_is_refused() {
        let origin: Uri = "/x".parse().unwrap();
        let a = format!("a1-80.{D}");
        assert_eq!(request_host(&headers(&[&a]), &origin), Ok(a.clone()));
        assert_eq!(request_host(&headers(&[&a, &a]), &origin), Err(HostError::Duplicate));
        assert_eq!(request_host(&headers(&[]), &origin), Err(HostError::Missing));
        let absolute: Uri = format!("http://b2-80.{D}/x").parse().unwrap();
        assert_eq!(request_host(&headers(&[&a]), &absolute), Err(HostError::Mismatch));
        assert_eq!(request_host(&headers(&[]), &absolute), Ok(format!("b2-80.{D}")));
        let same: Uri = format!("http://A1-80.{}.:7172/x", D.to_uppercase()).parse().unwrap();
        assert_eq!(request_host(&headers(&[&a]), &same), Ok(a));
    }
}
