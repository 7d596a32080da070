//! Building a template from a recipe, inside a microVM, and deleting built templates.
//!
//! A build plans its layers ([`lizard_recipe::plan`]: one key per step), takes the longest
//! prefix whose layers exist from the cache, and runs the remaining steps in ONE build VM
//! cold-booted over the top cached layer (or the base's disk). After each step the guest
//! syncs and the VM's overlay is frozen into that step's layer (QMP
//! `blockdev-snapshot-sync` onto a new overlay, as a fork does); the layer is linked
//! under its final name only then. The result is registered (`template.json`) and, when
//! the node does snapshots, its template snapshot is made at once (with the start
//! command running), so the first create is a restore.
//!
//! Whatever ends a build early — a failing step, the time limit, a cancel — the build
//! VM, its directory and network, and the layers this build made are removed; a cancel
//! or the time limit while the template snapshot is made (a start command awaited)
//! stops that at once, its VM killed.

use super::Node;
use crate::error::BuildError;
use crate::guest_steps::{self, StepRef};
use crate::layer_store::LayerLock;
use crate::network::SandboxNet;
use crate::templates::{self, NodeTemplate, StartSpec, TemplateRecord};
use crate::vm::{self, Machine};
use crate::{sandbox, NodeError, Result};
use lizard_agent_client::AgentClient;
use lizard_agent_proto::handshake::Secret;
use lizard_api::templates::{BuildEvent, BuildStatus, BuildStepInfo};
use lizard_image::ImageStore;
use lizard_recipe::{Action, Base, BuildState, LayerPlan, Step};
use lizard_vmm::Vm;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

pub use lizard_api::templates::{BuildTemplate, BuiltTemplate};

/// What a build has made so far, to remove when it ends early. Owned outside the
/// build's future, so that a cancel or a timeout (which drop that future) still finds it.
#[derive(Default)]
pub(super) struct Scratch {
    vm: Option<Box<dyn Vm>>,
    run_dir: Option<PathBuf>,
    net: Option<SandboxNet>,
    /// Layer keys this build published.
    pub(super) created: Vec<String>,
    /// Held until the build ends: shared on the cached layers, exclusive on the ones it makes.
    locks: Vec<LayerLock>,
    /// The build VM's CPUs and memory, counted with the sandboxes' until it is gone.
    reservation: Option<crate::confine::Reservation>,
}

impl Scratch {
    /// Stop the build VM and remove its directory and network.
    async fn drop_vm(&mut self) {
        if let Some(vm) = self.vm.take() {
            let _ = vm.kill().await;
        }
        self.reservation.take();
        if let Some(dir) = self.run_dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
        self.net.take();
    }
}

/// Counts a build as running while it lives.
pub(super) struct Running<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Node {
    /// Build in a microVM; events go to `events` as they happen (the last one is not
    /// `Done`: the caller sends `Done` from the returned result). Cancelling `cancel`
    /// stops the build and leaves nothing behind (VM, overlay, layers of this build,
    /// network).
    pub async fn build_template(
        self: &Arc<Self>,
        req: BuildTemplate,
        events: UnboundedSender<BuildEvent>,
        cancel: CancellationToken,
    ) -> Result<BuiltTemplate> {
        let node = self.clone();
        tokio::spawn(async move { node.build_now(req, events, cancel).await }).await.expect("build task panicked")
    }

    async fn build_now(
        self: &Arc<Self>,
        req: BuildTemplate,
        events: UnboundedSender<BuildEvent>,
        cancel: CancellationToken,
    ) -> Result<BuiltTemplate> {
        let started = Instant::now();
        let name = &req.template_ref;
        if !templates::is_valid_ref(name) || ImageStore::template_names().contains(&name.as_str()) {
            return Err(BuildError::BadRef { template_ref: name.clone() }.into());
        }
        if self.templates.contains(name) {
            return Err(BuildError::RefTaken { template_ref: name.clone() }.into());
        }
        // The base stays while the build stands on it (its layers are not yet in a chain
        // of a registered template).
        let _claim = self.claim_template(&req.base_ref);
        let (base, base_record) = match &req.recipe.from {
            // Only the fixed roots (lizard_recipe::DebianBase::for_push): the host runs no
            // package a user chose.
            Base::Debian(debian) => match debian.pushable() {
                Some(root) => (self.debian_root(&root, req.recipe.build.disk_gb, &events).await?, None),
                None => return Err(NodeError::TemplateNotFound { name: format!("debian:{}", debian.debian) }),
            },
            Base::Template(_) => self.build_base(&req.base_ref, &events, &cancel).await?,
        };
        let plan = plan(&req.recipe, &base, &req.context)?.map_err(|e| copy_refused(&req.recipe, &req.context, e))?;
        let _running = self.build_running();
        tracing::info!(template = %name, display = %req.display_name, base = %req.base_ref, "template build starting");

        let deadline = started + Duration::from_secs(req.recipe.build.timeout_s.into());
        let mut scratch = Scratch::default();
        let steps = self.run_steps_within(&req, &base, &plan, &events, &cancel, deadline, &mut scratch).await;
        let result = match steps {
            Ok(steps) => {
                self.register(&req, &base, base_record.as_ref(), &plan, steps, &events, &cancel, deadline).await
            }
            Err(e) => Err(e),
        };
        if result.is_err() {
            self.discard_layers(&scratch.created);
        }
        drop(scratch);
        match &result {
            Ok(_) => tracing::info!(template = %name, ms = started.elapsed().as_millis(), "template built"),
            Err(e) => {
                tracing::info!(template = %name, ms = started.elapsed().as_millis(), "template build failed: {e}")
            }
        }
        result
    }

    /// The base template and, for a built one, its record. A built-in base that is not
    /// built yet is built first (reported to `events`).
    async fn build_base(
        self: &Arc<Self>,
        base_ref: &str,
        events: &UnboundedSender<BuildEvent>,
        cancel: &CancellationToken,
    ) -> Result<(NodeTemplate, Option<TemplateRecord>)> {
        if let Some(record) = self.templates.get(base_ref) {
            return Ok((record.template(|k| self.template_layers.path(k)), Some(record)));
        }
        if !ImageStore::template_names().contains(&base_ref) {
            return Err(NodeError::TemplateNotFound { name: base_ref.to_owned() });
        }
        Ok((self.builtin_template(base_ref, events, cancel).await?, None))
    }

    /// [`Node::run_steps`] until `cancel` or `deadline`; the build VM is gone after.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn run_steps_within(
        self: &Arc<Self>,
        req: &BuildTemplate,
        base: &NodeTemplate,
        plan: &LayerPlan,
        events: &UnboundedSender<BuildEvent>,
        cancel: &CancellationToken,
        deadline: Instant,
        scratch: &mut Scratch,
    ) -> Result<(Vec<BuildStepInfo>, BuildState)> {
        let limit_s = req.recipe.build.timeout_s;
        let steps = tokio::select! {
            r = self.run_steps(req, base, plan, events, scratch) => r,
            () = cancel.cancelled() => Err(BuildError::Cancelled.into()),
            () = tokio::time::sleep_until(deadline.into()) => Err(BuildError::TimedOut { limit_s }.into()),
        };
        scratch.drop_vm().await;
        steps
    }

    /// Count a build as running (layer collection then spares temporary layers) until
    /// the guard is dropped.
    pub(super) fn build_running(&self) -> Running<'_> {
        self.builds_running.fetch_add(1, Ordering::SeqCst);
        Running(&self.builds_running)
    }

    /// Delete the layers `keys` that no registered template uses and no built-in keeps.
    pub(super) fn discard_layers(&self, keys: &[String]) {
        let in_use = self.template_layers_in_use();
        for key in keys.iter().filter(|k| !in_use.contains(*k)) {
            self.template_layers.remove(key);
        }
    }

    /// Lock the plan's layers, take the cached prefix, run the rest in a build VM.
    async fn run_steps(
        self: &Arc<Self>,
        req: &BuildTemplate,
        base: &NodeTemplate,
        plan: &LayerPlan,
        events: &UnboundedSender<BuildEvent>,
        scratch: &mut Scratch,
    ) -> Result<(Vec<BuildStepInfo>, BuildState)> {
        let store = &self.template_layers;
        // Locks in plan order (keys of one position are a chain, so every build takes
        // them in the same order): shared on the cached prefix, exclusive from there.
        let mut cached = 0;
        for layer in &plan.layers {
            if !store.exists(&layer.key) {
                break;
            }
            let lock = store.read(&layer.key).await;
            // A failed build removes its layers before it lets go of them.
            if !store.exists(&layer.key) {
                break;
            }
            scratch.locks.push(lock);
            cached += 1;
        }
        for layer in &plan.layers[cached..] {
            scratch.locks.push(store.write(&layer.key).await);
        }
        // Another build may have made some of them meanwhile.
        while cached < plan.layers.len() && store.exists(&plan.layers[cached].key) {
            cached += 1;
        }

        let total = u32::try_from(plan.layers.len()).expect("a recipe has at most 256 steps");
        let mut state = BuildState::new(&base.config);
        let mut infos = Vec::with_capacity(plan.layers.len());
        for layer in &plan.layers[..cached] {
            state.apply(&layer.step);
            let index = step_index(layer.index);
            let description = layer.step.summary();
            let _ = events.send(BuildEvent::Step { index, total, description: description.clone(), cached: true });
            let _ = events.send(BuildEvent::StepDone { index, duration_ms: 0 });
            infos.push(BuildStepInfo {
                index,
                description,
                cached: true,
                status: BuildStatus::Ready,
                duration_ms: Some(0),
            });
        }
        if cached == plan.layers.len() {
            return Ok((infos, state));
        }

        let (disk, format) = match cached {
            0 => (base.disk.clone(), base.disk_format.as_str()),
            n => (store.path(&plan.layers[n - 1].key), "qcow2"),
        };
        let _ = events.send(BuildEvent::Phase { message: "booting the build VM".into() });
        let agent = self.boot_build_vm(req, &disk, format, scratch).await?;
        let size = disk_size(&req.recipe, base)?;
        if size > vm::virtual_size(&disk, format)? {
            let gib = size >> 30;
            let _ = events.send(BuildEvent::Phase { message: format!("growing the root file system to {gib} GiB") });
            scratch.vm.as_ref().expect("the build VM runs").grow_root_disk(size).await?;
            let index = step_index(plan.layers[cached].index);
            let grow = format!("grow the root file system to {gib} GiB");
            let step = StepRef { index, description: &grow, events };
            let resize = lizard_recipe::Command {
                argv: vec!["resize2fs".into(), "/dev/vda".into()],
                env: Default::default(),
                cwd: "/".into(),
                user: "root".into(),
            };
            guest_steps::exec(&agent, &step, &resize).await?;
        }
        let nonce = sandbox::new_id();
        let run_dir = scratch.run_dir.clone().expect("the build VM has a directory");
        let mut top = scratch.vm.as_ref().expect("the build VM runs").config().root_disk.clone();
        for layer in &plan.layers[cached..] {
            let index = step_index(layer.index);
            let description = layer.step.summary();
            let _ = events.send(BuildEvent::Step { index, total, description: description.clone(), cached: false });
            let begun = Instant::now();
            let step = StepRef { index, description: &description, events };
            match (&layer.step, state.apply(&layer.step)) {
                (_, Action::Exec(cmd)) => guest_steps::exec(&agent, &step, &cmd).await?,
                (_, Action::Copy(copy)) => guest_steps::copy(&agent, &step, &copy, &req.context, &req.blobs).await?,
                (Step::Workdir(dir), Action::State) => guest_steps::make_workdir(&agent, &step, dir).await?,
                (_, Action::State) => {}
            }
            // Freeze what the step wrote into its layer; the VM goes on in a new overlay.
            guest_steps::sync(&agent, &step).await?;
            let next = run_dir.join(format!("step-{index}.qcow2"));
            let layer_path = store.path(&layer.key);
            vm::create_overlay_naming(&layer_path, &top, &next)?;
            scratch.vm.as_ref().expect("the build VM runs").freeze_disk(&next).await?;
            store
                .publish(&layer.key, &top, &nonce)
                .map_err(|e| NodeError::io(format!("publish layer {}", layer_path.display()), e))?;
            scratch.created.push(layer.key.clone());
            top = next;
            let duration_ms = u64::try_from(begun.elapsed().as_millis()).unwrap_or(u64::MAX);
            let _ = events.send(BuildEvent::StepDone { index, duration_ms });
            infos.push(BuildStepInfo {
                index,
                description,
                cached: false,
                status: BuildStatus::Ready,
                duration_ms: Some(duration_ms),
            });
        }
        Ok((infos, state))
    }

    /// Cold-boot the build VM (`[build]` shape and network) over `disk`.
    async fn boot_build_vm(
        &self,
        req: &BuildTemplate,
        disk: &std::path::Path,
        format: &str,
        scratch: &mut Scratch,
    ) -> Result<AgentClient> {
        let build = &req.recipe.build;
        // Admitted as a sandbox of its size is, and counted with them while it runs.
        let (vcpus, memory_mib) =
            crate::confine::sizes::check(build.vcpus, build.memory_mib).map_err(crate::confine::ConfineError::from)?;
        self.check_build_disk(u64::from(build.disk_gb) << 30)?;
        scratch.reservation = Some(self.reserve(1, vcpus, memory_mib)?);
        let boot = self.assets.boot_files().await?;
        let machine = Machine::new(&boot, vcpus, memory_mib, self.accel().await?);
        let id = sandbox::new_id();
        let run_dir = self.sandboxes_dir().join(&id);
        scratch.run_dir = Some(run_dir.clone());
        let policy =
            lizard_api::network::NetworkPolicy { allow_internet_access: Some(build.internet), ..Default::default() };
        scratch.net = self.attach_network(&policy).await?;
        let config = vm::sandbox_vm(&id, run_dir, &machine, None, scratch.net.as_ref().map(|n| n.attachment()));
        let secret = Secret::generate();
        tracing::info!(template = %req.template_ref, vm = %id, "booting the build VM");
        let launched =
            vm::cold_boot(self.backend.as_ref(), &config, disk, format, &secret, self.config.boot_timeout).await?;
        scratch.vm = Some(launched.vm);
        Ok(launched.agent)
    }

    /// Record the built template, then make its template snapshot (start command
    /// running); a start command that does not get ready fails the build and unregisters it.
    #[allow(clippy::too_many_arguments)]
    async fn register(
        self: &Arc<Self>,
        req: &BuildTemplate,
        base: &NodeTemplate,
        base_record: Option<&TemplateRecord>,
        plan: &LayerPlan,
        (steps, state): (Vec<BuildStepInfo>, BuildState),
        events: &UnboundedSender<BuildEvent>,
        cancel: &CancellationToken,
        deadline: Instant,
    ) -> Result<BuiltTemplate> {
        let recipe = &req.recipe;
        let mut layers: Vec<String> = base_record.map(|r| r.layers.clone()).unwrap_or_default();
        layers.extend(plan.layers.iter().map(|l| l.key.clone()));
        let own: Vec<&str> = plan.layers.iter().map(|l| l.key.as_str()).collect();
        let layer_bytes = own.iter().map(|k| self.template_layers.bytes(k)).sum();
        let (config, start) = outcome(base, recipe, &state);
        let top = layers.last().cloned().unwrap_or_else(|| base.hash.clone());
        let (root_disk, root_format) = match base_record {
            Some(r) => (r.root_disk.clone(), r.root_format),
            None => (base.disk.clone(), base.disk_format),
        };
        let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let record = TemplateRecord {
            format: templates::RECORD_FORMAT,
            template_ref: req.template_ref.clone(),
            display_name: req.display_name.clone(),
            base_ref: req.base_ref.clone(),
            root_disk,
            root_format,
            layers,
            own_layers: plan.layers.len(),
            hash: templates::built_hash(&top, &config, start.as_ref()),
            config,
            start,
            description: recipe.description.clone(),
            layer_bytes,
            // Milliseconds since 1970 fit a u64 for the next 500 million years.
            created_at_ms: u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX),
        };
        let template = record.template(|k| self.template_layers.path(k));
        self.templates.insert(record)?;
        if self.config.snapshots {
            let _ = events.send(BuildEvent::Phase {
                message: if template.start.is_some() {
                    "starting the start command and saving the template snapshot".into()
                } else {
                    "saving the template snapshot".into()
                },
            });
            // In its own task, aborted by a cancel or the time limit (an aborted snapshot
            // build kills its VM and removes its files: `snapshot::build`), not awaited
            // to the end of a start command's wait.
            let node = self.clone();
            let t = template.clone();
            let mut snapshot = tokio::spawn(async move { node.default_snapshot(&t).await });
            let limit_s = recipe.build.timeout_s;
            let stopped = |snapshot: tokio::task::JoinHandle<Result<()>>, why: BuildError| async move {
                snapshot.abort();
                let _ = snapshot.await;
                Err(why.into())
            };
            let made = tokio::select! {
                r = &mut snapshot => r.expect("snapshot task panicked"),
                () = cancel.cancelled() => stopped(snapshot, BuildError::Cancelled).await,
                () = tokio::time::sleep_until(deadline.into()) => stopped(snapshot, BuildError::TimedOut { limit_s }).await,
            };
            let failed = match made {
                Ok(()) => None,
                Err(NodeError::Start(e)) => Some(NodeError::Build(BuildError::StartNotReady(e))),
                Err(e @ NodeError::Build(_)) => Some(e),
                // Creates fall back to cold boots (which start the command themselves).
                Err(e) => {
                    tracing::warn!(template = %req.template_ref, "no template snapshot for the built template: {e}");
                    None
                }
            };
            if let Some(e) = failed {
                self.unregister(&req.template_ref);
                return Err(e);
            }
        }
        Ok(BuiltTemplate { template_ref: req.template_ref.clone(), steps, layer_bytes })
    }

    /// The template snapshot of `template` in the size a create that names none gets.
    async fn default_snapshot(&self, template: &NodeTemplate) -> Result<()> {
        let boot = self.assets.boot_files().await?;
        let (vcpus, memory_mib) = self.sandbox_size(template, None, None)?;
        let _reservation = self.reserve(1, vcpus, memory_mib)?;
        let machine = Machine::new(&boot, vcpus, memory_mib, self.accel().await?);
        self.template_snapshot(template, &boot, &machine).await.map(drop)
    }

    /// Forget a built template and its snapshots (its layers are collected after).
    fn unregister(&self, template_ref: &str) {
        if let Err(e) = self.templates.remove(template_ref) {
            tracing::warn!(template = %template_ref, "{e}");
        }
        self.remove_snapshots_of(template_ref);
    }

    /// Forget a built template and delete the layers no other template uses.
    /// [`NodeError::TemplateInUse`] while a sandbox (running or paused) uses it.
    pub async fn delete_template(&self, template_ref: &str) -> Result<()> {
        if !self.templates.contains(template_ref) {
            return Err(NodeError::TemplateNotFound { name: template_ref.to_owned() });
        }
        {
            // Held while checking and removing: a create or build claims first (and is
            // counted here) or finds the template gone.
            let claims = self.template_claims.lock().expect("template claims poisoned");
            let users = self.sandboxes().values().filter(|s| s.template == template_ref).count()
                + claims.get(template_ref).copied().unwrap_or(0)
                + self.sandbox_snapshots_of(template_ref);
            if users > 0 {
                return Err(NodeError::TemplateInUse { name: template_ref.to_owned(), users });
            }
            self.templates.remove(template_ref)?;
        }
        self.remove_snapshots_of(template_ref);
        let removed = self.collect_template_layers();
        tracing::info!(template = %template_ref, layers = removed.len(), "template deleted");
        Ok(())
    }

    /// The refs of the templates this node built.
    pub fn built_templates(&self) -> Vec<String> {
        self.templates.refs()
    }

    /// Delete the layers no registered template uses, no built-in keeps and no build holds
    /// (and, when no build runs, leftover temporary layers). Returns the keys removed.
    pub(super) fn collect_template_layers(&self) -> Vec<String> {
        let idle = self.builds_running.load(Ordering::SeqCst) == 0;
        self.template_layers.collect(&self.template_layers_in_use(), idle)
    }

    /// The layers registered templates stand on and built-ins keep for their next build.
    fn template_layers_in_use(&self) -> std::collections::HashSet<String> {
        let mut in_use = self.templates.layers_in_use();
        in_use.extend(self.builtin_layers.in_use());
        in_use
    }

    /// Unregister built templates whose disks are gone (a data directory restored in
    /// part): a create from them could never boot.
    pub(super) fn drop_broken_templates(&self) {
        for name in self.templates.refs() {
            let Some(record) = self.templates.get(&name) else { continue };
            let whole = record.root_disk.is_file() && record.layers.iter().all(|k| self.template_layers.exists(k));
            if !whole {
                tracing::warn!(template = %name, "a layer or the base disk is missing: template dropped");
                self.unregister(&name);
            }
        }
    }

    /// Delete the template snapshots made of `template_ref` (running clones keep their
    /// open files).
    fn remove_snapshots_of(&self, template_ref: &str) {
        self.pool.drain_template(template_ref);
        let Ok(entries) = std::fs::read_dir(self.snapshots_dir()) else { return };
        for entry in entries.flatten() {
            if let Some(snap) = crate::snapshot::TemplateSnapshot::load(&entry.path()) {
                if snap.meta.template == template_ref {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
    }
}

/// The layers of `recipe` over `base`. The first layer's parent key covers the base
/// (disk, config) and the root disk's size, which `[build] disk_gb` may grow: layers of
/// one content but two sizes are two layers. The outer error is the node's (the base's
/// disk unreadable), the inner one the recipe's (a `copy` refused).
pub(super) fn plan(
    recipe: &lizard_recipe::Recipe,
    base: &NodeTemplate,
    context: &lizard_recipe::Context,
) -> Result<std::result::Result<LayerPlan, lizard_recipe::ContextError>> {
    let size = disk_size(recipe, base)?;
    Ok(lizard_recipe::plan(recipe, &format!("{}/disk-bytes={size}", base.layer_base_key()), context))
}

/// The root disk size of a template built from `recipe` over `base`: the base's, or
/// `[build] disk_gb` where that is larger.
fn disk_size(recipe: &lizard_recipe::Recipe, base: &NodeTemplate) -> Result<u64> {
    let wanted = u64::from(recipe.build.disk_gb) << 30;
    Ok(vm::virtual_size(&base.disk, base.disk_format.as_str())?.max(wanted))
}

/// What a template built from `recipe` over `base` gives its sandboxes, once its steps
/// left `state`: the recipe's env, directory, user and `[sandbox]` size over the base's,
/// and its start command (else the base's).
pub(super) fn outcome(
    base: &NodeTemplate,
    recipe: &lizard_recipe::Recipe,
    state: &BuildState,
) -> (lizard_recipe::TemplateConfig, Option<StartSpec>) {
    let derived = recipe.config();
    let mut config = base.config.clone();
    config.env.extend(derived.env);
    config.workdir = derived.workdir.or(config.workdir);
    config.user = derived.user.or(config.user);
    config.size = derived.size.or(config.size);
    let start = match &recipe.start {
        Some(s) => Some(state.start_spec(s, &recipe.env)),
        None => base.start.clone(),
    };
    (config, start)
}

/// A 1-based step index as the wire counts it (a recipe has at most 256 steps).
fn step_index(index: usize) -> u32 {
    u32::try_from(index).expect("a recipe has at most 256 steps")
}

/// The plan's refusal as the error of the first `copy` step whose source is refused.
fn copy_refused(
    recipe: &lizard_recipe::Recipe,
    context: &lizard_recipe::Context,
    e: lizard_recipe::ContextError,
) -> NodeError {
    let failing = recipe.steps.iter().enumerate().find_map(|(i, step)| match step {
        Step::Copy(c) => context.select(&c.src).err().map(|e| (i + 1, step.summary(), e)),
        _ => None,
    });
    let (step, description, reason) = match failing {
        Some((i, summary, e)) => (step_index(i), summary, e.to_string()),
        None => (0, String::new(), e.to_string()),
    };
    BuildError::CopyRefused { step, description, reason }.into()
}
