//! One deploy or rollback of a service, to its end: the version's build awaited, its
//! instances started and health-checked within the grace period, then the traffic moved
//! (the previous live version's instances drain) — or the version failed with the reason,
//! its instances stopped, and whatever served before serving on.

use super::{
    delete_version_template, error, health, instance, log_tail, modify, start_instance, stop_instance, KEPT_VERSIONS,
};
use crate::state::AppState;
use lizard_api::services::{InstanceState, ServiceError, ServiceStatus, VersionStatus};
use lizard_api::templates::BuildStatus;
use lizard_store::ServiceRecord;
use std::time::Duration;

/// How often a rollout looks at its build and its instances.
const POLL: Duration = Duration::from_millis(500);
/// Bytes of an instance's output a failure shows.
const FAILURE_TAIL_BYTES: u64 = 2000;

/// Run the rollout of `version` (building or, for a rollback, starting) to its end.
pub(super) async fn run(state: AppState, service: ServiceRecord, version: u32) {
    match roll_out(&state, &service, version).await {
        Ok(()) => tracing::info!(service = %service.name, version, "service version live"),
        Err(failure) => {
            tracing::info!(service = %service.name, version, code = %failure.code, "service version failed: {}", failure.message);
            fail(&state, &service, version, failure).await;
        }
    }
}

async fn roll_out(state: &AppState, service: &ServiceRecord, version: u32) -> Result<(), ServiceError> {
    let internal = |e: crate::error::AppError| error("UNAVAILABLE", e.0.message, None);
    let gone = || error("DELETED", "the service was deleted during the deploy", None);
    let v = service.version(version).ok_or_else(gone)?.clone();
    let template_ref = match (&v.template_ref, &v.build_id) {
        (Some(r), _) => r.clone(),
        (None, Some(build)) => built(state, build).await?,
        (None, None) => return Err(error("BUILD_FAILED", "the version has no build", None)),
    };
    let (service, _) = modify(state, &service.name, &service.id, |s| {
        if let Some(v) = s.version_mut(version) {
            v.template_ref = Some(template_ref.clone());
            v.status = VersionStatus::Starting;
        }
    })
    .await
    .map_err(internal)?
    .ok_or_else(gone)?;
    let v = service.version(version).ok_or_else(gone)?.clone();

    // Its instances, each recorded as soon as it runs (a failure stops every one).
    for _ in 0..v.spec.scale.max {
        let sandbox = start_instance(state, &service, &v)
            .await
            .map_err(|e| error("UNAVAILABLE", format!("an instance could not be started: {}", e.0.message), None))?;
        let id = sandbox.id().to_owned();
        let added =
            modify(state, &service.name, &service.id, |s| s.body.instances.push(instance(&id, version, 0))).await;
        if !matches!(added, Ok(Some(_))) {
            stop_instance(state, &id, "its service was deleted").await;
            return Err(gone());
        }
    }

    // Healthy within the grace period, every one of them.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(v.spec.health.grace_ms);
    loop {
        let current = state.server.store.service_by_name(&service.name).await.map_err(|e| internal(e.into()))?;
        let current = current.filter(|s| s.id == service.id).ok_or_else(gone)?;
        let starting: Vec<String> = current
            .body
            .instances
            .iter()
            .filter(|i| i.version == version && i.state == InstanceState::Starting)
            .map(|i| i.sandbox_id.clone())
            .collect();
        if starting.is_empty() {
            break;
        }
        let mut last_error = None;
        for id in &starting {
            match health::check(state, id, v.spec.port, &v.spec.health).await {
                Ok(()) => {
                    modify(state, &service.name, &service.id, |s| {
                        if let Some(i) = s.body.instances.iter_mut().find(|i| &i.sandbox_id == id) {
                            i.state = InstanceState::Healthy;
                            i.since = lizard_api::ids::now_ms();
                        }
                    })
                    .await
                    .map_err(internal)?;
                }
                Err(e) => last_error = Some((id.clone(), e)),
            }
        }
        if tokio::time::Instant::now() >= deadline {
            if let Some((id, e)) = last_error {
                let message =
                    format!("its instances did not pass the health check within {} ms: {e}", v.spec.health.grace_ms);
                return Err(error("UNHEALTHY", message, log_tail(state, &id, FAILURE_TAIL_BYTES).await));
            }
        }
        tokio::time::sleep(POLL).await;
    }

    // Traffic moves: this version is live, the one before drains.
    let (service, _) = modify(state, &service.name, &service.id, |s| {
        let previous = s.body.live_version.replace(version);
        for v in &mut s.body.versions {
            if v.version == version {
                v.status = VersionStatus::Live;
                v.error = None;
            } else if Some(v.version) == previous || v.status == VersionStatus::Live {
                v.status = VersionStatus::Retired;
            }
        }
        let now = lizard_api::ids::now_ms();
        for i in &mut s.body.instances {
            if i.version != version {
                i.state = InstanceState::Draining;
                i.since = now;
            }
        }
        s.body.status = ServiceStatus::Live;
        s.body.error = None;
    })
    .await
    .map_err(internal)?
    .ok_or_else(gone)?;
    retire_old_layers(state, &service).await;
    Ok(())
}

/// Wait for the build `build_id` to end: its node template, or why it failed.
async fn built(state: &AppState, build_id: &str) -> Result<String, ServiceError> {
    loop {
        let build = state
            .server
            .store
            .get_build(build_id)
            .await
            .map_err(|e| error("UNAVAILABLE", e.to_string(), None))?
            .ok_or_else(|| error("BUILD_FAILED", format!("build {build_id} not found"), None))?;
        match build.status {
            BuildStatus::Ready => return Ok(build.template_ref),
            BuildStatus::Failed | BuildStatus::Cancelled => {
                let f = build.error.unwrap_or_else(|| lizard_api::templates::BuildFailure {
                    code: "INTERNAL".into(),
                    message: "the build failed".into(),
                    step: None,
                    output_tail: None,
                });
                // The start command never got ready: the app crashed at start or did not
                // listen on its port; anything else is the build's.
                let code = if f.code == "START_NOT_READY" { "START_NOT_READY" } else { "BUILD_FAILED" };
                let message = if code == "START_NOT_READY" {
                    format!("the app did not start listening on its port: {}", f.message)
                } else {
                    format!("the build failed ({}): {}", f.code, f.message)
                };
                return Err(error(code, message, f.output_tail));
            }
            _ => tokio::time::sleep(POLL).await,
        }
    }
}

/// Record `version` failed with `failure`, stop its instances and delete its layer; a
/// service that never went live is failed too.
pub(super) async fn fail(state: &AppState, service: &ServiceRecord, version: u32, failure: ServiceError) {
    let mut stopped = Vec::new();
    let changed = modify(state, &service.name, &service.id, |s| {
        // A rollback's target (older than the live version) keeps its layer.
        let rollback = s.body.live_version.is_some_and(|live| version < live);
        if let Some(v) = s.version_mut(version) {
            v.status = if rollback { VersionStatus::Retired } else { VersionStatus::Failed };
            v.error = Some(failure.clone());
        }
        stopped = s.body.instances.iter().filter(|i| i.version == version).map(|i| i.sandbox_id.clone()).collect();
        s.body.instances.retain(|i| i.version != version);
        if s.body.live_version.is_none() {
            s.body.status = ServiceStatus::Failed;
            s.body.error = Some(failure.clone());
        }
    })
    .await;
    let Ok(Some((service, _))) = changed else {
        // Deleted meanwhile: what this version started goes too.
        if let Some(v) = service.version(version) {
            super::delete_version_template(state, service, v).await;
        }
        return;
    };
    for id in stopped {
        stop_instance(state, &id, "its service version failed").await;
    }
    if let Some(v) = service.version(version).filter(|v| v.status == VersionStatus::Failed) {
        delete_version_template(state, &service, v).await;
    }
}

/// Delete the layers of versions past the [`KEPT_VERSIONS`] newest non-failed ones.
async fn retire_old_layers(state: &AppState, service: &ServiceRecord) {
    let mut kept: Vec<&lizard_store::VersionRecord> = service
        .body
        .versions
        .iter()
        .filter(|v| v.status != VersionStatus::Failed && v.template_ref.is_some())
        .collect();
    kept.sort_by_key(|v| std::cmp::Reverse(v.version));
    let old: Vec<u32> = kept.iter().skip(KEPT_VERSIONS).map(|v| v.version).collect();
    if old.is_empty() {
        return;
    }
    let Ok(Some((service, _))) = modify(state, &service.name, &service.id, |s| {
        for v in &mut s.body.versions {
            if old.contains(&v.version) {
                v.template_ref = None;
            }
        }
    })
    .await
    else {
        return;
    };
    for v in service.body.versions.iter().filter(|v| old.contains(&v.version)) {
        delete_version_template(state, &service, v).await;
    }
}
