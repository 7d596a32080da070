//! Where things run, and how to reach the node that runs them.
//!
//! A new volume goes to the least-loaded node of a region. A new sandbox goes to a node of
//! the server's region that is `up`, heard from within its lease (or in-process), and has
//! room for its size by its last report; nodes that hold the template's snapshot come
//! first, then the least loaded (used memory fraction). A sandbox that mounts a volume runs
//! on the volume's node. Everything that acts on an existing sandbox or volume reaches the
//! node its record names ([`node`], [`node_of`], [`sandbox_node`]): any replica can serve
//! any request.

use crate::error::{ApiResult, AppError};
use crate::state::AppState;
use lizard_api::cluster::{NodeCapacity, NodeReport, NodeState, NodeUsage};
use lizard_api::ErrorCode;
use lizard_node_client::{NodeClient, Nodes};
use lizard_store::{ClusterNode, NodeLoad, NodeRecord, SandboxRecord, Store};
use std::cmp::Ordering;
use std::collections::HashSet;
use std::sync::Arc;

pub use lizard_node_client::LOCAL_NODE_ID;

/// The size placement assumes for a create that names none (a node's default size; a
/// template whose own default is larger is caught by the node's admission, answered 503,
/// and the next node is tried).
pub const DEFAULT_VCPUS: u32 = 1;
pub const DEFAULT_MEMORY_MIB: u64 = 512;

/// A node chosen for something.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub node_id: String,
    pub region: String,
}

/// A node chosen for something, with the handle to reach it.
pub struct Placed {
    pub at: Placement,
    pub node: Arc<dyn NodeClient>,
}

/// The node for a new volume: in `region` when given, the usable node with the fewest
/// volumes (ties: the oldest). No node in that region → 422 naming the regions there are;
/// a chosen node this server cannot reach → 503.
pub async fn place_volume(state: &AppState, region: Option<&str>) -> ApiResult<Placed> {
    register_home_node(state).await?;
    let store = state.server.store.as_ref();
    let now = lizard_api::ids::now_ms();
    let usable: HashSet<String> =
        store.list_nodes().await?.into_iter().filter(|n| usable(state, n, now)).map(|n| n.id).collect();
    let loads: Vec<NodeLoad> = store.node_loads().await?.into_iter().filter(|l| usable.contains(&l.node.id)).collect();
    let at = choose(&loads, region)?;
    let node = node(state, &at.node_id).await?;
    Ok(Placed { at, node })
}

/// Whether new things may go to `n`: `up`, and in this process or heard from within its
/// lease.
fn usable(state: &AppState, n: &ClusterNode, now: i64) -> bool {
    n.state == NodeState::Up && candidate(state, n, now).is_some_and(|c| c.fresh)
}

/// Pure part of [`place_volume`].
pub fn choose(loads: &[NodeLoad], region: Option<&str>) -> ApiResult<Placement> {
    let best = loads
        .iter()
        .filter(|l| region.is_none_or(|r| l.node.region == r))
        .min_by_key(|l| (l.volumes, l.node.created_at));
    match best {
        Some(l) => Ok(Placement { node_id: l.node.id.clone(), region: l.node.region.clone() }),
        None => {
            let mut regions: Vec<&str> = loads.iter().map(|l| l.node.region.as_str()).collect();
            regions.sort();
            regions.dedup();
            Err(AppError::invalid(format!(
                "no node in region {:?}; regions: {}",
                region.unwrap_or_default(),
                regions.join(", ")
            )))
        }
    }
}

/// What a new sandbox needs of a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    pub region: String,
    pub vcpus: u32,
    pub memory_mib: u64,
    /// The node template it boots from (a built-in's name or a build's ref).
    pub template: String,
    /// Only nodes that hold `template` (a pushed template's build exists only there).
    pub template_required: bool,
}

/// A node as placement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: String,
    pub region: String,
    pub state: NodeState,
    /// In-process, or heard from within its lease.
    pub fresh: bool,
    /// The node inside this server: it builds pushed templates itself, so it is taken
    /// as holding every template (a missing one is its own 404), and its own admission
    /// judges its room — as in single-machine mode.
    pub in_process: bool,
    /// Its last report; `None`: unknown (an in-process node behind a test client), taken
    /// as room enough and holding every template.
    pub report: Option<NodeReport>,
}

impl Candidate {
    fn has_room(&self, want: &Want) -> bool {
        // The in-process node's own admission answers for it (503 with what it has),
        // exactly as in single-machine mode; the next node is tried then.
        self.in_process
            || self.report.as_ref().is_none_or(|r| {
                u64::from(r.capacity.vcpus).saturating_sub(u64::from(r.usage.vcpus)) >= u64::from(want.vcpus)
                    && r.capacity.memory_mib.saturating_sub(r.usage.memory_mib) >= want.memory_mib
            })
    }

    /// This candidate with `count` sandboxes its report does not count yet (recorded since
    /// its last heartbeat) added to its usage, each taken as the default size.
    fn with_unreported(mut self, count: u32) -> Candidate {
        if let Some(r) = self.report.as_mut().filter(|_| !self.in_process && count > 0) {
            r.usage.vcpus = r.usage.vcpus.saturating_add(count.saturating_mul(DEFAULT_VCPUS));
            r.usage.memory_mib = r.usage.memory_mib.saturating_add(u64::from(count) * DEFAULT_MEMORY_MIB);
            r.usage.sandboxes = r.usage.sandboxes.saturating_add(count);
        }
        self
    }

    fn holds(&self, template: &str) -> bool {
        self.in_process || self.report.as_ref().is_none_or(|r| r.templates.iter().any(|t| t == template))
    }

    /// Used memory over capacity, as a fraction to compare (`(used, capacity)`).
    fn load(&self) -> (u64, u64) {
        self.report.as_ref().map_or((0, 1), |r| (r.usage.memory_mib, r.capacity.memory_mib.max(1)))
    }
}

/// How many sandboxes of the wanted size a node without the template's snapshot counts as
/// running on top of its load.
const TEMPLATE_MISS_WEIGHT: u64 = 2;

/// Pure part of [`place_sandbox`]: the nodes to try, best first — in the region, `up`,
/// fresh, with room; the least loaded, a node without the template's snapshot weighted as
/// [`TEMPLATE_MISS_WEIGHT`] sandboxes busier (ties: the order given). None → 503 saying
/// what did not fit where.
pub fn choose_nodes(candidates: &[Candidate], want: &Want) -> ApiResult<Vec<String>> {
    let roomy: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| c.region == want.region && c.state == NodeState::Up && c.fresh && c.has_room(want))
        .collect();
    let mut fit: Vec<&Candidate> =
        roomy.iter().copied().filter(|c| !want.template_required || c.holds(&want.template)).collect();
    if fit.is_empty() && !roomy.is_empty() {
        return Err(AppError::new(
            ErrorCode::Unavailable,
            format!("no node with room holds the build {} (the node that built it may be down or full)", want.template),
        ));
    }
    if fit.is_empty() {
        return Err(AppError::new(
            ErrorCode::Unavailable,
            format!("no node has room for {} vCPUs and {} MiB in region {}", want.vcpus, want.memory_mib, want.region),
        ));
    }
    // A node without the template's snapshot makes it with one cold boot: it counts as if
    // it ran TEMPLATE_MISS_WEIGHT more sandboxes of this size, so creates go to holders
    // first but still spread once a holder is that much busier.
    let weighted = |c: &Candidate| {
        let (used, capacity) = c.load();
        let miss = if c.holds(&want.template) { 0 } else { TEMPLATE_MISS_WEIGHT * want.memory_mib };
        (used.saturating_add(miss), capacity)
    };
    fit.sort_by(|a, b| {
        let ((ua, ca), (ub, cb)) = (weighted(a), weighted(b));
        // ua/ca vs ub/cb without floats.
        (u128::from(ua) * u128::from(cb)).cmp(&(u128::from(ub) * u128::from(ca))).then(Ordering::Equal)
    });
    Ok(fit.into_iter().map(|c| c.id.clone()).collect())
}

/// The nodes a new sandbox without a volume may go to, best first (the caller tries the
/// next when one answers 503), or 503 when none has room.
pub async fn place_sandbox(state: &AppState, want: &Want) -> ApiResult<Vec<Placed>> {
    if state.nodes.local_client().is_some() {
        register_home_node(state).await?;
    }
    let now = lizard_api::ids::now_ms();
    let nodes = state.server.store.list_nodes().await?;
    let pending = state.server.store.placed_since_heartbeat().await?;
    let candidates: Vec<Candidate> = nodes
        .iter()
        .filter_map(|n| candidate(state, n, now))
        .map(|c| {
            let since = pending.get(&c.id).copied().unwrap_or(0);
            c.with_unreported(since)
        })
        .collect();
    let mut placed = Vec::new();
    for id in choose_nodes(&candidates, want)? {
        let region = candidates.iter().find(|c| c.id == id).map(|c| c.region.clone()).unwrap_or_default();
        match node(state, &id).await {
            Ok(client) => placed.push(Placed { at: Placement { node_id: id, region }, node: client }),
            Err(e) => tracing::warn!(node = %id, "placement skips a node it cannot reach: {}", e.0.message),
        }
    }
    if placed.is_empty() {
        return Err(AppError::new(ErrorCode::Unavailable, format!("no node is reachable in region {}", want.region)));
    }
    Ok(placed)
}

/// The node a template build runs on: the in-process node when there is one (as in
/// single-machine mode), else the best joined node with room for the build VM — one that
/// holds the base when the base is itself a build. The result lives on that node only:
/// creates from it are placed on nodes that hold it (`Want::template_required`).
pub async fn place_build(
    state: &AppState,
    build: &lizard_node_client::BuildTemplate,
    base_is_built: bool,
) -> ApiResult<Placed> {
    if let Some(local) = state.nodes.local_client() {
        let at = Placement { node_id: LOCAL_NODE_ID.into(), region: state.server.config.region.clone() };
        return Ok(Placed { at, node: local.clone() });
    }
    let want = Want {
        region: state.server.config.region.clone(),
        vcpus: build.recipe.build.vcpus,
        memory_mib: u64::from(build.recipe.build.memory_mib),
        template: build.base_ref.clone(),
        template_required: base_is_built,
    };
    let placed = place_sandbox(state, &want).await?;
    placed.into_iter().next().ok_or_else(|| AppError::new(ErrorCode::Unavailable, "no node to build on"))
}

/// Every node that may hold node templates (to delete one wherever it is): the
/// in-process node and the joined ones that are not down.
pub async fn template_holders(store: &dyn Store, nodes: &Nodes) -> Vec<Arc<dyn NodeClient>> {
    let mut holders: Vec<Arc<dyn NodeClient>> = nodes.local_client().into_iter().cloned().collect();
    match store.list_nodes().await {
        Ok(rows) => {
            for row in rows.iter().filter(|n| n.id != LOCAL_NODE_ID && n.state != NodeState::Down) {
                if let Ok(node) = resolve(store, nodes, &row.id).await {
                    holders.push(node);
                }
            }
        }
        Err(e) => tracing::warn!("cannot list the nodes that may hold a node template: {e}"),
    }
    holders
}

/// `n` as a placement candidate: the in-process node with what it says of itself now; a
/// remote node with its last report. `None` for the in-process row of a server that runs
/// no node, and for a remote row without an address.
fn candidate(state: &AppState, n: &ClusterNode, now: i64) -> Option<Candidate> {
    let lease = i64::try_from(state.server.config.cluster.lease_ms).unwrap_or(i64::MAX);
    let (fresh, report) = if n.id == LOCAL_NODE_ID {
        state.nodes.local_client()?;
        (true, state.nodes.local_node().map(|node| local_report(node)))
    } else {
        n.address.as_ref()?;
        (n.last_heartbeat.is_some_and(|at| at >= now.saturating_sub(lease)), Some(n.report.clone()))
    };
    let in_process = n.id == LOCAL_NODE_ID;
    Some(Candidate { id: n.id.clone(), region: n.region.clone(), state: n.state, fresh, in_process, report })
}

/// What the in-process node says of itself now (its held-sandbox list left out).
pub fn local_report(node: &lizard_node::Node) -> NodeReport {
    let ((cap_vcpus, cap_memory), (used_vcpus, used_memory)) = node.load();
    NodeReport {
        capacity: NodeCapacity {
            vcpus: u32::try_from(cap_vcpus).unwrap_or(u32::MAX),
            memory_mib: cap_memory,
            disk_gib: 0,
        },
        usage: NodeUsage {
            vcpus: u32::try_from(used_vcpus).unwrap_or(u32::MAX),
            memory_mib: used_memory,
            sandboxes: u32::try_from(node.list().len()).unwrap_or(u32::MAX),
        },
        templates: node.built_templates(),
        sandboxes: Vec::new(),
    }
}

/// The handle of the node `node_id`: the in-process one, or a remote one built from its
/// store row. 503 for a node that is down, unknown, or not reachable from this server.
pub async fn resolve(store: &dyn Store, nodes: &Nodes, node_id: &str) -> ApiResult<Arc<dyn NodeClient>> {
    let unavailable = |why: &str| AppError::new(ErrorCode::Unavailable, format!("node {node_id} {why}"));
    if node_id == LOCAL_NODE_ID {
        if let Some(local) = nodes.local_client() {
            return Ok(local.clone());
        }
    }
    let row = store.get_node(node_id).await?.ok_or_else(|| unavailable("is unknown to this server"))?;
    if row.state == NodeState::Down {
        return Err(AppError::new(ErrorCode::Unavailable, format!("its node {node_id} is down")));
    }
    let address = row.address.ok_or_else(|| unavailable("is not reachable from this server"))?;
    Ok(nodes.remote(node_id, &address)?)
}

/// The node handle for `node_id` (see [`resolve`]).
pub async fn node(state: &AppState, node_id: &str) -> ApiResult<Arc<dyn NodeClient>> {
    resolve(state.server.store.as_ref(), &state.nodes, node_id).await
}

/// The node that runs the recorded sandbox.
pub async fn node_of(state: &AppState, record: &SandboxRecord) -> ApiResult<Arc<dyn NodeClient>> {
    node(state, &record.node_id).await
}

/// The node that runs the sandbox `sandbox_id`, by its record; 404 without one.
pub async fn sandbox_node(state: &AppState, sandbox_id: &str) -> ApiResult<Arc<dyn NodeClient>> {
    let record = state
        .server
        .store
        .get_sandbox(sandbox_id)
        .await?
        .ok_or_else(|| AppError::not_found(format!("sandbox {sandbox_id} not found")))?;
    node_of(state, &record).await
}

/// Record the in-process node in the server's region (no-op without one).
pub async fn register_home_node(state: &AppState) -> ApiResult<()> {
    if state.nodes.local_client().is_none() {
        return Ok(());
    }
    let node = NodeRecord {
        id: LOCAL_NODE_ID.to_string(),
        region: state.server.config.region.clone(),
        created_at: lizard_api::ids::now_ms(),
    };
    state.server.store.upsert_node(&node).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(id: &str, region: &str, created_at: i64, volumes: u64) -> NodeLoad {
        NodeLoad { node: NodeRecord { id: id.into(), region: region.into(), created_at }, volumes }
    }

    #[test]
    fn picks_the_least_loaded_node_of_the_region() {
        let loads = [load("n1", "eu", 1, 5), load("n2", "eu", 2, 2), load("n3", "us", 3, 0), load("n4", "eu", 4, 2)];
        assert_eq!(choose(&loads, Some("eu")).unwrap(), Placement { node_id: "n2".into(), region: "eu".into() });
        assert_eq!(choose(&loads, None).unwrap().node_id, "n3");
        let e = choose(&loads, Some("ap")).unwrap_err();
        assert_eq!(e.0.code, lizard_api::ErrorCode::InvalidArgument);
        assert!(e.0.message.contains("eu, us"), "{}", e.0.message);
    }

    fn node(id: &str, region: &str, state: NodeState, fresh: bool, used: (u32, u64), templates: &[&str]) -> Candidate {
        Candidate {
            id: id.into(),
            region: region.into(),
            state,
            fresh,
            in_process: false,
            report: Some(NodeReport {
                capacity: NodeCapacity { vcpus: 8, memory_mib: 8192, disk_gib: 100 },
                usage: NodeUsage { vcpus: used.0, memory_mib: used.1, sandboxes: used.0 },
                templates: templates.iter().map(|t| t.to_string()).collect(),
                sandboxes: vec![],
            }),
        }
    }

    fn want(vcpus: u32, memory_mib: u64, template: &str) -> Want {
        Want { region: "eu".into(), vcpus, memory_mib, template: template.into(), template_required: false }
    }

    #[test]
    fn sandboxes_go_to_fresh_up_nodes_with_room_least_loaded_first_counting_a_missing_snapshot() {
        let nodes = [
            node("busy", "eu", NodeState::Up, true, (4, 6144), &["base"]),
            node("idle", "eu", NodeState::Up, true, (0, 0), &[]),
            node("half", "eu", NodeState::Up, true, (2, 4096), &["base"]),
            node("drained", "eu", NodeState::Draining, true, (0, 0), &["base"]),
            node("down", "eu", NodeState::Down, true, (0, 0), &["base"]),
            node("stale", "eu", NodeState::Up, false, (0, 0), &["base"]),
            node("far", "us", NodeState::Up, true, (0, 0), &["base"]),
            node("full", "eu", NodeState::Up, true, (8, 1024), &["base"]),
        ];
        // Without the snapshot, idle counts as running two more 512 MiB sandboxes: still
        // the least loaded.
        assert_eq!(choose_nodes(&nodes, &want(1, 512, "base")).unwrap(), ["idle", "half", "busy"]);
        assert_eq!(choose_nodes(&nodes, &want(1, 512, "other")).unwrap(), ["idle", "half", "busy"]);
        // A holder running one such sandbox goes before an empty node that would make the
        // snapshot; with three running, after it.
        let light = node("light", "eu", NodeState::Up, true, (1, 512), &["base"]);
        let empty = node("empty", "eu", NodeState::Up, true, (0, 0), &[]);
        assert_eq!(choose_nodes(&[empty.clone(), light], &want(1, 512, "base")).unwrap(), ["light", "empty"]);
        let three = node("three", "eu", NodeState::Up, true, (3, 1536), &["base"]);
        assert_eq!(choose_nodes(&[three, empty], &want(1, 512, "base")).unwrap(), ["empty", "three"]);
        // The busy node has 4 vCPUs but only 2 GiB free.
        assert_eq!(choose_nodes(&nodes, &want(4, 4096, "base")).unwrap(), ["half", "idle"]);
        let required = Want { template_required: true, ..want(1, 512, "base") };
        assert_eq!(choose_nodes(&nodes, &required).unwrap(), ["half", "busy"]);
        let e = choose_nodes(&nodes, &want(16, 512, "base")).unwrap_err();
        assert_eq!(e.0.code, ErrorCode::Unavailable);
        assert_eq!(e.0.message, "no node has room for 16 vCPUs and 512 MiB in region eu");
        let e = choose_nodes(&nodes, &Want { region: "ap".into(), ..want(1, 512, "base") }).unwrap_err();
        assert!(e.0.message.ends_with("in region ap"), "{}", e.0.message);
        // An in-process node behind a test client: room and templates unknown, taken as fine.
        let unknown = Candidate { report: None, ..node("local", "eu", NodeState::Up, true, (0, 0), &[]) };
        assert_eq!(choose_nodes(&[unknown], &required).unwrap(), ["local"]);
        // The in-process node builds pushed templates itself: never excluded for one.
        let local = Candidate { in_process: true, ..node("node_local", "eu", NodeState::Up, true, (0, 0), &[]) };
        assert_eq!(choose_nodes(std::slice::from_ref(&local), &required).unwrap(), ["node_local"]);
        assert_eq!(choose_nodes(&[local], &want(16, 65536, "base")).unwrap(), ["node_local"]);
    }
}
