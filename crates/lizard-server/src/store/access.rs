//! Private sandbox URLs: which sandboxes answer through the sandbox-URL proxy only to a
//! request carrying their access token (see [`crate::proxy::access`]). Only the token's
//! hash is stored; a sandbox with no row here has public URLs.

use super::Result;
use async_trait::async_trait;

#[async_trait]
pub trait AccessStore: Send + Sync {
    /// Make `sandbox_id`'s URLs private, answering only to the token whose SHA-256 is
    /// `token_hash`. Call before the sandbox is recorded (its record then never exists
    /// without it).
    async fn set_sandbox_access(&self, sandbox_id: &str, token_hash: &[u8]) -> Result<()>;
    /// The token hash `sandbox_id`'s URLs require; `None`: its URLs are public.
    async fn sandbox_access(&self, sandbox_id: &str) -> Result<Option<Vec<u8>>>;
    /// Give `copy` the same access rule as `source` (a fork's copies answer to the
    /// source's token). Call before the copy is recorded.
    async fn copy_sandbox_access(&self, source: &str, copy: &str) -> Result<()>;
}
