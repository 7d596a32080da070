//! Where things run: a volume is placed on a node (and so in that node's region), a
//! sandbox that mounts a volume runs on the volume's node, and any other sandbox on the
//! home node. Every answer is a node handle ([`NodeClient`]) ready to be called.
//!
//! Nodes are rows of the store's `nodes` table; placement picks among them, so a second
//! node is a second row (plus a [`NodeClient`] to reach it in [`crate::nodes::Nodes`]),
//! not new placement code. Today the server has one node, in-process, registered under
//! [`LOCAL_NODE_ID`] in the server's region each time placement runs.

use crate::error::{ApiResult, AppError};
use crate::nodes::NodeClient;
use crate::state::AppState;
use crate::store::{NodeLoad, NodeRecord};
use std::sync::Arc;

pub use crate::nodes::LOCAL_NODE_ID;

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

/// The node for a new volume: in `region` when given, the one with the fewest volumes
/// (ties: the oldest node). No node in that region → 422 naming the regions there are;
/// a chosen node this server cannot reach → 503.
pub async fn place_volume(state: &AppState, region: Option<&str>) -> ApiResult<Placed> {
    register_home_node(state).await?;
    let loads = state.server.store.node_loads().await?;
    let at = choose(&loads, region)?;
    let node = node(state, &at.node_id)?;
    Ok(Placed { at, node })
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

/// The node for a new sandbox without a volume.
pub fn place_sandbox(state: &AppState) -> Arc<dyn NodeClient> {
    state.nodes.home()
}

/// The node that runs the sandbox `sandbox_id`. Sandbox records do not name a node yet
/// (one node per server): it is the home node.
pub fn sandbox_node(state: &AppState, _sandbox_id: &str) -> Arc<dyn NodeClient> {
    state.nodes.home()
}

/// The node handle for `node_id`, or 503 for a node this server cannot reach.
pub fn node(state: &AppState, node_id: &str) -> ApiResult<Arc<dyn NodeClient>> {
    Ok(state.nodes.get(node_id)?)
}

/// Record the home node in the server's region.
pub async fn register_home_node(state: &AppState) -> ApiResult<()> {
    let node = NodeRecord {
        id: state.nodes.home_id().to_string(),
        region: state.server.config.region.clone(),
        created_at: crate::ids::now_ms(),
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
}
