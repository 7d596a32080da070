//! The control plane's state, behind one trait.
//!
//! Handlers see only [`Store`] (as `Arc<dyn Store>`), never SQL. [`sql::SqlStore`] is its
//! implementation, on SQLite (the embedded default, one file) or PostgreSQL (the state
//! shared by several server replicas), with one SQL text for both; [`open_store`] picks
//! the engine from the `--database` setting ([`database`]).
//! What an implementation must guarantee is written on each method; the ones that check
//! and then write (deletes that must find a thing empty, the first-start bootstrap) are
//! atomic.
//!
//! Every lookup that a client can drive takes the caller's `account_id`, so one account's
//! ids can never reach another's rows, whatever a handler forgets. Scope checks (which of
//! the account's rows a key reaches) are the handlers' job, through the server's `auth`.
//!
//! Timestamps are milliseconds since the Unix epoch.
//!
//! With the `test-support` feature, [`harness`] gives the tests of crates built on the store
//! fresh databases of either engine and [`store_tests!`], and [`fixture`] a seeded
//! in-memory store.

pub mod access;
pub mod billing;
pub mod blob_content;
pub mod cluster;
pub mod database;
#[cfg(any(test, feature = "test-support"))]
pub mod fixture;
#[cfg(any(test, feature = "test-support"))]
pub mod harness;
pub mod idempotency;
pub mod scope;
pub mod services;
pub mod snapshots;
pub mod sql;
pub mod template_tags;
pub mod templates;
#[cfg(test)]
mod tests;
pub mod volumes;

pub use access::{AccessStore, SandboxAccess};
pub use billing::{BillingStore, MeterSpec, MeterState};
pub use blob_content::{BlobContent, BlobContentStore, BLOB_CHUNK_BYTES};
pub use cluster::{ClusterNode, ClusterStore, HeartbeatOutcome, LostNode, NewNode, NodeTokenRecord, GONE_REASON};
pub use idempotency::IdempotencyStore;
pub use lizard_api::{OnTimeout, SandboxState};
pub use services::{InstanceRecord, ServiceBody, ServiceRecord, ServiceStore, VersionRecord};
pub use snapshots::{SnapshotRecord, SnapshotStore};
pub use template_tags::{TagRecord, TemplateTagStore};

use async_trait::async_trait;
pub use scope::Scope;
use std::collections::BTreeMap;
pub use templates::{BuildRecord, FinishedBuild, NewBuild, NewTemplate, TemplateRecord, TemplateStore};
pub use volumes::{NewVolume, NodeLoad, NodeRecord, VolumeRecord, VolumeStore};

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No such row in this account.
    #[error("{0} not found")]
    NotFound(String),
    /// A uniqueness rule was broken (duplicate name or slug, duplicate id).
    #[error("{0}")]
    Conflict(String),
    /// A quota has no room for what was asked.
    #[error("{0}")]
    OverQuota(String),
    /// Something still lives inside what was to be deleted.
    #[error("{0}")]
    NotEmpty(String),
    /// The database holds a schema newer than this build knows: refuse rather than guess.
    #[error("database schema version {found} is newer than this build's {known}; upgrade lizard")]
    SchemaTooNew { found: i64, known: i64 },
    /// A column holds a value this build does not know (a sandbox state, an on-timeout
    /// policy): refuse rather than guess.
    #[error("the database holds an unknown {what}: {value:?}")]
    UnknownValue { what: &'static str, value: String },
    /// The database cannot be reached now (connection refused or lost, pool exhausted, the
    /// server shutting down): worth a retry.
    #[error("database unavailable: {0}")]
    Unavailable(Box<dyn std::error::Error + Send + Sync>),
    /// The database failed.
    #[error("database: {0}")]
    Backend(Box<dyn std::error::Error + Send + Sync>),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Open the store that `database` (the `--database` setting, see [`database::Database`])
/// names: SQLite in `data_dir` when absent. A URL's password shows in no error.
pub async fn open_store(database: Option<&str>, data_dir: &std::path::Path) -> Result<std::sync::Arc<dyn Store>> {
    use database::Database;
    let chosen = Database::parse(database).map_err(|e| StoreError::Backend(Box::new(e)))?;
    Ok(match chosen {
        Database::DataDir => std::sync::Arc::new(sql::SqlStore::open_sqlite(data_dir).await?),
        Database::SqliteFile(path) => std::sync::Arc::new(sql::SqlStore::open_sqlite_file(&path).await?),
        Database::Postgres(url) => std::sync::Arc::new(sql::SqlStore::open_postgres(&url).await?),
    })
}

/// An account: owns workspaces and keys, and is billed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountRecord {
    pub id: String,
    pub email: String,
    pub plan: String,
    pub created_at: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceRecord {
    pub id: String,
    pub account_id: String,
    pub name: String,
    pub slug: String,
    pub created_at: i64,
    /// GiB of volumes it may hold (see [`volumes::check_quota`]); None: its account's
    /// quota alone.
    pub volume_quota_gb: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectRecord {
    pub id: String,
    pub workspace_id: String,
    pub name: String,
    pub slug: String,
    pub created_at: i64,
}

/// An API key as stored: never the plaintext.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    pub id: String,
    pub account_id: String,
    pub name: String,
    /// Lookup prefix (`lz_` + 8 characters), see the server's `keys`.
    pub prefix: String,
    /// SHA-256 of the key.
    pub hash: Vec<u8>,
    /// `None`: unscoped.
    pub scope: Option<Scope>,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

/// A sandbox to record (the sandbox routes insert it when they start one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSandbox {
    pub id: String,
    pub project_id: String,
    pub template: String,
    /// The state its meter opens in.
    pub state: SandboxState,
    pub created_at: i64,
    pub timeout_at: Option<i64>,
    pub metadata: BTreeMap<String, String>,
    /// What it costs; its meter opens at `created_at` in `state`.
    pub meter: MeterSpec,
    /// What the timeout does.
    pub on_timeout: OnTimeout,
    /// The lifetime it was given (a resume gives it again).
    pub timeout_ms: Option<i64>,
    /// The node template of a pushed template's build it runs from (`None`: a built-in).
    pub template_ref: Option<String>,
    /// The node that runs it (every later operation routes by it).
    pub node_id: String,
}

/// A recorded sandbox, with where it lives (for scope checks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRecord {
    pub id: String,
    pub account_id: String,
    pub workspace_id: String,
    pub project_id: String,
    pub template: String,
    pub state: SandboxState,
    pub created_at: i64,
    pub timeout_at: Option<i64>,
    pub ended_at: Option<i64>,
    pub end_reason: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub on_timeout: OnTimeout,
    pub timeout_ms: Option<i64>,
    /// The node template of a pushed template's build (`None`: a built-in).
    pub template_ref: Option<String>,
    /// The node that runs it (rows older than the cluster migration: the in-process node).
    pub node_id: String,
}

/// How a sandbox state is written in the store.
pub fn sandbox_state_name(state: SandboxState) -> &'static str {
    match state {
        SandboxState::Running => "running",
        SandboxState::Paused => "paused",
        SandboxState::Ended => "ended",
    }
}

/// A stored sandbox state; an unknown one is an error, never a guess.
pub fn parse_sandbox_state(value: &str) -> Result<SandboxState> {
    match value {
        "running" => Ok(SandboxState::Running),
        "paused" => Ok(SandboxState::Paused),
        "ended" => Ok(SandboxState::Ended),
        other => Err(StoreError::UnknownValue { what: "sandbox state", value: other.into() }),
    }
}

/// How an on-timeout policy is written in the store.
pub fn on_timeout_name(policy: OnTimeout) -> &'static str {
    match policy {
        OnTimeout::Kill => "kill",
        OnTimeout::Pause => "pause",
    }
}

/// A stored on-timeout policy; an unknown one is an error, never a guess.
pub fn parse_on_timeout(value: &str) -> Result<OnTimeout> {
    match value {
        "kill" => Ok(OnTimeout::Kill),
        "pause" => Ok(OnTimeout::Pause),
        other => Err(StoreError::UnknownValue { what: "on-timeout policy", value: other.into() }),
    }
}

impl SandboxRecord {
    pub fn is_live(&self) -> bool {
        self.ended_at.is_none()
    }
}

/// Which sandboxes [`Store::list_sandboxes`] returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxFilter {
    pub workspace_id: Option<String>,
    pub project_id: Option<String>,
    /// Also ended ones (history); default: live only.
    pub include_ended: bool,
}

/// What a delete removed that the rest of the system must act on: the live sandboxes
/// whose rows went with it (their VMs are still running until a server's `SandboxReaper`
/// kills them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removed {
    pub live_sandboxes: Vec<SandboxRecord>,
    /// Volumes whose records went with it: their disks are still on their nodes until
    /// the server's `SandboxReaper` deletes them.
    pub volumes: Vec<VolumeRecord>,
    /// Node templates of the builds of templates that went with it: still on the node
    /// until the server's `SandboxReaper` deletes them.
    pub template_refs: Vec<String>,
}

/// The control plane's persistent state. Object-safe: handlers hold `Arc<dyn Store>`.
/// Billing (the ledger, the meters) is its [`BillingStore`] half.
#[async_trait]
pub trait Store:
    VolumeStore
    + TemplateStore
    + BillingStore
    + IdempotencyStore
    + AccessStore
    + ClusterStore
    + BlobContentStore
    + ServiceStore
    + SnapshotStore
    + TemplateTagStore
    + Send
    + Sync
    + 'static
{
    // --- accounts -------------------------------------------------------------------

    /// First start: insert `account` and its first `key` in one transaction, but only if
    /// the store has no account yet. Returns whether it did. Two servers starting on one
    /// database at once bootstrap once.
    async fn bootstrap(&self, account: &AccountRecord, key: &KeyRecord) -> Result<bool>;

    async fn get_account(&self, account_id: &str) -> Result<Option<AccountRecord>>;

    // --- workspaces -----------------------------------------------------------------

    /// Conflict when the account already has a workspace with this name or slug.
    async fn insert_workspace(&self, workspace: &WorkspaceRecord) -> Result<()>;

    async fn get_workspace(&self, account_id: &str, workspace_id: &str) -> Result<Option<WorkspaceRecord>>;
    /// Set (or lift, with None) a workspace's volume quota; the workspace as it is now.
    async fn set_workspace_volume_quota(
        &self,
        account_id: &str,
        workspace_id: &str,
        quota_gb: Option<u32>,
    ) -> Result<WorkspaceRecord>;

    /// Oldest first.
    async fn list_workspaces(&self, account_id: &str) -> Result<Vec<WorkspaceRecord>>;

    /// Delete a workspace. Without `force`, atomically refuse ([`StoreError::NotEmpty`])
    /// while any project (and so any sandbox or volume) remains. With `force`, delete it
    /// and everything inside in one transaction, and return the live sandboxes removed.
    async fn delete_workspace(&self, account_id: &str, workspace_id: &str, force: bool) -> Result<Removed>;

    // --- projects -------------------------------------------------------------------

    /// Conflict when the workspace already has a project with this name or slug;
    /// NotFound when the workspace is not the account's.
    async fn insert_project(&self, account_id: &str, project: &ProjectRecord) -> Result<()>;

    async fn get_project(&self, account_id: &str, project_id: &str) -> Result<Option<ProjectRecord>>;

    /// The account's projects (of one workspace when given), oldest first.
    async fn list_projects(&self, account_id: &str, workspace_id: Option<&str>) -> Result<Vec<ProjectRecord>>;

    /// Rename (the slug stays). Conflict on a duplicate name in the workspace.
    async fn rename_project(&self, account_id: &str, project_id: &str, name: &str) -> Result<ProjectRecord>;

    /// Delete a project; atomically refuse ([`StoreError::NotEmpty`]) while a live
    /// sandbox or a volume remains. Ended sandboxes' rows go with it.
    async fn delete_project(&self, account_id: &str, project_id: &str) -> Result<()>;

    // --- api keys -------------------------------------------------------------------

    async fn insert_key(&self, key: &KeyRecord) -> Result<()>;

    /// Keys (revoked ones too) with this lookup prefix, across accounts: authentication
    /// does not know the account yet.
    async fn keys_by_prefix(&self, prefix: &str) -> Result<Vec<KeyRecord>>;

    /// The hashes of the keys (revoked ones too) created at or after `since` (ms), across
    /// accounts: what the server's in-memory `key_index` reads.
    async fn key_hashes_since(&self, since: i64) -> Result<Vec<Vec<u8>>>;

    /// A key of the account that is not revoked.
    async fn get_key(&self, account_id: &str, key_id: &str) -> Result<Option<KeyRecord>>;

    /// The account's keys that are not revoked, oldest first.
    async fn list_keys(&self, account_id: &str) -> Result<Vec<KeyRecord>>;

    /// Revoke a key now: from the next request on it authenticates nothing. Refuses
    /// ([`StoreError::Conflict`]) to revoke the account's last unscoped key, which would
    /// lock the account out for good. NotFound for an unknown or already revoked key.
    async fn revoke_key(&self, account_id: &str, key_id: &str, at: i64) -> Result<()>;

    // --- sandboxes ------------------------------------------------------------------

    /// Record a sandbox. NotFound when the project does not exist (deleted meanwhile:
    /// the caller must then kill what it started).
    async fn insert_sandbox(&self, sandbox: &NewSandbox) -> Result<()>;

    /// Any sandbox by id, with its account: the caller checks the account and scope.
    async fn get_sandbox(&self, sandbox_id: &str) -> Result<Option<SandboxRecord>>;

    /// The account's sandboxes, filtered; when `scope` is given only those it reaches.
    /// Oldest first.
    async fn list_sandboxes(
        &self,
        account_id: &str,
        scope: Option<&Scope>,
        filter: &SandboxFilter,
    ) -> Result<Vec<SandboxRecord>>;

    /// Record a state change. Atomically bills the sandbox's meter up to now in the old
    /// state and meters the new one from now.
    async fn set_sandbox_state(&self, sandbox_id: &str, state: SandboxState) -> Result<()>;

    async fn set_sandbox_timeout(&self, sandbox_id: &str, timeout_at: Option<i64>) -> Result<()>;

    /// Mark a sandbox ended (killed, timed out, lost), and detach the volume it held.
    /// Returns false when it had already ended (the first reason wins). Atomically bills
    /// its meter up to `at` and closes it.
    async fn end_sandbox(&self, sandbox_id: &str, at: i64, reason: &str) -> Result<bool>;

    /// Live sandboxes of every account whose timeout is at or before `now`.
    async fn sandboxes_due(&self, now: i64) -> Result<Vec<SandboxRecord>>;
}
