//! Ids, slugs, names and timestamps.
//!
//! Ids are a type prefix and random lowercase base-36 (`ws_…`, `prj_…`, `key_…`,
//! `acc_…`): the prefix says what an id is when it turns up in a log or a support
//! request, and the underscore can never occur in a slug, so "is this an id or a slug" is
//! never ambiguous. Lowercase keeps ids usable in DNS labels like sandbox hosts.
//! Timestamps are milliseconds since the Unix epoch in storage (a plain integer in any
//! database) and RFC 3339 on the wire.

use rand::Rng;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const ID_CHARS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
/// 16 base-36 characters ≈ 82 bits: collisions are not a concern.
const ID_LEN: usize = 16;

/// A new random id with the given type prefix, e.g. `new_id("ws")` → `ws_k3j…`.
pub fn new_id(prefix: &str) -> String {
    let mut rng = rand::rngs::OsRng;
    let body: String = (0..ID_LEN).map(|_| ID_CHARS[rng.gen_range(0..ID_CHARS.len())] as char).collect();
    format!("{prefix}_{body}")
}

/// Longest name we accept for a workspace, project or key.
pub const MAX_NAME: usize = 100;
/// Longest slug (a DNS label's limit, should slugs ever become hostnames).
pub const MAX_SLUG: usize = 63;

/// Why a name is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Empty or only whitespace.
    #[error("name must not be empty")]
    Empty,
    /// Too long.
    #[error("name must be at most {MAX_NAME} characters")]
    TooLong,
    /// Control characters have no place in a name.
    #[error("name must not contain control characters")]
    Control,
    /// Slugs are built from letters and digits; a name without any has no slug.
    #[error("name must contain at least one letter or digit")]
    NoSlug,
}

/// Check a display name (workspace, project, key) and return it trimmed.
pub fn check_name(name: &str) -> Result<String, NameError> {
    let name = name.trim();
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.chars().count() > MAX_NAME {
        return Err(NameError::TooLong);
    }
    if name.chars().any(char::is_control) {
        return Err(NameError::Control);
    }
    Ok(name.to_string())
}

/// The slug of a name: ASCII letters and digits lowercased, every other run of characters
/// one `-`, no leading or trailing `-`, at most [`MAX_SLUG`] characters.
pub fn slugify(name: &str) -> Result<String, NameError> {
    let mut slug = String::new();
    let mut dash = false;
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            if dash && !slug.is_empty() {
                slug.push('-');
            }
            dash = false;
            slug.push(c.to_ascii_lowercase());
        } else {
            dash = true;
        }
    }
    if slug.is_empty() {
        return Err(NameError::NoSlug);
    }
    slug.truncate(MAX_SLUG);
    Ok(slug.trim_end_matches('-').to_string())
}

/// Now, in milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)).unwrap_or(0)
}

/// RFC 3339 (UTC, milliseconds) of a stored timestamp.
pub fn rfc3339(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_prefix_and_are_distinct() {
        let a = new_id("ws");
        assert!(a.starts_with("ws_") && a.len() == 3 + ID_LEN);
        assert!(a[3..].bytes().all(|b| ID_CHARS.contains(&b)));
        assert_ne!(a, new_id("ws"));
    }

    #[test]
    fn slugs() {
        assert_eq!(slugify("My Project").unwrap(), "my-project");
        assert_eq!(slugify("  user-42 / Ünïcode!! ").unwrap(), "user-42-n-code");
        assert_eq!(slugify("a__b").unwrap(), "a-b");
        assert_eq!(slugify("¿?"), Err(NameError::NoSlug));
        let long = "a-".repeat(100);
        let s = slugify(&long).unwrap();
        assert!(s.len() <= MAX_SLUG && !s.ends_with('-'));
        assert!(!slugify("prj_abc").unwrap().contains('_'), "a slug never looks like an id");
    }

    #[test]
    fn names() {
        assert_eq!(check_name("  x "), Ok("x".into()));
        assert_eq!(check_name("  "), Err(NameError::Empty));
        assert_eq!(check_name("a\nb"), Err(NameError::Control));
        assert_eq!(check_name(&"x".repeat(101)), Err(NameError::TooLong));
    }

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert!(now_ms() > 1_600_000_000_000);
    }
}
