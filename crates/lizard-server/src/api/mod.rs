//! The HTTP API, and nothing else: each handler extracts its request, authorizes it
//! (the key's scope, through [`crate::auth`]), calls the store or an operation of
//! [`crate::ops`], and maps the answer to JSON. The types on the wire are [`lizard_api`]'s,
//! so the CLI and SDKs read what the server writes.
//!
//! Every handler is documented with `#[utoipa::path]` and registered through
//! [`utoipa_axum::routes!`], so a route cannot be served without appearing in
//! `/openapi.json`.

pub mod account;
pub mod billing;
pub mod cluster;
pub mod code;
pub mod files;
pub mod keys;
pub mod lifecycle;
pub mod metrics;
pub mod nodes;
pub mod processes;
pub mod projects;
pub mod regions;
pub mod sandboxes;
pub mod services;
pub mod templates;
pub mod volumes;
pub mod workspaces;

use crate::state::{AppState, ServerState};
use axum::extract::FromRef;
use lizard_store::{KeyRecord, ProjectRecord, WorkspaceRecord};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// All tenancy routes, for any router state `S` that can hand out a [`ServerState`] (so
/// the sandbox routes may keep a state of their own and merge these in).
pub fn routes<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    ServerState: FromRef<S>,
{
    OpenApiRouter::new()
        .routes(routes!(workspaces::list, workspaces::create))
        .routes(routes!(workspaces::find, workspaces::update, workspaces::delete))
        .routes(routes!(projects::list, projects::create))
        .routes(routes!(projects::get, projects::update, projects::delete))
        .routes(routes!(keys::list, keys::create))
        .routes(routes!(keys::delete))
        .routes(routes!(account::whoami))
        .routes(routes!(account::account))
        .routes(routes!(regions::list))
        .routes(routes!(billing::balance))
        .routes(routes!(billing::transactions))
        .routes(routes!(billing::summary))
        .routes(routes!(billing::live))
        .routes(routes!(billing::sandbox_costs))
        .routes(routes!(metrics::metrics))
}

/// Every route of `/v1`: tenancy, sandboxes, volumes, templates, nodes and the node
/// channel (the faces add theirs: [`crate::state::Faces::routes`]).
pub fn all_routes() -> OpenApiRouter<AppState> {
    routes::<AppState>()
        .routes(routes!(sandboxes::create, sandboxes::list))
        .routes(routes!(sandboxes::get, sandboxes::kill))
        .routes(routes!(sandboxes::set_timeout))
        .routes(routes!(sandboxes::set_network))
        .routes(routes!(sandboxes::sign_url))
        .routes(routes!(lifecycle::pause))
        .routes(routes!(lifecycle::resume))
        .routes(routes!(lifecycle::connect))
        .routes(routes!(lifecycle::fork))
        .routes(routes!(sandboxes::exec))
        .routes(routes!(sandboxes::read_file, sandboxes::write_file, sandboxes::remove))
        .routes(routes!(sandboxes::list_dir))
        .routes(routes!(sandboxes::make_dir))
        .routes(routes!(files::info))
        .routes(routes!(files::exists))
        .routes(routes!(files::rename))
        .routes(routes!(files::watch))
        .routes(routes!(files::read_archive, files::write_archive))
        .routes(routes!(processes::start, processes::list))
        .routes(routes!(processes::output))
        .routes(routes!(processes::stdin, processes::close_stdin))
        .routes(routes!(processes::signal))
        .routes(routes!(processes::resize))
        .routes(routes!(processes::ports))
        .routes(routes!(processes::wait_for_port))
        .routes(routes!(processes::pty))
        .routes(routes!(code::run_code))
        .routes(routes!(code::list_contexts, code::create_context))
        .routes(routes!(code::remove_context))
        .routes(routes!(code::restart_context))
        .routes(routes!(volumes::create, volumes::list))
        .routes(routes!(volumes::get, volumes::delete))
        .routes(routes!(templates::missing_blobs))
        .routes(routes!(templates::upload_blob))
        // A push's manifest lists every path of the directory: more than axum's 2 MB default.
        .merge(
            OpenApiRouter::new()
                .routes(routes!(templates::push, templates::list))
                .layer(axum::extract::DefaultBodyLimit::max(templates::MAX_PUSH_BYTES)),
        )
        .routes(routes!(templates::get, templates::delete))
        .routes(routes!(templates::get_build, templates::cancel))
        .routes(routes!(templates::events))
        // A deploy's manifest, like a push's.
        .merge(
            OpenApiRouter::new()
                .routes(routes!(services::create, services::list))
                .routes(routes!(services::deploy))
                .layer(axum::extract::DefaultBodyLimit::max(templates::MAX_PUSH_BYTES)),
        )
        .routes(routes!(services::get, services::delete))
        .routes(routes!(services::rollback))
        .routes(routes!(services::logs))
        .routes(routes!(cluster::join))
        .routes(routes!(cluster::heartbeat))
        .routes(routes!(cluster::events))
        .routes(routes!(cluster::halts))
        .routes(routes!(nodes::list))
        .routes(routes!(nodes::get, nodes::remove))
        .routes(routes!(nodes::drain))
        .routes(routes!(nodes::undrain))
        .routes(routes!(nodes::create_token, nodes::list_tokens))
        .routes(routes!(nodes::revoke_token))
}

pub(crate) fn workspace_json(w: WorkspaceRecord) -> lizard_api::Workspace {
    lizard_api::Workspace {
        id: w.id,
        name: w.name,
        slug: w.slug,
        created_at: lizard_api::ids::rfc3339(w.created_at),
        volume_quota_gb: w.volume_quota_gb,
    }
}

pub(crate) fn project_json(p: ProjectRecord) -> lizard_api::Project {
    lizard_api::Project {
        id: p.id,
        workspace_id: p.workspace_id,
        name: p.name,
        slug: p.slug,
        created_at: lizard_api::ids::rfc3339(p.created_at),
    }
}

pub(crate) fn key_json(k: KeyRecord) -> lizard_api::ApiKey {
    let (workspaces, projects) = match k.scope {
        None => (None, None),
        Some(s) => (Some(s.workspaces.into_iter().collect()), Some(s.projects.into_iter().collect())),
    };
    lizard_api::ApiKey {
        id: k.id,
        name: k.name,
        prefix: k.prefix,
        workspaces,
        projects,
        created_at: lizard_api::ids::rfc3339(k.created_at),
    }
}

#[cfg(test)]
mod tests;
