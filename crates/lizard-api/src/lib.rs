//! The types of Lizard's HTTP API. No machinery here: the node, the server, the CLI and
//! the Rust client all speak these, so a field means the same thing everywhere.
//!
//! JSON is camelCase, like the SDK reference. Request bodies reject unknown fields.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub mod cluster;
pub mod network;
pub mod node_api;

pub use lizard_agent_proto::types::{
    ArchiveResult, ExitStatus, FileEntry, FileInfo, FileType, FsEvent, FsEventKind, WriteResult,
};

pub mod code;
pub mod files;
pub mod ids;
pub mod processes;
pub mod routes;
pub mod services;
pub mod templates;

pub use files::{FileExists, FileMode, InvalidFileMode};

/// `POST /v1/sandboxes`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateSandboxRequest {
    pub template: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u32>,
    /// Environment for every process started in the sandbox.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// Whether destinations in neither `allowOut` nor `denyOut` are reachable (default
    /// true). Private, link-local and loopback ranges, other sandboxes and the host are
    /// never reachable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_internet_access: Option<bool>,
    /// CIDRs or domain names (`registry.example`, `*.example`) reachable even without
    /// internet access (never an address the platform denies).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_out: Vec<String>,
    /// CIDRs or domain names never reachable; wins over `allowOut`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_out: Vec<String>,
    /// Id of a volume on this node to mount at `/workspace` (one sandbox at a time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    /// Start from this sandbox snapshot of the node instead of `template`: its processes,
    /// memory, files, shape and environment (`env` is added to it); the network fields
    /// replace its policy when any is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

impl CreateSandboxRequest {
    pub fn network_policy(&self) -> network::NetworkPolicy {
        network::NetworkPolicy {
            allow_internet_access: self.allow_internet_access,
            allow_out: self.allow_out.clone(),
            deny_out: self.deny_out.clone(),
        }
    }
}

/// Lifecycle state of a sandbox.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    Running,
    Paused,
    /// Killed, timed out or its VM stopped: only a record (usage, history) shows it.
    Ended,
}

/// A sandbox as the API shows it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxInfo {
    pub sandbox_id: String,
    pub template: String,
    pub state: SandboxState,
    pub vcpus: u32,
    pub memory_mib: u32,
    /// RFC 3339.
    pub started_at: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// The project it runs in and is billed to (control plane only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    /// When the sandbox will be killed unless its timeout is changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_at: Option<String>,
    /// Suffix of its public hosts: port P is served at `{sandboxId}-{P}.{domain}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// The directory its processes start in when they name none (its template's), if
    /// the template sets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// Only in the answer to a create with `publicUrls: false` (shown once, stored hashed):
    /// the token every request to its URLs must carry, in the `X-Lizard-Access-Token`
    /// header or the `lizardAccessToken` query parameter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_token: Option<String>,
}

/// `POST /v1/sandboxes` on the control plane.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewSandboxRequest {
    pub template: String,
    /// The project by id, slug or name (one of `project` or `projectId` is required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// The project's exact id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    /// Lifetime from now; the sandbox is killed (or paused, see `onTimeout`) when it
    /// passes (default 5 minutes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// What happens when the timeout passes: `kill` (default) or `pause`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<OnTimeout>,
    /// Environment for every process in the sandbox.
    #[serde(default, alias = "envs", skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// An API key placed in the sandbox as `LIZARD_API_KEY`, for the CLI inside.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lizard_token: Option<String>,
    /// Default: the template's `[sandbox] vcpus`, else 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u32>,
    /// Default: the template's `[sandbox] memory_mib`, else 512.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u32>,
    /// Whether destinations in neither `allowOut` nor `denyOut` are reachable (default
    /// true). Private, link-local and loopback ranges, other sandboxes and the host are
    /// never reachable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_internet_access: Option<bool>,
    /// CIDRs or domain names (`registry.example`, `*.example`) reachable even without
    /// internet access (never an address the platform denies).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_out: Vec<String>,
    /// CIDRs or domain names never reachable; wins over `allowOut`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_out: Vec<String>,
    /// A volume of the sandbox's project (by name or id) to mount at `/workspace`. The
    /// sandbox then runs on the volume's node, in its region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_name: Option<String>,
    /// Whether anyone may use the sandbox's URLs (default true). `false`: every request
    /// through them must carry the access token the create answers with (`accessToken`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_urls: Option<bool>,
}

impl NewSandboxRequest {
    pub fn network_policy(&self) -> network::NetworkPolicy {
        network::NetworkPolicy {
            allow_internet_access: self.allow_internet_access,
            allow_out: self.allow_out.clone(),
            deny_out: self.deny_out.clone(),
        }
    }
}

/// What a sandbox's timeout does.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OnTimeout {
    /// Kill the sandbox: everything in it is gone.
    #[default]
    Kill,
    /// Pause it: processes, memory and files wait on disk for a resume.
    Pause,
}

/// `POST /v1/sandboxes/{id}/fork`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ForkRequest {
    /// How many copies (1..=16).
    #[serde(default = "one")]
    pub count: u32,
}

fn one() -> u32 {
    1
}

/// `POST /v1/sandboxes/{id}/timeout`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetTimeoutRequest {
    /// New lifetime, counted from now.
    pub timeout_ms: u64,
}

/// `POST /v1/sandboxes/{id}/signed-urls`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SignUrlRequest {
    /// The sandbox port the URL reaches (1–65535).
    pub port: u16,
    /// How long the URL works, in seconds (1 to 604800, a week; 3600 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_seconds: Option<u64>,
}

/// A URL to a sandbox's port that carries its own proof: `http(s)://{host}{path}?{query}`
/// works without the access token until `expiresAt`. The first request through it also
/// sets a cookie for that host, so the page's own later requests work too.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SignedUrl {
    /// `{sandboxId}-{port}.{domain}`.
    pub host: String,
    /// The query parameters to add to any path on that host (empty for a sandbox whose
    /// URLs are public: it needs no proof).
    pub query: String,
    /// RFC 3339; absent for a sandbox whose URLs are public.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

/// `POST /v1/sandboxes/{id}/exec`. Exactly one of `cmd` (run by `/bin/sh -c`) or `argv`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Text fed to the command's stdin (then EOF). Absent: stdin is /dev/null.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
}

/// Result of a buffered exec (the SDKs' ProcessResult). Output is UTF-8 (lossy); use the
/// streaming form for exact bytes.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ProcessResult {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i32,
    #[serde(default)]
    pub timed_out: bool,
}

/// Stable error codes. The HTTP status is part of the contract too: see [`ErrorCode::status`].
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    InvalidArgument,
    Unauthenticated,
    Forbidden,
    NotFound,
    Conflict,
    /// A guest did not become ready in time, or the VMM failed.
    BootFailed,
    /// Nothing in the sandbox accepts connections on that port: 502.
    PortClosed,
    Unavailable,
    Internal,
    /// The route is account-wide (billing, account usage, account details) and the key is
    /// scoped to workspaces or projects: 403.
    AccountScopeRequired,
    /// Too many requests from this key; retry after the `Retry-After` seconds: 429.
    RateLimited,
    /// The account's balance is used up: creating or resuming sandboxes is refused until
    /// credits are added: 402.
    PaymentRequired,
    /// The sandbox runs no code service (its template is not `interpreter` or built from
    /// it), or the service stopped answering: 502.
    CodeServiceUnavailable,
    /// A non-streamed exec's output (stdout + stderr) passed the server's cap (16 MiB):
    /// run it with `?stream=true`, which has no cap. 422.
    OutputTooLarge,
    /// An `Idempotency-Key` was used before with another request (route or body): 422.
    IdempotencyKeyReused,
    /// What the request waited for (a port to listen) did not happen within its
    /// `timeoutMs`: 408.
    TimedOut,
    /// The account's or workspace's disk quota has no room for the volume asked for: 403.
    QuotaExceeded,
}

impl ErrorCode {
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::InvalidArgument => 422,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::Conflict => 409,
            ErrorCode::BootFailed => 502,
            ErrorCode::PortClosed => 502,
            ErrorCode::Unavailable => 503,
            ErrorCode::Internal => 500,
            ErrorCode::AccountScopeRequired => 403,
            ErrorCode::RateLimited => 429,
            ErrorCode::PaymentRequired => 402,
            ErrorCode::CodeServiceUnavailable => 502,
            ErrorCode::OutputTooLarge => 422,
            ErrorCode::IdempotencyKeyReused => 422,
            ErrorCode::TimedOut => 408,
            ErrorCode::QuotaExceeded => 403,
        }
    }
}

/// Body of every error response.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError { code, message: message.into() }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let code = serde_json::to_value(self.code).ok();
        let code = code.as_ref().and_then(|c| c.as_str()).unwrap_or("ERROR");
        write!(f, "{code}: {}", self.message)
    }
}

impl std::error::Error for ApiError {}

pub mod billing;
pub mod tenancy;
pub use billing::*;
pub use tenancy::*;
pub mod volumes;
pub use volumes::{CreateVolumeRequest, Volume, DEFAULT_VOLUME_SIZE_GB, MAX_VOLUME_SIZE_GB};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_rejects_unknown_fields_and_is_camel_case() {
        assert!(serde_json::from_str::<CreateSandboxRequest>(r#"{"template":"base","x":1}"#).is_err());
        let r: CreateSandboxRequest = serde_json::from_str(r#"{"template":"base","memoryMib":256}"#).unwrap();
        assert_eq!(r.memory_mib, Some(256));
        let r: CreateSandboxRequest =
            serde_json::from_str(r#"{"template":"base","allowInternetAccess":false,"allowOut":["203.0.113.0/24"]}"#)
                .unwrap();
        let p = r.network_policy().parse().unwrap();
        assert!(!p.allow_internet_access);
        assert_eq!(p.allow_out[0].to_string(), "203.0.113.0/24");
    }

    #[test]
    fn error_display_uses_stable_code() {
        let e = ApiError::new(ErrorCode::NotFound, "sandbox x not found");
        assert_eq!(e.to_string(), "NOT_FOUND: sandbox x not found");
        assert_eq!(e.code.status(), 404);
        assert_eq!(serde_json::to_string(&e).unwrap(), r#"{"code":"NOT_FOUND","message":"sandbox x not found"}"#);
    }
}
