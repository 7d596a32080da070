//! The reconciler: once a second, on the replica holding the `services` lease, each
//! service's live instances are checked (every `health.intervalMs`) and kept so — see the
//! module doc of [`super`] for what it does, and [`reconcile_once`] for the order.

use super::{error, health, instance, log_tail, logs, modify, start_instance, stop_instance, MAX_RESTARTS};
use crate::error::ApiResult;
use crate::state::AppState;
use lizard_api::ids;
use lizard_api::services::{IdlePolicy, InstanceState, ServiceSpec, ServiceStatus};
use lizard_store::{InstanceRecord, ServiceRecord};

/// Failed checks in a row (past the grace period) that make an instance unhealthy.
const FAILURES_TO_RESTART: u32 = 2;
/// A draining instance stops once it has had no request in flight for this long…
const DRAIN_SETTLE_MS: i64 = 1_000;
/// …or this long after it began draining, whatever is in flight.
const DRAIN_MAX_MS: i64 = 60_000;
/// Healthy this long, an instance's restart count starts again from 0.
const STABLE_MS: i64 = 60_000;
/// How often instances' timeouts are pushed out and their logs trimmed.
const UPKEEP_MS: u64 = 60_000;
/// Bytes of output a crash loop's error shows.
const CRASH_TAIL_BYTES: u64 = 2000;

/// The wait before restart number `restarts + 1`: 1 s, doubling, at most 30 s.
pub fn backoff_ms(restarts: u32) -> i64 {
    (1_000i64 << restarts.min(5)).min(30_000)
}

/// One pass over every service.
pub async fn reconcile_once(state: &AppState) {
    let services = match state.server.store.list_services(None).await {
        Ok(s) => s,
        Err(e) => return tracing::warn!("service reconciler: {e}"),
    };
    for s in services {
        if let Err(e) = reconcile(state, &s).await {
            tracing::warn!(service = %s.name, "service reconciler: {}", e.0.message);
        }
    }
}

async fn reconcile(state: &AppState, s: &ServiceRecord) -> ApiResult<()> {
    let now = ids::now_ms();
    for i in s.body.instances.iter().filter(|i| i.state == InstanceState::Draining) {
        let quiet = state.services.in_flight(&i.sandbox_id) == 0 && now - i.since >= DRAIN_SETTLE_MS;
        if quiet || now - i.since >= DRAIN_MAX_MS {
            stop_instance(state, &i.sandbox_id, "replaced by a new version of its service").await;
            remove(state, s, &i.sandbox_id).await?;
        }
    }
    let Some(live) = s.body.live_version else { return Ok(()) };
    let Some(spec) = s.version(live).map(|v| v.spec.clone()) else { return Ok(()) };
    let mut running = s
        .body
        .instances
        .iter()
        .filter(|i| i.version == live && i.state != InstanceState::Paused && i.state != InstanceState::Draining)
        .count();
    for i in s.body.instances.iter().filter(|i| i.version == live) {
        if state.services.renew_due(&i.sandbox_id, UPKEEP_MS, now) && i.state != InstanceState::Paused {
            upkeep(state, &i.sandbox_id).await;
        }
        match i.state {
            InstanceState::Paused | InstanceState::Draining => {}
            InstanceState::Unhealthy => restart(state, s, i, &spec, now).await?,
            InstanceState::Starting | InstanceState::Healthy => {
                if !state.services.check_due(&i.sandbox_id, spec.health.interval_ms, now) {
                    continue;
                }
                if is_idle(state, i, &spec, now) && running > spec.scale.min as usize {
                    pause(state, s, i, &spec).await?;
                    running -= 1;
                    continue;
                }
                check(state, s, i, &spec, now).await?;
            }
        }
    }
    Ok(())
}

/// Idle: `idle = pause`, healthy, and no request (nor start or resume) for `idleAfterMs`.
fn is_idle(state: &AppState, i: &InstanceRecord, spec: &ServiceSpec, now: i64) -> bool {
    if spec.scale.idle != IdlePolicy::Pause || i.state != InstanceState::Healthy {
        return false;
    }
    if state.services.in_flight(&i.sandbox_id) > 0 {
        return false;
    }
    let last = state.services.last_request_ms(&i.sandbox_id).unwrap_or(i.since).max(i.since);
    now - last >= i64::try_from(spec.scale.idle_after_ms).unwrap_or(i64::MAX)
}

/// Pause an idle instance: recorded paused first, so no new request picks it, then
/// paused — under the service's resume lock, so a request that finds it paused resumes it
/// only once the pause is done (and one that picked it just before is picked again).
async fn pause(state: &AppState, s: &ServiceRecord, i: &InstanceRecord, spec: &ServiceSpec) -> ApiResult<()> {
    let lock = state.services.resume_lock(&s.id);
    let _held = lock.lock().await;
    // Still idle now that no resume can run? (A request may have resumed it meanwhile.)
    let now = state.server.store.service_by_name(&s.name).await?.filter(|x| x.id == s.id);
    let current = now.as_ref().and_then(|x| x.body.instances.iter().find(|x| x.sandbox_id == i.sandbox_id));
    if !current.is_some_and(|c| is_idle(state, c, spec, ids::now_ms())) {
        return Ok(());
    }
    set_state(state, s, &i.sandbox_id, |r| r.state = InstanceState::Paused).await?;
    if state.services.in_flight(&i.sandbox_id) > 0 {
        // A request came in meanwhile: stay up.
        return set_state(state, s, &i.sandbox_id, |r| r.state = InstanceState::Healthy).await;
    }
    match crate::ops::lifecycle::pause(state, &i.sandbox_id).await {
        Ok(()) => {
            tracing::info!(service = %s.name, sandbox = %i.sandbox_id, "paused an idle service instance");
            Ok(())
        }
        Err(e) => {
            tracing::warn!(sandbox = %i.sandbox_id, "cannot pause an idle service instance: {}", e.0.message);
            set_state(state, s, &i.sandbox_id, |r| r.state = InstanceState::Healthy).await
        }
    }
}

/// One health check and what follows from it.
async fn check(state: &AppState, s: &ServiceRecord, i: &InstanceRecord, spec: &ServiceSpec, now: i64) -> ApiResult<()> {
    match health::check(state, &i.sandbox_id, spec.port, &spec.health).await {
        Ok(()) => {
            let stable = i.state == InstanceState::Healthy && now - i.since >= STABLE_MS;
            if i.state != InstanceState::Healthy || i.failures > 0 || (stable && i.restarts > 0) {
                set_state(state, s, &i.sandbox_id, |r| {
                    if r.state != InstanceState::Healthy {
                        r.since = now;
                    }
                    r.state = InstanceState::Healthy;
                    r.failures = 0;
                    if stable {
                        r.restarts = 0;
                    }
                })
                .await?;
            }
            Ok(())
        }
        Err(e) => {
            let grace = i64::try_from(spec.health.grace_ms).unwrap_or(i64::MAX);
            if i.state == InstanceState::Starting && now - i.since < grace {
                return Ok(());
            }
            tracing::info!(service = %s.name, sandbox = %i.sandbox_id, failures = i.failures + 1, "health check failed: {e}");
            set_state(state, s, &i.sandbox_id, |r| {
                r.failures += 1;
                if r.failures >= FAILURES_TO_RESTART || r.state == InstanceState::Starting {
                    r.state = InstanceState::Unhealthy;
                    r.since = now;
                }
            })
            .await
        }
    }
}

/// Restart an unhealthy instance once its backoff passed: a new sandbox from the version's
/// snapshot in its place. Past [`MAX_RESTARTS`] the service is failing, with the reason
/// and the app's last output, and the instance is gone.
async fn restart(
    state: &AppState,
    s: &ServiceRecord,
    i: &InstanceRecord,
    spec: &ServiceSpec,
    now: i64,
) -> ApiResult<()> {
    if now - i.since < backoff_ms(i.restarts) {
        return Ok(());
    }
    let tail = log_tail(state, &i.sandbox_id, CRASH_TAIL_BYTES).await;
    stop_instance(state, &i.sandbox_id, "restarted by its service: it failed its health checks").await;
    if i.restarts >= MAX_RESTARTS {
        let message = format!(
            "an instance failed its health checks (GET {} on port {}) and {} restarts did not help",
            spec.health.path, spec.port, i.restarts
        );
        tracing::warn!(service = %s.name, "{message}");
        let failure = error("CRASH_LOOP", message, tail);
        modify(state, &s.name, &s.id, |r| {
            r.body.instances.retain(|x| x.sandbox_id != i.sandbox_id);
            r.body.status = ServiceStatus::Failing;
            r.body.error = Some(failure.clone());
        })
        .await?;
        return Ok(());
    }
    let Some(version) = s.version(i.version).cloned() else { return remove(state, s, &i.sandbox_id).await };
    let restarts = i.restarts + 1;
    tracing::info!(service = %s.name, sandbox = %i.sandbox_id, restarts, "restarting a service instance");
    match start_instance(state, s, &version).await {
        Ok(new) => {
            let new_id = new.id().to_owned();
            let replaced = modify(state, &s.name, &s.id, |r| {
                match r.body.instances.iter_mut().find(|x| x.sandbox_id == i.sandbox_id) {
                    Some(slot) => {
                        *slot = instance(&new_id, i.version, restarts);
                        true
                    }
                    None => false,
                }
            })
            .await?;
            if !matches!(replaced, Some((_, true))) {
                stop_instance(state, &new_id, "its service changed meanwhile").await;
            }
            Ok(())
        }
        Err(e) => {
            // Tried again after the next backoff, counted as a restart.
            tracing::warn!(service = %s.name, "cannot restart an instance: {}", e.0.message);
            set_state(state, s, &i.sandbox_id, |r| {
                r.restarts = restarts;
                r.since = ids::now_ms();
            })
            .await
        }
    }
}

/// Push the instance's timeout out (instances live as long as their service) and keep its
/// log bounded.
async fn upkeep(state: &AppState, sandbox_id: &str) {
    if let Ok(at) = crate::ops::sandboxes::timeout_end(crate::ops::sandboxes::MAX_TIMEOUT_MS) {
        if let Err(e) = state.server.store.set_sandbox_timeout(sandbox_id, Some(at)).await {
            tracing::warn!(sandbox = %sandbox_id, "cannot renew a service instance's timeout: {e}");
        }
    }
    if let Err(e) = logs::trim(state, sandbox_id).await {
        tracing::debug!(sandbox = %sandbox_id, "cannot trim a service instance's log: {}", e.0.message);
    }
}

/// Change the record of the instance `sandbox_id`.
async fn set_state(
    state: &AppState,
    s: &ServiceRecord,
    sandbox_id: &str,
    mut change: impl FnMut(&mut InstanceRecord),
) -> ApiResult<()> {
    modify(state, &s.name, &s.id, |r| {
        if let Some(i) = r.body.instances.iter_mut().find(|i| i.sandbox_id == sandbox_id) {
            change(i);
        }
    })
    .await
    .map(drop)
}

async fn remove(state: &AppState, s: &ServiceRecord, sandbox_id: &str) -> ApiResult<()> {
    state.services.forget(sandbox_id);
    modify(state, &s.name, &s.id, |r| r.body.instances.retain(|i| i.sandbox_id != sandbox_id)).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_back_off_exponentially_up_to_30_s() {
        assert_eq!((0..7).map(backoff_ms).collect::<Vec<_>>(), [1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000]);
    }
}
