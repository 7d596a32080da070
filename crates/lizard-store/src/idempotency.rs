//! The idempotency part of the store: the first answer to a request sent with an
//! `Idempotency-Key`, per (API key, route, idempotency key), so that a retry gets that
//! answer instead of running the request again. See the server's `idempotency`.

use super::Result;
use async_trait::async_trait;

/// Which stored request: the API key's id, the route (method and path template) and the
/// client's idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyId {
    pub key_id: String,
    pub route: String,
    pub idem_key: String,
}

/// A stored answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredAnswer {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

/// What the store holds for an id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdempotencyEntry {
    /// The first request is still being served.
    InProgress { request_hash: Vec<u8> },
    /// It was answered.
    Done { request_hash: Vec<u8>, answer: StoredAnswer },
}

#[async_trait]
pub trait IdempotencyStore: Send + Sync {
    /// Claim `id` for a request with `request_hash` at `now`: `None` when claimed (serve
    /// it, then [`Self::finish_idempotent`] or [`Self::release_idempotent`]), else what
    /// is there. Entries created before `expired_before` are gone first.
    async fn claim_idempotent(
        &self,
        id: &IdempotencyId,
        request_hash: &[u8],
        now: i64,
        expired_before: i64,
    ) -> Result<Option<IdempotencyEntry>>;
    /// Record the answer of a claimed request.
    async fn finish_idempotent(&self, id: &IdempotencyId, answer: &StoredAnswer) -> Result<()>;
    /// Forget a claim (its request was not served: a retry may run it).
    async fn release_idempotent(&self, id: &IdempotencyId) -> Result<()>;
}
