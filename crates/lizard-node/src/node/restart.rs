//! What a node finds from an earlier node process at start: paused sandboxes it takes
//! back, and running ones (their VMM processes and directories), which are lost.

use super::Node;
use crate::error::EndReason;
use crate::sandbox::Sandbox;
use crate::vm;
use std::sync::Arc;

impl Node {
    /// Take back the paused sandboxes an earlier node process left; kill VMM processes
    /// and delete directories of the rest (recorded as lost), and delete layers nothing
    /// uses any more.
    pub(super) fn adopt_or_sweep(self: &Arc<Self>) {
        if let Ok(entries) = std::fs::read_dir(self.sandboxes_dir()) {
            for entry in entries.flatten() {
                let id = entry.file_name().to_string_lossy().into_owned();
                let dir = entry.path();
                if let Some(pid) = vm::vmm_pid_of(&dir, &id) {
                    tracing::warn!(%id, pid, "killing VMM left by a previous node process");
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
                } else if let Some(sandbox) = Sandbox::adopt(&dir, &self.seal) {
                    tracing::info!(%id, "paused sandbox taken back");
                    // A record from before sealing holds its environment in plain text.
                    if let Err(e) = sandbox.write_record(&self.seal) {
                        tracing::warn!(%id, "cannot rewrite the record of a taken-back sandbox: {e}");
                    }
                    if let Some(volume) = &sandbox.volume {
                        self.hold_volume(volume, &id);
                    }
                    self.sandboxes_mut().insert(id, Arc::new(sandbox));
                    continue;
                }
                let _ = std::fs::remove_dir_all(&dir);
                self.bury(&id, EndReason::Lost);
            }
        }
        let in_use = self.layers_in_use();
        if let Ok(entries) = std::fs::read_dir(self.layers_dir()) {
            for path in entries.flatten().map(|e| e.path()) {
                if !in_use.contains(&path) {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
    }
}
