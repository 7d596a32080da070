//! A sandbox's life after create: admitting a started one, watching its VM, pause to
//! disk, resume, kill, and node shutdown.
//!
//! A paused sandbox's directory holds everything it is (its VMM, when kept a while for a
//! quick resume, is stopped, and can go at any moment: see [`super::kept`]): the root
//! disk overlay, the secret, `sandbox.json`, and its saved VM — either device state only
//! beside a memory file of its own (a cold boot), or, for a clone whose memory is a
//! private copy-on-write mapping of a template's (or a fork's) memory, the pages it
//! changed and its device state beside a hard link to that memory. A clone resumes a
//! clone: its pauses write what it changed, its files stay ∝ that. A full save left by an
//! older node loads into a memory file of the sandbox's own (see [`crate::vm`]'s
//! `save_in_place`).

use super::kept::{self, Taken};
use super::Node;
use crate::error::EndReason;
use crate::sandbox::{Durability, Live, Sandbox};
use crate::{vm, NodeError, Result};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

impl Node {
    /// Stop a sandbox's vCPUs, save it to its directory and end its VMM process (or keep
    /// it, stopped, for [`crate::NodeConfig::keep_paused_vm`]). Its processes, memory and
    /// files come back with [`Node::resume`]. Pausing a paused sandbox does nothing.
    pub async fn pause(self: &Arc<Self>, id: &str) -> Result<Arc<Sandbox>> {
        let sandbox = self.get(id)?;
        let (node, s) = (self.clone(), sandbox.clone());
        let paused = tokio::spawn(async move { node.pause_now(&s).await }).await.expect("pause task panicked");
        paused.map_err(|e| e.or_disk_full("save the sandbox", &self.config.data_dir))?;
        Ok(sandbox)
    }

    async fn pause_now(self: &Arc<Self>, sandbox: &Arc<Sandbox>) -> Result<()> {
        let _transition = sandbox.transition.lock().await;
        self.get(&sandbox.id)?; // killed while we waited
        let (live, own_memory) = {
            let st = sandbox.state();
            match &st.live {
                None => return Ok(()),
                Some(live) => (live.clone(), st.own_memory),
            }
        };
        // A halted VM cannot be saved (the save needs the disk that is full), and its
        // guest cannot take part: refused before anything changes.
        if let Some(halt) = live.halted() {
            return Err(NodeError::Halted { id: sandbox.id.clone(), no_space: halt.no_space });
        }
        // The volume's data reaches its disk before the VM stops: a paused sandbox's
        // volume must read the same from the host as from the guest. That write may be
        // the one the node's disk cannot take: the VM halts, and the pause is refused
        // with nothing changed yet.
        let mut halts = live.vm().io_halt();
        let halted = tokio::select! {
            () = sandbox.sync_volume() => None,
            halt = halts.wait_for(Option::is_some) => halt.ok().and_then(|h| (*h).clone()),
        };
        if let Some(halt) = halted {
            return Err(NodeError::Halted { id: sandbox.id.clone(), no_space: halt.no_space });
        }
        // New operations are refused from here, as for a paused sandbox.
        sandbox.pausing.store(true, Ordering::SeqCst);
        // The agent goes back to waiting for a host, so that the first connection after the
        // resume is simply its next session. Not waited for: a session the agent had not
        // seen end yet is ended by that connection's first bytes (see `vm::agent`).
        let _ = tokio::time::timeout(Duration::from_secs(2), live.agent().shutdown()).await;
        let vm = live.vm();
        let saved = match vm::save_in_place(vm, own_memory).await {
            Ok(saved) => saved,
            Err(e) => {
                self.run_on(sandbox, &live).await;
                return Err(e.into());
            }
        };
        // From here the saved VM is the sandbox once its record says so: the process
        // must not run on. Taking it out of the state first tells its monitor that its
        // exit is no crash.
        sandbox.state().live = None;
        if let Err(e) = sandbox.write_record(&self.seal, Durability::Synced) {
            // Still recorded as running (a full disk, say): so it is, and runs on.
            sandbox.state().live = Some(live.clone());
            self.run_on(sandbox, &live).await;
            return Err(e);
        }
        sandbox.pausing.store(false, Ordering::SeqCst);
        if self.config.keep_paused_vm.is_zero() {
            let _ = vm.kill().await;
        } else {
            self.keep_stopped(sandbox, live);
        }
        tracing::info!(id = %sandbox.id, form = ?saved, "sandbox paused");
        Ok(())
    }

    /// Keep a just-paused sandbox's stopped VMM for [`crate::NodeConfig::keep_paused_vm`].
    fn keep_stopped(self: &Arc<Self>, sandbox: &Sandbox, live: Arc<Live>) {
        let token = self.kept.keep(&sandbox.id, live, sandbox.vcpus, sandbox.memory_mib);
        let (node, id, keep) = (Arc::downgrade(self), sandbox.id.clone(), self.config.keep_paused_vm);
        tokio::spawn(async move {
            tokio::time::sleep(keep).await;
            if let Some(node) = node.upgrade() {
                node.kept.let_go_if(&id, token);
            }
        });
    }

    /// Not paused after all: the VM runs on, with a new agent session. A VM that halts
    /// on a full disk as it continues (QEMU retries the write that failed during the
    /// pause) answers nothing until the node continues it, which waits for this pause's
    /// transition: its session is made in the background once it runs again.
    async fn run_on(self: &Arc<Self>, sandbox: &Arc<Sandbox>, live: &Arc<Live>) {
        let _ = live.vm().resume().await;
        match self.new_session(sandbox, live).await {
            Some(Ok(())) => {}
            Some(Err(e)) => tracing::warn!(id = %sandbox.id, "no agent session after a failed pause: {e}"),
            None => self.new_session_once_continued(sandbox.clone(), live.clone()),
        }
        sandbox.pausing.store(false, Ordering::SeqCst);
    }

    /// A new agent session with `live`'s guest; None when its VM halts first.
    async fn new_session(&self, sandbox: &Sandbox, live: &Live) -> Option<Result<()>> {
        let vm = live.vm();
        let mut halts = vm.io_halt();
        let deadline = self.config.boot_timeout;
        tokio::select! {
            made = vm::connect_agent(vm, &sandbox.secret, deadline, Some(vm::RESTORED_HANDSHAKE)) => Some(made.map(|agent| {
                self.forward_api(&sandbox.id, &agent);
                live.set_agent(agent);
            })),
            _ = halts.wait_for(Option::is_some) => None,
        }
    }

    /// [`Self::new_session`] each time the halted `live` continues, until one is made or
    /// `live` is no longer the sandbox's VM.
    fn new_session_once_continued(self: &Arc<Self>, sandbox: Arc<Sandbox>, live: Arc<Live>) {
        let node = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut halts = live.vm().io_halt();
            loop {
                tokio::select! {
                    continued = halts.wait_for(Option::is_none) => if continued.is_err() { return },
                    _ = live.vm().wait() => return,
                }
                let Some(node) = node.upgrade() else { return };
                // No pause or kill meanwhile: they would find the session half made.
                let _transition = sandbox.transition.lock().await;
                if !sandbox.state().live.as_ref().is_some_and(|l| Arc::ptr_eq(l, &live)) {
                    return;
                }
                match node.new_session(&sandbox, &live).await {
                    Some(Ok(())) => tracing::info!(id = %sandbox.id, "agent session made: the halted VM continued"),
                    Some(Err(e)) => tracing::warn!(id = %sandbox.id, "no agent session after a halt: {e}"),
                    None => continue,
                }
                return;
            }
        });
    }

    /// Start a paused sandbox's VM again where it stopped. Resuming a running sandbox
    /// does nothing.
    pub async fn resume(self: &Arc<Self>, id: &str) -> Result<Arc<Sandbox>> {
        let sandbox = self.get(id)?;
        let (node, s) = (self.clone(), sandbox.clone());
        tokio::spawn(async move { node.resume_now(&s).await }).await.expect("resume task panicked")?;
        Ok(sandbox)
    }

    async fn resume_now(self: &Arc<Self>, sandbox: &Arc<Sandbox>) -> Result<()> {
        let _transition = sandbox.transition.lock().await;
        self.get(&sandbox.id)?;
        let (mut config, own_memory) = {
            let st = sandbox.state();
            if st.live.is_some() {
                return Ok(());
            }
            (st.config.clone(), st.own_memory)
        };
        let kept = self.kept.take(&sandbox.id);
        // A resume starts a VMM like a create does (or keeps the one it kept): the node
        // admits it only with the CPUs and memory to spare, else it stays paused, intact.
        let _reservation = match self.reserve(1, sandbox.vcpus, sandbox.memory_mib) {
            Ok(r) => r,
            Err(e) => {
                if let Some(kept) = kept {
                    kept.ended().await;
                }
                return Err(e);
            }
        };
        match kept {
            Some(Taken::Stopped(live)) => match self.continue_kept(sandbox, &live).await {
                Ok(true) => return self.record_resumed(sandbox, "its VMM was kept"),
                // The VMM did not start again (it died meanwhile): the save is whole.
                Ok(false) => Taken::Dying(live).ended().await,
                // It ran, and its agent did not answer: what ran since the pause may have
                // reached the disk, so the save no longer matches it. Paused, as a failed
                // restore leaves a sandbox.
                Err(e) => {
                    Taken::Dying(live).ended().await;
                    return Err(e);
                }
            },
            Some(dying) => dying.ended().await,
            None => {}
        }
        // Taken back after a node restart: the old process's namespace is gone (swept at
        // start), so it gets a new one, same policy; the guest's side is the same in every
        // namespace.
        if config.net.is_some() && !sandbox.has_network() {
            let net = self.attach_network(&sandbox.network_policy()).await?;
            config.net = net.as_ref().map(|n| n.attachment());
            sandbox.set_network(net);
            sandbox.state().config.net = config.net.clone();
        }
        let deadline = self.config.boot_timeout;
        let (launched, own_memory) =
            vm::resume_in_place(self.backend.as_ref(), &config, own_memory, &sandbox.secret, deadline).await?;
        let live = Arc::new(Live::new(launched));
        {
            let mut st = sandbox.state();
            st.live = Some(live.clone());
            st.own_memory = own_memory;
        }
        vm::discard_saved(&sandbox.run_dir);
        self.watch(sandbox.clone(), live);
        self.record_resumed(sandbox, "its save restored")
    }

    /// Record a sandbox that runs again (an error leaves it running, as it is).
    fn record_resumed(&self, sandbox: &Sandbox, how: &str) -> Result<()> {
        sandbox.write_record(&self.seal, Durability::Cached)?;
        tracing::info!(id = %sandbox.id, how, "sandbox resumed");
        Ok(())
    }

    /// Continue a kept VMM where its pause stopped it, with a new agent session (whose
    /// handshake sets the clock); false when it would not start again. An error comes
    /// only before the sandbox counts as running again.
    async fn continue_kept(&self, sandbox: &Arc<Sandbox>, live: &Arc<Live>) -> Result<bool> {
        let vm = live.vm();
        if let Err(e) = vm.resume().await {
            tracing::warn!(id = %sandbox.id, "the kept VMM of a paused sandbox did not continue, restoring its save: {e}");
            return Ok(false);
        }
        let deadline = self.config.boot_timeout;
        let agent =
            vm::give_identity(vm, &sandbox.id, &sandbox.secret, &sandbox.secret, deadline, vm::RESTORED_HANDSHAKE)
                .await?;
        live.set_agent(agent);
        sandbox.state().live = Some(live.clone());
        vm::discard_saved(&sandbox.run_dir);
        // Its monitor from before the pause still waits on it; only the session is new.
        self.forward_api(&sandbox.id, &live.agent());
        Ok(true)
    }

    /// Put a just-started sandbox in the map, under watch, with its record written; or,
    /// when it did not start, remove its directory.
    pub(super) fn admit(self: &Arc<Self>, started: Result<Sandbox>, run_dir: &Path) -> Result<Arc<Sandbox>> {
        let sandbox = match started {
            Ok(s) => Arc::new(s),
            Err(e) => {
                let _ = std::fs::remove_dir_all(run_dir);
                return Err(e);
            }
        };
        if let Err(e) = sandbox.write_record(&self.seal, Durability::Cached) {
            let live = sandbox.state().live.clone();
            if let Some(live) = live {
                tokio::spawn(async move { live.vm().kill().await });
            }
            sandbox.cleanup();
            return Err(e);
        }
        self.sandboxes_mut().insert(sandbox.id.clone(), sandbox.clone());
        let live = sandbox.state().live.clone();
        if let Some(live) = live {
            self.watch(sandbox.clone(), live);
        }
        Ok(sandbox)
    }

    /// Clean up after a VMM that exits by itself (crash, guest power-off, OOM kill). A VM
    /// that a pause ended is no longer the sandbox's live one, and is left alone.
    pub(super) fn watch(self: &Arc<Self>, sandbox: Arc<Sandbox>, live: Arc<Live>) {
        // Every live VM (created, resumed, forked) gets its guest's API connections carried,
        // and goes on after a halt for a full disk.
        self.forward_api(&sandbox.id, &live.agent());
        self.tend_disk_halts(sandbox.clone(), live.clone());
        let node = Arc::downgrade(self);
        tokio::spawn(async move {
            let exit = live.vm().wait().await;
            let current = sandbox.state().live.as_ref().is_some_and(|l| Arc::ptr_eq(l, &live));
            let Some(node) = node.upgrade() else { return };
            if !current {
                return;
            }
            let why = EndReason::Crashed(exit);
            // Files first: once the sandbox is reported gone, nothing of it is left. (Killed
            // on purpose, it is no longer in the map and kill() cleans up as well.)
            sandbox.cleanup();
            node.release_volume(sandbox.volume.as_deref(), &sandbox.id);
            if node.remove(&sandbox.id, why.clone()).is_some() {
                node.release_layers(&sandbox);
                tracing::warn!(id = %sandbox.id, "{why}");
            }
        });
    }

    /// Replace a sandbox's outbound policy in place, running or paused (see
    /// [`crate::network::SandboxNet::set_policy`]: on error the old one stays); its record
    /// keeps the new one for a resume after a node restart, and its forks inherit it. In
    /// its own task, so a caller that goes away cannot leave the two apart.
    pub async fn set_network_policy(
        self: &Arc<Self>,
        id: &str,
        policy: lizard_api::network::NetworkPolicy,
    ) -> Result<()> {
        let parsed = policy.parse().map_err(NodeError::BadNetworkPolicy)?;
        let sandbox = self.get(id)?;
        let node = self.clone();
        tokio::spawn(async move {
            let _transition = sandbox.transition.lock().await;
            node.get(&sandbox.id)?;
            // Taken out while it changes (only transitions, serialized here, use it).
            let net = sandbox.take_network();
            let applied = match &net {
                Some(net) => net.set_policy(&parsed).await.map_err(NodeError::from),
                None => Ok(()),
            };
            sandbox.set_network(net);
            applied?;
            sandbox.set_network_policy(policy);
            sandbox.write_record(&node.seal, Durability::Synced)
        })
        .await
        .expect("network policy task panicked")
    }

    /// Stop a sandbox's VM (if it runs) and delete everything the node made for it (in
    /// its own task, so a caller that goes away cannot leave it half done).
    pub async fn kill(self: &Arc<Self>, id: &str) -> Result<()> {
        // What the guest wrote to its volume and did not sync yet reaches the disk first
        // (bounded: a hung guest must not keep its sandbox alive).
        self.get(id)?.sync_volume().await;
        let sandbox = self.remove(id, EndReason::Killed).ok_or_else(|| self.not_found(id))?;
        let node = self.clone();
        tokio::spawn(async move {
            let _transition = sandbox.transition.lock().await;
            let live = sandbox.state().live.clone();
            let result = match live {
                Some(live) => live.vm().kill().await.map(drop).map_err(NodeError::from),
                None => Ok(()),
            };
            if let Some(kept) = node.kept.take(&sandbox.id) {
                kept.ended().await;
            }
            sandbox.cleanup();
            node.release_layers(&sandbox);
            node.release_volume(sandbox.volume.as_deref(), &sandbox.id);
            result
        })
        .await
        .expect("kill task panicked")
    }

    /// Kill every running sandbox (node shutdown) and leave the data directory to the next
    /// node process; paused sandboxes stay on disk for it.
    pub async fn shutdown(self: &Arc<Self>) {
        self.pool.drain().await;
        let running: Vec<String> = self.sandboxes().values().filter(|s| !s.is_paused()).map(|s| s.id.clone()).collect();
        for id in running {
            let _ = self.kill(&id).await;
        }
        // Paused sandboxes are their saves: kept VMMs end with the node.
        futures_util::future::join_all(self.kept.take_all().into_iter().map(kept::Taken::ended)).await;
        if let Some(network) = &self.network {
            network.stop().await;
        }
        // The next node process may have the directory now.
        self.dir_lock.lock().expect("data directory lock poisoned").take();
    }
}
