//! Many machines: what node agents and the control plane say to each other, and what an
//! operator sees of the nodes.
//!
//! A node process (`lizard node join`) joins once with a join token an operator minted
//! (`POST /v1/node-tokens`, stored hashed), and gets back its id and its credential. From
//! then on it heartbeats with that credential ([`NodeReport`] each time) and posts the
//! sandboxes that ended by themselves; every server replica calls the node's own API
//! (the [`crate::routes::node`] table, on the node's `--listen` address) with the same
//! credential as a bearer token. The credential is never stored: any replica recomputes
//! it from the cluster key and the node id.
//!
//! A node whose heartbeats stop for its lease is `down`: its live sandboxes are recorded
//! lost (billed to its last heartbeat), its volumes unavailable until it is back. Its next
//! heartbeat brings it back `up`, and the answer lists what it must stop (sandboxes whose
//! records ended meanwhile).

use crate::SandboxState;
use serde::{Deserialize, Serialize};

/// What a node has for sandboxes.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct NodeCapacity {
    /// vCPUs it admits (host CPUs × its CPU overcommit).
    pub vcpus: u32,
    /// Guest memory it admits, MiB (host memory × its memory overcommit).
    pub memory_mib: u64,
    /// Free space in its data directory, GiB.
    pub disk_gib: u64,
}

/// What a node's sandboxes take of its [`NodeCapacity`] now (running ones; paused ones
/// take disk only).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct NodeUsage {
    pub vcpus: u32,
    pub memory_mib: u64,
    /// Sandboxes it runs or keeps paused.
    pub sandboxes: u32,
}

/// A sandbox a node runs or keeps paused.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct HeldSandbox {
    pub sandbox_id: String,
    pub state: SandboxState,
}

/// What a node says of itself at join and in every heartbeat.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeReport {
    pub capacity: NodeCapacity,
    pub usage: NodeUsage,
    /// Template refs whose snapshots it holds (placement prefers these nodes).
    #[serde(default)]
    pub templates: Vec<String>,
    /// Every sandbox it runs or keeps paused.
    #[serde(default)]
    pub sandboxes: Vec<HeldSandbox>,
}

/// `POST /v1/cluster/join`, with `Authorization: Bearer <join token>`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinRequest {
    /// The region it serves.
    pub region: String,
    /// Base URL of its API as the servers reach it (`http://10.0.0.5:7180`).
    pub address: String,
    pub report: NodeReport,
}

/// The answer to a join: who the node is from now on. The node keeps both (its data
/// directory, 0600) and heartbeats with them; it joins again only with a new data
/// directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct JoinResponse {
    /// `node_…`.
    pub node_id: String,
    /// Bearer token of the node channel, both ways. Shown once.
    pub credential: String,
    /// How often to heartbeat.
    pub heartbeat_ms: u64,
    /// How long without a heartbeat before the node is `down`.
    pub lease_ms: u64,
}

/// `POST /v1/cluster/nodes/{id}/heartbeat`, with the node's credential: a [`NodeReport`].
pub type HeartbeatRequest = NodeReport;

/// The answer to a heartbeat.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatResponse {
    /// The node's state now (`draining`: keep what runs, expect no new sandboxes).
    pub state: NodeState,
    /// Sandboxes it reported whose records have ended (or never existed): kill them.
    #[serde(default)]
    pub stop: Vec<String>,
}

/// `POST /v1/cluster/nodes/{id}/events`, with the node's credential: sandboxes that ended
/// by themselves (a VMM crash, a guest power-off), as a JSON array.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxEnded {
    pub sandbox_id: String,
    /// Safe to show the sandbox's owner.
    pub reason: String,
}

/// `POST /v1/cluster/nodes/{id}/halts`, with the node's credential: sandboxes whose VM a
/// disk error halted (`halted`, a full node disk) or that run again, as a JSON array:
/// billed as paused while halted.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxHalt {
    pub sandbox_id: String,
    pub halted: bool,
}

/// Where a node stands.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub enum NodeState {
    /// Takes new sandboxes.
    Up,
    /// Keeps what it runs and holds; takes no new sandboxes.
    Draining,
    /// Its lease expired: its sandboxes were recorded lost, its volumes are unavailable.
    Down,
}

/// A node as the operator sees it (`GET /v1/nodes`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct NodeInfo {
    pub id: String,
    pub region: String,
    /// Its API's base URL; absent for the node inside the server process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    pub state: NodeState,
    pub capacity: NodeCapacity,
    pub usage: NodeUsage,
    #[serde(default)]
    pub templates: Vec<String>,
    /// RFC 3339; absent for the node inside the server process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat: Option<String>,
    /// RFC 3339.
    pub joined_at: String,
}

/// `POST /v1/node-tokens`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateNodeTokenRequest {
    /// How long it may be used to join, seconds (default: one hour).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_secs: Option<u64>,
    /// How many nodes may join with it (default 1: each join spends one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uses: Option<u32>,
}

/// A join token. `token` is shown only in the answer to its creation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct NodeToken {
    /// `ntk_…`.
    pub id: String,
    /// `lzn_…`; only when just created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// Joins it still allows; absent for a token minted before tokens had a number of uses
    /// (it joins until it expires or is revoked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uses_left: Option<u64>,
}
