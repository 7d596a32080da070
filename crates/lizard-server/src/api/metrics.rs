//! `GET /v1/metrics`: usage (sandbox-seconds, cost, running count) per workspace and per
//! project, within the key's scope — what a platform built on Lizard bills its users from.
//!
//! Unlike `/v1/billing/*` this is open to scoped keys: a key sees the projects it reaches
//! and the totals of the workspaces it reaches whole, nothing else. Filtering on a
//! workspace or project outside the scope answers 404, as everywhere.

use crate::auth::{self, Principal};
use crate::error::{ApiQuery, ApiResult, AppError};
use crate::openapi::{InvalidArgument, NotFound, Unauthenticated};
use crate::state::ServerState;
use axum::extract::State;
use axum::Json;
use lizard_api::{format_usd, Metrics, UsageMetrics};
use lizard_store::scope;
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MetricsQuery {
    /// Only this workspace (id).
    workspace_id: Option<String>,
    /// Only this project (id).
    project_id: Option<String>,
    /// Usage metered from this instant (RFC 3339, UTC), by interval start.
    from: Option<String>,
    /// Usage metered before this instant (RFC 3339, UTC).
    to: Option<String>,
}

fn instant(name: &str, v: Option<&str>) -> ApiResult<Option<i64>> {
    v.map(|s| {
        humantime::parse_rfc3339_weak(s)
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .and_then(|d| i64::try_from(d.as_millis()).ok())
            .ok_or_else(|| {
                AppError::invalid(format!("{name} must be an RFC 3339 instant (e.g. 2026-11-01T00:00:00Z), got {s:?}"))
            })
    })
    .transpose()
}

fn usage(workspace_id: String, project_id: Option<String>, cost: i64, ms: i64, running: u32) -> UsageMetrics {
    UsageMetrics {
        workspace_id,
        project_id,
        sandbox_seconds: ms / 1000,
        sandbox_ms: ms,
        cost_nanos: cost,
        cost: format_usd(cost),
        running,
    }
}

/// Usage per workspace and project within the key's scope.
#[utoipa::path(
    get,
    path = lizard_api::routes::METRICS.path,
    tag = "metrics",
    security(("apiKey" = [])),
    params(MetricsQuery),
    responses((status = 200, description = "Usage within the key's scope", body = Metrics), Unauthenticated, NotFound, InvalidArgument)
)]
pub async fn metrics(
    State(state): State<ServerState>,
    p: Principal,
    ApiQuery(q): ApiQuery<MetricsQuery>,
) -> ApiResult<Json<Metrics>> {
    let from = instant("from", q.from.as_deref())?;
    let to = instant("to", q.to.as_deref())?;
    let store = state.store.as_ref();
    let s = p.scope.as_ref();
    // Filters on things outside the scope are 404, like any other lookup. (An unscoped
    // key may name deleted workspaces and projects: their usage stays in the ledger.)
    if let Some(prj) = &q.project_id {
        if s.is_some() {
            auth::project_for(store, &p, prj).await?;
        }
    }
    if let Some(ws) = &q.workspace_id {
        if let Some(sc) = s {
            let mut reaches = sc.sees_workspace(ws);
            for prj in &sc.projects {
                if reaches {
                    break;
                }
                reaches = store.get_project(&p.account_id, prj).await?.is_some_and(|r| &r.workspace_id == ws);
            }
            if !reaches {
                return Err(AppError::not_found(format!("workspace {ws} not found")));
            }
        }
    }
    let rows = store.usage_by_project(&p.account_id, from, to).await?;
    let mut projects = Vec::new();
    let mut workspaces: BTreeMap<String, (i64, i64, u32)> = BTreeMap::new();
    for r in rows {
        if q.workspace_id.as_ref().is_some_and(|w| *w != r.workspace_id)
            || q.project_id.as_ref().is_some_and(|p| *p != r.project_id)
        {
            continue;
        }
        if scope::sees_workspace(s, &r.workspace_id) {
            let w = workspaces.entry(r.workspace_id.clone()).or_default();
            w.0 += r.cost_nanos;
            w.1 += r.sandbox_ms;
            w.2 += r.running;
        }
        if scope::sees_project(s, &r.workspace_id, &r.project_id) {
            projects.push(usage(r.workspace_id, Some(r.project_id), r.cost_nanos, r.sandbox_ms, r.running));
        }
    }
    // A project filter narrows the workspace totals to that project: report none then.
    let workspaces = if q.project_id.is_some() {
        Vec::new()
    } else {
        workspaces.into_iter().map(|(w, (cost, ms, running))| usage(w, None, cost, ms, running)).collect()
    };
    Ok(Json(Metrics { workspaces, projects }))
}
