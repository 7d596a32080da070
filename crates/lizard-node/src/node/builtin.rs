//! Built-in templates, built like any pushed one.
//!
//! A built-in's recipe (compiled into `lizard-image`) starts from a Debian root that the
//! image store makes on the host (mmdebstrap: trusted, pinned inputs), or from another
//! built-in. Its steps run in a build VM through the same builder as a pushed template,
//! with the files beside its recipe (compiled in) as its build context; the finished layer
//! chain is then published in the image store (shared by every node of the machine and
//! kept across data directories, as the test suite's image cache is): flattened over a
//! Debian root, one qcow2 layer over a parent built-in. The build's step layers stay in
//! the node's layer store for the next build of that built-in ([`super::builtin_layers`]).

use super::build::{outcome, BuildTemplate, Scratch};
use super::builtin_layers::{DiskIdentity, KeptLayers};
use super::Node;
use crate::templates::{DiskFormat, NodeTemplate};
use crate::{NodeError, Result};
use lizard_api::templates::BuildEvent;
use lizard_image::{BuiltinOutcome, ImageStore, TemplateImage};
use lizard_recipe::{Base, DebianBase};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

impl Node {
    /// Built-in `name`, built now (reporting to `events`; `cancel` stops the build and
    /// removes what it made) unless the image store has it for its current recipe. Builds
    /// of one name are serialized within the node and, through the image store's lock,
    /// between processes.
    pub(crate) async fn builtin_template(
        self: &Arc<Self>,
        name: &str,
        events: &UnboundedSender<BuildEvent>,
        cancel: &CancellationToken,
    ) -> Result<NodeTemplate> {
        Ok(NodeTemplate::builtin(self.builtin_image(name, events, cancel).await?))
    }

    async fn builtin_image(
        self: &Arc<Self>,
        name: &str,
        events: &UnboundedSender<BuildEvent>,
        cancel: &CancellationToken,
    ) -> Result<TemplateImage> {
        if let Some(image) = self.assets.cached_builtin(name).await? {
            return Ok(image);
        }
        let lock = self
            .snapshot_locks
            .lock()
            .expect("snapshot locks poisoned")
            .entry(format!("builtin-{name}"))
            .or_default()
            .clone();
        let _guard = lock.lock().await;
        let images = self.assets.images();
        let n = name.to_owned();
        let _file_lock =
            tokio::task::spawn_blocking(move || images.lock_builtin(&n)).await.expect("lock task panicked")?;
        if let Some(image) = self.assets.cached_builtin(name).await? {
            return Ok(image);
        }
        Box::pin(self.build_builtin(name, events, cancel)).await
    }

    /// The Debian root `debian` (made on this host by the image store, cached by its hash)
    /// as a base to build on.
    pub(super) async fn debian_root(
        &self,
        debian: &DebianBase,
        disk_gb: u32,
        events: &UnboundedSender<BuildEvent>,
    ) -> Result<NodeTemplate> {
        let _ = events.send(BuildEvent::Phase { message: format!("making the Debian {} root", debian.debian) });
        let (images, d) = (self.assets.images(), debian.clone());
        let image = tokio::task::spawn_blocking(move || images.debian_base(&d, disk_gb))
            .await
            .expect("image build task panicked")?;
        Ok(NodeTemplate {
            name: format!("debian-{}", debian.debian),
            disk: image.rootfs,
            disk_format: DiskFormat::Raw,
            hash: image.hash,
            config: Default::default(),
            start: None,
            description: String::new(),
            builtin: true,
        })
    }

    /// Delete the layers kept from built-in `name`'s last build if they stand on another
    /// disk than `base` (its base made again from the same recipe): their keys would match,
    /// their contents would not.
    fn forget_layers_over_another_base(&self, name: &str, base: DiskIdentity) {
        let Some(kept) = self.builtin_layers.get(name) else { return };
        if kept.base != base {
            self.builtin_layers.remove(name);
            tracing::info!(template = %name, layers = kept.layers.len(), "its base was made again: kept layers dropped");
            self.discard_layers(&kept.layers);
        }
    }

    async fn build_builtin(
        self: &Arc<Self>,
        name: &str,
        events: &UnboundedSender<BuildEvent>,
        cancel: &CancellationToken,
    ) -> Result<TemplateImage> {
        let started = Instant::now();
        let recipe = ImageStore::builtin_recipe(name)?;
        let images = self.assets.images();
        let (base, parent) = match &recipe.from {
            Base::Debian(debian) => (self.debian_root(debian, recipe.build.disk_gb, events).await?, None),
            Base::Template(parent) if parent == name => {
                return Err(NodeError::TemplateNotFound { name: parent.clone() });
            }
            Base::Template(parent) => {
                let parent = Box::pin(self.builtin_image(parent, events, cancel)).await?;
                (NodeTemplate::builtin(parent.clone()), Some(parent))
            }
        };
        let key = images.builtin_key(name)?;
        let files = ImageStore::builtin_context(name)?;
        let blobs = tempfile::Builder::new()
            .prefix(".builtin-files-")
            .tempdir_in(&self.config.data_dir)
            .map_err(|e| NodeError::io("create a directory for a built-in's files", e))?;
        for (sha256, bytes) in &files.contents {
            let path = blobs.path().join(sha256);
            std::fs::write(&path, bytes).map_err(|e| NodeError::io("write a built-in's file", e))?;
        }
        let context = files.context;
        let plan = super::build::plan(&recipe, &base, &context)?
            .map_err(|e| NodeError::io("plan a built-in template", std::io::Error::other(e.to_string())))?;
        let base_disk = DiskIdentity::of(&base.disk).map_err(|e| NodeError::io("read a built-in's base", e))?;
        self.forget_layers_over_another_base(name, base_disk);
        let _running = self.build_running();
        tracing::info!(template = %name, steps = plan.layers.len(), "building a built-in template");
        let req = BuildTemplate {
            template_ref: format!("builtin-{name}"),
            display_name: name.to_owned(),
            recipe,
            base_ref: base.name.clone(),
            context,
            blobs: blobs.path().to_owned(),
        };
        let deadline = started + Duration::from_secs(req.recipe.build.timeout_s.into());
        let mut scratch = Scratch::default();
        let steps = self.run_steps_within(&req, &base, &plan, events, cancel, deadline, &mut scratch).await;
        let published = match steps {
            Ok((_, state)) => {
                let _ = events.send(BuildEvent::Phase { message: format!("publishing template {name}") });
                let (config, start) = outcome(&base, &req.recipe, &state);
                let top = plan.layers.last().map_or(base.disk.clone(), |l| self.template_layers.path(&l.key));
                let outcome = BuiltinOutcome { config, start, build_seconds: started.elapsed().as_secs_f64() };
                let (images, name) = (images.clone(), name.to_owned());
                tokio::task::spawn_blocking(move || images.publish_builtin(&name, &key, &top, parent.as_ref(), outcome))
                    .await
                    .expect("image publish task panicked")
                    .map_err(NodeError::from)
            }
            Err(e) => Err(e),
        };
        // The published image is a copy; the step layers made (those of a failed build's
        // steps that succeeded too) stay for the next build of this built-in, and those of
        // its build before, no longer in its plan, go.
        let layers = plan.layers.iter().map(|l| l.key.clone()).filter(|k| self.template_layers.exists(k)).collect();
        if let Err(e) = self.builtin_layers.set(name, &KeptLayers { base: base_disk, layers }) {
            tracing::warn!(template = %name, "cannot keep a built-in's layers for its next build: {e}");
            self.discard_layers(&scratch.created);
        }
        drop(scratch);
        self.collect_template_layers();
        let image = published?;
        self.assets.remember_builtin(image.clone()).await;
        tracing::info!(template = %name, seconds = started.elapsed().as_secs(), "built-in template ready");
        Ok(image)
    }
}
