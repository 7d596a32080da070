//! The agent handshake: connecting to a booting or restored guest's agent, giving a
//! restored guest its own identity, and asking the agent to mount the volume.

use super::{BootCause, BootError};
use crate::{NodeError, Result};
use lizard_agent_client::{AgentClient, ClientError};
use lizard_agent_proto::handshake::{HandshakeError, Secret};
use lizard_agent_proto::types::Identity;
use lizard_vmm::Vm;
use std::time::{Duration, Instant, SystemTime};

/// How long the first handshake may take on a guest that is known to be up (restored);
/// each retry doubles it. A retry covers a stale session the breaker did not end (one
/// caught mid-frame: the next connection's hang-up ends it).
pub(crate) const RESTORED_HANDSHAKE: Duration = Duration::from_secs(2);

/// [`RESTORED_HANDSHAKE`] for a fork's copy, whose stale session the protocol's
/// `STALE_SESSION_BREAKER` should have ended: short, so that a session it did not end (one
/// caught mid-frame) costs little before the reconnect that ends it. (When the copy had to
/// outwait it every time, the first handshake was 50 ms: 200 ms had cost a copy ≈700 ms of
/// retries.)
pub(crate) const COPY_HANDSHAKE: Duration = Duration::from_millis(250);

/// How long the first handshake with a cold-booting guest may take before the node
/// reconnects (each retry doubles it): far above a boot's few seconds, so that it only
/// matters when the agent missed the host's connection and waits for the next one.
pub(crate) const COLD_BOOT_HANDSHAKE: Duration = Duration::from_secs(10);

/// How long a mount may take (a restored guest first waits for the resize notice).
const VOLUME_MOUNT_LIMIT: Duration = Duration::from_secs(20);

/// How a connection authenticates.
#[derive(Clone, Copy)]
enum Auth<'a> {
    /// With the guest's current secret.
    Plain(&'a Secret),
    /// With the secret a restored guest was saved with, giving it a new identity in the
    /// same message.
    WithIdentity { saved: &'a Secret, identity: &'a Identity, new: &'a Secret },
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
    connect_with(vm, Auth::Plain(secret), deadline, attempt).await
}

async fn connect_with(
    vm: &dyn Vm,
    auth: Auth<'_>,
    deadline: Duration,
    attempt: Option<Duration>,
) -> Result<AgentClient> {
    let start = Instant::now();
    let socket = vm.config().agent_socket();
    let mut limit = attempt;
    let mut auth = auth;
    // Set when an attempt that carried the identity was cut off: the guest may have taken
    // it (and its new secret) without its answer reaching us.
    let mut identity_maybe_taken: Option<&Identity> = None;
    let attempt = async {
        loop {
            match tokio::net::UnixStream::connect(&socket).await {
                Ok(stream) => match with_limit(limit, handshake(stream, auth)).await {
                    Ok(client) => match (identity_maybe_taken, auth) {
                        // The new secret opened the session: the guest did take the
                        // identity; give it one again for a clock that is current.
                        (Some(identity), Auth::Plain(new)) => {
                            let left = deadline.saturating_sub(start.elapsed());
                            return send_identity(&client, &identity.sandbox_id, new, left).await.map(|()| client);
                        }
                        _ => return Ok(client),
                    },
                    Err(ClientError::Handshake(HandshakeError::Denied)) => match (auth, identity_maybe_taken) {
                        (Auth::WithIdentity { new, .. }, Some(_)) => auth = Auth::Plain(new),
                        _ => return Err(NodeError::from(BootError::SecretRefused)),
                    },
                    Err(e @ ClientError::Handshake(HandshakeError::IdentityFailed)) => {
                        return Err(BootError::Identity(e).into())
                    }
                    // The channel closed before the guest answered: it is still
                    // booting, or the VMM is gone (checked below).
                    Err(e) => {
                        tracing::debug!("agent handshake: {e}");
                        if let Auth::WithIdentity { identity, saved, new } = auth {
                            identity_maybe_taken = (saved != new).then_some(identity);
                        }
                        limit = limit.map(|l| l * 2);
                    }
                },
                Err(e) => tracing::trace!("agent socket: {e}"),
            }
            if !vm.is_running() {
                return Err(boot_failure(vm, BootCause::VmmExited(None)));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::select! {
        r = attempt => r,
        exit = vm.wait() => Err(boot_failure(vm, BootCause::VmmExited(Some(exit)))),
        _ = tokio::time::sleep(deadline.saturating_sub(start.elapsed())) => {
            Err(boot_failure(vm, BootCause::AgentTimeout(deadline)))
        }
    }
}

/// One handshake on `stream` (it opens with the protocol's stale-session breaker: a guest
/// saved or left mid-session — a fork's copy, a pause the agent had not noticed yet, a node
/// that restarted — ends that session at once).
async fn handshake(stream: tokio::net::UnixStream, auth: Auth<'_>) -> Result<AgentClient, ClientError> {
    match auth {
        Auth::Plain(secret) => AgentClient::connect(stream, secret).await,
        Auth::WithIdentity { saved, identity, .. } => AgentClient::connect_with_identity(stream, saved, identity).await,
    }
}

async fn with_limit<T>(
    limit: Option<Duration>,
    f: impl std::future::Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    match limit {
        None => f.await,
        Some(d) => tokio::time::timeout(d, f).await.unwrap_or(Err(ClientError::Closed)),
    }
}

/// A failed boot, with the end of the guest's console and of the VMM's stderr.
fn boot_failure(vm: &dyn Vm, cause: BootCause) -> NodeError {
    let config = vm.config();
    BootError::Failed {
        cause,
        console: lizard_vmm::tail_of(&config.console_log(), 1500),
        vmm_stderr: lizard_vmm::tail_of(&config.run_dir.join("qemu.stderr"), 500),
    }
    .into()
}

/// Authenticate to a just-restored guest with the secret it was saved with and give it
/// its own identity (id, secret, hostname, entropy, clock) in the same message. The agent
/// answers only once it has switched: from then on only the new secret opens a session,
/// while this one, already authenticated, carries on (a reconnect to prove the switch
/// cost ≈100 ms per create under TCG; the snapshot tests prove it instead).
pub(crate) async fn give_identity(
    vm: &dyn Vm,
    id: &str,
    saved_secret: &Secret,
    secret: &Secret,
    deadline: Duration,
    first_attempt: Duration,
) -> Result<AgentClient> {
    let start = Instant::now();
    let identity = new_identity(id, secret);
    let auth = Auth::WithIdentity { saved: saved_secret, identity: &identity, new: secret };
    let agent = connect_with(vm, auth, deadline, Some(first_attempt)).await?;
    tracing::debug!(%id, handshake = ?start.elapsed(), "restored guest took its identity");
    Ok(agent)
}

/// Give the guest behind the open session `agent` its own identity (id, secret,
/// hostname, entropy, clock) within `limit`, as a call on that session: for a guest whose
/// session is already open (a warm pool's, claimed), where the handshake cannot carry it.
pub(crate) async fn send_identity(agent: &AgentClient, id: &str, secret: &Secret, limit: Duration) -> Result<()> {
    match tokio::time::timeout(limit, agent.identity(&new_identity(id, secret))).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(BootError::Identity(e).into()),
        Err(_) => Err(BootError::IdentityTimeout(limit).into()),
    }
}

/// A fresh identity for sandbox `id`: its name, `secret`, host entropy and clock.
fn new_identity(id: &str, secret: &Secret) -> Identity {
    use rand::RngCore;
    let mut entropy = [0u8; lizard_agent_proto::types::IDENTITY_ENTROPY_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut entropy);
    let since_epoch = SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    // Milliseconds since 1970 fit a u64 for the next 500 million years.
    let unix_time_ms = u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX);
    Identity {
        sandbox_id: id.to_string(),
        hostname: id.to_string(),
        secret: secret.to_hex(),
        entropy: hex::encode(entropy),
        unix_time_ms,
    }
}

/// Mount the volume (`/dev/vdb`) at /workspace. A restored guest is first told the
/// disk's real size (it still has the template's placeholder size in mind).
pub(crate) async fn mount_volume(vm: &dyn Vm, agent: &AgentClient, restored: bool) -> Result<()> {
    let size = if restored {
        vm.refresh_disk_size(0).await?
    } else {
        let disk = vm.config().extra_disks.first().ok_or(BootError::NoVolumeDisk)?;
        std::fs::metadata(disk).map_err(|e| NodeError::io(format!("stat {}", disk.display()), e))?.len()
    };
    match tokio::time::timeout(VOLUME_MOUNT_LIMIT, agent.mount_volume(size)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(BootError::VolumeMount(e).into()),
        Err(_) => Err(BootError::VolumeMountTimeout(VOLUME_MOUNT_LIMIT).into()),
    }
}
