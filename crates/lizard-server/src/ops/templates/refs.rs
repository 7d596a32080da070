//! Node templates (a build's result on the node that made it): deleted wherever they are
//! once nothing keeps them.

use crate::placement;
use crate::state::AppState;
use lizard_api::ErrorCode;
use lizard_node_client::{NodeResult, Nodes};
use lizard_store::Store;

/// Delete a node template nothing keeps any more (a rebuild replaced it, or its last tag
/// moved): no live sandbox runs from it, no tag names its build, it is no current build.
pub(super) async fn release_ref(state: &AppState, node_ref: &str) {
    match state.server.store.template_ref_in_use(node_ref).await {
        Ok(false) => {
            if let Err(e) = delete_node_template(state.server.store.as_ref(), &state.nodes, node_ref).await {
                tracing::info!(template_ref = node_ref, "replaced node template kept: {}", e.message);
            }
        }
        Ok(true) => tracing::info!(template_ref = node_ref, "replaced node template kept while sandboxes use it"),
        Err(e) => tracing::warn!(template_ref = node_ref, "cannot tell whether a node template is in use: {e}"),
    }
}

/// Delete the node template `template_ref` on every node that may hold it (it lives on
/// the node that built it). Ok when no node keeps it; the first refusal other than
/// NOT_FOUND (a sandbox runs from it: 409) otherwise.
pub async fn delete_node_template(store: &dyn Store, nodes: &Nodes, template_ref: &str) -> NodeResult<()> {
    let mut result = Ok(());
    for node in placement::template_holders(store, nodes).await {
        match node.delete_template(template_ref).await {
            Err(e) if e.code != ErrorCode::NotFound && result.is_ok() => result = Err(e),
            _ => {}
        }
    }
    result
}
