//! Templates and their builds: what `lizard push` sends, what a build reports as it goes,
//! and how templates are listed.
//!
//! A push is three calls: `POST /v1/templates/blobs/missing` with the content hashes of the
//! pushed directory (the answer names those the server lacks for this workspace), one
//! `PUT /v1/templates/blobs/{sha256}` per missing file, then `POST /v1/templates` with the
//! recipe and the directory's manifest, which starts the build. The build's events are
//! read from `GET /v1/templates/{name}/builds/{buildId}/events` (newline-delimited JSON,
//! from the first event, following the build until it ends).

use serde::{Deserialize, Serialize};

/// How the recipe text of a push is written.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RecipeFormat {
    /// `lizard.template.toml`.
    #[default]
    Toml,
    /// The Dockerfile subset (`FROM <lizard template>`, RUN, COPY, ENV, WORKDIR, USER, CMD).
    Dockerfile,
}

/// One path of the pushed directory (the manifest; `lizard_recipe::Entry` on the wire).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContextEntry {
    /// Relative, `/`-separated.
    pub path: String,
    /// Permission bits.
    pub mode: u32,
    /// `file`, `dir` or `symlink`.
    #[serde(rename = "type")]
    pub kind: ContextEntryKind,
    /// SHA-256 (hex) of a file's content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// A file's size in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// A symlink's target, as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ContextEntryKind {
    File,
    Dir,
    Symlink,
}

/// The manifest as the recipe crate sees it (feature `recipe`): what a scan is sent as,
/// and what the server checks.
#[cfg(feature = "recipe")]
mod manifest {
    use super::{ContextEntry, ContextEntryKind};
    use lizard_recipe::{Entry, EntryKind};

    impl From<&Entry> for ContextEntry {
        fn from(e: &Entry) -> ContextEntry {
            let (kind, sha256, size, target) = match &e.kind {
                EntryKind::File { sha256, size } => (ContextEntryKind::File, Some(sha256.clone()), Some(*size), None),
                EntryKind::Dir => (ContextEntryKind::Dir, None, None, None),
                EntryKind::Symlink { target, .. } => (ContextEntryKind::Symlink, None, None, Some(target.clone())),
            };
            ContextEntry { path: e.path.clone(), mode: e.mode, kind, sha256, size, target }
        }
    }

    impl ContextEntry {
        /// The recipe crate's entry, or what the wire entry lacks. A symlink's `inside`
        /// is left false: `Context::from_manifest` works it out again, never trusting a
        /// client's word.
        pub fn to_entry(&self) -> Result<Entry, &'static str> {
            let kind = match self.kind {
                ContextEntryKind::File => EntryKind::File {
                    sha256: self.sha256.clone().ok_or("a file needs sha256")?,
                    size: self.size.ok_or("a file needs size")?,
                },
                ContextEntryKind::Dir => EntryKind::Dir,
                ContextEntryKind::Symlink => {
                    EntryKind::Symlink { target: self.target.clone().ok_or("a symlink needs target")?, inside: false }
                }
            };
            Ok(Entry { path: self.path.clone(), mode: self.mode, kind })
        }
    }
}

/// A template build as the control plane hands it to a node (feature `recipe`): a
/// checked recipe over an uploaded directory.
#[cfg(feature = "recipe")]
#[derive(Debug, Clone)]
pub struct BuildTemplate {
    /// The node's name for the result; sandboxes of it are created with
    /// `CreateSandboxRequest { template: template_ref, .. }`. Unique per build, chosen by
    /// the caller: `[a-z0-9-]{1,64}`, never a built-in name (the server uses
    /// `tb-<build id>`).
    pub template_ref: String,
    /// The user-facing name, for logs and the event stream only.
    pub display_name: String,
    pub recipe: lizard_recipe::Recipe,
    /// `recipe.from` resolved by the caller to a node template: a built-in name or an
    /// earlier `template_ref`.
    pub base_ref: String,
    pub context: lizard_recipe::Context,
    /// Directory holding each context file's content at `<blobs>/<sha256>` (hex).
    pub blobs: std::path::PathBuf,
}

/// A template a node built and registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltTemplate {
    pub template_ref: String,
    pub steps: Vec<BuildStepInfo>,
    /// Bytes of the layers this template added over its base.
    pub layer_bytes: u64,
}

/// `POST /v1/templates/blobs/missing`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MissingBlobsRequest {
    /// SHA-256 (hex) of each file the push would send.
    pub sha256: Vec<String>,
}

/// The answer to [`MissingBlobsRequest`]: the hashes to upload.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MissingBlobs {
    pub missing: Vec<String>,
}

/// `POST /v1/templates`: build a template from a recipe and an uploaded directory.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PushTemplateRequest {
    /// The recipe file's text.
    pub recipe: String,
    #[serde(default)]
    pub format: RecipeFormat,
    /// The template's name; required for a Dockerfile, overrides the recipe's `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The pushed directory; every file's content must have been uploaded.
    #[serde(default)]
    pub files: Vec<ContextEntry>,
    /// The workspace the template belongs to (id, slug or name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// A project (id, slug or name) whose workspace the template belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
}

/// Where a build stands.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BuildStatus {
    Queued,
    Running,
    Ready,
    Failed,
    Cancelled,
}

impl BuildStatus {
    pub fn is_final(self) -> bool {
        matches!(self, BuildStatus::Ready | BuildStatus::Failed | BuildStatus::Cancelled)
    }
}

/// One step of a build, as far as it got.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BuildStepInfo {
    /// 1-based, in recipe order.
    pub index: u32,
    /// The step as a line (`apt jq ripgrep`, `run make`, `copy tools/ → /opt/tools/`).
    pub description: String,
    /// Its layer came from the cache: it did not run.
    pub cached: bool,
    pub status: BuildStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}

/// Why a build failed.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BuildFailure {
    /// A stable code: `STEP_FAILED`, `TIMED_OUT`, `START_NOT_READY`, `CANCELLED`, `INTERNAL`,
    /// `BLOB_UNAVAILABLE` (a pushed file could not be fetched from the store: push again),
    /// or a node's refusal (`UNAVAILABLE`, `NOT_FOUND`, …).
    pub code: String,
    pub message: String,
    /// The step that failed (1-based), if a step did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
    /// The last lines the failing command printed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tail: Option<String>,
}

/// A build of a template.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TemplateBuildInfo {
    pub build_id: String,
    pub template: String,
    pub status: BuildStatus,
    pub steps: Vec<BuildStepInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<BuildFailure>,
    /// RFC 3339.
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// The build's output so far (the last 64 KiB).
    #[serde(default)]
    pub log: String,
}

/// A template as the API lists it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TemplateInfo {
    pub name: String,
    pub description: String,
    /// Built into Lizard (visible to every key) rather than pushed by a workspace.
    pub builtin: bool,
    /// The workspace that pushed it; none for built-ins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_id: Option<String>,
    /// The template it was built from (`from`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Whether sandboxes can be created from it (a build has succeeded).
    pub ready: bool,
    /// The build sandboxes are created from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_id: Option<String>,
    /// The newest build (which may still be running or have failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_build_id: Option<String>,
    /// The command every sandbox of it starts with, already running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_cmd: Option<String>,
    /// Bytes on disk of its own layers (what it adds over its base).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
}

/// One line of a build's event stream (`…/builds/{buildId}/events`, NDJSON).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum BuildEvent {
    /// A step begins (or is taken from the cache, `cached`).
    #[serde(rename_all = "camelCase")]
    Step { index: u32, total: u32, description: String, cached: bool },
    /// Output of the running step (or of the start command).
    #[serde(rename_all = "camelCase")]
    Output { stream: OutputStream, data: String },
    /// A step ended well.
    #[serde(rename_all = "camelCase")]
    StepDone { index: u32, duration_ms: u64 },
    /// Something the builder does between steps (booting the build VM, starting the start
    /// command, saving the snapshot).
    #[serde(rename_all = "camelCase")]
    Phase { message: String },
    /// The build ended; always the last event.
    #[serde(rename_all = "camelCase")]
    Done {
        status: BuildStatus,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<BuildFailure>,
    },
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OutputStream {
    Stdout,
    Stderr,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_tagged_camel_case_lines() {
        let e = BuildEvent::StepDone { index: 2, duration_ms: 5 };
        assert_eq!(serde_json::to_string(&e).unwrap(), r#"{"type":"stepDone","index":2,"durationMs":5}"#);
        let done: BuildEvent = serde_json::from_str(
            r#"{"type":"done","status":"failed","error":{"code":"STEP_FAILED","message":"m","step":3}}"#,
        )
        .unwrap();
        assert!(matches!(
            done,
            BuildEvent::Done { status: BuildStatus::Failed, error: Some(BuildFailure { step: Some(3), .. }) }
        ));
    }

    #[test]
    fn a_push_rejects_unknown_fields_and_defaults_to_toml() {
        let p: PushTemplateRequest = serde_json::from_str(r#"{"recipe":"x"}"#).unwrap();
        assert_eq!((p.format, p.files.len()), (RecipeFormat::Toml, 0));
        assert!(serde_json::from_str::<PushTemplateRequest>(r#"{"recipe":"x","extra":1}"#).is_err());
    }
}
