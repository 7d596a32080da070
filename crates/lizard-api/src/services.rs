//! Services (`lizard up`): an app directory deployed as a persistent, load-balanced set of
//! sandboxes behind `https://{name}.svc.{region}.{domain}`.
//!
//! A deploy is two kinds of calls: the directory's files go up exactly as for a template
//! push (`POST /v1/templates/blobs/missing`, then `PUT /v1/templates/blobs/{sha256}` per
//! missing file, in the service's workspace), then `POST /v1/services` (a new service) or
//! `POST /v1/services/{name}/versions` (a new version of one) with the [`ServiceSpec`] and
//! the directory's manifest. The answer (202) is the service with the new version
//! `building`; the version then goes `building` → `starting` → `live` (its instances
//! passed their health checks and took the traffic; the previous version's instances
//! drain and stop), or `failed` with the reason (the previous live version keeps
//! serving). Clients follow it with `GET /v1/services/{name}`.
//!
//! Service names are one namespace per server (they are host names): a name another
//! project holds answers 409 `CONFLICT`, as does `POST /v1/services` for a name this
//! project already uses.

use crate::templates::ContextEntry;
use serde::{Deserialize, Serialize};

/// Longest service name (a DNS label, with room for the platform's prefixes).
pub const MAX_SERVICE_NAME_LEN: usize = 40;
/// Most instances a service may ask for (`scale.max`).
pub const MAX_INSTANCES: u32 = 10;
/// Largest total size of a deploy's files.
pub const MAX_DEPLOY_BYTES: u64 = 256 << 20;
/// Bytes of an instance's log (`cmd`'s stdout and stderr) kept in the instance; older
/// output is dropped.
pub const MAX_LOG_BYTES: u64 = 1 << 20;

/// Whether `name` is a service name: 1..=[`MAX_SERVICE_NAME_LEN`] of `[a-z0-9-]`, starting
/// with a letter and not ending with `-`.
pub fn is_service_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_SERVICE_NAME_LEN
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// What runs, and how it is checked and scaled (`lizard.toml`'s `[service]`, `[health]`
/// and `[scale]`; durations in milliseconds here).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceSpec {
    /// The template the code runs on: a built-in or one of the workspace's (default `base`).
    #[serde(default = "default_template")]
    pub template: String,
    /// Run once per deploy (`sh -c`, in `/app`, inside the build VM), e.g. `npm ci`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<String>,
    /// The app's command (`sh -c`, in `/app`); required.
    pub cmd: String,
    /// The port `cmd` listens on (on the guest's loopback or any address); required.
    pub port: u16,
    /// Environment for `build` and `cmd`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub env: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub health: HealthSpec,
    #[serde(default)]
    pub scale: ScaleSpec,
}

fn default_template() -> String {
    "base".into()
}

/// How an instance is checked: `GET path` on its port answers 2xx or 3xx within
/// `timeoutMs`, every `intervalMs`; a new instance has `graceMs` to pass its first check.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthSpec {
    /// Starts with `/` (default `/`).
    #[serde(default = "default_health_path")]
    pub path: String,
    /// 1 000..=300 000 (default 5 000).
    #[serde(default = "default_interval_ms")]
    pub interval_ms: u64,
    /// 100..=60 000 (default 2 000).
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// 1 000..=600 000 (default 10 000 on top of the app's start).
    #[serde(default = "default_grace_ms")]
    pub grace_ms: u64,
}

fn default_health_path() -> String {
    "/".into()
}
fn default_interval_ms() -> u64 {
    5_000
}
fn default_timeout_ms() -> u64 {
    2_000
}
fn default_grace_ms() -> u64 {
    10_000
}

impl Default for HealthSpec {
    fn default() -> Self {
        HealthSpec {
            path: default_health_path(),
            interval_ms: default_interval_ms(),
            timeout_ms: default_timeout_ms(),
            grace_ms: default_grace_ms(),
        }
    }
}

/// What an idle instance becomes.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum IdlePolicy {
    /// Paused: no CPU, no memory, no compute billing; the next request resumes it.
    #[default]
    Pause,
    /// Kept running.
    Keep,
}

/// How many instances run.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScaleSpec {
    /// Instances kept running even when idle (default 0: with `idle = pause` an idle
    /// service is paused whole).
    #[serde(default)]
    pub min: u32,
    /// 1..=[`MAX_INSTANCES`] (default 1): the instances a version starts with.
    #[serde(default = "one")]
    pub max: u32,
    #[serde(default)]
    pub idle: IdlePolicy,
    /// No request for this long makes an instance idle (default 300 000; at least 1 000).
    #[serde(default = "default_idle_after_ms")]
    pub idle_after_ms: u64,
}

fn one() -> u32 {
    1
}
fn default_idle_after_ms() -> u64 {
    300_000
}

impl Default for ScaleSpec {
    fn default() -> Self {
        ScaleSpec { min: 0, max: 1, idle: IdlePolicy::Pause, idle_after_ms: default_idle_after_ms() }
    }
}

impl ServiceSpec {
    /// Every rule on the fields, with the field's name in the message.
    pub fn validate(&self) -> Result<(), String> {
        if self.cmd.trim().is_empty() {
            return Err("cmd: the command that starts the app is required (e.g. \"node server.js\")".into());
        }
        if self.port == 0 {
            return Err("port: the port the app listens on is required (1..=65535)".into());
        }
        if crate::code::is_reserved_guest_port(self.port) {
            return Err(format!("port: {} is reserved for the platform", self.port));
        }
        if self.template.is_empty() {
            return Err("template: required".into());
        }
        let h = &self.health;
        if !h.path.starts_with('/') || h.path.len() > 1024 || h.path.chars().any(|c| c.is_control() || c == ' ') {
            return Err(format!("health.path: {:?} must be a path starting with '/'", h.path));
        }
        range("health.intervalMs", h.interval_ms, 1_000, 300_000)?;
        range("health.timeoutMs", h.timeout_ms, 100, 60_000)?;
        range("health.graceMs", h.grace_ms, 1_000, 600_000)?;
        let s = &self.scale;
        range("scale.max", s.max.into(), 1, MAX_INSTANCES.into())?;
        if s.min > s.max {
            return Err(format!("scale.min: {} is more than scale.max ({})", s.min, s.max));
        }
        range("scale.idleAfterMs", s.idle_after_ms, 1_000, 7 * 24 * 3_600_000)?;
        Ok(())
    }
}

fn range(field: &str, value: u64, min: u64, max: u64) -> Result<(), String> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(format!("{field}: {value} is outside {min}..={max}"))
    }
}

/// `POST /v1/services`: a new service and its first version.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateServiceRequest {
    /// See [`is_service_name`]; the URL's first label.
    pub name: String,
    /// The project by id, slug or name; may be left out when the key reaches exactly one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    pub spec: ServiceSpec,
    /// The app directory's manifest; every file's content uploaded first.
    #[serde(default)]
    pub files: Vec<ContextEntry>,
}

/// `POST /v1/services/{name}/versions`: a new version of a service.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeployServiceRequest {
    pub spec: ServiceSpec,
    #[serde(default)]
    pub files: Vec<ContextEntry>,
}

/// `POST /v1/services/{name}/rollback`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RollbackRequest {
    /// The version to go back to (default: the live one before the current).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
}

/// Where a service stands.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ServiceStatus {
    /// No version has gone live yet; the first one is building or starting.
    Deploying,
    /// A live version serves (possibly paused while idle).
    Live,
    /// Instances of the live version keep failing: restarts gave up (see `reason`).
    Failing,
    /// The first version never went live; nothing serves.
    Failed,
}

/// Where a version stands.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum VersionStatus {
    /// Its layer (files + build step + the app started) is being built.
    Building,
    /// Its instances are starting; they take traffic once healthy.
    Starting,
    /// It serves.
    Live,
    /// It never became healthy (or did not build): rolled back, `reason` says why.
    Failed,
    /// An earlier live version, kept for rollback.
    Retired,
}

/// One deploy of a service: base template + files + build step, as a layer.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceVersion {
    /// 1, 2, …
    pub version: u32,
    pub status: VersionStatus,
    pub spec: ServiceSpec,
    /// The template build that made its layer (`GET /v1/templates/…/builds/{buildId}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_id: Option<String>,
    /// Why it failed: a stable code and the message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ServiceError>,
    /// RFC 3339.
    pub created_at: String,
}

/// Why a version or a service failed.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceError {
    /// `BUILD_FAILED` (the build step or the files), `START_NOT_READY` (nothing listened on
    /// the port in time, or the app exited), `UNHEALTHY` (health checks failed),
    /// `CRASH_LOOP` (restarts gave up), `UNAVAILABLE` (no node could run an instance).
    pub code: String,
    pub message: String,
    /// The app's last output lines, when it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_tail: Option<String>,
}

/// Where an instance stands.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum InstanceState {
    /// Started, not yet healthy.
    Starting,
    /// Passing health checks; takes traffic.
    Healthy,
    /// Failed its last checks; being restarted.
    Unhealthy,
    /// Idle: paused (from the moment its pause begins), resumed by the next request.
    Paused,
    /// Of a replaced version: finishing its requests, then stopped.
    Draining,
}

/// One instance: a sandbox of the version's template with `cmd` running.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceInstance {
    /// The sandbox (billed to the service's project).
    pub sandbox_id: String,
    pub version: u32,
    pub state: InstanceState,
    /// Restarts since it last stayed healthy.
    pub restarts: u32,
}

/// A service as the API shows it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceInfo {
    /// `svc_…`.
    pub service_id: String,
    pub name: String,
    pub project_id: String,
    pub workspace_id: String,
    /// Where it answers: `http://{name}.svc.{region}.{domain}[:port]`.
    pub url: String,
    pub status: ServiceStatus,
    /// Why it is failing or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ServiceError>,
    /// The version that serves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_version: Option<u32>,
    /// Newest first; failed and retired ones are kept (a bounded number).
    pub versions: Vec<ServiceVersion>,
    pub instances: Vec<ServiceInstance>,
    /// RFC 3339.
    pub created_at: String,
    pub updated_at: String,
}

impl ServiceInfo {
    /// The version numbered `n`.
    pub fn version(&self, n: u32) -> Option<&ServiceVersion> {
        self.versions.iter().find(|v| v.version == n)
    }

    /// The newest version.
    pub fn latest(&self) -> Option<&ServiceVersion> {
        self.versions.iter().max_by_key(|v| v.version)
    }
}

/// One line of `GET /v1/services/{name}/logs` (NDJSON): output of `cmd` in one instance.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceLogLine {
    pub sandbox_id: String,
    pub version: u32,
    /// The text (lossy UTF-8), as the app wrote it; stdout and stderr interleaved.
    pub data: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ServiceSpec {
        serde_json::from_str(r#"{"cmd":"node server.js","port":3000}"#).unwrap()
    }

    #[test]
    fn a_spec_needs_cmd_and_port_and_has_defaults() {
        let s = spec();
        assert_eq!((s.template.as_str(), s.scale.max, s.scale.min, s.health.path.as_str()), ("base", 1, 0, "/"));
        assert_eq!(s.validate(), Ok(()));
        assert!(serde_json::from_str::<ServiceSpec>(r#"{"port":3000}"#).is_err());
        assert!(serde_json::from_str::<ServiceSpec>(r#"{"cmd":"x","port":1,"extra":1}"#).is_err());
        let mut s = spec();
        s.cmd = " ".into();
        assert!(s.validate().unwrap_err().starts_with("cmd:"));
        let mut s = spec();
        s.port = 0;
        assert!(s.validate().unwrap_err().starts_with("port:"));
        let mut s = spec();
        s.port = 49999;
        assert!(s.validate().unwrap_err().contains("reserved"));
        let mut s = spec();
        s.scale.min = 3;
        assert!(s.validate().unwrap_err().starts_with("scale.min"));
        let mut s = spec();
        s.health.path = "healthz".into();
        assert!(s.validate().unwrap_err().starts_with("health.path"));
    }

    #[test]
    fn service_names_are_dns_labels() {
        for good in ["my-app", "a", "a1-b2"] {
            assert!(is_service_name(good), "{good}");
        }
        for bad in ["", "-a", "a-", "1a", "My-App", "a_b", "a.b", &"a".repeat(41)] {
            assert!(!is_service_name(bad), "{bad}");
        }
    }
}
