//! What a node must keep on disk but never in plain text: a paused sandbox's environment
//! (it carries API keys — `lizardToken` becomes `LIZARD_API_KEY` — and the user's own
//! secrets) waits in `sandbox.json` for as long as the pause lasts (the operator's
//! retention, days). It is sealed (XChaCha20-Poly1305, a random nonce per write) with a
//! key of the node's own, `<data dir>/seal.key` (owner-only, made at first start), so a
//! sandbox directory that is copied, backed up or read through a path leak shows none of
//! it. Losing the key loses only paused sandboxes' environments: their records no longer
//! open and the node treats them as lost.

use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The key file, in the node's data directory.
const KEY_FILE: &str = "seal.key";
const KEY_LEN: usize = 32;
const NONCE_LEN: usize = 24;

/// Why a sealed value did not open.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("sealed value is not hex")]
    Encoding,
    #[error("sealed value is damaged or was sealed with another key")]
    Damaged,
    #[error("{action}: {cause}")]
    Io { action: String, cause: std::io::Error },
    #[error("{0} holds no {KEY_LEN}-byte key")]
    BadKey(String),
}

/// The node's sealing key.
pub struct SealKey(XChaCha20Poly1305);

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(..)")
    }
}

impl SealKey {
    /// The key in `data_dir`, made (owner-only, written whole before it is used) if
    /// there is none.
    pub fn load_or_create(data_dir: &Path) -> Result<SealKey, SealError> {
        let path = data_dir.join(KEY_FILE);
        let io = |action: &str, source| SealError::Io { action: format!("{action} {}", path.display()), cause: source };
        match std::fs::read(&path) {
            Ok(bytes) => {
                let key: [u8; KEY_LEN] = bytes.try_into().map_err(|_| SealError::BadKey(path.display().to_string()))?;
                return Ok(SealKey(XChaCha20Poly1305::new(&key.into())));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("read", e)),
        }
        let key = XChaCha20Poly1305::generate_key(&mut OsRng);
        // Written under another name and renamed: a crash never leaves half a key.
        let tmp = data_dir.join(format!("{KEY_FILE}.tmp"));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| io("create", e))?;
        file.write_all(&key).and_then(|()| file.sync_all()).map_err(|e| io("write", e))?;
        std::fs::rename(&tmp, &path).map_err(|e| io("rename into", e))?;
        Ok(SealKey(XChaCha20Poly1305::new(&key)))
    }

    /// `plain` sealed, as hex (nonce, then ciphertext and tag).
    pub fn seal(&self, plain: &[u8]) -> String {
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let sealed = self.0.encrypt(&nonce, plain).expect("XChaCha20-Poly1305 seals any input that fits in memory");
        let mut out = nonce.to_vec();
        out.extend(sealed);
        hex::encode(out)
    }

    /// What [`SealKey::seal`] sealed, checked.
    pub fn open(&self, sealed: &str) -> Result<Vec<u8>, SealError> {
        let bytes = hex::decode(sealed).map_err(|_| SealError::Encoding)?;
        if bytes.len() < NONCE_LEN {
            return Err(SealError::Damaged);
        }
        let (nonce, ciphertext) = bytes.split_at(NONCE_LEN);
        self.0.decrypt(XNonce::from_slice(nonce), ciphertext).map_err(|_| SealError::Damaged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_with_their_key_only() {
        let dir = tempfile::tempdir().unwrap();
        let key = SealKey::load_or_create(dir.path()).unwrap();
        let sealed = key.seal(b"LIZARD_API_KEY=lz_secret");
        assert!(!sealed.contains("lz_secret") && !hex::decode(&sealed).unwrap().windows(9).any(|w| w == b"lz_secret"));
        assert_ne!(sealed, key.seal(b"LIZARD_API_KEY=lz_secret"), "a nonce of its own per seal");
        // The same key again from the file.
        let again = SealKey::load_or_create(dir.path()).unwrap();
        assert_eq!(again.open(&sealed).unwrap(), b"LIZARD_API_KEY=lz_secret");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(KEY_FILE)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        let other = SealKey::load_or_create(tempfile::tempdir().unwrap().path()).unwrap();
        assert!(matches!(other.open(&sealed), Err(SealError::Damaged)));
        let mut flipped = hex::decode(&sealed).unwrap();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(matches!(key.open(&hex::encode(flipped)), Err(SealError::Damaged)));
        assert!(matches!(key.open("zz"), Err(SealError::Encoding)));
        assert!(matches!(key.open("00"), Err(SealError::Damaged)));
    }

    #[test]
    fn a_damaged_key_file_is_an_error_not_a_new_key() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(KEY_FILE), b"short").unwrap();
        assert!(matches!(SealKey::load_or_create(dir.path()), Err(SealError::BadKey(_))));
        assert_eq!(std::fs::read(dir.path().join(KEY_FILE)).unwrap(), b"short", "never replaced");
    }
}
