//! A build's life after its push: run on a node (the in-process one, else a joined one
//! with room, [`placement::place_build`]) to its end with its events recorded and
//! broadcast, cancelled on request, or failed at a restart that interrupted it. Node
//! templates are deleted wherever they are ([`super::refs`]).

use super::base_name;
use super::refs::{delete_node_template, release_ref};
use crate::builds::{to_ndjson, Progress, RunningBuild};
use crate::error::{ApiResult, AppError};
use crate::placement;
use crate::state::AppState;
use lizard_api::ids;
use lizard_api::templates::{BuildEvent, BuildFailure, BuildStatus};
use lizard_api::ErrorCode;
use lizard_node_client::{BuildError, BuildTemplate};
use lizard_recipe::Base;
use lizard_store::templates::FinishedBuild;
use lizard_store::BuildRecord;

/// The stable code of a node's refusal, as a build failure's code.
fn code_name(code: ErrorCode) -> String {
    serde_json::to_value(code).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_else(|| "INTERNAL".into())
}

/// Run a build on its node to its end, and record how it ended.
/// Run a recorded build on a node and record its end; a ready build takes `tags` (see
/// [`super::tags`]) before its followers hear that it ended.
pub(super) async fn run_build(
    state: AppState,
    build_id: String,
    build: BuildTemplate,
    running: RunningBuild,
    tags: Vec<String>,
) {
    let store = state.server.store.clone();
    let hub = running.hub.clone();
    let recipe = build.recipe.clone();
    let node_ref = build.template_ref.clone();
    if let Err(e) = store.start_build(&build_id).await {
        tracing::warn!(build = %build_id, "cannot record a build's start: {e}");
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    // A built-in or a Debian root is made by whichever node builds; a built template is
    // on the nodes that hold it.
    let base_is_built = !super::is_builtin(&state, &build.base_ref) && !matches!(recipe.from, Base::Debian(_));
    let fetched = super::fetch_context_blobs(&state, &build.context).await;
    let mut built_on = None;
    let result = match fetched {
        Err(failure) => Err(BuildError::Failed(failure)),
        Ok(()) => match placement::place_build(&state, &build, base_is_built).await {
            Err(no_node) => Err(BuildError::Refused(no_node.0)),
            Ok(placed) => {
                built_on = Some(placed.at.node_id);
                let built = placed.node.build_template(build, tx, running.cancel.clone());
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
            }
        },
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
    // Followers hear `Done` only once the end is recorded: what they do next (a create from
    // the build, perhaps through another replica) reads the record.
    let done = BuildEvent::Done { status, error: error.clone() };
    let mut progress = hub.progress();
    progress.apply(&done);
    let Progress { steps: seen, log } = progress;
    let finished = FinishedBuild {
        status,
        steps: steps.unwrap_or(seen),
        error,
        log,
        events: hub.ndjson() + &to_ndjson(std::slice::from_ref(&done)),
        layer_bytes,
        finished_at: ids::now_ms(),
        description: recipe.description.clone(),
        base: base_name(&recipe),
        start_cmd: recipe.start.as_ref().map(|s| s.cmd.clone()),
    };
    if let Some(node_id) = built_on.filter(|_| status == BuildStatus::Ready) {
        // Creates from it may come before the node's next heartbeat lists it.
        if let Err(e) = store.add_node_template(&node_id, &node_ref).await {
            tracing::warn!(build = %build_id, node = %node_id, "cannot note the node holding a build: {e}");
        }
    }
    let recorded = store.finish_build(&build_id, &finished).await;
    let untagged = match (&recorded, status) {
        (Ok(_), BuildStatus::Ready) if !tags.is_empty() => super::tags::take(&state, &build_id, &tags).await,
        _ => Vec::new(),
    };
    hub.push(done);
    for node_ref in untagged {
        release_ref(&state, &node_ref).await;
    }
    match recorded {
        Ok(Some(replaced)) => release_ref(&state, &replaced).await,
        Ok(None) => {}
        Err(e) => {
            tracing::error!(build = %build_id, "cannot record a build's end: {e}");
            if status == BuildStatus::Ready {
                // Unrecorded, nothing can use it: do not keep it.
                let _ = delete_node_template(state.server.store.as_ref(), &state.nodes, &node_ref).await;
            }
        }
    }
    state.builds.finish(&build_id);
    tracing::info!(build = %build_id, template = %recipe.name, status = ?status, "template build ended");
}

/// Cancel a queued or running build; 409 once it ended.
pub async fn cancel(state: &AppState, build: &BuildRecord) -> ApiResult<()> {
    if build.status.is_final() {
        return Err(AppError::conflict(format!(
            "build {} already ended ({})",
            build.id,
            lizard_store::templates::build_status_name(build.status)
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
                let _ = delete_node_template(state.server.store.as_ref(), &state.nodes, &r).await;
            }
        }
        Err(e) => tracing::warn!("cannot close the builds a previous process left: {e}"),
    }
}
