//! The template part of the store: templates pushed by workspaces, their builds, and which
//! file contents (blobs) each workspace has uploaded.
//!
//! Part of [`super::Store`] (a supertrait), kept apart so the template rules read in one
//! place. A template is a name in a workspace; each push is a build with its own node
//! template (`template_ref`), and the template points at its current (last ready) build.
//! Sandboxes record the `template_ref` they run from, which is what keeps an old build's
//! node template alive after a rebuild, and what makes a delete refuse while one runs.

use super::Result;
use async_trait::async_trait;
use lizard_api::templates::{BuildFailure, BuildStatus, BuildStepInfo};

/// A template to create on its first push, or whose row a later push finds by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTemplate {
    pub id: String,
    pub workspace_id: String,
    pub name: String,
    pub description: String,
    /// The recipe's `from`, as written.
    pub base: String,
    pub start_cmd: Option<String>,
    pub created_at: i64,
}

/// A recorded template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateRecord {
    pub id: String,
    pub account_id: String,
    pub workspace_id: String,
    pub name: String,
    pub description: String,
    pub base: String,
    pub start_cmd: Option<String>,
    /// The ready build new sandboxes are created from.
    pub current_build_id: Option<String>,
    /// Its node template.
    pub current_ref: Option<String>,
    /// Bytes its current build added over its base.
    pub layer_bytes: Option<u64>,
    /// The newest build, whatever its status.
    pub latest_build_id: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A build to record (queued).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewBuild {
    pub id: String,
    pub template_ref: String,
    pub created_at: i64,
    /// Builds its workspace may have queued or running at once, this one included.
    pub workspace_limit: u32,
    /// What the build VM costs while the build runs: metered from `created_at` until the
    /// build is finished ([`TemplateStore::finish_build`]), billed to the workspace.
    pub meter: crate::MeterSpec,
}

/// A recorded build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildRecord {
    pub id: String,
    pub template_id: String,
    pub template_name: String,
    pub workspace_id: String,
    pub account_id: String,
    pub status: BuildStatus,
    pub steps: Vec<BuildStepInfo>,
    pub error: Option<BuildFailure>,
    /// The output's last 64 KiB.
    pub log: String,
    /// The event stream as NDJSON (bounded), for followers once the build ended.
    pub events: String,
    pub template_ref: String,
    pub layer_bytes: Option<u64>,
    pub created_at: i64,
    pub finished_at: Option<i64>,
}

/// How a build ended, to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishedBuild {
    pub status: BuildStatus,
    pub steps: Vec<BuildStepInfo>,
    pub error: Option<BuildFailure>,
    pub log: String,
    pub events: String,
    pub layer_bytes: Option<u64>,
    pub finished_at: i64,
    /// On success, what the template now says of itself (from the recipe just built).
    pub description: String,
    pub base: String,
    pub start_cmd: Option<String>,
}

/// How a build status is written in the store.
pub fn build_status_name(status: BuildStatus) -> &'static str {
    match status {
        BuildStatus::Queued => "queued",
        BuildStatus::Running => "running",
        BuildStatus::Ready => "ready",
        BuildStatus::Failed => "failed",
        BuildStatus::Cancelled => "cancelled",
    }
}

/// A stored build status; an unknown one is an error, never a guess.
pub fn parse_build_status(value: &str) -> Result<BuildStatus> {
    match value {
        "queued" => Ok(BuildStatus::Queued),
        "running" => Ok(BuildStatus::Running),
        "ready" => Ok(BuildStatus::Ready),
        "failed" => Ok(BuildStatus::Failed),
        "cancelled" => Ok(BuildStatus::Cancelled),
        other => Err(super::StoreError::UnknownValue { what: "build status", value: other.into() }),
    }
}

#[async_trait]
pub trait TemplateStore: Send + Sync {
    /// Record a queued build of the template `template.name` in its workspace, creating
    /// the template on its first push. Atomically refuses (Conflict) while another build
    /// of it is queued or running, or while the workspace has `build.workspace_limit`
    /// builds queued or running; NotFound when the workspace is gone.
    async fn insert_build(&self, template: &NewTemplate, build: &NewBuild) -> Result<TemplateRecord>;

    /// A template of a workspace by name.
    async fn find_template(&self, workspace_id: &str, name: &str) -> Result<Option<TemplateRecord>>;

    /// The account's templates, by workspace then name.
    async fn list_templates(&self, account_id: &str) -> Result<Vec<TemplateRecord>>;

    /// Any build by id, with its template and account: the caller checks both.
    async fn get_build(&self, build_id: &str) -> Result<Option<BuildRecord>>;

    /// A queued build starts running.
    async fn start_build(&self, build_id: &str) -> Result<()>;

    /// Record a running build's progress (steps and output so far).
    async fn record_progress(&self, build_id: &str, steps: &[BuildStepInfo], log: &str) -> Result<()>;

    /// Record how a build ended; a ready one becomes its template's current build.
    /// Returns the node template of the build it replaced, if any.
    async fn finish_build(&self, build_id: &str, finished: &FinishedBuild) -> Result<Option<String>>;

    /// Mark every queued or running build failed with `error` (a server that stopped
    /// mid-build cannot resume one). Returns their node templates.
    async fn fail_unfinished_builds(&self, error: &BuildFailure, at: i64) -> Result<Vec<String>>;

    /// Delete a template and its builds. Atomically refuses (Conflict) while a build of it
    /// is queued or running, or a live sandbox runs from one of its builds (naming it).
    /// Returns the node templates of its builds that succeeded, to delete on the node.
    async fn delete_template(&self, template_id: &str) -> Result<Vec<String>>;

    /// Whether this node template is kept: a live sandbox runs from it, a tag names its
    /// build, or it is its template's current build.
    async fn template_ref_in_use(&self, template_ref: &str) -> Result<bool>;

    /// Of `sha256`, those this workspace has not uploaded, in the given order.
    async fn missing_blobs(&self, workspace_id: &str, sha256: &[String]) -> Result<Vec<String>>;

    /// Record that this workspace uploaded a content (idempotent).
    async fn insert_blob(&self, workspace_id: &str, sha256: &str, size: u64, at: i64) -> Result<()>;
}
