//! The many-machines part of the store: node rows with their reports, leases and state;
//! join tokens; the cluster key; leader leases; and what a lost node's expiry writes.
//!
//! Part of [`super::Store`] (a supertrait), kept apart so the cluster's rules read in one
//! place. Every check-then-write here is one statement or one transaction, so replicas
//! sharing a database never disagree on who holds a lease or which nodes are down.

use super::{Result, SandboxRecord, StoreError};
use async_trait::async_trait;
pub use lizard_api::cluster::{NodeReport, NodeState};

/// The id of the one cluster key row.
pub const CLUSTER_KEY_ID: &str = "cluster";

/// How a node state is written in the store.
pub fn node_state_name(state: NodeState) -> &'static str {
    match state {
        NodeState::Up => "up",
        NodeState::Draining => "draining",
        NodeState::Down => "down",
    }
}

/// A stored node state; an unknown one is an error, never a guess.
pub fn parse_node_state(value: &str) -> Result<NodeState> {
    match value {
        "up" => Ok(NodeState::Up),
        "draining" => Ok(NodeState::Draining),
        "down" => Ok(NodeState::Down),
        other => Err(StoreError::UnknownValue { what: "node state", value: other.into() }),
    }
}

/// A node as stored, with its last report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    pub id: String,
    pub region: String,
    /// Its API's base URL; `None` for the node inside a server process.
    pub address: Option<String>,
    pub state: NodeState,
    /// Capacity and usage as of its last report (templates and usage; the held-sandbox
    /// list is not kept).
    pub report: NodeReport,
    /// `None` for the in-process node (never leased).
    pub last_heartbeat: Option<i64>,
    pub created_at: i64,
}

/// A node joining.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewNode {
    pub id: String,
    pub region: String,
    pub address: String,
    pub report: NodeReport,
    pub at: i64,
}

/// A join token as stored: never the plaintext.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTokenRecord {
    pub id: String,
    /// SHA-256 of the token.
    pub hash: Vec<u8>,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
    /// Joins it still allows; `None`: any number (tokens minted before single use).
    pub uses_left: Option<i64>,
}

impl NodeTokenRecord {
    /// Whether it lets a node join at `now`.
    pub fn is_usable(&self, now: i64) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|at| now < at) && self.uses_left != Some(0)
    }
}

/// What a heartbeat wrote, and what the node must stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatOutcome {
    /// The node's state after it (a `down` node is `up` again).
    pub state: NodeState,
    /// Reported sandboxes whose records ended, or that no record names after the grace
    /// period for creates in flight.
    pub stop: Vec<String>,
    /// Live records on this node, older than the grace period, that it did not report:
    /// ended now with [`GONE_REASON`] (a node that restarted lost them).
    pub ended: Vec<String>,
}

/// The end reason of a sandbox its node no longer reports.
pub const GONE_REASON: &str = "lost: its node no longer has it";

/// A node whose lease expired, and the live sandboxes recorded lost with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostNode {
    pub node_id: String,
    /// Its last heartbeat: where its sandboxes' records and meters ended.
    pub last_heartbeat: i64,
    pub sandboxes: Vec<SandboxRecord>,
}

#[async_trait]
pub trait ClusterStore: Send + Sync {
    // --- the cluster key -------------------------------------------------------------

    /// The cluster key: `candidate` is stored if there is none yet, and the stored one
    /// is returned (concurrent first starts all get the same).
    async fn cluster_key(&self, candidate: &[u8]) -> Result<Vec<u8>>;

    // --- join tokens ------------------------------------------------------------------

    async fn insert_node_token(&self, token: &NodeTokenRecord) -> Result<()>;

    /// The token with this hash, revoked, expired and used up ones too.
    async fn node_token_by_hash(&self, hash: &[u8]) -> Result<Option<NodeTokenRecord>>;

    /// Spend one join of the token with this hash, if it is usable at `now` (atomically:
    /// of two joins racing for a token's last use, one wins). The token after it, or
    /// `None` (unknown, revoked, expired or used up).
    async fn use_node_token(&self, hash: &[u8], now: i64) -> Result<Option<NodeTokenRecord>>;

    /// Tokens not revoked, not expired at `now` and not used up, oldest first.
    async fn list_node_tokens(&self, now: i64) -> Result<Vec<NodeTokenRecord>>;

    /// Revoke a token; NotFound for an unknown or already revoked one.
    async fn revoke_node_token(&self, token_id: &str, at: i64) -> Result<()>;

    // --- nodes ------------------------------------------------------------------------

    /// The account created at first start (the operator's).
    async fn owner_account_id(&self) -> Result<Option<String>>;

    /// Record a joined node: `up`, its report, its first heartbeat at `at`.
    async fn insert_node(&self, node: &NewNode) -> Result<()>;

    async fn get_node(&self, node_id: &str) -> Result<Option<ClusterNode>>;

    /// Forget a joined node, so that its credential is refused from now on. Refuses
    /// ([`StoreError::Conflict`], saying what holds it) while a live sandbox or a volume is
    /// recorded on it, or for the node inside the server process; NotFound for an unknown
    /// node.
    async fn remove_node(&self, node_id: &str) -> Result<()>;

    /// Every node, oldest first.
    async fn list_nodes(&self) -> Result<Vec<ClusterNode>>;

    /// Running sandboxes recorded on each node after its last heartbeat, by node id: its
    /// report does not count them yet (placement adds them to its usage, so a burst of
    /// creates between two heartbeats does not pile onto one node).
    async fn placed_since_heartbeat(&self) -> Result<std::collections::BTreeMap<String, u32>>;

    /// Store a node's report and `last_heartbeat = at`; a `down` node becomes `up`.
    /// Answers what it must stop: reported sandboxes whose records ended, and those no
    /// record names that were first reported `grace_ms` or more before `at` (a create in
    /// flight is recorded within that). Live records on the node created `grace_ms` or
    /// more before `at` that it does not report end at `at` (unless the report is
    /// inconsistent: a held list shorter than its own sandbox count). NotFound for an
    /// unknown node.
    async fn record_heartbeat(
        &self,
        node_id: &str,
        report: &NodeReport,
        at: i64,
        grace_ms: i64,
    ) -> Result<HeartbeatOutcome>;

    /// `node_id` holds the node template `template` from now (a build just ended there):
    /// added to its last report's templates, so creates from the build are placed on it
    /// before its next heartbeat says so itself. Nothing for an unknown node.
    async fn add_node_template(&self, node_id: &str, template: &str) -> Result<()>;

    /// Drain (`up`/`draining` → `draining`) or undrain (`draining` → `up`) a node. A
    /// `down` node stays as it is: a drain answers it unchanged, an undrain is a
    /// Conflict. NotFound for an unknown node.
    async fn set_node_draining(&self, node_id: &str, draining: bool) -> Result<ClusterNode>;

    /// Mark `down` every node with an address, `up` or `draining`, whose last heartbeat
    /// is before `now - lease_ms`; end its running sandboxes with `reason` at its last
    /// heartbeat (meters closed there, volumes detached). Paused ones stay: their saved
    /// state is on the node's disk, unavailable until it is back. One transaction per
    /// node: a heartbeat that lands first keeps it up.
    async fn expire_nodes(&self, now: i64, lease_ms: i64, reason: &str) -> Result<Vec<LostNode>>;

    // --- leader leases ----------------------------------------------------------------

    /// Take or renew the lease `name` for `holder` until `now + ttl_ms` if it is free,
    /// lapsed (`expires_at < now`) or already `holder`'s. Returns whether `holder` holds
    /// it now.
    async fn acquire_lease(&self, name: &str, holder: &str, now: i64, ttl_ms: i64) -> Result<bool>;

    /// Give the lease up if `holder` holds it (a clean shutdown hands over at once).
    async fn release_lease(&self, name: &str, holder: &str) -> Result<()>;
}
