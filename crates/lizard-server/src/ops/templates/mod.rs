//! Templates pushed by workspaces: uploads of the pushed files, a push (checked in full
//! before anything is built, then built in the background on a node), a template's
//! delete, and what a sandbox of a pushed template is created from. Which workspace a
//! call is about is [`scope`]'s; a build's run, cancel and end are [`build`]'s; how the
//! API shows them is [`answers`]'s.
//!
//! A push checks, in order: the recipe (syntax and every field), the name (not a
//! built-in's: 409), the base (a built-in or a ready template of the same workspace, else
//! 404 naming it), the directory's manifest (normalized, within the size limits: 422),
//! that every file's content was uploaded by this workspace (422 naming the path), and
//! that each `copy` takes only what lies inside the directory (422). Only then is a build
//! recorded (one at a time per template: 409) and started.
//!
//! Each build gets its own node template, `tb-<build id>`; a successful one becomes its
//! template's current build, so new sandboxes use it while running ones keep theirs. The
//! node template a rebuild replaced is deleted at once when no sandbox runs from it, and
//! every one left is deleted with the template.

mod answers;
mod build;
mod refs;
mod scope;
pub mod tags;

pub use answers::{build_info, builtin_info, template_info};
pub use build::{cancel, fail_unfinished};
pub use refs::delete_node_template;
pub use scope::{find, find_build, target_workspace, visible_workspaces};

use crate::blobs::{self, BlobError};
use crate::error::{ApiResult, AppError};
use crate::shared_blobs::{self, SharedBlobError};
use crate::state::AppState;
use lizard_api::ids;
use lizard_api::templates::{BuildFailure, ContextEntry, PushTemplateRequest, RecipeFormat};
use lizard_node_client::{BuildTemplate, BuiltinTemplate};
use lizard_recipe::{Base, Context, ContextLimits, Entry, EntryKind, Recipe, Step};
use lizard_store::{BuildRecord, NewBuild, NewTemplate, ProjectRecord, StoreError, TemplateRecord, WorkspaceRecord};

/// Largest file a push may upload.
pub const MAX_BLOB_BYTES: u64 = 512 << 20;

/// Names a template may not have: they would read as another route.
pub const RESERVED_NAMES: &[&str] = &["blobs"];

/// Prefix of the templates that hold services' versions ([`crate::ops::services`]); a
/// push may not use it.
pub const SERVICE_TEMPLATE_PREFIX: &str = "svc-";

/// Prefix of build ids; the node template of a build is `tb-` and the rest.
pub const BUILD_ID_PREFIX: &str = "bld";

/// Whether `id` names a build: a build's meter is kept beside the sandboxes' under its id.
pub fn is_build_id(id: &str) -> bool {
    id.strip_prefix(BUILD_ID_PREFIX).is_some_and(|rest| rest.starts_with('_'))
}

/// What a pushed directory may hold.
pub fn context_limits() -> ContextLimits {
    ContextLimits::default()
}

/// The node template of a build: `tb-<build id>` with `_` as `-` (`[a-z0-9-]`).
pub fn template_ref(build_id: &str) -> String {
    format!("tb-{}", build_id.to_ascii_lowercase().replace('_', "-"))
}

// --- built-ins ---------------------------------------------------------------------------

/// The templates built into the nodes (the in-process node's, or this build's list).
pub fn builtins(state: &AppState) -> Vec<BuiltinTemplate> {
    state.nodes.local_client().map_or_else(lizard_node_client::builtin_templates, |node| node.builtin_templates())
}

pub fn is_builtin(state: &AppState, name: &str) -> bool {
    builtins(state).iter().any(|b| b.name == name)
}

// --- uploads -----------------------------------------------------------------------------

/// Of `hashes`, those this workspace must upload (422 for one that is no SHA-256).
pub async fn missing_blobs(state: &AppState, workspace: &WorkspaceRecord, hashes: &[String]) -> ApiResult<Vec<String>> {
    if let Some(bad) = hashes.iter().find(|h| !blobs::is_sha256(h)) {
        return Err(AppError::invalid(format!("{bad:?} is not a SHA-256 (64 lower-case hex digits)")));
    }
    if hashes.len() > context_limits().max_entries {
        return Err(AppError::invalid(format!("at most {} hashes per call", context_limits().max_entries)));
    }
    let mut unique = hashes.to_vec();
    unique.sort_unstable();
    unique.dedup();
    let mut missing = state.server.store.missing_blobs(&workspace.id, &unique).await?;
    let recorded: Vec<String> = unique.into_iter().filter(|h| !missing.contains(h)).collect();
    // Recorded but not on this replica's disk: uploaded through another replica (then
    // complete in the store when pushed files are shared), or gone (an operator cleaned
    // it): ask for it again.
    let mut elsewhere = Vec::new();
    for h in recorded {
        if !state.blobs.has(&h).await {
            elsewhere.push(h);
        }
    }
    if !elsewhere.is_empty() && state.server.config.shares_blobs() {
        let in_store = state.server.store.complete_blobs(&elsewhere).await?;
        elsewhere.retain(|h| !in_store.contains(h));
    }
    missing.extend(elsewhere);
    missing.sort_unstable();
    Ok(missing)
}

/// Store an uploaded file for this workspace; 422 when its bytes hash to something else
/// or pass [`MAX_BLOB_BYTES`].
pub async fn upload_blob<S, E>(state: &AppState, workspace: &WorkspaceRecord, sha256: &str, body: S) -> ApiResult<()>
where
    S: futures_util::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let size = match state.blobs.put(sha256, body, MAX_BLOB_BYTES).await {
        Ok(size) => size,
        Err(e @ BlobError::Io { .. }) => return Err(AppError::internal(e)),
        Err(e) => return Err(AppError::invalid(e.to_string())),
    };
    if state.server.config.shares_blobs() {
        // Before the record: a workspace's blob is never listed as uploaded while
        // another replica could not read it.
        shared_blobs::share(state.server.store.as_ref(), &state.blobs, sha256).await.map_err(|e| match e {
            SharedBlobError::Store(e) => AppError::from(e),
            other => AppError::internal(other),
        })?;
    }
    state.server.store.insert_blob(&workspace.id, sha256, size, ids::now_ms()).await.map_err(|e| match e {
        StoreError::NotFound(_) => AppError::not_found(format!("workspace {} not found", workspace.id)),
        other => other.into(),
    })?;
    Ok(())
}

/// Copy every file of a build's context that this replica lacks from the store to its
/// disk (pushed files shared: the upload may have reached another replica). A failure is
/// the build's, with a message that names the file and no host detail (the log has it).
pub(crate) async fn fetch_context_blobs(state: &AppState, context: &Context) -> Result<(), BuildFailure> {
    if !state.server.config.shares_blobs() {
        return Ok(());
    }
    for e in &context.entries {
        let EntryKind::File { sha256, .. } = &e.kind else { continue };
        if state.blobs.has(sha256).await {
            continue;
        }
        let Err(error) = shared_blobs::fetch(state.server.store.clone(), &state.blobs, sha256).await else { continue };
        tracing::warn!(path = %e.path, sha256 = %sha256, "cannot copy a pushed file from the store: {error}");
        let (code, message) = match &error {
            _ if error.is_transient() => (
                "UNAVAILABLE",
                format!("the content of {:?} could not be read from the database (unavailable); push again", e.path),
            ),
            SharedBlobError::Corrupt { .. } | SharedBlobError::NotStored(_) => (
                "BLOB_UNAVAILABLE",
                format!(
                    "the uploaded content of {:?} is incomplete or corrupt on the server; push again to upload it anew",
                    e.path
                ),
            ),
            _ => ("INTERNAL", format!("the content of {:?} could not be copied to the building server", e.path)),
        };
        return Err(BuildFailure { code: code.into(), message, step: None, output_tail: None });
    }
    Ok(())
}

// --- push --------------------------------------------------------------------------------

/// The recipe of a push, with the name it is pushed under.
pub fn parse_recipe(req: &PushTemplateRequest) -> ApiResult<Recipe> {
    let invalid = |e: lizard_recipe::RecipeError| AppError::invalid(format!("recipe: {e}"));
    let recipe = match req.format {
        RecipeFormat::Toml => {
            let mut recipe = Recipe::from_toml(&req.recipe).map_err(invalid)?;
            if let Some(name) = &req.name {
                recipe.name = name.clone();
                recipe.validate().map_err(invalid)?;
            }
            recipe
        }
        RecipeFormat::Dockerfile => {
            let name = req.name.as_deref().ok_or_else(|| {
                AppError::invalid("a template built from a Dockerfile needs a name (a Dockerfile has none)")
            })?;
            lizard_recipe::dockerfile::parse(&req.recipe, name).map_err(invalid)?
        }
    };
    if RESERVED_NAMES.contains(&recipe.name.as_str()) || recipe.name.starts_with(SERVICE_TEMPLATE_PREFIX) {
        return Err(AppError::invalid(format!("{:?} is reserved; choose another template name", recipe.name)));
    }
    Ok(recipe)
}

/// A manifest entry of the wire as the recipe crate's; 422 for one that is incomplete.
pub fn entry(e: &ContextEntry) -> ApiResult<Entry> {
    e.to_entry().map_err(|what| AppError::invalid(format!("files: {:?}: {what}", e.path)))
}

/// A push checked in full: what to build, on which node template.
pub struct CheckedPush {
    pub recipe: Recipe,
    pub base_ref: String,
    pub context: Context,
}

/// Every check of a push (see the module doc), nothing recorded yet.
pub async fn check_push(
    state: &AppState,
    workspace: &WorkspaceRecord,
    req: &PushTemplateRequest,
) -> ApiResult<CheckedPush> {
    let recipe = parse_recipe(req)?;
    if is_builtin(state, &recipe.name) {
        return Err(AppError::conflict(format!("{} is the name of a built-in template; choose another", recipe.name)));
    }
    check_recipe(state, workspace, recipe, &req.files).await
}

/// The checks of a push after its recipe's own (base, manifest, uploads, copy sources):
/// also what a service's version goes through, its recipe made by the platform.
pub async fn check_recipe(
    state: &AppState,
    workspace: &WorkspaceRecord,
    recipe: Recipe,
    files: &[ContextEntry],
) -> ApiResult<CheckedPush> {
    recipe.validate().map_err(|e| AppError::invalid(format!("recipe: {e}")))?;
    let store = state.server.store.as_ref();
    let base_ref = match &recipe.from {
        Base::Template(base) if is_builtin(state, base) => base.clone(),
        Base::Template(base) => store
            .find_template(&workspace.id, base)
            .await?
            .and_then(|t| t.current_ref)
            .ok_or_else(|| AppError::not_found(format!("template {base} not found (from = {base:?})")))?,
        Base::Debian(debian) if debian.pushable().is_some() => base_name(&recipe),
        Base::Debian(_) => {
            return Err(AppError::invalid(format!(
                "from: a pushed template builds on a Lizard template (a built-in or one of this workspace's) \
                 or on a Debian root of {} that names no packages; other Debian bases are for built-in templates",
                lizard_recipe::DebianBase::PUSH_SUITES.join(", ")
            )))
        }
    };
    let entries = files.iter().map(entry).collect::<ApiResult<Vec<_>>>()?;
    let context =
        Context::from_manifest(entries, context_limits()).map_err(|e| AppError::invalid(format!("files: {e}")))?;
    let hashes: Vec<String> = context.hashes().into_iter().map(str::to_owned).collect();
    let missing = missing_blobs(state, workspace, &hashes).await?;
    if let Some(first) = missing.first() {
        let path = context
            .entries
            .iter()
            .find(|e| matches!(&e.kind, EntryKind::File { sha256, .. } if sha256 == first))
            .map_or(first.as_str(), |e| e.path.as_str());
        return Err(AppError::invalid(format!(
            "the content of {path:?} was not uploaded ({} file(s) missing); upload it first",
            missing.len()
        )));
    }
    for (i, step) in recipe.steps.iter().enumerate() {
        if let Step::Copy(c) = step {
            context.select(&c.src).map_err(|e| AppError::invalid(format!("steps[{}].copy.src: {e}", i + 1)))?;
        }
    }
    Ok(CheckedPush { recipe, base_ref, context })
}

/// Check a push, record its build (queued) and start it in the background.
pub async fn push(state: &AppState, workspace: &WorkspaceRecord, req: &PushTemplateRequest) -> ApiResult<BuildRecord> {
    let checked = check_push(state, workspace, req).await?;
    start_build(state, workspace, checked).await
}

/// Record the build of a checked push (queued) and start it in the background.
pub async fn start_build(
    state: &AppState,
    workspace: &WorkspaceRecord,
    checked: CheckedPush,
) -> ApiResult<BuildRecord> {
    start_build_as(state, workspace, checked, ids::new_id(BUILD_ID_PREFIX), Vec::new()).await
}

/// [`start_build`] under an id minted before (E2B's builds name theirs first).
pub async fn start_build_as(
    state: &AppState,
    workspace: &WorkspaceRecord,
    checked: CheckedPush,
    build_id: String,
    tags: Vec<String>,
) -> ApiResult<BuildRecord> {
    let recipe = &checked.recipe;
    let now = ids::now_ms();
    let new_template = NewTemplate {
        id: ids::new_id("tpl"),
        workspace_id: workspace.id.clone(),
        name: recipe.name.clone(),
        description: recipe.description.clone(),
        base: base_name(recipe),
        start_cmd: recipe.start.as_ref().map(|s| s.cmd.clone()),
        created_at: now,
    };
    let new_build = NewBuild {
        id: build_id.clone(),
        template_ref: template_ref(&build_id),
        created_at: now,
        workspace_limit: state.server.config.traffic.builds_per_workspace,
        meter: state.server.config.billing.pricing.meter(recipe.build.vcpus, recipe.build.memory_mib),
    };
    let store = state.server.store.as_ref();
    store.insert_build(&new_template, &new_build).await.map_err(|e| match e {
        StoreError::NotFound(_) => AppError::not_found(format!("workspace {} not found", workspace.id)),
        other => other.into(),
    })?;
    let running = state.builds.start(&build_id);
    let build = BuildTemplate {
        template_ref: new_build.template_ref.clone(),
        display_name: recipe.name.clone(),
        recipe: checked.recipe.clone(),
        base_ref: checked.base_ref,
        context: checked.context,
        blobs: state.blobs.dir().to_path_buf(),
    };
    tokio::spawn(build::run_build(state.clone(), build_id.clone(), build, running, tags));
    tracing::info!(build = %build_id, template = %recipe.name, workspace = %workspace.id, "template build queued");
    store.get_build(&build_id).await?.ok_or_else(|| AppError::internal("build record vanished"))
}

fn base_name(recipe: &Recipe) -> String {
    match &recipe.from {
        Base::Template(t) => t.clone(),
        Base::Debian(d) => format!("debian:{}", d.debian),
    }
}

// --- delete, sandboxes -------------------------------------------------------------------

/// Delete a template, then its node templates; 409 while a build of it runs or a sandbox
/// runs from it.
pub async fn delete(state: &AppState, template: &TemplateRecord) -> ApiResult<()> {
    let refs = state.server.store.delete_template(&template.id).await?;
    for r in refs {
        if let Err(e) = refs::delete_node_template(state.server.store.as_ref(), &state.nodes, &r).await {
            tracing::warn!(template_ref = %r, "template deleted but its node template remains: {}", e.message);
        }
    }
    Ok(())
}

/// The node template a sandbox of `name` in `project` is created from: `None` for a
/// built-in (created by its name), the current build's for a template of the project's
/// workspace (`name:tag`: the build that tag names); 404 otherwise (another workspace's
/// template included).
pub async fn node_template_for(state: &AppState, project: &ProjectRecord, name: &str) -> ApiResult<Option<String>> {
    if is_builtin(state, name) {
        return Ok(None);
    }
    let (template, tag) = tags::split_reference(name);
    match state.server.store.find_template(&project.workspace_id, template).await? {
        Some(t) => tags::build_for(state, &t, tag).await.map(|(_, node_ref)| Some(node_ref)),
        None => Err(AppError::not_found(format!("template {template} not found"))),
    }
}
