//! Signed `/files` URLs: a link to read or write one file of a sandbox that works with no
//! header, for a browser or `curl` (E2B's `download_url`/`upload_url`).
//!
//! The proof is `v1_` and the unpadded standard base64 of SHA-256 over
//! `<path>:<read|write>:<user>:<envd token>[:<expiry>]` (user empty for the default one,
//! the expiry in Unix seconds when the URL has one), as the SDKs compute it.

use base64::Engine;
use sha2::{Digest, Sha256};

/// A signature's version prefix.
pub const PREFIX: &str = "v1_";

/// The signature of a URL to `op` (`read` or `write`) `path` as `user`, with the
/// sandbox's envd `token`, until `expiry`.
pub fn signature(path: &str, op: &str, user: &str, token: &str, expiry: Option<u64>) -> String {
    let raw = match expiry {
        Some(at) => format!("{path}:{op}:{user}:{token}:{at}"),
        None => format!("{path}:{op}:{user}:{token}"),
    };
    let digest = Sha256::digest(raw.as_bytes());
    format!("{PREFIX}{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_cover_path_operation_user_token_and_expiry() {
        let s = signature("/tmp/a", "read", "", "tok", None);
        // sha256("/tmp/a:read::tok"), standard base64 without padding.
        assert_eq!(s, "v1_jRv7bf35peDXq059OOOyWD0PBnF4OWRLw0tBteoU7A4");
        // SHA-256 is 32 bytes: 43 characters of unpadded base64.
        assert_eq!(s.len(), PREFIX.len() + 43);
        for other in [
            signature("/tmp/b", "read", "", "tok", None),
            signature("/tmp/a", "write", "", "tok", None),
            signature("/tmp/a", "read", "root", "tok", None),
            signature("/tmp/a", "read", "", "tok2", None),
            signature("/tmp/a", "read", "", "tok", Some(1)),
        ] {
            assert_ne!(s, other);
        }
    }
}
