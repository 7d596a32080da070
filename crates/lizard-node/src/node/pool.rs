//! Machines made ahead of demand, so that a create does only what must wait for it.
//!
//! For each template snapshot (template, shape, kernel: one snapshot key) that sandboxes
//! were created from, the node keeps a shelf of ready machines, refilled in the
//! background while no create is under way:
//!
//! - **pre-spawned** ([`NodeConfig::prespawn`](crate::NodeConfig) per shelf, for the most
//!   recently used shelves): the run directory, the root overlay, a closed network and a
//!   QEMU process that maps the snapshot's memory and waits for its device state. A claim
//!   loads the state, runs it and gives the guest its identity.
//! - **warm** ([`NodeConfig::warm_pool`](crate::NodeConfig), per template, filled from
//!   node start): restored and running, the agent's session open. Right after the
//!   restore the guest gets a throwaway identity (a secret nobody is given, fresh
//!   entropy, the clock), so that it stops answering to the template's secret and the
//!   claim's identity call runs code the emulator has already translated (the claim's
//!   guest leg ≈16–31 → ≈10–18 ms under TCG). A claim only gives the guest its identity.
//!
//! Either way a machine on a shelf is nobody's: it has no secret of the sandbox's yet
//! (that reaches it with the identity, which also reseeds its RNG, names it and sets its
//! clock), its network is closed (no route out, the create's policy is added at claim),
//! it is not in the sandbox map, so it is never listed, billed or reachable through the
//! API. A machine that fails its claim is discarded and the create goes the ordinary way.
//!
//! Pool machines count toward the node's admission like sandboxes: a refill makes a
//! machine only if it fits beside everything promised, and a create that does not fit
//! discards machines (least recently used shelves first) before it is refused. A create
//! does not count the machine it would claim (two creates at once may both count on the
//! last one: the one that finds it gone restores beside the pool, one machine over).
//!
//! Pool machines live in `<data>/sandboxes/<id>` like any sandbox (QEMU holds paths
//! there; a rename would break later disk reopens), with no `sandbox.json`: a node
//! restart finds them without a record and sweeps them.

use super::Node;
use crate::network::SandboxNet;
use crate::snapshot::TemplateSnapshot;
use crate::vm::{self, Launched, Machine};
use crate::Result;
use lizard_agent_proto::handshake::Secret;
use lizard_vmm::{PendingVm, VmConfig};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Shelves of pre-spawned machines kept at most (the most recently used snapshot keys):
/// each waiting QEMU holds a network slot and some memory.
const MAX_PRESPAWN_SHELVES: usize = 4;

/// How long no create must have been under way before a refill makes a machine.
const REFILL_QUIET: std::time::Duration = std::time::Duration::from_millis(250);

/// A machine on a shelf.
pub(crate) struct Ready {
    /// The sandbox's secret, to be given to the guest at claim (the run dir's copy is
    /// the fw_cfg item every VM has; a restored guest never reads it again).
    pub secret: Secret,
    pub config: VmConfig,
    pub net: Option<SandboxNet>,
    /// Taken by the claim: from then on the VM and its directory are the sandbox's.
    pub stage: Option<Stage>,
}

pub(crate) enum Stage {
    /// A QEMU process waiting for the snapshot's device state.
    Spawned(Box<dyn PendingVm>),
    /// Restored and answering with the snapshot's secret; no identity yet.
    Warm(Launched),
}

impl Drop for Ready {
    /// A machine nobody claimed: its VMM is killed (the backend reaps it), its directory
    /// removed; its network goes with the struct.
    fn drop(&mut self) {
        let Some(stage) = &self.stage else { return };
        vm::sigkill(match stage {
            Stage::Spawned(p) => p.pid(),
            Stage::Warm(l) => l.vm.pid(),
        });
        let _ = std::fs::remove_dir_all(&self.config.run_dir);
    }
}

/// One snapshot key's machines.
struct Shelf {
    /// Its template is `snap.meta.template`, its key the snapshot's.
    snap: TemplateSnapshot,
    machine: Machine,
    warm: bool,
    /// How many machines it keeps.
    target: usize,
    ready: VecDeque<Ready>,
    /// A refill task is at work on it.
    filling: bool,
    last_used: Instant,
}

/// All shelves of a node, and what creates are under way (refills wait for none).
pub(crate) struct Pool {
    shelves: Mutex<HashMap<String, Shelf>>,
    creates: tokio::sync::watch::Sender<usize>,
    /// Refill tasks running: a shutdown waits for them, so that a machine one was making
    /// when the shelves were drained is gone (VMM and directory) when shutdown returns.
    refills: tokio::sync::watch::Sender<usize>,
}

/// A refill task, counted while it runs.
struct RefillRunning(tokio::sync::watch::Sender<usize>);

impl Drop for RefillRunning {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

/// A create under way, counted while it lives: refills stay out of its way.
pub(crate) struct CreateUnderWay<'a>(&'a Pool);

impl Drop for CreateUnderWay<'_> {
    fn drop(&mut self) {
        self.0.creates.send_modify(|n| *n -= 1);
    }
}

impl Pool {
    pub fn new() -> Pool {
        Pool {
            shelves: Mutex::new(HashMap::new()),
            creates: tokio::sync::watch::Sender::new(0),
            refills: tokio::sync::watch::Sender::new(0),
        }
    }

    fn shelves(&self) -> std::sync::MutexGuard<'_, HashMap<String, Shelf>> {
        self.shelves.lock().expect("pool poisoned")
    }

    pub fn create_under_way(&self) -> CreateUnderWay<'_> {
        self.creates.send_modify(|n| *n += 1);
        CreateUnderWay(self)
    }

    /// A machine of snapshot `key`, if one is ready.
    pub fn take(&self, key: &str) -> Option<Ready> {
        let mut shelves = self.shelves();
        let shelf = shelves.get_mut(key)?;
        shelf.last_used = Instant::now();
        shelf.ready.pop_front()
    }

    /// vCPUs and MiB of the machines on the shelves, less one that a create of
    /// `claimable` (template, vCPUs, MiB) would claim: taking it adds nothing.
    pub fn held(&self, claimable: Option<(&str, u32, u32)>) -> (u64, u64) {
        let mut exempt = claimable;
        self.shelves().values().fold((0, 0), |(c, m), s| {
            let mut n = s.ready.len() as u64;
            let shape = (s.snap.meta.template.as_str(), s.machine.vcpus, s.machine.memory_mib);
            if n > 0 && exempt == Some(shape) {
                n -= 1;
                exempt = None;
            }
            (c + n * u64::from(s.machine.vcpus), m + n * u64::from(s.machine.memory_mib))
        })
    }

    /// Discard one machine, of the least recently used shelf that has one; whether there
    /// was one.
    pub fn discard_one(&self) -> bool {
        let discarded = {
            let mut shelves = self.shelves();
            let lru = shelves.values_mut().filter(|s| !s.ready.is_empty()).min_by_key(|s| s.last_used);
            lru.and_then(|s| s.ready.pop_back())
        };
        discarded.is_some()
    }

    /// How many machines of `template` are ready (all shapes), for tests and the bench.
    /// Whether the pool makes machines from the snapshot `key`.
    pub fn uses_snapshot(&self, key: &str) -> bool {
        self.shelves().contains_key(key)
    }

    pub fn ready_of(&self, template: &str) -> usize {
        self.shelves().values().filter(|s| s.snap.meta.template == template).map(|s| s.ready.len()).sum()
    }

    /// Discard every machine made from `template`'s snapshots (it is being deleted).
    pub fn drain_template(&self, template: &str) {
        let removed: Vec<Shelf> = {
            let mut shelves = self.shelves();
            let keys: Vec<String> =
                shelves.iter().filter(|(_, s)| s.snap.meta.template == template).map(|(k, _)| k.clone()).collect();
            keys.iter().filter_map(|k| shelves.remove(k)).collect()
        };
        drop(removed);
    }

    /// Discard every machine (node shutdown), and wait until no refill runs: one that
    /// was making a machine drops it once it finds its shelf gone.
    pub async fn drain(&self) {
        let all: Vec<Shelf> = self.shelves().drain().map(|(_, s)| s).collect();
        drop(all);
        let mut running = self.refills.subscribe();
        let _ = running.wait_for(|n| *n == 0).await;
    }

    /// Make sure a shelf for `snap` exists, keeping `target` machines (`warm`: restored),
    /// and evict the least recently used pre-spawn shelves beyond the bound. Returns
    /// whether it needs a refill.
    fn want(&self, snap: &TemplateSnapshot, machine: &Machine, warm: bool, target: usize) -> bool {
        let evicted: Vec<Shelf>;
        let needs;
        {
            let mut shelves = self.shelves();
            let shelf = shelves.entry(snap.key()).or_insert_with(|| Shelf {
                snap: snap.clone(),
                machine: machine.clone(),
                warm,
                target,
                ready: VecDeque::new(),
                filling: false,
                last_used: Instant::now(),
            });
            shelf.last_used = Instant::now();
            needs = !shelf.filling && shelf.ready.len() < shelf.target;
            let mut spawned: Vec<(Instant, String)> =
                shelves.iter().filter(|(_, s)| !s.warm).map(|(k, s)| (s.last_used, k.clone())).collect();
            spawned.sort();
            let excess = spawned.len().saturating_sub(MAX_PRESPAWN_SHELVES);
            evicted = spawned.iter().take(excess).filter_map(|(_, k)| shelves.remove(k)).collect();
        }
        drop(evicted);
        needs
    }
}

/// Run one short command in a warm machine. Under TCG a new VMM process translates each
/// guest code path the first time it runs (a restored guest's first command takes ≈150 ms,
/// later ones ≈35): this way the claimant's first command does not pay for it. It writes
/// to stdout and stderr, as most first commands do, so that the output paths are
/// translated too. What it leaves is a finished process; a failure only means a slower
/// first command.
async fn warm_up(launched: &Launched) {
    let req = lizard_agent_proto::types::ExecRequest {
        argv: Some(vec!["/bin/sh".into(), "-c".into(), "echo warm; echo up >&2".into()]),
        ..Default::default()
    };
    match tokio::time::timeout(WARM_UP_LIMIT, launched.agent.exec_collect(req)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::debug!("pool: warm-up command failed: {e}"),
        Err(_) => tracing::debug!("pool: warm-up command timed out"),
    }
}

/// How long the warm-up command may take.
const WARM_UP_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Node {
    /// Keep machines of `snap` ready from now on (a create of it just happened), and start
    /// refilling its shelf if it is short.
    pub(super) fn keep_ready(self: &Arc<Self>, snap: &TemplateSnapshot, machine: &Machine) {
        let warm = self.config.warm_pool.get(&snap.meta.template).copied().unwrap_or(0);
        let (is_warm, target) = if warm > 0 { (true, warm) } else { (false, self.config.prespawn) };
        let Ok(target) = usize::try_from(target) else { return };
        if target == 0 {
            return;
        }
        if self.pool.want(snap, machine, is_warm, target) {
            self.spawn_refill(snap.key());
        }
    }

    fn spawn_refill(self: &Arc<Self>, key: String) {
        {
            let mut shelves = self.pool.shelves();
            let Some(shelf) = shelves.get_mut(&key) else { return };
            if shelf.filling {
                return;
            }
            shelf.filling = true;
        }
        let node = Arc::downgrade(self);
        self.pool.refills.send_modify(|n| *n += 1);
        let running = RefillRunning(self.pool.refills.clone());
        tokio::spawn(async move {
            let _running = running;
            loop {
                let Some(node) = node.upgrade() else { return };
                // Creates come first: a refill waits until none has been under way for a
                // moment (a just-created sandbox's first commands run in that moment).
                let mut creates = node.pool.creates.subscribe();
                let _ = creates.wait_for(|n| *n == 0).await;
                creates.mark_unchanged();
                tokio::select! {
                    _ = tokio::time::sleep(REFILL_QUIET) => {}
                    _ = creates.changed() => continue,
                }
                let job = {
                    let mut shelves = node.pool.shelves();
                    let Some(shelf) = shelves.get_mut(&key) else { return };
                    if shelf.ready.len() >= shelf.target {
                        shelf.filling = false;
                        return;
                    }
                    (shelf.snap.clone(), shelf.machine.clone(), shelf.warm, shelf.snap.meta.template.clone())
                };
                let (snap, machine, warm, template) = job;
                // Held until the machine is on its shelf (and counted there) or failed.
                let reservation = match node.reserve_for_pool(&machine) {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::debug!(%template, "pool: no room for another machine: {e}");
                        if let Some(shelf) = node.pool.shelves().get_mut(&key) {
                            shelf.filling = false;
                        }
                        return;
                    }
                };
                let made = node.make_ready(&snap, &machine, warm).await;
                let mut shelves = node.pool.shelves();
                // A shelf drained meanwhile (template deleted, evicted) drops the machine.
                let Some(shelf) = shelves.get_mut(&key) else { return };
                match made {
                    Ok(ready) => {
                        shelf.ready.push_back(ready);
                        drop(reservation);
                    }
                    Err(e) => {
                        tracing::warn!(%template, "pool: could not make a machine ready: {e}");
                        shelf.filling = false;
                        return;
                    }
                }
            }
        });
    }

    /// One machine of `snap`: pre-spawned, and with `warm` restored too.
    async fn make_ready(&self, snap: &TemplateSnapshot, machine: &Machine, warm: bool) -> Result<Ready> {
        let _permit = self.restore_permit().await;
        let closed = lizard_api::network::ParsedPolicy::default();
        let net = match &self.network {
            Some(n) => Some(n.attach(&closed).await?),
            None => None,
        };
        let id = crate::sandbox::new_id();
        let run_dir = self.sandboxes_dir().join(&id);
        let config = vm::sandbox_vm(&id, run_dir.clone(), machine, None, net.as_ref().map(|n| n.attachment()));
        let secret = Secret::generate();
        let pending =
            match vm::spawn_clone(self.backend.as_ref(), &config, &snap.disk(), &snap.vm_snapshot().memory, &secret)
                .await
            {
                Ok(p) => p,
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&run_dir);
                    return Err(e);
                }
            };
        let stage = if warm {
            let vmstate = snap.vm_snapshot().vmstate;
            let deadline = self.config.boot_timeout;
            let restored = async {
                let l = vm::restore_clone(pending, &vmstate, &snap.secret, None, deadline).await?;
                // The shelf's throwaway identity (see the module doc), through the same
                // call as the claim's rather than in the handshake: that translates the
                // claim's code path (guest leg p50 ≈13 ms, ≈17 ms via the handshake).
                vm::identify(l, &Secret::generate(), deadline).await
            };
            match restored.await {
                Ok(l) => {
                    warm_up(&l).await;
                    Stage::Warm(l)
                }
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&run_dir);
                    return Err(e);
                }
            }
        } else {
            Stage::Spawned(pending)
        };
        Ok(Ready { secret, config, net, stage: Some(stage) })
    }

    /// Fill the warm pools the config names, from node start (each template's default
    /// shape; its snapshot is made first if there is none).
    pub(super) fn start_warm_pools(self: &Arc<Self>) {
        for template in self.config.warm_pool.keys() {
            let (node, template) = (self.clone(), template.clone());
            tokio::spawn(async move {
                let ready = async {
                    let t = node.resolve_template(&template).await?;
                    let (vcpus, memory_mib) = node.sandbox_size(&t, None, None)?;
                    let boot = node.assets.boot_files().await?;
                    let machine = Machine::new(&boot, vcpus, memory_mib, node.accel().await?);
                    let snap = node.template_snapshot(&t, &boot, &machine).await?;
                    node.keep_ready(&snap, &machine);
                    Ok::<(), crate::NodeError>(())
                };
                if let Err(e) = ready.await {
                    tracing::warn!(%template, "warm pool not started: {e}");
                }
            });
        }
    }

    /// Turn a machine from the shelf into a sandbox's running VM: its network gets the
    /// create's policy, its guest the sandbox's identity.
    pub(super) async fn claim(
        &self,
        ready: &mut Ready,
        policy: &lizard_api::network::ParsedPolicy,
        snap: &TemplateSnapshot,
    ) -> Result<Launched> {
        let start = Instant::now();
        let deadline = self.config.boot_timeout;
        // The network's policy and the guest's identity are independent: both at once.
        // Nothing of the guest goes out before the claim returns, and on failure the VM
        // is killed (the caller removes the directory and the network).
        let policy_set = async {
            let done = match &ready.net {
                Some(net) => net.set_policy(policy).await.map_err(crate::NodeError::from),
                None => Ok(()),
            };
            (done, start.elapsed())
        };
        let stage = ready.stage.take().expect("a machine on the shelf has a stage");
        let (secret, vmstate) = (&ready.secret, snap.vm_snapshot().vmstate);
        let started = async {
            let done = match stage {
                Stage::Spawned(pending) => {
                    let _permit = self.restore_permit().await;
                    vm::restore_clone(pending, &vmstate, &snap.secret, Some(secret), deadline).await
                }
                Stage::Warm(launched) => vm::identify(launched, secret, deadline).await,
            };
            (done, start.elapsed())
        };
        let ((policy_set, policy_took), (started, started_took)) = tokio::join!(policy_set, started);
        let launched = match (policy_set, started) {
            (Ok(()), Ok(launched)) => launched,
            (Err(e), Ok(launched)) => {
                let _ = launched.vm.kill().await;
                return Err(e);
            }
            (_, Err(e)) => return Err(e),
        };
        tracing::debug!(id = %ready.config.id, policy = ?policy_took, guest = ?started_took, took = ?start.elapsed(), "pool machine claimed");
        Ok(launched)
    }
}
