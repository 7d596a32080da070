//! The node channel's bearer token: HMAC-SHA256(cluster key, node id), hex.
//!
//! Never stored: every replica holds the cluster key (one row of the store) and
//! recomputes a node's credential when it calls the node or checks a node's call. The
//! node keeps its own copy from its join.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// Bytes of a fresh cluster key.
pub const KEY_LEN: usize = 32;

/// The cluster key (secret; `Debug` does not show it).
#[derive(Clone)]
pub struct ClusterKey(Vec<u8>);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(…)")
    }
}

impl ClusterKey {
    /// A key from its stored bytes.
    pub fn new(bytes: Vec<u8>) -> ClusterKey {
        ClusterKey(bytes)
    }

    /// 32 fresh random bytes (offered to the store at first start).
    pub fn generate() -> ClusterKey {
        use rand::RngCore;
        let mut bytes = vec![0u8; KEY_LEN];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        ClusterKey(bytes)
    }

    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// The credential of `node_id`, hex.
    pub fn credential(&self, node_id: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(node_id.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    /// Whether `presented` is `node_id`'s credential, compared in constant time.
    pub fn verify(&self, node_id: &str, presented: &str) -> bool {
        self.credential(node_id).as_bytes().ct_eq(presented.as_bytes()).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_per_node_and_per_key() {
        let key = ClusterKey::new(vec![7; KEY_LEN]);
        let a = key.credential("node_a");
        assert_eq!(a.len(), 64);
        assert_eq!(a, ClusterKey::new(vec![7; KEY_LEN]).credential("node_a"), "any replica recomputes it");
        assert_ne!(a, key.credential("node_b"));
        assert_ne!(a, ClusterKey::new(vec![8; KEY_LEN]).credential("node_a"));
        assert!(key.verify("node_a", &a));
        assert!(!key.verify("node_b", &a), "one node's credential is not another's");
        assert!(!key.verify("node_a", &a[..63]));
        assert!(!key.verify("node_a", ""));
        assert_ne!(ClusterKey::generate().bytes(), ClusterKey::generate().bytes());
        assert!(!format!("{key:?}").contains('7'));
    }
}
