//! Kept answers are sealed (XChaCha20-Poly1305, a random nonce each) under a key derived
//! from the caller's API key, which the server never stores (only its hash). An answer can
//! hold what is shown once — a private sandbox's access token, an exec's output — and sits
//! in the database for [`super::RETENTION`]: read from there (a backup, a leaked file, a
//! replica's operator), it shows nothing. A retry presents the same API key (a claim
//! belongs to one key), so every replica can open it.

use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng};
use chacha20poly1305::{Key, XChaCha20Poly1305, XNonce};
use hmac::{Hmac, Mac};
use lizard_store::idempotency::IdempotencyId;
use sha2::Sha256;

/// Starts every sealed answer; what does not start with it was kept before answers were
/// sealed (JSON or nothing) and is replayed as it is until it expires.
const MAGIC: &[u8] = b"lizard-sealed-1\0";
const NONCE_LEN: usize = 24;

/// The key of one idempotent request's answer.
pub struct AnswerKey(Key);

/// A kept answer that does not open: damaged, or not sealed for this key.
#[derive(Debug, thiserror::Error)]
#[error("the kept answer does not open with this request's key")]
pub struct Damaged;

impl AnswerKey {
    /// HMAC-SHA256 of the request's identity under the presented API key.
    pub fn derive(api_key: &str, id: &IdempotencyId) -> Self {
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(api_key.as_bytes()).expect("HMAC takes a key of any length");
        for part in [b"lizard idempotent answer".as_slice(), id.route.as_bytes(), id.idem_key.as_bytes()] {
            mac.update(part);
            mac.update(b"\0");
        }
        AnswerKey(mac.finalize().into_bytes())
    }

    pub fn seal(&self, body: &[u8]) -> Vec<u8> {
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let sealed =
            XChaCha20Poly1305::new(&self.0).encrypt(&nonce, body).expect("XChaCha20-Poly1305 seals any length");
        [MAGIC, nonce.as_slice(), sealed.as_slice()].concat()
    }

    pub fn open(&self, stored: Vec<u8>) -> Result<Vec<u8>, Damaged> {
        let Some(rest) = stored.strip_prefix(MAGIC) else { return Ok(stored) };
        if rest.len() < NONCE_LEN {
            return Err(Damaged);
        }
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        XChaCha20Poly1305::new(&self.0).decrypt(XNonce::from_slice(nonce), sealed).map_err(|_| Damaged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(idem_key: &str) -> IdempotencyId {
        IdempotencyId { key_id: "key_1".into(), route: "POST /v1/sandboxes".into(), idem_key: idem_key.into() }
    }

    #[test]
    fn an_answer_opens_only_with_its_own_api_key_and_request() {
        let body = br#"{"id":"sbx_1","accessToken":"lzt_secret"}"#;
        let key = AnswerKey::derive("lz_first", &id("create-1"));
        let sealed = key.seal(body);
        assert!(!sealed.windows(10).any(|w| w == b"lzt_secret"), "the secret is kept in the clear");
        assert_ne!(sealed, key.seal(body), "a fresh nonce each time");
        assert_eq!(key.open(sealed.clone()).unwrap(), body);
        assert!(AnswerKey::derive("lz_other", &id("create-1")).open(sealed.clone()).is_err(), "another API key");
        assert!(AnswerKey::derive("lz_first", &id("create-2")).open(sealed.clone()).is_err(), "another request");
        let mut damaged = sealed;
        *damaged.last_mut().unwrap() ^= 1;
        assert!(key.open(damaged).is_err());
        assert!(key.open(MAGIC.to_vec()).is_err(), "too short for a nonce");
    }

    #[test]
    fn answers_kept_before_sealing_replay_as_they_are() {
        let key = AnswerKey::derive("lz_first", &id("create-1"));
        assert_eq!(key.open(b"{\"id\":\"sbx_1\"}".to_vec()).unwrap(), b"{\"id\":\"sbx_1\"}");
        assert_eq!(key.open(Vec::new()).unwrap(), b"");
    }
}
