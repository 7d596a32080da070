//! One sandbox: its VM, its root disk and its authenticated agent connection.

use crate::snapshot::TemplateSnapshot;
use crate::{NodeError, Result};
use lizard_agent_client::AgentClient;
use lizard_agent_proto::frame::{Frame, FrameKind};
use lizard_agent_proto::handshake::Secret;
use lizard_api::{CreateSandboxRequest, SandboxInfo, SandboxState};
use lizard_image::TemplateImage;
use lizard_vmm::{Backend, MemoryMapping, Vm, VmConfig};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Kernel arguments common to every guest. `quiet` keeps the serial console (slow under
/// TCG) nearly silent; `panic=-1` + `reboot=k` + QEMU's `-no-reboot` turn a guest panic
/// into a VMM exit the node notices; the i8042 flags skip probing a controller microvm
/// does not have.
pub(crate) const BASE_CMDLINE: &str =
    "console=ttyS0 quiet loglevel=3 panic=-1 reboot=k i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd random.trust_cpu=on";

/// The guest's command line. The secret is not on it: it travels in a file (see
/// [`write_secret`]), since a VMM's arguments are readable by every host user.
pub(crate) fn cmdline(id: &str) -> String {
    use lizard_agent_proto::cmdline as k;
    format!("{BASE_CMDLINE} {}={id} {}=/dev/vda", k::HOSTNAME, k::ROOT)
}

/// Write the secret for the VMM to hand to the guest: owner-only, in the sandbox dir.
pub(crate) fn write_secret(path: &Path, secret: &Secret) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| NodeError::io(format!("create {}", path.display()), e))?;
    f.write_all(secret.to_hex().as_bytes()).map_err(|e| NodeError::io("write the secret", e))
}

/// File name, in a VM's run directory, of the empty disk that stands in for a volume.
pub(crate) const PLACEHOLDER_DISK: &str = "no-volume.img";

/// How long the agent gets to sync a volume before a kill or pause goes ahead anyway.
const VOLUME_SYNC_LIMIT: Duration = Duration::from_secs(10);
/// How long a mount may take (a restored guest first waits for the resize notice).
const VOLUME_MOUNT_LIMIT: Duration = Duration::from_secs(20);

/// A fresh sandbox id: 20 characters of [a-z0-9], starting with a letter, so that
/// `{id}-{port}.sandbox.{region}.{domain}` is a valid DNS label.
pub(crate) fn new_id() -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rngs::OsRng;
    let mut id = String::with_capacity(20);
    id.push((b'a' + rng.gen_range(0..26)) as char);
    for _ in 1..20 {
        id.push(ALPHABET[rng.gen_range(0..ALPHABET.len())] as char);
    }
    id
}

/// The pid in `dir/vmm.pid` if that process is still the VMM of sandbox `id`.
pub(crate) fn vmm_pid_of(dir: &Path, id: &str) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(dir.join("vmm.pid")).ok()?.trim().parse().ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    // Pids are reused: only a process whose arguments name this sandbox is ours.
    let needle = format!("lizard-{id}");
    cmdline.split(|b| *b == 0).any(|arg| arg == needle.as_bytes()).then_some(pid)
}

/// The VM of a running sandbox and the authenticated connection to its agent. A pause
/// ends both; a resume makes new ones.
pub struct Live {
    vm: Box<dyn Vm>,
    /// Replaced when a pause that ended the session fails and the node reconnects.
    agent: Mutex<AgentClient>,
}

impl Live {
    pub(crate) fn new(vm: Box<dyn Vm>, agent: AgentClient) -> Live {
        Live { vm, agent: Mutex::new(agent) }
    }

    pub fn vm(&self) -> &dyn Vm {
        self.vm.as_ref()
    }

    /// The agent connection (a cheap handle on the one session).
    pub fn agent(&self) -> AgentClient {
        self.agent.lock().unwrap().clone()
    }

    pub(crate) fn set_agent(&self, agent: AgentClient) {
        *self.agent.lock().unwrap() = agent;
    }
}

/// What changes over a sandbox's life.
pub(crate) struct State {
    /// The VM while running; None while paused.
    pub live: Option<Arc<Live>>,
    /// The VM's shape now (a fork gives the sandbox a new root disk overlay).
    pub config: VmConfig,
    /// Guest memory is the VM's own file (cold boot, or loaded from a full save), so a
    /// pause saves only device state; else (a template clone, whose memory is a private
    /// copy-on-write mapping of the template's) a pause saves all of memory.
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
    pub from_snapshot: bool,
    pub network_policy: lizard_api::network::NetworkPolicy,
    pub volume: Option<String>,
}

/// A sandbox: running, or paused with its memory and devices saved in its directory.
pub struct Sandbox {
    pub id: String,
    pub template: String,
    pub vcpus: u32,
    pub memory_mib: u32,
    pub started_at: SystemTime,
    pub metadata: BTreeMap<String, String>,
    /// Environment given at create; every exec starts with it.
    pub env: BTreeMap<String, String>,
    /// The volume mounted at /workspace, if any (its id).
    pub volume: Option<String>,
    pub(crate) secret: Secret,
    pub(crate) run_dir: PathBuf,
    from_snapshot: bool,
    pub(crate) state: Mutex<State>,
    /// Its network namespace and everything in it (while it has a NIC); released at
    /// cleanup. A paused sandbox keeps it; one taken back after a node restart gets a new
    /// one at resume.
    pub(crate) net: Mutex<Option<crate::network::SandboxNet>>,
    /// The outbound policy it was created with (forks inherit it).
    pub(crate) network_policy: lizard_api::network::NetworkPolicy,
    /// Serializes pause, resume, fork and kill of this sandbox.
    pub(crate) transition: tokio::sync::Mutex<()>,
    /// A pause is under way: new operations are refused as if it were paused, and ones
    /// whose channel the pause closes fail the same way.
    pub(crate) pausing: std::sync::atomic::AtomicBool,
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
    /// Create the root disk, boot the VM and authenticate to its agent within `deadline`.
    /// On failure the VM is killed; the caller removes the run directory.
    pub(crate) async fn boot(
        backend: &dyn Backend,
        config: VmConfig,
        template: &TemplateImage,
        secret: Secret,
        req: CreateSandboxRequest,
        deadline: Duration,
    ) -> Result<Sandbox> {
        prepare_run_dir(&config, &secret)?;
        create_overlay(&template.rootfs, "raw", &config.root_disk).await?;
        let vm = backend.boot(&config).await?;
        let agent = connected(vm.as_ref(), connect_agent(vm.as_ref(), &secret, deadline, None)).await?;
        if req.volume.is_some() {
            connected(vm.as_ref(), mount_volume(vm.as_ref(), &agent, false)).await?;
        }
        Ok(Sandbox::running(&config, template, req, secret, Live::new(vm, agent), false))
    }

    /// Start a sandbox by restoring a template snapshot: a new root overlay over the
    /// snapshot's disk, the snapshot's memory mapped copy-on-write, then a fresh identity
    /// for the guest (secret, hostname, entropy, clock), given before anything else runs
    /// in it. On failure the VM is killed; the
    /// caller removes the run directory.
    pub(crate) async fn restore(
        backend: &dyn Backend,
        config: VmConfig,
        template: &TemplateImage,
        snapshot: &TemplateSnapshot,
        secret: Secret,
        req: CreateSandboxRequest,
        deadline: Duration,
    ) -> Result<Sandbox> {
        if (config.vcpus, config.memory_mib) != (snapshot.meta.vcpus, snapshot.meta.memory_mib) {
            return Err(NodeError::Boot("the snapshot has another shape".into()));
        }
        // Same devices as the template VM, the fw_cfg item included; a restored guest does
        // not read it again: its secret arrives with the identity.
        let t = Instant::now();
        prepare_run_dir(&config, &secret)?;
        create_overlay(&snapshot.disk(), "qcow2", &config.root_disk).await?;
        let disk = t.elapsed();
        let vm = backend.restore(&config, &snapshot.vm_snapshot(), MemoryMapping::CopyOnWrite).await?;
        let vmm = t.elapsed();
        let identity = give_identity(vm.as_ref(), &config.id, &snapshot.secret, &secret, deadline);
        let agent = connected(vm.as_ref(), identity).await?;
        if req.volume.is_some() {
            connected(vm.as_ref(), mount_volume(vm.as_ref(), &agent, true)).await?;
        }
        tracing::debug!(id = %config.id, ?disk, ?vmm, total = ?t.elapsed(), "restored");
        Ok(Sandbox::running(&config, template, req, secret, Live::new(vm, agent), true))
    }

    fn running(
        config: &VmConfig,
        template: &TemplateImage,
        req: CreateSandboxRequest,
        secret: Secret,
        live: Live,
        from_snapshot: bool,
    ) -> Sandbox {
        let policy = req.network_policy();
        Sandbox {
            id: config.id.clone(),
            template: template.name.clone(),
            vcpus: config.vcpus,
            memory_mib: config.memory_mib,
            started_at: SystemTime::now(),
            metadata: req.metadata,
            env: req.env,
            volume: req.volume,
            secret,
            run_dir: config.run_dir.clone(),
            from_snapshot,
            net: Mutex::new(None),
            network_policy: policy,
            state: Mutex::new(State {
                live: Some(Arc::new(live)),
                config: config.clone(),
                own_memory: !from_snapshot,
                layers: vec![],
            }),
            transition: tokio::sync::Mutex::new(()),
            pausing: Default::default(),
        }
    }

    pub(crate) fn set_network(&self, net: Option<crate::network::SandboxNet>) {
        *self.net.lock().unwrap() = net;
    }

    /// Its network namespace (under /run/netns) and host link, if it has a network.
    pub fn network(&self) -> Option<(String, String)> {
        self.net.lock().unwrap().as_ref().map(|n| (n.netns_name(), n.host_link()))
    }

    /// A copy of `source` (a fork) running in `live`, whose root disk is backed by the
    /// source's frozen `layers`.
    pub(crate) fn forked(
        source: &Sandbox,
        config: VmConfig,
        secret: Secret,
        live: Live,
        layers: Vec<PathBuf>,
    ) -> Sandbox {
        Sandbox {
            id: config.id.clone(),
            template: source.template.clone(),
            vcpus: source.vcpus,
            memory_mib: source.memory_mib,
            started_at: SystemTime::now(),
            metadata: source.metadata.clone(),
            env: source.env.clone(),
            // Sandboxes with a volume cannot be forked.
            volume: None,
            secret,
            run_dir: config.run_dir.clone(),
            from_snapshot: true,
            net: Mutex::new(None),
            network_policy: source.network_policy.clone(),
            state: Mutex::new(State { live: Some(Arc::new(live)), config, own_memory: true, layers }),
            transition: tokio::sync::Mutex::new(()),
            pausing: Default::default(),
        }
    }

    /// A paused sandbox (taken back from its directory after a node restart).
    pub(crate) fn paused(
        who: Identity,
        secret: Secret,
        config: VmConfig,
        own_memory: bool,
        layers: Vec<PathBuf>,
    ) -> Sandbox {
        Sandbox {
            id: who.id,
            template: who.template,
            vcpus: who.vcpus,
            memory_mib: who.memory_mib,
            started_at: who.started_at,
            metadata: who.metadata,
            env: who.env,
            volume: who.volume,
            secret,
            run_dir: config.run_dir.clone(),
            from_snapshot: who.from_snapshot,
            net: Mutex::new(None),
            network_policy: who.network_policy,
            state: Mutex::new(State { live: None, config, own_memory, layers }),
            transition: tokio::sync::Mutex::new(()),
            pausing: Default::default(),
        }
    }

    /// Whether this sandbox was restored from a snapshot (else cold-booted).
    pub fn from_snapshot(&self) -> bool {
        self.from_snapshot
    }

    /// The running VM and agent, or CONFLICT while paused (or pausing).
    pub fn live(&self) -> Result<Arc<Live>> {
        if self.pausing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(NodeError::Paused(self.id.clone()));
        }
        self.state.lock().unwrap().live.clone().ok_or_else(|| NodeError::Paused(self.id.clone()))
    }

    pub fn is_paused(&self) -> bool {
        self.state.lock().unwrap().live.is_none()
    }

    pub fn info(&self) -> SandboxInfo {
        SandboxInfo {
            sandbox_id: self.id.clone(),
            template: self.template.clone(),
            // Pausing counts as paused: operations are already refused.
            state: if self.is_paused() || self.pausing.load(std::sync::atomic::Ordering::SeqCst) {
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
        }
    }

    /// Have the guest write what it cached for its volume to the disk, within a bound;
    /// a failure is logged, not returned (a guest that cannot sync cannot be helped by
    /// waiting). No volume: nothing to do.
    pub async fn sync_volume(&self) {
        let Some(live) = self.state.lock().unwrap().live.clone() else { return };
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
        if let Some(net) = self.net.lock().unwrap().take() {
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
                Ok(live) if live.vm.is_running() => NodeError::Unavailable(other.to_string()),
                Ok(_) => NodeError::Dead(self.id.clone(), format!("its VM stopped ({other})")),
                Err(paused) => paused,
            },
        }
    }
}

/// Operations inside the guest, through the agent.
impl Sandbox {
    /// The agent's form of an exec request: the sandbox's environment under the
    /// request's, stdin as a one-chunk stream.
    fn agent_exec(
        &self,
        req: lizard_api::ExecRequest,
    ) -> Result<(
        lizard_agent_proto::types::ExecRequest,
        Option<futures_util::stream::Once<std::future::Ready<bytes::Bytes>>>,
    )> {
        if req.cmd.is_some() == req.argv.is_some() {
            return Err(NodeError::InvalidArgument("give exactly one of cmd (a shell string) or argv".into()));
        }
        if req.argv.as_ref().is_some_and(|a| a.is_empty()) {
            return Err(NodeError::InvalidArgument("argv must not be empty".into()));
        }
        let mut env = self.env.clone();
        env.extend(req.env);
        let stdin = req.stdin.map(|s| futures_util::stream::once(std::future::ready(bytes::Bytes::from(s))));
        let agent_req = lizard_agent_proto::types::ExecRequest {
            cmd: req.cmd,
            argv: req.argv,
            cwd: req.cwd,
            env,
            user: req.user,
            timeout_ms: req.timeout_ms,
            stdin: stdin.is_some(),
        };
        Ok((agent_req, stdin))
    }

    async fn start_exec(&self, req: lizard_api::ExecRequest) -> Result<lizard_agent_client::ExecStream> {
        let (req, stdin) = self.agent_exec(req)?;
        self.live()?.agent().exec(req, stdin).await.map_err(|e| self.agent_error(e))
    }

    /// Run a command to completion and collect its output (lossy UTF-8).
    pub async fn exec_collect(&self, req: lizard_api::ExecRequest) -> Result<lizard_api::ProcessResult> {
        use futures_util::StreamExt;
        let mut stream = self.start_exec(req).await?;
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        while let Some(event) = stream.next().await {
            match event {
                lizard_agent_client::ExecEvent::Stdout(b) => stdout.extend_from_slice(&b),
                lizard_agent_client::ExecEvent::Stderr(b) => stderr.extend_from_slice(&b),
            }
        }
        let status = stream.wait().await.map_err(|e| self.agent_error(e))?;
        Ok(lizard_api::ProcessResult {
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            exit_code: status.exit_code,
            timed_out: status.timed_out,
        })
    }

    /// Run a command, discard its output, and return how it ended (with the guest's own
    /// timing).
    pub async fn exec_status(&self, req: lizard_api::ExecRequest) -> Result<lizard_api::ExitStatus> {
        self.start_exec(req).await?.wait().await.map_err(|e| self.agent_error(e))
    }

    /// Run a command and stream its output as exec frames, ending with `Exit`, or with
    /// `Error` carrying an [`lizard_api::ApiError`].
    pub async fn exec_frames(
        self: &Arc<Self>,
        req: lizard_api::ExecRequest,
    ) -> Result<impl futures_util::Stream<Item = std::io::Result<Frame>> + Send + 'static> {
        use futures_util::StreamExt;
        let stream = self.start_exec(req).await?;
        let me = self.clone();
        Ok(futures_util::stream::unfold(Some(stream), move |state| {
            let me = me.clone();
            async move {
                let mut stream = state?;
                match stream.next().await {
                    Some(lizard_agent_client::ExecEvent::Stdout(b)) => {
                        Some((Ok(Frame::new(FrameKind::Stdout, b)), Some(stream)))
                    }
                    Some(lizard_agent_client::ExecEvent::Stderr(b)) => {
                        Some((Ok(Frame::new(FrameKind::Stderr, b)), Some(stream)))
                    }
                    None => {
                        let last = match stream.wait().await {
                            Ok(status) => Frame::json(FrameKind::Exit, &status),
                            Err(e) => Frame::json(FrameKind::Error, &me.agent_error(e).to_api()),
                        };
                        Some((Ok(last), None))
                    }
                }
            }
        }))
    }

    /// Stream a file out of the guest: its length (when known) and its bytes.
    pub async fn read_file(
        &self,
        path: &str,
    ) -> Result<(Option<u64>, futures_util::stream::BoxStream<'static, std::io::Result<bytes::Bytes>>)> {
        use futures_util::StreamExt;
        let file = self.live()?.agent().read_file(path).await.map_err(|e| self.agent_error(e))?;
        let len = file.content_length();
        Ok((len, file.map(|r| r.map_err(std::io::Error::other)).boxed()))
    }

    /// Stream `body` into a file in the guest (parents created, replaced atomically).
    pub async fn write_file<S>(&self, path: &str, mode: Option<u32>, body: S) -> Result<lizard_api::WriteResult>
    where
        S: futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send + 'static,
    {
        self.live()?.agent().write_file(path, mode, body).await.map_err(|e| self.agent_error(e))
    }

    pub async fn list_dir(&self, path: &str) -> Result<Vec<lizard_api::FileEntry>> {
        self.live()?.agent().list_dir(path).await.map_err(|e| self.agent_error(e))
    }

    /// Remove a file or a directory tree.
    pub async fn remove(&self, path: &str) -> Result<()> {
        self.live()?.agent().remove(path).await.map_err(|e| self.agent_error(e))
    }

    /// Create a directory and its parents.
    pub async fn make_dir(&self, path: &str) -> Result<()> {
        self.live()?.agent().make_dir(path).await.map_err(|e| self.agent_error(e))
    }

    /// A TCP connection to `port` on the guest's loopback, carried over the agent channel
    /// (not the guest network, which is closed to the host). This is what a reverse proxy for
    /// `{id}-{port}.sandbox.…` URLs writes requests into: raw bytes both ways, so HTTP/1.1
    /// keep-alive, streamed bodies and WebSocket upgrades pass through untouched.
    /// Nothing listening there is [`lizard_api::ErrorCode::Unavailable`]; port 0 is
    /// [`lizard_api::ErrorCode::InvalidArgument`].
    pub async fn connect_port(&self, port: u16) -> Result<lizard_agent_client::TcpTunnel> {
        self.live()?.agent().connect_tcp(port).await.map_err(|e| self.agent_error(e))
    }
}

/// Mount the volume (`/dev/vdb`) at /workspace. A restored guest is first told the
/// disk's real size (it still has the template's placeholder size in mind).
async fn mount_volume(vm: &dyn Vm, agent: &AgentClient, restored: bool) -> Result<AgentClient> {
    let size = if restored {
        vm.refresh_disk_size(0).await?
    } else {
        let disk = vm.config().extra_disks.first().ok_or_else(|| NodeError::Boot("no volume disk".into()))?;
        std::fs::metadata(disk).map_err(|e| NodeError::io(format!("stat {}", disk.display()), e))?.len()
    };
    match tokio::time::timeout(VOLUME_MOUNT_LIMIT, agent.mount_volume(size)).await {
        Ok(Ok(())) => Ok(agent.clone()),
        Ok(Err(e)) => Err(NodeError::Boot(format!("mount the volume: {e}"))),
        Err(_) => Err(NodeError::Boot(format!("the volume was not mounted within {VOLUME_MOUNT_LIMIT:?}"))),
    }
}

/// The sandbox's directory with its secret file in it, and the empty placeholder disk
/// when the VM has no volume.
pub(crate) fn prepare_run_dir(config: &VmConfig, secret: &Secret) -> Result<()> {
    std::fs::create_dir_all(&config.run_dir).map_err(|e| NodeError::io("create sandbox dir", e))?;
    for disk in config.extra_disks.iter().filter(|d| d.starts_with(&config.run_dir)) {
        std::fs::File::create(disk).map_err(|e| NodeError::io(format!("create {}", disk.display()), e))?;
    }
    match &config.secret_file {
        Some(path) => write_secret(path, secret),
        None => Ok(()),
    }
}

/// The agent connection `connect` makes, or the VM killed and the error.
pub(crate) async fn connected(
    vm: &dyn Vm,
    connect: impl std::future::Future<Output = Result<AgentClient>>,
) -> Result<AgentClient> {
    match connect.await {
        Ok(a) => Ok(a),
        Err(e) => {
            let _ = vm.kill().await;
            Err(e)
        }
    }
}

/// A qcow2 overlay whose backing file is a read-only image: the sandbox writes only its
/// own blocks, and creating it costs well under a millisecond. The size comes from the
/// backing file's header, which is readable even while a running VM holds the file (as
/// when a fork freezes a disk).
pub(crate) async fn create_overlay(backing: &Path, backing_format: &str, overlay: &Path) -> Result<()> {
    let size = virtual_size(backing, backing_format)?;
    crate::qcow2::create_overlay(backing, backing_format, size, overlay)
        .map_err(|e| NodeError::io(format!("create the disk overlay {}", overlay.display()), e))
}

/// The guest-visible size of a raw or qcow2 disk image.
fn virtual_size(image: &Path, format: &str) -> Result<u64> {
    use std::io::Read;
    let mut f = std::fs::File::open(image).map_err(|e| NodeError::io(format!("open {}", image.display()), e))?;
    if format == "raw" {
        return f.metadata().map(|m| m.len()).map_err(|e| NodeError::io(format!("stat {}", image.display()), e));
    }
    // qcow2 header: magic "QFI\xfb", then the size as a big-endian u64 at offset 24.
    let mut header = [0u8; 32];
    f.read_exact(&mut header).map_err(|e| NodeError::io(format!("read {}", image.display()), e))?;
    if &header[..4] != b"QFI\xfb" {
        return Err(NodeError::Boot(format!("{} is not a qcow2 image", image.display())));
    }
    Ok(u64::from_be_bytes(header[24..32].try_into().unwrap()))
}

/// How long the first handshake may take on a guest that is known to be up (restored);
/// each retry doubles it. A retry covers a connection that races the guest noticing that
/// the host it had before the snapshot left (its old session then waits for that host
/// until this one gives up and reconnects).
pub(crate) const RESTORED_HANDSHAKE: Duration = Duration::from_secs(2);

/// Authenticate to a just-restored guest with the template's secret and give it its own
/// identity. The agent answers only once it has switched: from then on only the new
/// secret opens a session, while this one, already authenticated, carries on (a
/// reconnect to prove the switch cost ≈100 ms per create under TCG; the snapshot tests
/// prove it instead).
pub(crate) async fn give_identity(
    vm: &dyn Vm,
    id: &str,
    template_secret: &Secret,
    secret: &Secret,
    deadline: Duration,
) -> Result<AgentClient> {
    use rand::RngCore;
    let start = Instant::now();
    let first = connect_agent(vm, template_secret, deadline, Some(RESTORED_HANDSHAKE)).await?;
    let mut entropy = [0u8; lizard_agent_proto::types::IDENTITY_ENTROPY_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut entropy);
    let unix_time_ms = SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis() as u64;
    let identity = lizard_agent_proto::types::Identity {
        sandbox_id: id.to_string(),
        hostname: id.to_string(),
        secret: secret.to_hex(),
        entropy: hex::encode(entropy),
        unix_time_ms,
    };
    tracing::debug!(%id, handshake = ?start.elapsed(), "restored guest answered");
    let left = deadline.saturating_sub(start.elapsed());
    match tokio::time::timeout(left, first.identity(&identity)).await {
        Ok(Ok(_)) => Ok(first),
        Ok(Err(e)) => Err(NodeError::Boot(format!("identity: {e}"))),
        Err(_) => Err(NodeError::Boot(format!("the restored guest did not take its identity within {deadline:?}"))),
    }
}

/// Connect to the agent's socket and run the handshake, retrying until the guest is up.
/// `attempt` bounds the first handshake, each later one twice as long as the one before
/// (None: a booting guest answers when it is ready). A wrong secret fails at once.
pub(crate) async fn connect_agent(
    vm: &dyn Vm,
    secret: &Secret,
    deadline: Duration,
    attempt: Option<Duration>,
) -> Result<AgentClient> {
    let start = Instant::now();
    let socket = vm.config().agent_socket();
    let mut limit = attempt;
    let attempt = async {
        loop {
            match tokio::net::UnixStream::connect(&socket).await {
                Ok(stream) => match with_limit(limit, AgentClient::connect(stream, secret)).await {
                    Ok(client) => return Ok(client),
                    Err(lizard_agent_client::ClientError::Handshake(
                        lizard_agent_proto::handshake::HandshakeError::Denied,
                    )) => return Err(NodeError::Boot("the agent refused the secret".into())),
                    // The channel closed before the guest answered: it is still
                    // booting, or the VMM is gone (checked below).
                    Err(e) => {
                        tracing::debug!("agent handshake: {e}");
                        limit = limit.map(|l| l * 2);
                    }
                },
                Err(e) => tracing::trace!("agent socket: {e}"),
            }
            if !vm.is_running() {
                return Err(boot_error(vm, "the VMM exited during boot"));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::select! {
        r = attempt => r,
        exit = vm.wait() => Err(boot_error(vm, &format!("the VMM exited during boot ({exit:?})"))),
        _ = tokio::time::sleep(deadline.saturating_sub(start.elapsed())) => {
            Err(boot_error(vm, &format!("the guest agent did not answer within {deadline:?}")))
        }
    }
}

async fn with_limit<T>(
    limit: Option<Duration>,
    f: impl std::future::Future<Output = Result<T, lizard_agent_client::ClientError>>,
) -> Result<T, lizard_agent_client::ClientError> {
    match limit {
        None => f.await,
        Some(d) => tokio::time::timeout(d, f).await.unwrap_or(Err(lizard_agent_client::ClientError::Closed)),
    }
}

fn boot_error(vm: &dyn Vm, what: &str) -> NodeError {
    let dir = &vm.config().run_dir;
    let console = lizard_vmm::tail_of(&vm.config().console_log(), 1500);
    let stderr = lizard_vmm::tail_of(&dir.join("qemu.stderr"), 500);
    NodeError::Boot(format!("{what}; console: {} {}", console.trim(), stderr.trim()))
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

    #[test]
    fn cmdline_carries_identity_but_not_the_secret() {
        let c = cmdline("abc");
        assert!(c.contains("lizard.hostname=abc"));
        assert!(!c.contains("lizard.secret"));
        let dir = tempfile::tempdir().unwrap();
        let s = Secret::generate();
        write_secret(&dir.path().join("secret"), &s).unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join("secret")).unwrap(), s.to_hex());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(dir.path().join("secret")).unwrap().permissions().mode() & 0o777, 0o600);
    }
}
