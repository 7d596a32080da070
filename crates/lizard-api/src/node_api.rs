//! What the control plane and a node say over the node's own API beyond the sandbox
//! routes: volumes, template builds, built-in templates and port tunnels (the
//! [`crate::routes::node`] routes that exist on nodes only).
//!
//! A build's request body is a [`NodeBuildRequest`] as one JSON line, then the bytes of
//! each distinct file of its context ([`NodeBuildRequest::blob_order`]), back to back:
//! the sizes are in the context, so no framing is needed, and a node never reads a
//! server's disk. The answer is NDJSON: [`NodeBuildLine`]s (blank lines keep an idle
//! connection checked), ending with `built`, `failed` or `refused`.

use crate::templates::{BuildEvent, BuildFailure, BuildStepInfo};
use crate::ApiError;
use serde::{Deserialize, Serialize};

/// `PUT /v1/node/volumes/{id}`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeVolumeRequest {
    pub size_gb: u32,
}

/// `GET /v1/node/volumes/{id}/holder`: the sandbox holding a volume's disk now.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeHolder {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
}

/// A sandbox snapshot on a node: a running sandbox saved under an id of its own, which
/// a create names in `snapshot` to start from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NodeSandboxSnapshot {
    pub id: String,
    /// The sandbox it was taken of.
    pub source: String,
    /// The template that sandbox was made from.
    pub template: String,
    pub vcpus: u32,
    pub memory_mib: u32,
}

/// `GET /v1/node/templates/builtin`: one template built into the node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BuiltinTemplateInfo {
    pub name: String,
    #[serde(default)]
    pub description: String,
}

/// The first line of `POST /v1/node/templates/builds`: the build, without its blobs.
#[cfg(feature = "recipe")]
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeBuildRequest {
    pub template_ref: String,
    pub display_name: String,
    pub recipe: lizard_recipe::Recipe,
    pub base_ref: String,
    pub context: lizard_recipe::Context,
}

#[cfg(feature = "recipe")]
impl NodeBuildRequest {
    /// The files whose bytes follow the header line, in order: each distinct SHA-256 of
    /// the context's files once, sorted, with its size.
    pub fn blob_order(&self) -> Vec<(String, u64)> {
        let mut blobs: Vec<(String, u64)> = self
            .context
            .entries
            .iter()
            .filter_map(|e| match &e.kind {
                lizard_recipe::EntryKind::File { sha256, size } => Some((sha256.clone(), *size)),
                _ => None,
            })
            .collect();
        blobs.sort();
        blobs.dedup_by(|a, b| a.0 == b.0);
        blobs
    }
}

/// One line of a build's answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum NodeBuildLine {
    /// Something the build did (never `done`: the last line says how it ended).
    Event { event: BuildEvent },
    /// The template is built and registered on the node.
    #[serde(rename_all = "camelCase")]
    Built { template_ref: String, steps: Vec<BuildStepInfo>, layer_bytes: u64 },
    /// The build ran and failed (a step, the time limit, the start command, a cancel).
    Failed { failure: BuildFailure },
    /// The node refused the build (an unknown base, a node error).
    Refused { error: ApiError },
}

#[cfg(all(test, feature = "recipe"))]
mod tests {
    use super::*;

    #[test]
    fn blobs_follow_in_hash_order_once_each() {
        let file = |path: &str, sha: &str, size| lizard_recipe::Entry {
            path: path.into(),
            mode: 0o644,
            kind: lizard_recipe::EntryKind::File { sha256: sha.into(), size },
        };
        let dir = lizard_recipe::Entry { path: "d".into(), mode: 0o755, kind: lizard_recipe::EntryKind::Dir };
        let recipe: lizard_recipe::Recipe =
            serde_json::from_value(serde_json::json!({"name": "t", "from": "base"})).expect("a minimal recipe");
        let req = NodeBuildRequest {
            template_ref: "tb-1".into(),
            display_name: "t".into(),
            recipe,
            base_ref: "base".into(),
            context: lizard_recipe::Context {
                entries: vec![file("b", "bb", 2), dir, file("a", "aa", 1), file("c", "bb", 2)],
            },
        };
        assert_eq!(req.blob_order(), [("aa".to_string(), 1), ("bb".to_string(), 2)]);
        let line =
            serde_json::to_value(NodeBuildLine::Built { template_ref: "tb-1".into(), steps: vec![], layer_bytes: 3 })
                .expect("serializes");
        assert_eq!(line, serde_json::json!({"type": "built", "templateRef": "tb-1", "steps": [], "layerBytes": 3}));
    }
}
