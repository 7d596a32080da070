//! What a node finds from an earlier node process at start: paused sandboxes it takes
//! back from their files, running ones it takes back with their VMM processes (which run
//! in process groups of their own and outlive the node: a node restart or crash costs a
//! running sandbox nothing), and leftovers it removes.

use super::Node;
use crate::error::EndReason;
use crate::sandbox::{Durability, Live, ReadBack, Recorded, Sandbox};
use crate::{vm, NodeError, Result};
use std::path::Path;
use std::sync::Arc;

impl Node {
    /// Take back the paused and running sandboxes an earlier node process left (a paused
    /// one whose VMM still runs, after a crash mid-pause, with that VMM killed); kill VMM
    /// processes and delete directories of the rest (recorded as lost); then sweep the
    /// networks, half-made sandbox snapshots (indexing the whole ones) and layers nothing
    /// uses any more.
    pub(super) async fn take_back_or_sweep(self: &Arc<Self>) {
        if let Ok(entries) = std::fs::read_dir(self.sandboxes_dir()) {
            for entry in entries.flatten() {
                let id = entry.file_name().to_string_lossy().into_owned();
                let dir = entry.path();
                if !self.take_back(&id, &dir).await {
                    let _ = std::fs::remove_dir_all(&dir);
                    self.bury(&id, EndReason::Lost);
                }
            }
        }
        if let Some(network) = &self.network {
            network.sweep();
        }
        self.take_back_sandbox_snapshots();
        let in_use = self.layers_in_use();
        if let Ok(entries) = std::fs::read_dir(self.layers_dir()) {
            for path in entries.flatten().map(|e| e.path()) {
                if !in_use.contains(&path) {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
    }

    /// Take back the sandbox in `dir` if its record and (for a running one) its VMM
    /// allow; false when it is lost (its VMM, if any, killed).
    async fn take_back(self: &Arc<Self>, id: &str, dir: &Path) -> bool {
        let pid = vm::vmm_pid_of(dir, id);
        let read = Sandbox::from_record(dir, &self.seal);
        let plain_env = read.as_ref().is_some_and(|r| r.plain_env);
        let sandbox = match (read.map(|r: ReadBack| r.recorded), pid) {
            (Some(Recorded::Paused(sandbox)), None) => {
                tracing::info!(%id, "paused sandbox taken back");
                sandbox
            }
            (Some(Recorded::Running(sandbox)), Some(pid)) => match self.take_back_running(&sandbox, pid).await {
                Ok(()) => {
                    tracing::info!(%id, pid, "running sandbox taken back with its VMM");
                    sandbox
                }
                Err(e) => {
                    tracing::warn!(%id, pid, "cannot take back a running sandbox, killing its VMM: {e}");
                    kill(pid);
                    return false;
                }
            },
            // A crash between a pause's record (written once its save was synced) and the
            // kill of its VMM: the save is whole and is the sandbox; the VMM is stale.
            (Some(Recorded::Paused(sandbox)), Some(pid)) => {
                tracing::warn!(%id, pid, "killing the VMM of a sandbox recorded paused; taken back paused");
                kill(pid);
                sandbox
            }
            (_, Some(pid)) => {
                tracing::warn!(%id, pid, "killing a VMM left by a previous node process without a record to run it by");
                kill(pid);
                return false;
            }
            (_, None) => return false,
        };
        // A record from before sealing holds its environment in plain text: sealed now.
        if plain_env {
            if let Err(e) = sandbox.write_record(&self.seal, Durability::Cached) {
                tracing::warn!(%id, "cannot seal the record of a taken-back sandbox: {e}");
            }
        }
        if let Some(volume) = &sandbox.volume {
            self.hold_volume(volume, id);
        }
        let sandbox = Arc::new(sandbox);
        let live = sandbox.state().live.clone();
        self.sandboxes_mut().insert(id.to_string(), sandbox.clone());
        if let Some(live) = live {
            self.watch(sandbox, live);
        }
        true
    }

    /// Reconnect to a running sandbox's VMM `pid`, its network and its agent (which went
    /// back to waiting for a host when the old process's channel closed).
    async fn take_back_running(&self, sandbox: &Sandbox, pid: i32) -> Result<()> {
        let config = sandbox.state().config.clone();
        let pid = u32::try_from(pid).map_err(|_| NodeError::io("VMM pid", std::io::ErrorKind::InvalidData.into()))?;
        let vm = self.backend.adopt(&config, pid).await?;
        if let (Some(network), Some(attachment)) = (&self.network, &config.net) {
            let policy = sandbox.network_policy().parse().map_err(NodeError::BadNetworkPolicy)?;
            sandbox.set_network(Some(network.adopt(attachment, &policy).await?));
        }
        let agent =
            vm::connect_agent(vm.as_ref(), &sandbox.secret, self.config.boot_timeout, Some(vm::RESTORED_HANDSHAKE))
                .await?;
        sandbox.state().live = Some(Arc::new(Live::new(vm::Launched { vm, agent })));
        Ok(())
    }
}

fn kill(pid: i32) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
}
