//! Volume disks over the node API: what the control plane asks of the node that keeps a
//! volume (make, delete, who holds it).

use super::{parse_json, Result};
use crate::Node;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use lizard_api::node_api::{NodeVolumeRequest, VolumeHolder};
use std::sync::Arc;

pub async fn create(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<StatusCode> {
    let req: NodeVolumeRequest = parse_json(&body)?;
    node.create_volume(&id, req.size_gb).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn delete(State(node): State<Arc<Node>>, Path(id): Path<String>) -> Result<StatusCode> {
    node.delete_volume(&id)?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn holder(State(node): State<Arc<Node>>, Path(id): Path<String>) -> Json<VolumeHolder> {
    Json(VolumeHolder { sandbox_id: node.volume_holder(&id) })
}
