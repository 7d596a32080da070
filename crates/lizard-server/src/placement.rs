//! Where things run: a volume is placed on a node (and so in that node's region), and a
//! sandbox that mounts a volume runs on the volume's node.
//!
//! Nodes are rows of the store's `nodes` table; placement picks among them, so a second
//! node is a second row (plus a way to reach it), not new placement code. Today the
//! server has one node, in-process, registered under [`LOCAL_NODE_ID`] in the server's
//! region each time placement runs.

use crate::api::AppState;
use crate::error::{ApiResult, AppError};
use crate::store::{NodeLoad, NodeRecord};
use std::sync::Arc;

/// The id of the node that runs inside the server process.
pub const LOCAL_NODE_ID: &str = "node_local";

/// A node chosen for something.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub node_id: String,
    pub region: String,
}

/// The node for a new volume: in `region` when given, the one with the fewest volumes
/// (ties: the oldest node). No node in that region → 422 naming the regions there are.
pub async fn place_volume(state: &AppState, region: Option<&str>) -> ApiResult<Placement> {
    register_local_node(state).await?;
    let loads = state.server.store.node_loads().await?;
    choose(&loads, region)
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

/// The node handle for `node_id`: the in-process node, or 503 for a node this server
/// cannot reach.
pub fn node(state: &AppState, node_id: &str) -> ApiResult<Arc<lizard_node::Node>> {
    if node_id == LOCAL_NODE_ID {
        Ok(state.node.clone())
    } else {
        Err(AppError::new(
            lizard_api::ErrorCode::Unavailable,
            format!("node {node_id} is not reachable from this server"),
        ))
    }
}

/// Record the in-process node under [`LOCAL_NODE_ID`] in the server's region.
pub async fn register_local_node(state: &AppState) -> ApiResult<()> {
    let node = NodeRecord {
        id: LOCAL_NODE_ID.into(),
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
