//! Templates over the node API: the built-in ones, and deleting a built one.

use super::Result;
use crate::Node;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use lizard_api::node_api::BuiltinTemplateInfo;
use std::sync::Arc;

/// The templates built into this node's release.
pub fn builtin_templates() -> Vec<BuiltinTemplateInfo> {
    lizard_image::ImageStore::template_names()
        .into_iter()
        .map(|name| BuiltinTemplateInfo {
            name: name.to_owned(),
            description: lizard_image::ImageStore::builtin_recipe(name).map(|r| r.description).unwrap_or_default(),
        })
        .collect()
}

pub async fn builtin() -> Json<Vec<BuiltinTemplateInfo>> {
    Json(builtin_templates())
}

pub async fn delete(State(node): State<Arc<Node>>, Path(template_ref): Path<String>) -> Result<StatusCode> {
    node.delete_template(&template_ref).await?;
    Ok(StatusCode::NO_CONTENT)
}
