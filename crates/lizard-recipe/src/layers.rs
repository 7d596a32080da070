//! Cache keys of the layers a recipe builds.
//!
//! Layer *i* is the disk after step *i*; its key is a SHA-256 over the key of layer *i − 1*
//! (the base's key for the first step), the step as written, and the content of what the
//! step reads from the context (for `copy`: each entry's path below the source, mode, and
//! content hash or link target). Two builds whose first *k* steps agree share their first
//! *k* layers, so changing the last step rebuilds only that step — and a rename of a file
//! the build never copies changes nothing.

use crate::context::{Context, ContextError, EntryKind};
use crate::recipe::{Recipe, Step};
use sha2::{Digest, Sha256};

/// Changes whenever the builder's way of making a layer from a step changes.
pub const LAYER_FORMAT: &str = "lizard-layer/1";

/// A recipe's steps with their keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerPlan {
    /// Key of the layer the first step starts from.
    pub base_key: String,
    pub layers: Vec<PlannedLayer>,
}

/// One step to build (or to find in the cache).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedLayer {
    /// 1-based, as build logs count steps.
    pub index: usize,
    pub key: String,
    pub step: Step,
}

impl LayerPlan {
    /// Key of the last layer: the template's disk before its start command.
    pub fn top(&self) -> &str {
        self.layers.last().map_or(self.base_key.as_str(), |l| l.key.as_str())
    }
}

/// Keys every step of `recipe` over the layer `base_key`; fails when a `copy` takes
/// something the context lacks or a symlink out of it.
pub fn plan(recipe: &Recipe, base_key: &str, context: &Context) -> Result<LayerPlan, ContextError> {
    let mut parent = base_key.to_owned();
    let mut layers = Vec::with_capacity(recipe.steps.len());
    for (i, step) in recipe.steps.iter().enumerate() {
        let mut hasher = Sha256::new();
        for part in [LAYER_FORMAT, parent.as_str(), &serde_json::to_string(step).unwrap_or_default()] {
            hasher.update(part.as_bytes());
            hasher.update(b"\n");
        }
        if let Step::Copy(copy) = step {
            let src = crate::context::normalize(&copy.src)?;
            for entry in context.select(&copy.src)? {
                let below = entry.path.strip_prefix(src.as_str()).unwrap_or(&entry.path);
                let content = match &entry.kind {
                    EntryKind::File { sha256, .. } => format!("file {sha256}"),
                    EntryKind::Dir => "dir".to_owned(),
                    EntryKind::Symlink { target, .. } => format!("symlink {target}"),
                };
                hasher.update(format!("{below}\t{:o}\t{content}\n", entry.mode).as_bytes());
            }
        }
        let key = hex::encode(hasher.finalize());
        layers.push(PlannedLayer { index: i + 1, key: key.clone(), step: step.clone() });
        parent = key;
    }
    Ok(LayerPlan { base_key: base_key.to_owned(), layers })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::ContextLimits;

    fn context(files: &[(&str, &str)]) -> (tempfile::TempDir, Context) {
        let dir = tempfile::tempdir().unwrap();
        for (path, content) in files {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
        let ctx = Context::scan(dir.path(), ContextLimits::default()).unwrap();
        (dir, ctx)
    }

    fn recipe(last_run: &str) -> Recipe {
        Recipe::from_toml(&format!(
            "name = \"t\"\nfrom = \"base\"\n[[steps]]\napt = [\"jq\"]\n[[steps]]\ncopy = {{ src = \"tools\", dest = \"/opt/tools\" }}\n[[steps]]\nrun = \"{last_run}\""
        ))
        .unwrap()
    }

    fn keys(plan: &LayerPlan) -> Vec<&str> {
        plan.layers.iter().map(|l| l.key.as_str()).collect()
    }

    #[test]
    fn a_changed_last_step_changes_only_the_last_key() {
        let (_d, ctx) = context(&[("tools/a.sh", "echo a")]);
        let one = plan(&recipe("true"), "base-key", &ctx).unwrap();
        let two = plan(&recipe("false"), "base-key", &ctx).unwrap();
        assert_eq!(keys(&one)[..2], keys(&two)[..2]);
        assert_ne!(keys(&one)[2], keys(&two)[2]);
        assert_eq!(one.top(), keys(&one)[2]);
        assert_eq!(plan(&recipe("true"), "base-key", &ctx).unwrap(), one, "keys are deterministic");
    }

    #[test]
    fn copied_content_changes_the_copy_and_every_later_key() {
        let (_d, before) = context(&[("tools/a.sh", "echo a"), ("README", "x")]);
        let (_e, edited) = context(&[("tools/a.sh", "echo b"), ("README", "x")]);
        let (_f, unrelated) = context(&[("tools/a.sh", "echo a"), ("README", "changed, but never copied")]);
        let base = plan(&recipe("true"), "k", &before).unwrap();
        let changed = plan(&recipe("true"), "k", &edited).unwrap();
        assert_eq!(keys(&base)[0], keys(&changed)[0]);
        assert_ne!(keys(&base)[1], keys(&changed)[1]);
        assert_ne!(keys(&base)[2], keys(&changed)[2], "a later step sits on a different layer");
        assert_eq!(plan(&recipe("true"), "k", &unrelated).unwrap(), base);
    }

    #[test]
    fn another_base_changes_every_key() {
        let (_d, ctx) = context(&[("tools/a.sh", "echo a")]);
        let a = plan(&recipe("true"), "base-1", &ctx).unwrap();
        let b = plan(&recipe("true"), "base-2", &ctx).unwrap();
        assert!(keys(&a).iter().zip(keys(&b)).all(|(x, y)| *x != y));
        let empty = Recipe::from_toml("name = \"t\"\nfrom = \"base\"").unwrap();
        assert_eq!(plan(&empty, "base-1", &ctx).unwrap().top(), "base-1");
    }

    #[test]
    fn a_copy_of_something_missing_fails_the_plan() {
        let (_d, ctx) = context(&[("other/a.sh", "echo a")]);
        assert!(matches!(plan(&recipe("true"), "k", &ctx), Err(ContextError::Missing { .. })));
    }
}
