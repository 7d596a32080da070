//! Templates pushed by workspaces: which workspace a call is about, uploads of the pushed
//! files, a push (checked in full before anything is built, then built in the background
//! on a node), a build's cancel, a template's delete, and what a sandbox of a pushed
//! template is created from.
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

use crate::auth::{self, Principal};
use crate::blobs::{self, BlobError};
use crate::builds::{Progress, RunningBuild};
use crate::error::{ApiResult, AppError};
use crate::ids;
use crate::nodes::{BuildError, BuiltinTemplate, TemplateBuild};
use crate::state::AppState;
use crate::store::templates::FinishedBuild;
use crate::store::{
    BuildRecord, NewBuild, NewTemplate, ProjectRecord, Store, StoreError, TemplateRecord, WorkspaceRecord,
};
use lizard_api::templates::{
    BuildEvent, BuildFailure, BuildStatus, ContextEntry, ContextEntryKind, PushTemplateRequest, RecipeFormat,
    TemplateBuildInfo, TemplateInfo,
};
use lizard_api::ErrorCode;
use lizard_recipe::{Base, Context, ContextLimits, Entry, EntryKind, Recipe, Step};

/// Largest file a push may upload.
pub const MAX_BLOB_BYTES: u64 = 512 << 20;

/// Names a template may not have: they would read as another route.
pub const RESERVED_NAMES: &[&str] = &["blobs"];

/// Prefix of build ids; the node template of a build is `tb-` and the rest.
pub const BUILD_ID_PREFIX: &str = "bld";

/// What a pushed directory may hold.
pub fn context_limits() -> ContextLimits {
    ContextLimits::default()
}

/// The node template of a build: `tb-<build id>` with `_` as `-` (`[a-z0-9-]`).
pub fn template_ref(build_id: &str) -> String {
    format!("tb-{}", build_id.to_ascii_lowercase().replace('_', "-"))
}

// --- which workspace ---------------------------------------------------------------------

/// The workspaces whose templates the key reaches: those its scope lists, and those of
/// the projects it lists (a sandbox in such a project is created from its workspace's
/// templates); every workspace of the account for an unscoped key.
pub async fn visible_workspaces(store: &dyn Store, p: &Principal) -> ApiResult<Vec<WorkspaceRecord>> {
    let all = store.list_workspaces(&p.account_id).await?;
    let Some(scope) = &p.scope else { return Ok(all) };
    let mut via_projects = std::collections::BTreeSet::new();
    for id in &scope.projects {
        if let Some(prj) = store.get_project(&p.account_id, id).await? {
            via_projects.insert(prj.workspace_id);
        }
    }
    Ok(all.into_iter().filter(|w| scope.workspaces.contains(&w.id) || via_projects.contains(&w.id)).collect())
}

/// The workspace a call is about: `workspace` (id, slug or name) or `project`'s, else
/// the only one the key reaches. One the key does not reach answers 404.
pub async fn target_workspace(
    store: &dyn Store,
    p: &Principal,
    workspace: Option<&str>,
    project: Option<&str>,
) -> ApiResult<WorkspaceRecord> {
    let mut visible = visible_workspaces(store, p).await?;
    match (workspace, project) {
        (Some(key), _) => {
            let matching: Vec<usize> = [
                visible.iter().position(|w| w.id == key),
                visible.iter().position(|w| w.slug == key),
                visible.iter().position(|w| w.name == key),
            ]
            .into_iter()
            .flatten()
            .collect();
            match matching.first() {
                Some(&i) => Ok(visible.swap_remove(i)),
                None => Err(AppError::not_found(format!("workspace {key:?} not found"))),
            }
        }
        (None, Some(key)) => {
            let prj = auth::resolve_project(store, p, key).await?;
            visible
                .into_iter()
                .find(|w| w.id == prj.workspace_id)
                .ok_or_else(|| AppError::not_found(format!("workspace {} not found", prj.workspace_id)))
        }
        (None, None) if visible.len() == 1 => Ok(visible.remove(0)),
        (None, None) => Err(AppError::invalid(
            "a workspace is required: pass workspace (id, slug or name) or project (id, slug or name)",
        )),
    }
}

/// The template `name` the key reaches: in `workspace` when given, else in any of its
/// workspaces (409 when it is in several). Another workspace's template answers 404,
/// like one that does not exist.
pub async fn find(
    store: &dyn Store,
    p: &Principal,
    name: &str,
    workspace: Option<&WorkspaceRecord>,
) -> ApiResult<TemplateRecord> {
    let not_found = || AppError::not_found(format!("template {name} not found"));
    if let Some(w) = workspace {
        return store.find_template(&w.id, name).await?.ok_or_else(not_found);
    }
    let mut found = Vec::new();
    for w in visible_workspaces(store, p).await? {
        if let Some(t) = store.find_template(&w.id, name).await? {
            found.push(t);
        }
    }
    match found.len() {
        0 => Err(not_found()),
        1 => Ok(found.remove(0)),
        n => Err(AppError::conflict(format!(
            "{n} of your workspaces have a template named {name}; pass workspace to say which"
        ))),
    }
}

/// The build `build_id` of the template `template`, else 404.
pub async fn find_build(store: &dyn Store, template: &TemplateRecord, build_id: &str) -> ApiResult<BuildRecord> {
    match store.get_build(build_id).await? {
        Some(b) if b.template_id == template.id => Ok(b),
        _ => Err(AppError::not_found(format!("build {build_id} of template {} not found", template.name))),
    }
}

// --- built-ins ---------------------------------------------------------------------------

/// The templates built into the home node.
pub fn builtins(state: &AppState) -> Vec<BuiltinTemplate> {
    state.nodes.home().builtin_templates()
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
    // Recorded but gone from the disk (an operator cleaned it): ask for it again.
    for h in recorded {
        if !state.blobs.has(&h).await {
            missing.push(h);
        }
    }
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
    state.server.store.insert_blob(&workspace.id, sha256, size, ids::now_ms()).await.map_err(|e| match e {
        StoreError::NotFound(_) => AppError::not_found(format!("workspace {} not found", workspace.id)),
        other => other.into(),
    })?;
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
    if RESERVED_NAMES.contains(&recipe.name.as_str()) {
        return Err(AppError::invalid(format!("{:?} is reserved; choose another template name", recipe.name)));
    }
    Ok(recipe)
}

/// A manifest entry of the wire as the recipe crate's; 422 for one that is incomplete.
pub fn entry(e: &ContextEntry) -> ApiResult<Entry> {
    let bad = |what: &str| AppError::invalid(format!("files: {:?}: {what}", e.path));
    let kind = match e.kind {
        ContextEntryKind::File => EntryKind::File {
            sha256: e.sha256.clone().ok_or_else(|| bad("a file needs sha256"))?,
            size: e.size.ok_or_else(|| bad("a file needs size"))?,
        },
        ContextEntryKind::Dir => EntryKind::Dir,
        ContextEntryKind::Symlink => EntryKind::Symlink {
            target: e.target.clone().ok_or_else(|| bad("a symlink needs target"))?,
            // Computed again by `Context::from_manifest`, never trusted.
            inside: false,
        },
    };
    Ok(Entry { path: e.path.clone(), mode: e.mode, kind })
}

/// The recipe crate's entry on the wire (what the CLI sends).
pub fn context_entry(e: &Entry) -> ContextEntry {
    let (kind, sha256, size, target) = match &e.kind {
        EntryKind::File { sha256, size } => (ContextEntryKind::File, Some(sha256.clone()), Some(*size), None),
        EntryKind::Dir => (ContextEntryKind::Dir, None, None, None),
        EntryKind::Symlink { target, .. } => (ContextEntryKind::Symlink, None, None, Some(target.clone())),
    };
    ContextEntry { path: e.path.clone(), mode: e.mode, kind, sha256, size, target }
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
    let store = state.server.store.as_ref();
    let base_ref = match &recipe.from {
        Base::Template(base) if is_builtin(state, base) => base.clone(),
        Base::Template(base) => store
            .find_template(&workspace.id, base)
            .await?
            .and_then(|t| t.current_ref)
            .ok_or_else(|| AppError::not_found(format!("template {base} not found (from = {base:?})")))?,
        Base::Debian(_) => {
            return Err(AppError::invalid(
                "from: a pushed template builds on a Lizard template (a built-in or one of this workspace's); \
                 a Debian base is for built-in templates",
            ))
        }
    };
    let entries = req.files.iter().map(entry).collect::<ApiResult<Vec<_>>>()?;
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
    let recipe = &checked.recipe;
    let now = ids::now_ms();
    let build_id = ids::new_id(BUILD_ID_PREFIX);
    let new_template = NewTemplate {
        id: ids::new_id("tpl"),
        workspace_id: workspace.id.clone(),
        name: recipe.name.clone(),
        description: recipe.description.clone(),
        base: base_name(recipe),
        start_cmd: recipe.start.as_ref().map(|s| s.cmd.clone()),
        created_at: now,
    };
    let new_build = NewBuild { id: build_id.clone(), template_ref: template_ref(&build_id), created_at: now };
    let store = state.server.store.as_ref();
    store.insert_build(&new_template, &new_build).await.map_err(|e| match e {
        StoreError::NotFound(_) => AppError::not_found(format!("workspace {} not found", workspace.id)),
        other => other.into(),
    })?;
    let running = state.builds.start(&build_id);
    let build = TemplateBuild {
        template_ref: new_build.template_ref.clone(),
        display_name: recipe.name.clone(),
        recipe: checked.recipe.clone(),
        base_ref: checked.base_ref,
        context: checked.context,
        blobs: state.blobs.dir().to_path_buf(),
    };
    tokio::spawn(run_build(state.clone(), build_id.clone(), build, running));
    tracing::info!(build = %build_id, template = %recipe.name, workspace = %workspace.id, "template build queued");
    store.get_build(&build_id).await?.ok_or_else(|| AppError::internal("build record vanished"))
}

fn base_name(recipe: &Recipe) -> String {
    match &recipe.from {
        Base::Template(t) => t.clone(),
        Base::Debian(d) => format!("debian:{}", d.debian),
    }
}

/// The stable code of a node's refusal, as a build failure's code.
fn code_name(code: ErrorCode) -> String {
    serde_json::to_value(code).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_else(|| "INTERNAL".into())
}

/// Run a build on the home node to its end, and record how it ended.
async fn run_build(state: AppState, build_id: String, build: TemplateBuild, running: RunningBuild) {
    let store = state.server.store.clone();
    let hub = running.hub.clone();
    let recipe = build.recipe.clone();
    let node_ref = build.template_ref.clone();
    if let Err(e) = store.start_build(&build_id).await {
        tracing::warn!(build = %build_id, "cannot record a build's start: {e}");
    }
    let node = state.nodes.home();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let result = {
        let built = node.build_template(build, tx, running.cancel.clone());
        tokio::pin!(built);
        loop {
            tokio::select! {
                result = &mut built => break result,
                Some(event) = rx.recv() => {
                    let boundary = matches!(event, BuildEvent::Step { .. } | BuildEvent::StepDone { .. });
                    hub.push(event);
                    if boundary {
                        let p = hub.progress();
                        if let Err(e) = store.record_progress(&build_id, &p.steps, &p.log).await {
                            tracing::warn!(build = %build_id, "cannot record a build's progress: {e}");
                        }
                    }
                }
            }
        }
    };
    while let Ok(event) = rx.try_recv() {
        hub.push(event);
    }
    let (status, error, layer_bytes, steps) = match result {
        Ok(built) => (BuildStatus::Ready, None, Some(built.layer_bytes), Some(built.steps)),
        Err(BuildError::Failed(f)) if f.code == "CANCELLED" => (BuildStatus::Cancelled, Some(f), None, None),
        Err(BuildError::Failed(f)) => (BuildStatus::Failed, Some(f), None, None),
        Err(BuildError::Refused(e)) => {
            let f = BuildFailure { code: code_name(e.code), message: e.message, step: None, output_tail: None };
            (BuildStatus::Failed, Some(f), None, None)
        }
    };
    hub.push(BuildEvent::Done { status, error: error.clone() });
    let Progress { steps: seen, log } = hub.progress();
    let finished = FinishedBuild {
        status,
        steps: steps.unwrap_or(seen),
        error,
        log,
        events: hub.ndjson(),
        layer_bytes,
        finished_at: ids::now_ms(),
        description: recipe.description.clone(),
        base: base_name(&recipe),
        start_cmd: recipe.start.as_ref().map(|s| s.cmd.clone()),
    };
    match store.finish_build(&build_id, &finished).await {
        Ok(Some(replaced)) => release_ref(&state, &replaced).await,
        Ok(None) => {}
        Err(e) => {
            tracing::error!(build = %build_id, "cannot record a build's end: {e}");
            if status == BuildStatus::Ready {
                // Unrecorded, nothing can use it: do not keep it.
                let _ = node.delete_template(&node_ref).await;
            }
        }
    }
    state.builds.finish(&build_id);
    tracing::info!(build = %build_id, template = %recipe.name, status = ?status, "template build ended");
}

/// Delete a node template no sandbox runs from any more (a rebuild replaced it).
async fn release_ref(state: &AppState, node_ref: &str) {
    match state.server.store.template_ref_in_use(node_ref).await {
        Ok(false) => {
            if let Err(e) = state.nodes.home().delete_template(node_ref).await {
                tracing::info!(template_ref = node_ref, "replaced node template kept: {}", e.message);
            }
        }
        Ok(true) => tracing::info!(template_ref = node_ref, "replaced node template kept while sandboxes use it"),
        Err(e) => tracing::warn!(template_ref = node_ref, "cannot tell whether a node template is in use: {e}"),
    }
}

// --- cancel, delete ----------------------------------------------------------------------

/// Cancel a queued or running build; 409 once it ended.
pub async fn cancel(state: &AppState, build: &BuildRecord) -> ApiResult<()> {
    if build.status.is_final() {
        return Err(AppError::conflict(format!(
            "build {} already ended ({})",
            build.id,
            crate::store::templates::build_status_name(build.status)
        )));
    }
    match state.builds.get(&build.id) {
        Some(running) => {
            running.cancel.cancel();
            Ok(())
        }
        None => {
            // Not in flight in this process (it ended a moment ago, or a previous process
            // left it): record it as cancelled if it is still open.
            let failure = cancelled("cancelled");
            let finished = FinishedBuild {
                status: BuildStatus::Cancelled,
                steps: build.steps.clone(),
                error: Some(failure.clone()),
                log: build.log.clone(),
                events: crate::builds::to_ndjson(&[BuildEvent::Done {
                    status: BuildStatus::Cancelled,
                    error: Some(failure),
                }]),
                layer_bytes: None,
                finished_at: ids::now_ms(),
                description: String::new(),
                base: String::new(),
                start_cmd: None,
            };
            state.server.store.finish_build(&build.id, &finished).await?;
            Ok(())
        }
    }
}

fn cancelled(message: &str) -> BuildFailure {
    BuildFailure { code: "CANCELLED".into(), message: message.into(), step: None, output_tail: None }
}

/// Delete a template, then its node templates; 409 while a build of it runs or a sandbox
/// runs from it.
pub async fn delete(state: &AppState, template: &TemplateRecord) -> ApiResult<()> {
    let refs = state.server.store.delete_template(&template.id).await?;
    let node = state.nodes.home();
    for r in refs {
        if let Err(e) = node.delete_template(&r).await {
            if e.code != ErrorCode::NotFound {
                tracing::warn!(template_ref = %r, "template deleted but its node template remains: {}", e.message);
            }
        }
    }
    Ok(())
}

/// At start: builds a previous process left unfinished cannot go on; record them failed.
pub async fn fail_unfinished(state: &AppState) {
    let failure = BuildFailure {
        code: "INTERNAL".into(),
        message: "the server restarted during the build; push again".into(),
        step: None,
        output_tail: None,
    };
    match state.server.store.fail_unfinished_builds(&failure, ids::now_ms()).await {
        Ok(refs) => {
            for r in refs {
                let _ = state.nodes.home().delete_template(&r).await;
            }
        }
        Err(e) => tracing::warn!("cannot close the builds a previous process left: {e}"),
    }
}

// --- sandboxes ---------------------------------------------------------------------------

/// The node template a sandbox of `name` in `project` is created from: `None` for a
/// built-in (created by its name), the current build's for a template of the project's
/// workspace; 404 otherwise (another workspace's template included).
pub async fn node_template_for(state: &AppState, project: &ProjectRecord, name: &str) -> ApiResult<Option<String>> {
    if is_builtin(state, name) {
        return Ok(None);
    }
    match state.server.store.find_template(&project.workspace_id, name).await? {
        Some(t) => match t.current_ref {
            Some(r) => Ok(Some(r)),
            None => Err(AppError::not_found(format!("template {name} has no successful build yet"))),
        },
        None => Err(AppError::not_found(format!("template {name} not found"))),
    }
}

// --- answers -----------------------------------------------------------------------------

/// A build as the API shows it; `live` is the progress of one in flight.
pub fn build_info(build: &BuildRecord, live: Option<Progress>) -> TemplateBuildInfo {
    let (steps, log) = match live {
        Some(p) if !build.status.is_final() => (p.steps, p.log),
        _ => (build.steps.clone(), build.log.clone()),
    };
    TemplateBuildInfo {
        build_id: build.id.clone(),
        template: build.template_name.clone(),
        status: build.status,
        steps,
        error: build.error.clone(),
        created_at: ids::rfc3339(build.created_at),
        finished_at: build.finished_at.map(ids::rfc3339),
        log,
    }
}

/// A pushed template as the API shows it.
pub fn template_info(t: &TemplateRecord) -> TemplateInfo {
    TemplateInfo {
        name: t.name.clone(),
        description: t.description.clone(),
        builtin: false,
        workspace_id: Some(t.workspace_id.clone()),
        from: Some(t.base.clone()),
        ready: t.current_build_id.is_some(),
        build_id: t.current_build_id.clone(),
        latest_build_id: t.latest_build_id.clone(),
        start_cmd: t.start_cmd.clone(),
        size_bytes: t.layer_bytes,
        created_at: Some(ids::rfc3339(t.created_at)),
        updated_at: Some(ids::rfc3339(t.updated_at)),
    }
}

/// A built-in template as the API shows it.
pub fn builtin_info(b: &BuiltinTemplate) -> TemplateInfo {
    TemplateInfo {
        name: b.name.clone(),
        description: b.description.clone(),
        builtin: true,
        workspace_id: None,
        from: None,
        ready: true,
        build_id: None,
        latest_build_id: None,
        start_cmd: None,
        size_bytes: None,
        created_at: None,
        updated_at: None,
    }
}
