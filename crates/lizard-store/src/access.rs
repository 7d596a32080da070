//! Sandbox access tokens: which sandboxes answer through the sandbox-URL proxy only to a
//! request carrying their access token (see the server's `proxy::access`), and which have a
//! token with public URLs (E2B's sandboxes: their envd and traffic tokens derive from
//! it). Only the token's hash is stored; a sandbox with no row here has public URLs and
//! no token.

use super::Result;
use async_trait::async_trait;

/// A sandbox's access rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxAccess {
    /// SHA-256 of its access token.
    pub token_hash: Vec<u8>,
    /// Its URLs answer without the token.
    pub urls_public: bool,
    /// A request to its URLs resumes it when paused (E2B's `autoResume`).
    pub resume_on_request: bool,
}

#[async_trait]
pub trait AccessStore: Send + Sync {
    /// Give `sandbox_id` the rule `access`. Call before the sandbox is recorded (its
    /// record then never exists without it).
    async fn set_sandbox_access(&self, sandbox_id: &str, access: &SandboxAccess) -> Result<()>;
    /// `sandbox_id`'s access rule; `None`: no token, public URLs.
    async fn sandbox_access(&self, sandbox_id: &str) -> Result<Option<SandboxAccess>>;
    /// Give `copy` the same access rule as `source` (a fork's copies answer to the
    /// source's token). Call before the copy is recorded.
    async fn copy_sandbox_access(&self, source: &str, copy: &str) -> Result<()>;
}
