//! The service part of the store: services deployed with `lizard up` (see
//! the server's `ops::services`).
//!
//! A service is one row: who owns it, its name (unique across the server: names are
//! host names) and its [`ServiceBody`] — versions, instances, status — as one JSON
//! document. Every write names the revision it read and fails with
//! [`StoreError::Conflict`](super::StoreError::Conflict) when another writer (an API
//! replica deploying, the reconciler) moved it on meanwhile, so no write is lost; the
//! caller reads again and retries.

use super::Result;
use async_trait::async_trait;
use lizard_api::services::{InstanceState, ServiceError, ServiceSpec, ServiceStatus, VersionStatus};
use serde::{Deserialize, Serialize};

/// A recorded service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRecord {
    pub id: String,
    pub account_id: String,
    pub workspace_id: String,
    pub project_id: String,
    pub name: String,
    pub body: ServiceBody,
    /// Bumped by every write; a write names the one it read.
    pub revision: i64,
    pub created_at: i64,
    pub updated_at: i64,
}

/// What changes over a service's life, kept as one JSON document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceBody {
    pub status: ServiceStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ServiceError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_version: Option<u32>,
    #[serde(default)]
    pub versions: Vec<VersionRecord>,
    #[serde(default)]
    pub instances: Vec<InstanceRecord>,
}

/// One version: its spec and the template build that holds its layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionRecord {
    pub version: u32,
    pub status: VersionStatus,
    pub spec: ServiceSpec,
    /// The workspace template of this version (`svc-<name>-v<version>`).
    pub template: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_id: Option<String>,
    /// Its node template, once built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_ref: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ServiceError>,
    pub created_at: i64,
}

/// One instance: a sandbox of a version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceRecord {
    pub sandbox_id: String,
    pub version: u32,
    pub state: InstanceState,
    /// Restarts since it last became healthy.
    #[serde(default)]
    pub restarts: u32,
    /// When it (re)started or was resumed: its grace and idle time count from here.
    pub since: i64,
    /// Failed health checks in a row.
    #[serde(default)]
    pub failures: u32,
}

#[async_trait]
pub trait ServiceStore: Send + Sync {
    /// Record a new service; [`StoreError::Conflict`](super::StoreError::Conflict) when
    /// its name is taken (by any account).
    async fn insert_service(&self, service: &ServiceRecord) -> Result<()>;
    /// The service named `name`, whoever owns it (the proxy and the reconciler).
    async fn service_by_name(&self, name: &str) -> Result<Option<ServiceRecord>>;
    /// The account's services, or every service (`None`: the reconciler), by name.
    async fn list_services(&self, account_id: Option<&str>) -> Result<Vec<ServiceRecord>>;
    /// Write `service.body` if its row is still at `service.revision`; answers the row
    /// as written (revision moved on). Stale: `Conflict`; deleted: `NotFound`.
    async fn update_service(&self, service: &ServiceRecord) -> Result<ServiceRecord>;
    /// Remove the row (its name is free again).
    async fn delete_service(&self, id: &str) -> Result<()>;
}

impl ServiceRecord {
    /// The version numbered `n`.
    pub fn version(&self, n: u32) -> Option<&VersionRecord> {
        self.body.versions.iter().find(|v| v.version == n)
    }

    pub fn version_mut(&mut self, n: u32) -> Option<&mut VersionRecord> {
        self.body.versions.iter_mut().find(|v| v.version == n)
    }

    /// The number the next version gets.
    pub fn next_version(&self) -> u32 {
        self.body.versions.iter().map(|v| v.version).max().unwrap_or(0) + 1
    }
}
