//! API key material: generation, the stored hash, and verification; and the access
//! tokens of sandboxes whose URLs are private ([`AccessToken`], checked by
//! [`crate::proxy::access`]), stored the same way: their SHA-256 alone.
//!
//! A key is `lz_` followed by 43 base-62 characters that encode 32 bytes from the
//! operating system's random source (256 bits: not guessable, so a fast hash is the right
//! one — slow password hashes exist for low-entropy secrets). The server stores only
//!
//! - the SHA-256 of the whole key, and
//! - its first 11 characters (`lz_` + 8), the *lookup prefix*: it finds the candidate row
//!   without an index on secret material, and lets a person recognise a key in a list.
//!
//! Verification looks the prefix up and compares hashes in constant time
//! ([`subtle::ConstantTimeEq`]), so response timing says nothing about how much of a
//! guessed hash matched. The plaintext is returned once, at creation, and never again.

use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Every key starts with this: recognisable by people and by secret scanners.
pub const KEY_PREFIX: &str = "lz_";
/// Random bytes per key.
pub const KEY_BYTES: usize = 32;
/// Base-62 characters that encode [`KEY_BYTES`] (62^43 > 2^256).
pub const KEY_BODY_LEN: usize = 43;
/// Characters of the body kept as the lookup prefix.
pub const LOOKUP_BODY_LEN: usize = 8;

const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// A freshly generated key: the plaintext (shown once) and what is stored.
#[derive(Debug, Clone)]
pub struct NewKey {
    pub plaintext: String,
    pub prefix: String,
    pub hash: [u8; 32],
}

/// Generate a key from 32 bytes of OS randomness.
pub fn generate() -> NewKey {
    let mut bytes = [0u8; KEY_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let plaintext = format!("{KEY_PREFIX}{}", base62_fixed(&bytes));
    NewKey { prefix: lookup_prefix(&plaintext).expect("well-formed").to_string(), hash: hash(&plaintext), plaintext }
}

/// Prefix of every sandbox access token (so a leaked one is recognizable).
pub const ACCESS_TOKEN_PREFIX: &str = "lzat_";

/// A new sandbox access token: the plaintext, shown once, and the hash that is stored.
pub struct AccessToken {
    pub plaintext: String,
    pub hash: [u8; 32],
}

impl AccessToken {
    pub fn generate() -> AccessToken {
        let mut bytes = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        let plaintext = format!("{ACCESS_TOKEN_PREFIX}{}", hex::encode(bytes));
        AccessToken { hash: hash(&plaintext), plaintext }
    }
}

/// SHA-256 of a key or an access token.
pub fn hash(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// The lookup prefix of a well-formed key, or `None` when `key` cannot be one of ours
/// (wrong prefix, length or alphabet) — those are refused without touching the store.
pub fn lookup_prefix(key: &str) -> Option<&str> {
    let body = key.strip_prefix(KEY_PREFIX)?;
    if body.len() != KEY_BODY_LEN || !body.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    Some(&key[..KEY_PREFIX.len() + LOOKUP_BODY_LEN])
}

/// Whether `key` hashes to `stored`, compared in constant time.
pub fn verify(key: &str, stored: &[u8]) -> bool {
    let h = hash(key);
    stored.len() == h.len() && bool::from(h.ct_eq(stored))
}

/// Big-endian base-62 of `bytes`, left-padded to [`KEY_BODY_LEN`] so every key has the
/// same length.
fn base62_fixed(bytes: &[u8; KEY_BYTES]) -> String {
    let mut num = bytes.to_vec();
    let mut digits = Vec::with_capacity(KEY_BODY_LEN);
    while num.iter().any(|&b| b != 0) {
        // num /= 62, collecting the remainder.
        let mut rem = 0u32;
        for b in num.iter_mut() {
            let acc = (rem << 8) | u32::from(*b);
            // acc < 62 << 8 (rem < 62), so acc / 62 < 256.
            *b = u8::try_from(acc / 62).expect("a base-62 digit step fits a byte");
            rem = acc % 62;
        }
        digits.push(BASE62[rem as usize]);
    }
    while digits.len() < KEY_BODY_LEN {
        digits.push(b'0');
    }
    digits.reverse();
    String::from_utf8(digits).expect("ascii")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_distinct_and_hash_to_what_is_stored() {
        let (a, b) = (AccessToken::generate(), AccessToken::generate());
        assert_ne!(a.plaintext, b.plaintext);
        assert!(a.plaintext.starts_with(ACCESS_TOKEN_PREFIX) && a.plaintext.len() == ACCESS_TOKEN_PREFIX.len() + 64);
        assert_eq!(hash(&a.plaintext), a.hash);
    }

    #[test]
    fn keys_are_well_formed_and_unique() {
        let a = generate();
        let b = generate();
        assert_ne!(a.plaintext, b.plaintext);
        assert!(a.plaintext.starts_with("lz_"));
        assert_eq!(a.plaintext.len(), 3 + KEY_BODY_LEN);
        assert_eq!(lookup_prefix(&a.plaintext), Some(a.prefix.as_str()));
        assert_eq!(a.prefix.len(), 11);
        assert!(verify(&a.plaintext, &a.hash));
        assert!(!verify(&b.plaintext, &a.hash));
        assert!(!verify(&a.plaintext, &a.hash[..31]));
    }

    #[test]
    fn malformed_keys_have_no_prefix() {
        assert_eq!(lookup_prefix(""), None);
        assert_eq!(lookup_prefix("lz_short"), None);
        assert_eq!(lookup_prefix(&format!("xx_{}", "a".repeat(KEY_BODY_LEN))), None);
        assert_eq!(lookup_prefix(&format!("lz_{}-", "a".repeat(KEY_BODY_LEN - 1))), None);
    }

    #[test]
    fn base62_extremes() {
        assert_eq!(base62_fixed(&[0; 32]), "0".repeat(KEY_BODY_LEN));
        let max = base62_fixed(&[0xff; 32]);
        assert_eq!(max.len(), KEY_BODY_LEN, "2^256-1 fits in 43 base-62 digits");
        let one = {
            let mut b = [0u8; 32];
            b[31] = 61;
            base62_fixed(&b)
        };
        assert!(one.ends_with('z'));
    }
}
