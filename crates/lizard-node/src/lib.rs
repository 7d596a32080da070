//! A Lizard node: the machinery on one host that turns "create a sandbox from template T"
//! into a running microVM with its own kernel, root disk and authenticated agent channel.
//!
//! The node owns `<data_dir>/sandboxes/<id>/` for each sandbox (root disk overlay, VMM
//! sockets, console log, memory file) and deletes it when the sandbox ends, whichever way
//! it ends: killed, VMM crash (noticed by a monitor task), failed boot, or a node restart
//! (the next start sweeps what the previous process left).
//!
//! The HTTP face of a node is in [`http`]; the control plane embeds a [`Node`] directly.

pub mod assets;
mod forward;
pub mod http;
mod lifecycle;
pub mod network;
mod qcow2;
mod sandbox;
pub mod snapshot;
pub mod volumes;

use assets::Assets;
use lizard_agent_proto::handshake::Secret;
use lizard_api::{CreateSandboxRequest, ErrorCode, SandboxInfo};
use lizard_image::ImageStore;
use lizard_vmm::{Backend, VmConfig};
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

pub use lifecycle::MAX_FORKS;
pub use lizard_vmm::Accel;
pub use sandbox::{Live, Sandbox};

/// Settings of a node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Root of everything the node stores (sandboxes, caches).
    pub data_dir: PathBuf,
    /// Where guest images are built and cached (`<image_root>/images`); usually the data
    /// directory, shared between nodes of one machine in tests.
    pub image_root: PathBuf,
    /// The static `lizard-agent` binary that becomes PID 1 in every guest.
    pub agent_bin: PathBuf,
    /// QEMU system emulator.
    pub qemu_binary: PathBuf,
    /// Force an accelerator instead of probing.
    pub accel: Option<Accel>,
    pub default_vcpus: u32,
    pub default_memory_mib: u32,
    /// How long a cold-booted guest may take until its agent answers.
    pub boot_timeout: Duration,
    /// Start sandboxes by restoring a template snapshot (made by cold-booting the
    /// template once) rather than booting a kernel each time. Templates whose recipe
    /// says `cold_boot_only` always cold-boot.
    pub snapshots: bool,
    /// Give every sandbox a network (its own namespace, TAP, NAT and firewall). Needs
    /// root, `ip` and `nft`. Without it sandboxes have no NIC.
    pub network: Option<network::NetworkConfig>,
    /// The static `lizard` CLI put into every guest (at `/usr/local/bin/lizard`); `None`:
    /// guests get no CLI.
    pub guest_cli: Option<PathBuf>,
    /// Where connections to the guest's API address ([`lizard_agent_proto::routes::FORWARD_GUEST_URL`])
    /// go: the control plane's API. `None`: guests cannot reach any API.
    pub api_forward: Option<std::net::SocketAddr>,
}

impl NodeConfig {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        let data_dir = data_dir.into();
        NodeConfig {
            image_root: data_dir.clone(),
            data_dir,
            agent_bin: default_agent_bin(),
            qemu_binary: PathBuf::from("qemu-system-x86_64"),
            accel: None,
            default_vcpus: 1,
            default_memory_mib: 512,
            boot_timeout: Duration::from_secs(60),
            snapshots: true,
            // Namespaces and firewall rules need root.
            network: nix::unistd::geteuid().is_root().then(network::NetworkConfig::default),
            guest_cli: default_guest_cli(),
            api_forward: None,
        }
    }
}

/// `LIZARD_AGENT_BIN`, else `lizard-agent` next to the running executable, else the
/// static build in this checkout's target directory.
pub fn default_agent_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("LIZARD_AGENT_BIN") {
        return PathBuf::from(p);
    }
    let exe_dir = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf));
    if let Some(dir) = &exe_dir {
        // A plain `cargo build` also leaves a dynamically linked lizard-agent next to the
        // CLI, which cannot run as a guest's init: only a static one will do.
        let candidate = dir.join("lizard-agent");
        if is_static_executable(&candidate) {
            return candidate;
        }
        // target/{debug,release}[/deps] → target/x86_64-unknown-linux-gnu/release/lizard-agent
        for up in dir.ancestors().take(3) {
            let c = up.join("x86_64-unknown-linux-gnu/release/lizard-agent");
            if c.exists() {
                return c;
            }
        }
    }
    PathBuf::from("/usr/local/bin/lizard-agent")
}

/// `LIZARD_GUEST_CLI_BIN`, else a static `lizard` (or `lizard-guest`) next to the agent
/// (scripts/build-agent.sh builds both), else none.
pub fn default_guest_cli() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("LIZARD_GUEST_CLI_BIN") {
        return Some(PathBuf::from(p));
    }
    let agent = default_agent_bin();
    let dir = agent.parent()?;
    ["lizard", "lizard-guest"].into_iter().map(|n| dir.join(n)).find(|p| is_static_executable(p))
}

/// An ELF file without a program interpreter (static or static-pie).
fn is_static_executable(path: &Path) -> bool {
    use object::read::elf::{FileHeader, ProgramHeader};
    let Ok(data) = std::fs::read(path) else { return false };
    let Ok(header) = object::elf::FileHeader64::<object::Endianness>::parse(&*data) else { return false };
    let Ok(endian) = header.endian() else { return false };
    let Ok(segments) = header.program_headers(endian, &*data) else { return false };
    !segments.iter().any(|s| s.p_type(endian) == object::elf::PT_INTERP)
}

/// The default data directory: /var/lib/lizard as root, else the XDG data home.
pub fn default_data_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("LIZARD_DATA_DIR") {
        return PathBuf::from(p);
    }
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/var/lib/lizard");
    }
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("lizard")
}

/// Why a node operation failed. Each maps to one stable API code.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Bad parameters.
    #[error("{0}")]
    InvalidArgument(String),
    /// No such sandbox (never existed, or already gone).
    #[error("sandbox {0} not found")]
    NotFound(String),
    /// The sandbox existed but has ended (killed, or its VM died); 404 like an unknown
    /// id, with a message that says why.
    #[error("sandbox {0} not found: {1}")]
    Dead(String, String),
    /// Image build failed.
    #[error("image: {0}")]
    Image(#[from] lizard_image::ImageError),
    /// The VMM failed.
    #[error("vmm: {0}")]
    Vmm(#[from] lizard_vmm::VmmError),
    /// The node has no room for it (disk space for a volume): INVALID_ARGUMENT (422), as
    /// for a region without nodes; the message says how much would fit.
    #[error("{0}")]
    InsufficientSpace(String),
    /// The guest did not come up.
    #[error("sandbox did not boot: {0}")]
    Boot(String),
    /// A request to the agent failed.
    #[error("{0}")]
    Agent(lizard_agent_proto::types::AgentError),
    /// The sandbox is paused: resume it first.
    #[error("sandbox {0} is paused: resume it first")]
    Paused(String),
    /// The sandbox is running where only a paused one will do, or the other way round; a
    /// volume another sandbox holds; a volume that already exists.
    #[error("{0}")]
    Conflict(String),
    /// The agent channel failed while the VM still runs.
    #[error("agent unavailable: {0}")]
    Unavailable(String),
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    /// The sandbox's network could not be made.
    #[error("network: {0}")]
    Network(#[from] network::NetError),
}

impl NodeError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        NodeError::Io { context: context.into(), source }
    }

    pub fn code(&self) -> ErrorCode {
        use lizard_agent_proto::types::ErrorCode as A;
        match self {
            NodeError::InvalidArgument(_) | NodeError::Image(lizard_image::ImageError::UnknownTemplate(_)) => {
                ErrorCode::InvalidArgument
            }
            NodeError::NotFound(_) | NodeError::Dead(..) => ErrorCode::NotFound,
            NodeError::Boot(_) | NodeError::Vmm(_) => ErrorCode::BootFailed,
            NodeError::Unavailable(_) => ErrorCode::Unavailable,
            // The request asks for more than the node can hold: a smaller size fits.
            NodeError::InsufficientSpace(_) => ErrorCode::InvalidArgument,
            NodeError::Paused(_) | NodeError::Conflict(_) => ErrorCode::Conflict,
            NodeError::Agent(e) => match e.code {
                A::NotFound => ErrorCode::NotFound,
                A::IsADirectory | A::NotADirectory | A::InvalidArgument => ErrorCode::InvalidArgument,
                A::AlreadyExists => ErrorCode::Conflict,
                A::PermissionDenied => ErrorCode::Forbidden,
                // Nothing listens on the guest port a tunnel named.
                A::ConnectionRefused => ErrorCode::PortClosed,
                A::Internal => ErrorCode::Internal,
            },
            NodeError::Network(network::NetError::Exhausted) => ErrorCode::Unavailable,
            NodeError::Image(_) | NodeError::Io { .. } | NodeError::Network(_) => ErrorCode::Internal,
        }
    }

    pub fn to_api(&self) -> lizard_api::ApiError {
        lizard_api::ApiError::new(self.code(), self.to_string())
    }
}

pub type Result<T, E = NodeError> = std::result::Result<T, E>;

/// How many ended sandboxes the node remembers, to say why an id is gone.
const TOMBSTONES: usize = 4096;

/// One host's sandboxes.
pub struct Node {
    config: NodeConfig,
    assets: Assets,
    backend: Arc<dyn Backend>,
    /// Sandbox networking, when configured.
    network: Option<Arc<network::Network>>,
    accel: tokio::sync::OnceCell<Accel>,
    sandboxes: RwLock<HashMap<String, Arc<Sandbox>>>,
    /// Ended sandboxes and why, newest last.
    tombstones: Mutex<VecDeque<(String, String)>>,
    /// One lock per snapshot key: the first create of a template builds its snapshot,
    /// the ones behind it wait for it.
    snapshot_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Volume id → the sandbox that holds it (being created, running or paused): one
    /// writer per volume.
    volume_holders: Mutex<HashMap<String, String>>,
}

impl Node {
    /// Open the node's data directory, cleaning up anything a previous process left.
    pub async fn start(mut config: NodeConfig) -> Result<Arc<Node>> {
        // Disk overlays and VMM arguments name these paths; relative ones would resolve
        // against the wrong directory.
        for dir in [&mut config.data_dir, &mut config.image_root] {
            *dir = std::path::absolute(&*dir).map_err(|e| NodeError::io(format!("resolve {}", dir.display()), e))?;
        }
        // Sandbox and snapshot directories hold VMM control sockets, secrets and guest
        // memory: owner only.
        use std::os::unix::fs::PermissionsExt;
        let dirs = [Some("sandboxes"), config.snapshots.then_some("snapshots"), Some("volumes")];
        for dir in dirs.into_iter().flatten().map(|d| config.data_dir.join(d)) {
            std::fs::create_dir_all(&dir).map_err(|e| NodeError::io(format!("create {}", dir.display()), e))?;
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
        }
        let network = match &config.network {
            Some(c) => Some(network::Network::start(c.clone()).await?),
            None => None,
        };
        let node = Arc::new(Node {
            network,
            assets: Assets::new(
                ImageStore::new(&config.image_root),
                config.agent_bin.clone(),
                config.guest_cli.clone(),
            ),
            backend: Arc::new(lizard_vmm::qemu::QemuBackend::with_binary(&config.qemu_binary)),
            accel: tokio::sync::OnceCell::new(),
            sandboxes: RwLock::new(HashMap::new()),
            tombstones: Mutex::new(VecDeque::new()),
            snapshot_locks: Mutex::new(HashMap::new()),
            volume_holders: Mutex::new(HashMap::new()),
            config,
        });
        node.adopt_or_sweep();
        snapshot::sweep(&node.snapshots_dir());
        volumes::sweep(&node.volumes_dir());
        Ok(node)
    }

    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    pub(crate) fn sandboxes_dir(&self) -> PathBuf {
        self.config.data_dir.join("sandboxes")
    }

    fn snapshots_dir(&self) -> PathBuf {
        self.config.data_dir.join("snapshots")
    }

    fn volumes_dir(&self) -> PathBuf {
        self.config.data_dir.join("volumes")
    }

    /// Make the disk of a new volume on this node (see [`volumes`]).
    pub async fn create_volume(&self, id: &str, size_gb: u32) -> Result<()> {
        volumes::create(&self.volumes_dir(), id, size_gb).await.map(drop)
    }

    /// Delete a volume's disk. Conflict while a sandbox of this node holds it.
    pub fn delete_volume(&self, id: &str) -> Result<()> {
        let holders = self.volume_holders.lock().unwrap();
        if let Some(holder) = holders.get(id) {
            return Err(NodeError::Conflict(format!("volume {id} is in use by sandbox {holder}")));
        }
        volumes::delete(&self.volumes_dir(), id)
    }

    /// The sandbox that holds volume `id` on this node, if any.
    pub fn volume_holder(&self, id: &str) -> Option<String> {
        self.volume_holders.lock().unwrap().get(id).cloned()
    }

    /// Reserve volume `volume` for sandbox `id`: its image path, or Conflict naming the
    /// holder, or NotFound.
    pub(crate) fn claim_volume(&self, volume: &str, id: &str) -> Result<PathBuf> {
        let path = volumes::image_path(&self.volumes_dir(), volume)?;
        let mut holders = self.volume_holders.lock().unwrap();
        if let Some(holder) = holders.get(volume) {
            return Err(NodeError::Conflict(format!("volume {volume} is in use by sandbox {holder}")));
        }
        if !path.is_file() {
            return Err(NodeError::InvalidArgument(format!("no volume {volume} on this node")));
        }
        holders.insert(volume.to_string(), id.to_string());
        Ok(path)
    }

    /// Give up `volume` if sandbox `id` holds it.
    pub(crate) fn release_volume(&self, volume: Option<&str>, id: &str) {
        let Some(volume) = volume else { return };
        let mut holders = self.volume_holders.lock().unwrap();
        if holders.get(volume).is_some_and(|h| h == id) {
            holders.remove(volume);
        }
    }

    /// The snapshot of `template` in this shape, made now (one cold boot) if there is
    /// none yet. Builders of one key are serialized within the node by a mutex and
    /// between node processes by a file lock.
    async fn template_snapshot(
        &self,
        template: &lizard_image::TemplateImage,
        boot: &assets::BootFiles,
        vcpus: u32,
        memory_mib: u32,
        accel: Accel,
    ) -> Result<snapshot::TemplateSnapshot> {
        let key = snapshot::key(template, boot, vcpus, memory_mib, accel, self.network.is_some());
        let dir = self.snapshots_dir().join(&key);
        if let Some(s) = snapshot::TemplateSnapshot::load(&dir) {
            return Ok(s);
        }
        let lock = self.snapshot_locks.lock().unwrap().entry(key.clone()).or_default().clone();
        let _guard = lock.lock().await;
        if let Some(s) = snapshot::TemplateSnapshot::load(&dir) {
            return Ok(s);
        }
        std::fs::create_dir_all(self.snapshots_dir()).map_err(|e| NodeError::io("create the snapshots dir", e))?;
        let _file_lock = snapshot::file_lock(self.snapshots_dir().join(format!("{key}.lock"))).await?;
        if let Some(s) = snapshot::TemplateSnapshot::load(&dir) {
            return Ok(s);
        }
        // Incomplete or of another format: replace it. Running clones keep their open
        // files.
        let _ = std::fs::remove_dir_all(&dir);
        tracing::info!(template = %template.name, %key, "making a template snapshot (one cold boot)");
        // The template VM needs the same NIC as its clones; its network is closed to the
        // outside and goes away with it.
        let closed =
            lizard_api::network::ParsedPolicy { allow_internet_access: false, allow_out: vec![], deny_out: vec![] };
        let net = match &self.network {
            Some(n) => Some(n.attach(&closed).await?),
            None => None,
        };
        let spec = snapshot::BuildSpec {
            net: net.as_ref().map(|n| n.attachment()),
            backend: self.backend.as_ref(),
            template,
            boot,
            vcpus,
            memory_mib,
            accel,
            boot_timeout: self.config.boot_timeout,
        };
        snapshot::build(spec, &dir).await
    }

    /// Take a sandbox out of the map, recording why in the same step, so that no lookup
    /// in between finds neither the sandbox nor the reason it is gone.
    pub(crate) fn remove(&self, id: &str, why: &str) -> Option<Arc<Sandbox>> {
        let mut map = self.sandboxes.write().unwrap();
        let sandbox = map.remove(id)?;
        self.bury(id, why.to_string());
        Some(sandbox)
    }

    pub(crate) fn bury(&self, id: &str, why: String) {
        let mut t = self.tombstones.lock().unwrap();
        if t.len() >= TOMBSTONES {
            t.pop_front();
        }
        t.push_back((id.to_string(), why));
    }

    pub(crate) fn not_found(&self, id: &str) -> NodeError {
        let t = self.tombstones.lock().unwrap();
        match t.iter().rev().find(|(i, _)| i == id) {
            Some((_, why)) => NodeError::Dead(id.to_string(), why.clone()),
            None => NodeError::NotFound(id.to_string()),
        }
    }

    /// The accelerator, probed once per node (and cached on disk per host).
    async fn accel(&self) -> Result<Accel> {
        if let Some(a) = self.config.accel {
            return Ok(a);
        }
        let boot = self.assets.boot_files().await?;
        let probe_dir = self.config.data_dir.join("probe");
        let _ = std::fs::remove_dir_all(&probe_dir);
        let cfg = VmConfig {
            id: "accel-probe".into(),
            vcpus: 1,
            memory_mib: 128,
            kernel: boot.kernel.vmlinux.clone(),
            initramfs: boot.initramfs.path.clone(),
            cmdline: format!("{} {}=probe", sandbox::BASE_CMDLINE, lizard_agent_proto::cmdline::MODE),
            root_disk: PathBuf::from("/dev/null"),
            extra_disks: vec![],
            secret_file: None,
            run_dir: probe_dir,
            accel: Accel::Kvm,
            net: None,
        };
        let backend = self.backend.clone();
        let cache = self.config.image_root.join("accel.json");
        Ok(*self
            .accel
            .get_or_init(|| async move { lizard_vmm::accel::choose(backend.as_ref(), &cfg, &cache).await })
            .await)
    }

    /// Build (or take from cache) the images for `template`, without booting anything.
    pub async fn prepare(&self, template: &str) -> Result<()> {
        self.assets.template(template).await?;
        self.assets.boot_files().await?;
        self.accel().await?;
        Ok(())
    }

    /// Boot a new sandbox and wait until its agent answers.
    ///
    /// The work runs in its own task: a caller that goes away mid-boot (a dropped HTTP
    /// request) must not leave a VM that nothing tracks.
    pub async fn create(self: &Arc<Self>, req: CreateSandboxRequest) -> Result<Arc<Sandbox>> {
        let node = self.clone();
        tokio::spawn(async move { node.create_now(req).await }).await.expect("create task panicked")
    }

    async fn create_now(self: &Arc<Self>, req: CreateSandboxRequest) -> Result<Arc<Sandbox>> {
        // Checked before anything is made (create_with makes the network from it).
        req.network_policy().parse().map_err(NodeError::InvalidArgument)?;
        let vcpus = req.vcpus.unwrap_or(self.config.default_vcpus);
        let memory_mib = req.memory_mib.unwrap_or(self.config.default_memory_mib);
        if !(1..=16).contains(&vcpus) {
            return Err(NodeError::InvalidArgument(format!("vcpus must be 1..=16, got {vcpus}")));
        }
        if !(128..=16384).contains(&memory_mib) {
            return Err(NodeError::InvalidArgument(format!("memoryMib must be 128..=16384, got {memory_mib}")));
        }
        let template = self.assets.template(&req.template).await?;
        let boot = self.assets.boot_files().await?;
        let accel = self.accel().await?;
        let id = sandbox::new_id();
        let volume = req.volume.clone();
        let volume_disk = match &volume {
            Some(v) => Some(self.claim_volume(v, &id)?),
            None => None,
        };
        let result = self.create_with(req, id.clone(), volume_disk, template, boot, accel, vcpus, memory_mib).await;
        if result.is_err() {
            self.release_volume(volume.as_deref(), &id);
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    async fn create_with(
        self: &Arc<Self>,
        req: CreateSandboxRequest,
        id: String,
        volume_disk: Option<PathBuf>,
        template: lizard_image::TemplateImage,
        boot: assets::BootFiles,
        accel: Accel,
        vcpus: u32,
        memory_mib: u32,
    ) -> Result<Arc<Sandbox>> {
        let secret = Secret::generate();
        let run_dir = self.sandboxes_dir().join(&id);
        // Dropped on every error path below, which removes it again.
        let net = self.attach_network(&req.network_policy()).await?;
        let config = VmConfig {
            id: id.clone(),
            vcpus,
            memory_mib,
            kernel: boot.kernel.vmlinux.clone(),
            initramfs: boot.initramfs.path.clone(),
            cmdline: sandbox::cmdline(&id),
            root_disk: run_dir.join("root.qcow2"),
            // Always a second disk, so that every VM (template snapshots included) has
            // the same devices: the volume, or an empty placeholder.
            extra_disks: vec![volume_disk.unwrap_or_else(|| run_dir.join(sandbox::PLACEHOLDER_DISK))],
            secret_file: Some(run_dir.join("secret")),
            run_dir: run_dir.clone(),
            accel,
            net: net.as_ref().map(|n| n.attachment()),
        };
        let mut restored = None;
        if self.config.snapshots && !template.cold_boot_only {
            match self.template_snapshot(&template, &boot, vcpus, memory_mib, accel).await {
                Ok(snap) => {
                    let r = Sandbox::restore(
                        self.backend.as_ref(),
                        config.clone(),
                        &template,
                        &snap,
                        secret.clone(),
                        req.clone(),
                        self.config.boot_timeout,
                    )
                    .await;
                    match r {
                        Ok(s) => restored = Some(s),
                        Err(e) => {
                            tracing::warn!(%id, template = %template.name, "restore from the template snapshot failed, cold-booting: {e}");
                            let _ = std::fs::remove_dir_all(&run_dir);
                        }
                    }
                }
                Err(e) => tracing::warn!(template = %template.name, "no template snapshot, cold-booting: {e}"),
            }
        }
        let started = match restored {
            Some(s) => Ok(s),
            None => {
                Sandbox::boot(self.backend.as_ref(), config, &template, secret, req, self.config.boot_timeout).await
            }
        };
        // On failure the network is dropped with the closure, which removes it.
        let started = started.inspect(|s| s.set_network(net));
        let sandbox = self.admit(started, &run_dir)?;
        tracing::info!(%id, template = %sandbox.template, "sandbox running");
        Ok(sandbox)
    }

    /// A new network with `policy` for a sandbox, when the node gives sandboxes one.
    pub(crate) async fn attach_network(
        &self,
        policy: &lizard_api::network::NetworkPolicy,
    ) -> Result<Option<network::SandboxNet>> {
        let Some(n) = &self.network else { return Ok(None) };
        let policy = policy.parse().map_err(NodeError::InvalidArgument)?;
        Ok(Some(n.attach(&policy).await?))
    }

    /// Carry the guest's connections to its API address to [`NodeConfig::api_forward`]
    /// until this agent channel closes (a pause ends it; a resume opens a new one).
    pub(crate) fn forward_api(&self, id: &str, agent: &lizard_agent_client::AgentClient) {
        if let Some(target) = self.config.api_forward {
            forward::spawn(id.to_string(), agent.clone(), target);
        }
    }

    pub fn get(&self, id: &str) -> Result<Arc<Sandbox>> {
        self.sandboxes.read().unwrap().get(id).cloned().ok_or_else(|| self.not_found(id))
    }

    pub fn list(&self) -> Vec<SandboxInfo> {
        let mut v: Vec<SandboxInfo> = self.sandboxes.read().unwrap().values().map(|s| s.info()).collect();
        v.sort_by(|a, b| a.started_at.cmp(&b.started_at).then(a.sandbox_id.cmp(&b.sandbox_id)));
        v
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_static_binaries_pass_for_the_agent() {
        // This test binary is dynamically linked (it has an interpreter); /etc/hostname is no ELF.
        assert!(!super::is_static_executable(&std::env::current_exe().unwrap()));
        assert!(!super::is_static_executable(std::path::Path::new("/etc/hostname")));
        let agent = super::default_agent_bin();
        if agent.exists() {
            assert!(super::is_static_executable(&agent), "{} is not static", agent.display());
        }
    }
}
