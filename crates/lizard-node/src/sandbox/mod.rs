//! One sandbox: its identity, its VM (while running), its network, and what it may be
//! asked to do.
//!
//! - [`guest`]: operations inside the guest (exec, background processes and terminals,
//!   port waits, files, tunnels), through the agent.
//! - [`record`]: `sandbox.json`, which lets a paused sandbox outlive the node process.
//!
//! Starting, pausing and ending a sandbox's VM is the node's job (`crate::node`), on top
//! of the VM layer (`crate::vm`); a sandbox only holds what that produced.

mod guest;
mod record;
mod transfer;

pub use guest::ProcessFrameStream;
pub(crate) use record::{Durability, ReadBack, Recorded};
pub use transfer::TransferStats;

use crate::network::SandboxNet;
use crate::templates::NodeTemplate;
use crate::vm::Launched;
use crate::{NodeError, Result};
use lizard_agent_client::AgentClient;
use lizard_agent_proto::handshake::Secret;
use lizard_api::network::NetworkPolicy;
use lizard_api::{CreateSandboxRequest, SandboxInfo, SandboxState};
use lizard_vmm::{Vm, VmConfig};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// How long the agent gets to sync a volume before a kill or pause goes ahead anyway.
const VOLUME_SYNC_LIMIT: Duration = Duration::from_secs(10);

/// A fresh sandbox id: 20 characters of [a-z0-9], starting with a letter, so that
/// `{id}-{port}.sandbox.{region}.{domain}` is a valid DNS label.
pub(crate) fn new_id() -> String {
    use rand::Rng;
    const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyz";
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rngs::OsRng;
    let mut id = String::with_capacity(20);
    id.push(char::from(LETTERS[rng.gen_range(0..LETTERS.len())]));
    for _ in 1..20 {
        id.push(char::from(ALPHABET[rng.gen_range(0..ALPHABET.len())]));
    }
    id
}

/// The VM of a running sandbox and the authenticated connection to its agent. A pause
/// ends both; a resume makes new ones.
pub struct Live {
    vm: Box<dyn Vm>,
    /// Replaced when a pause that ended the session fails and the node reconnects.
    agent: Mutex<AgentClient>,
}

impl Live {
    pub(crate) fn new(launched: Launched) -> Live {
        Live { vm: launched.vm, agent: Mutex::new(launched.agent) }
    }

    pub fn vm(&self) -> &dyn Vm {
        self.vm.as_ref()
    }

    /// The agent connection (a cheap handle on the one session).
    pub fn agent(&self) -> AgentClient {
        self.agent.lock().expect("agent lock poisoned").clone()
    }

    pub(crate) fn set_agent(&self, agent: AgentClient) {
        *self.agent.lock().expect("agent lock poisoned") = agent;
    }

    /// The disk error its VM stands halted by, if any.
    pub fn halted(&self) -> Option<lizard_vmm::IoHalt> {
        self.vm.io_halt().borrow().clone()
    }
}

/// What changes over a sandbox's life.
pub(crate) struct State {
    /// The VM while running; None while paused.
    pub live: Option<Arc<Live>>,
    /// The VM's shape now (a fork gives the sandbox a new root disk overlay).
    pub config: VmConfig,
    /// Guest memory is the VM's own file (cold boot, or loaded from a full save), so a
    /// pause saves only device state; else (a clone, whose memory is a private
    /// copy-on-write mapping of a template's or a fork's) a pause saves the pages it
    /// changed (a memory delta).
    pub own_memory: bool,
    /// Frozen disk layers (under `<data>/layers`) that the root disk is backed by.
    pub layers: Vec<PathBuf>,
}

/// The facts about a sandbox that never change.
pub(crate) struct Identity {
    pub id: String,
    pub template: String,
    pub vcpus: u32,
    pub memory_mib: u32,
    pub started_at: SystemTime,
    pub metadata: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub user: Option<String>,
    pub from_snapshot: bool,
    pub network_policy: NetworkPolicy,
    pub volume: Option<String>,
}

impl Identity {
    /// A sandbox created now from `req` as the VM `config` of `template`: the template's
    /// environment, directory and user are its defaults, the request's env wins.
    pub fn created(
        req: CreateSandboxRequest,
        config: &VmConfig,
        template: &NodeTemplate,
        from_snapshot: bool,
    ) -> Identity {
        let network_policy = req.network_policy();
        let mut env = template.config.env.clone();
        env.extend(req.env);
        Identity {
            network_policy,
            id: config.id.clone(),
            template: template.name.clone(),
            vcpus: config.vcpus,
            memory_mib: config.memory_mib,
            started_at: SystemTime::now(),
            metadata: req.metadata,
            env,
            workdir: template.config.workdir.clone(),
            user: template.config.user.clone(),
            from_snapshot,
            volume: req.volume,
        }
    }

    /// A copy of `source` made now under id `id`: a fork has no volume (one writer per
    /// volume: sandboxes with one cannot be forked).
    pub fn fork_of(source: &Sandbox, id: String) -> Identity {
        Identity {
            id,
            template: source.template.clone(),
            vcpus: source.vcpus,
            memory_mib: source.memory_mib,
            started_at: SystemTime::now(),
            metadata: source.metadata.clone(),
            env: source.env.clone(),
            workdir: source.workdir.clone(),
            user: source.user.clone(),
            from_snapshot: true,
            network_policy: source.network_policy(),
            volume: None,
        }
    }
}

/// A sandbox: running, or paused with its memory and devices saved in its directory.
pub struct Sandbox {
    pub id: String,
    pub template: String,
    pub vcpus: u32,
    pub memory_mib: u32,
    pub started_at: SystemTime,
    pub metadata: BTreeMap<String, String>,
    /// Environment given at create over the template's; every exec starts with it.
    pub env: BTreeMap<String, String>,
    /// The template's working directory and user: an exec's defaults.
    pub workdir: Option<String>,
    pub user: Option<String>,
    /// The volume mounted at /workspace, if any (its id).
    pub volume: Option<String>,
    pub(crate) secret: Secret,
    pub(crate) run_dir: PathBuf,
    from_snapshot: bool,
    pub(crate) state: Mutex<State>,
    /// Its network namespace and everything in it (while it has a NIC); released at
    /// cleanup. A paused sandbox keeps it; one taken back after a node restart gets a new
    /// one at resume.
    net: Mutex<Option<SandboxNet>>,
    /// Its outbound policy: the one it was created with, or the last set since (forks
    /// inherit it).
    network_policy: Mutex<NetworkPolicy>,
    /// Serializes pause, resume, fork and kill of this sandbox.
    pub(crate) transition: tokio::sync::Mutex<()>,
    /// A pause is under way: new operations are refused as if it were paused, and ones
    /// whose channel the pause closes fail the same way.
    pub(crate) pausing: AtomicBool,
    /// Which path its file transfers took.
    transfers: transfer::TransferCounts,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("id", &self.id)
            .field("template", &self.template)
            .field("paused", &self.is_paused())
            .finish()
    }
}

impl Sandbox {
    /// The one constructor: a sandbox that is `who`, answers to `secret`, and is in
    /// `state` (running when it has a live VM, else paused). Its run directory is its
    /// VM's.
    pub(crate) fn new(who: Identity, secret: Secret, state: State) -> Sandbox {
        Sandbox {
            id: who.id,
            template: who.template,
            vcpus: who.vcpus,
            memory_mib: who.memory_mib,
            started_at: who.started_at,
            metadata: who.metadata,
            env: who.env,
            workdir: who.workdir,
            user: who.user,
            volume: who.volume,
            secret,
            run_dir: state.config.run_dir.clone(),
            from_snapshot: who.from_snapshot,
            net: Mutex::new(None),
            network_policy: Mutex::new(who.network_policy),
            state: Mutex::new(state),
            transition: tokio::sync::Mutex::new(()),
            pausing: AtomicBool::new(false),
            transfers: transfer::TransferCounts::default(),
        }
    }

    /// The state lock (a poisoned one means a panic mid-update: nothing sane is left).
    pub(crate) fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("sandbox state lock poisoned")
    }

    pub(crate) fn set_network(&self, net: Option<SandboxNet>) {
        *self.net.lock().expect("network lock poisoned") = net;
    }

    /// Its network, taken out (to be set again with [`Self::set_network`]).
    pub(crate) fn take_network(&self) -> Option<SandboxNet> {
        self.net.lock().expect("network lock poisoned").take()
    }

    /// Its outbound policy now.
    pub(crate) fn network_policy(&self) -> NetworkPolicy {
        self.network_policy.lock().expect("policy lock poisoned").clone()
    }

    pub(crate) fn set_network_policy(&self, policy: NetworkPolicy) {
        *self.network_policy.lock().expect("policy lock poisoned") = policy;
    }

    /// Whether it has a network now (a sandbox taken back after a node restart has none
    /// until it resumes).
    pub(crate) fn has_network(&self) -> bool {
        self.net.lock().expect("network lock poisoned").is_some()
    }

    /// Its network namespace (under /run/netns) and host link, if it has a network.
    pub fn network(&self) -> Option<(String, String)> {
        self.net.lock().expect("network lock poisoned").as_ref().map(|n| (n.netns_name(), n.host_link()))
    }

    /// Whether this sandbox was restored from a snapshot (else cold-booted).
    pub fn from_snapshot(&self) -> bool {
        self.from_snapshot
    }

    /// The running VM and agent; CONFLICT while paused (or pausing), UNAVAILABLE while
    /// its VM stands halted by a disk error (an operation would hang until it goes on).
    pub fn live(&self) -> Result<Arc<Live>> {
        if self.pausing.load(Ordering::SeqCst) {
            return Err(NodeError::Paused { id: self.id.clone() });
        }
        let live = self.state().live.clone().ok_or_else(|| NodeError::Paused { id: self.id.clone() })?;
        if let Some(halt) = live.halted() {
            return Err(NodeError::Halted { id: self.id.clone(), no_space: halt.no_space });
        }
        Ok(live)
    }

    /// Whether its VM stands halted by a disk error now.
    pub fn is_halted(&self) -> bool {
        self.state().live.as_ref().is_some_and(|l| l.halted().is_some())
    }

    pub fn is_paused(&self) -> bool {
        self.state().live.is_none()
    }

    pub fn info(&self) -> SandboxInfo {
        SandboxInfo {
            sandbox_id: self.id.clone(),
            template: self.template.clone(),
            // Pausing counts as paused: operations are already refused.
            state: if self.is_paused() || self.pausing.load(Ordering::SeqCst) {
                SandboxState::Paused
            } else {
                SandboxState::Running
            },
            vcpus: self.vcpus,
            memory_mib: self.memory_mib,
            started_at: humantime::format_rfc3339_millis(self.started_at).to_string(),
            metadata: self.metadata.clone(),
            project_id: None,
            end_at: None,
            domain: None,
            workdir: self.workdir.clone(),
            access_token: None,
        }
    }

    /// Have the guest write what it cached for its volume to the disk, within a bound;
    /// a failure is logged, not returned (a guest that cannot sync cannot be helped by
    /// waiting). No volume: nothing to do.
    pub async fn sync_volume(&self) {
        let Some(live) = self.state().live.clone() else { return };
        if self.volume.is_none() || !live.vm.is_running() {
            return;
        }
        let agent = live.agent();
        match tokio::time::timeout(VOLUME_SYNC_LIMIT, agent.sync_volume()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(id = %self.id, "volume sync failed: {e}"),
            Err(_) => tracing::warn!(id = %self.id, "volume sync did not finish within {VOLUME_SYNC_LIMIT:?}"),
        }
    }

    /// Delete the run directory (disk overlay, sockets, memory file) and the network.
    /// Call after the VM has exited.
    pub(crate) fn cleanup(&self) {
        if let Some(net) = self.net.lock().expect("network lock poisoned").take() {
            net.release();
        }
        if let Err(e) = std::fs::remove_dir_all(&self.run_dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(id = %self.id, "cannot remove {}: {e}", self.run_dir.display());
            }
        }
    }

    /// Turn an agent failure into the node's error, noticing a VM that died meanwhile.
    pub fn agent_error(&self, e: lizard_agent_client::ClientError) -> NodeError {
        match e {
            lizard_agent_client::ClientError::Agent(a) => NodeError::Agent(a),
            other => match self.live() {
                Ok(live) if live.vm.is_running() => NodeError::AgentUnavailable(other),
                Ok(_) => NodeError::VmStopped { id: self.id.clone(), cause: other },
                Err(paused) => paused,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_dns_labels_and_distinct() {
        let a = new_id();
        assert_eq!(a.len(), 20);
        assert!(a.chars().next().unwrap().is_ascii_lowercase());
        assert!(a.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
        assert_ne!(a, new_id());
    }
}
