//! The cluster key (read or created at start) and join tokens: minted by an operator
//! (`lzn_…`, shown once, stored as SHA-256), good for a set number of joins (one unless
//! the operator asks for more) until they expire or are revoked. Each join spends one,
//! atomically: a token copied off a machine after its join is worth nothing.

use lizard_api::ids;
use lizard_node_client::ClusterKey;
use lizard_store::{NodeTokenRecord, Store, StoreError};
use rand::RngCore;
use sha2::{Digest, Sha256};

/// What every join token starts with.
pub const TOKEN_PREFIX: &str = "lzn_";
/// Random bytes in a join token (hex in the token).
const TOKEN_BYTES: usize = 24;

/// Why a join token is refused (all answered 401 alike: a caller learns nothing of
/// which tokens exist).
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("not a join token")]
    Malformed,
    #[error("unknown join token")]
    Unknown,
    #[error("this join token was revoked, has expired or was used up")]
    Unusable,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The cluster key every replica derives node credentials from: the stored one, or a new
/// one this start stores (concurrent first starts agree on one).
pub async fn load_key(store: &dyn Store) -> Result<ClusterKey, StoreError> {
    let offered = ClusterKey::generate();
    Ok(ClusterKey::new(store.cluster_key(offered.bytes()).await?))
}

/// SHA-256 of a join token.
pub fn hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// A new join token good for `uses` joins: its stored record and its plaintext (shown once).
pub fn mint(now: i64, ttl_ms: Option<i64>, uses: u32) -> (NodeTokenRecord, String) {
    let mut bytes = [0u8; TOKEN_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let plaintext = format!("{TOKEN_PREFIX}{}", hex::encode(bytes));
    let record = NodeTokenRecord {
        id: ids::new_id("ntk"),
        hash: hash(&plaintext),
        created_at: now,
        expires_at: ttl_ms.map(|ttl| now.saturating_add(ttl)),
        revoked_at: None,
        uses_left: Some(i64::from(uses)),
    };
    (record, plaintext)
}

/// Spend one join of the token `presented` is, at `now`: the token after it.
pub async fn spend(store: &dyn Store, presented: &str, now: i64) -> Result<NodeTokenRecord, TokenError> {
    let body = presented.strip_prefix(TOKEN_PREFIX).ok_or(TokenError::Malformed)?;
    if body.len() != TOKEN_BYTES * 2 || !body.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(TokenError::Malformed);
    }
    let hash = hash(presented);
    match store.use_node_token(&hash, now).await? {
        Some(record) => Ok(record),
        None if store.node_token_by_hash(&hash).await?.is_some() => Err(TokenError::Unusable),
        None => Err(TokenError::Unknown),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lizard_store::sql::SqlStore;
    use lizard_store::ClusterStore;

    #[tokio::test]
    async fn tokens_join_their_number_of_times_until_revoked_or_expired_and_the_key_is_made_once() {
        let store = SqlStore::memory().await.unwrap();
        let (twice, plain) = mint(1_000, None, 2);
        assert!(plain.starts_with(TOKEN_PREFIX) && !plain.contains(&hex::encode(&twice.hash)));
        store.insert_node_token(&twice).await.unwrap();
        let (short, short_plain) = mint(1_000, Some(500), 5);
        store.insert_node_token(&short).await.unwrap();
        assert_eq!(spend(&store, &plain, 2_000).await.unwrap().uses_left, Some(1));
        assert!(matches!(spend(&store, &short_plain, 1_500).await, Err(TokenError::Unusable)), "expired");
        assert_eq!(spend(&store, &short_plain, 1_499).await.unwrap().id, short.id);
        assert!(matches!(spend(&store, "lzn_nope", 0).await, Err(TokenError::Malformed)));
        let (_, unknown) = mint(0, None, 1);
        assert!(matches!(spend(&store, &unknown, 0).await, Err(TokenError::Unknown)));
        let mut listed: Vec<String> = store.list_node_tokens(1_200).await.unwrap().into_iter().map(|t| t.id).collect();
        let mut both = vec![twice.id.clone(), short.id.clone()];
        listed.sort();
        both.sort();
        assert_eq!(listed, both);
        assert_eq!(store.list_node_tokens(1_600).await.unwrap().len(), 1, "expired tokens are not listed");
        // Its second join spends it: a third is refused, and it is no longer listed.
        assert_eq!(spend(&store, &plain, 2_001).await.unwrap().uses_left, Some(0));
        assert!(matches!(spend(&store, &plain, 2_002).await, Err(TokenError::Unusable)));
        assert!(store.list_node_tokens(2_003).await.unwrap().is_empty());
        // Racing joins for one last use: exactly one wins.
        let (last, last_plain) = mint(3_000, None, 1);
        store.insert_node_token(&last).await.unwrap();
        let (a, b) = tokio::join!(spend(&store, &last_plain, 3_001), spend(&store, &last_plain, 3_001));
        assert_eq!(u8::from(a.is_ok()) + u8::from(b.is_ok()), 1);
        store.revoke_node_token(&twice.id, 3_000).await.unwrap();
        assert!(matches!(store.revoke_node_token(&twice.id, 3_002).await, Err(StoreError::NotFound(_))));

        let a = load_key(&store).await.unwrap();
        let b = load_key(&store).await.unwrap();
        assert_eq!(a.bytes(), b.bytes(), "every start reads the one stored key");
        assert_eq!(a.bytes().len(), lizard_node_client::credential::KEY_LEN);
    }
}
