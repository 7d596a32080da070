//! Volumes: disks that outlive sandboxes. A volume belongs to a project (its name is its
//! key there), lives on one node and so in one region, and is mounted at `/workspace` in
//! the one sandbox (running or paused) that holds it.

use serde::{Deserialize, Serialize};

/// Size of a volume created without `sizeGb`.
pub const DEFAULT_VOLUME_SIZE_GB: u32 = 10;
/// Largest `sizeGb`.
pub const MAX_VOLUME_SIZE_GB: u32 = 1024;

/// A volume as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    /// `vol_…`.
    pub id: String,
    /// Unique within the project.
    pub name: String,
    pub project_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_id: Option<String>,
    /// The filesystem's size: writes past it fail with ENOSPC in the guest.
    pub size_gb: u32,
    /// Where it lives; a sandbox that mounts it runs there.
    pub region: String,
    /// RFC 3339.
    pub created_at: String,
    /// The sandbox (running or paused) that has it mounted, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attached_to: Option<String>,
}

/// `POST /v1/volumes`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateVolumeRequest {
    /// 1..=63 of `[A-Za-z0-9._-]`, starting with a letter or digit, not `vol_…`.
    pub name: String,
    /// The project by id, slug or name; may be left out when the key reaches exactly one
    /// project.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// The project's exact id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    /// 1..=1024 (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_gb: Option<u32>,
    /// Where to place it (default: any region with room).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}
