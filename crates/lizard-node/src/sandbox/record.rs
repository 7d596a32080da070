//! `sandbox.json`: what a sandbox's directory says about it, enough to take a paused one
//! back after the node restarts.

use super::{Identity, Sandbox, State};
use crate::sealed::SealKey;
use crate::vm::saved_form;
use crate::{NodeError, Result};
use lizard_agent_proto::handshake::Secret;
use lizard_vmm::VmConfig;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

const RECORD: &str = "sandbox.json";

/// Whether writing a record waits until it is on the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// fsync'd: a paused sandbox is its files, which must survive a host crash. Costs
    /// ≈ 9 ms on our disks.
    Synced,
    /// In the page cache: enough for a running sandbox, whose record only a later node
    /// process of the same host reads (its VM does not outlive a host crash anyway).
    Cached,
}

/// What a record says a sandbox was when it was last written.
pub(crate) enum Recorded {
    Paused(Sandbox),
    Running(Sandbox),
}

/// A record read back, and whether it held its environment in plain text (written
/// before sealing: it should be written again).
pub(crate) struct ReadBack {
    pub recorded: Recorded,
    pub plain_env: bool,
}

/// The contents of `sandbox.json`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    id: String,
    template: String,
    vcpus: u32,
    memory_mib: u32,
    started_at_ms: u64,
    metadata: BTreeMap<String, String>,
    /// The environment as JSON, sealed with the node's key ([`crate::sealed`]): it holds
    /// API keys and the user's secrets.
    #[serde(default)]
    env_sealed: Option<String>,
    /// The environment in plain text, as records written before sealing have it: read,
    /// never written (the next write seals it).
    #[serde(default, skip_serializing)]
    env: Option<BTreeMap<String, String>>,
    #[serde(default)]
    workdir: Option<String>,
    #[serde(default)]
    user: Option<String>,
    from_snapshot: bool,
    config: VmConfig,
    own_memory: bool,
    layers: Vec<PathBuf>,
    paused: bool,
    #[serde(default)]
    network_policy: lizard_api::network::NetworkPolicy,
    /// The volume it holds (mounted at /workspace), if any.
    #[serde(default)]
    volume: Option<String>,
}

impl Sandbox {
    /// Write `sandbox.json`, replacing it atomically.
    pub(crate) fn write_record(&self, seal: &SealKey, durability: Durability) -> Result<()> {
        let record = {
            let st = self.state();
            let since_epoch = self.started_at.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
            Record {
                id: self.id.clone(),
                template: self.template.clone(),
                vcpus: self.vcpus,
                memory_mib: self.memory_mib,
                // Milliseconds since 1970 fit a u64 for the next 500 million years.
                started_at_ms: u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX),
                metadata: self.metadata.clone(),
                env_sealed: Some(seal.seal(&serde_json::to_vec(&self.env).expect("maps of strings serialize"))),
                env: None,
                workdir: self.workdir.clone(),
                user: self.user.clone(),
                from_snapshot: self.from_snapshot(),
                config: st.config.clone(),
                own_memory: st.own_memory,
                layers: st.layers.clone(),
                paused: st.live.is_none(),
                network_policy: self.network_policy(),
                volume: self.volume.clone(),
            }
        };
        let tmp = self.run_dir.join(format!("{RECORD}.tmp"));
        let json = serde_json::to_vec_pretty(&record).expect("records serialize");
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(&json)?;
            if durability == Durability::Synced {
                file.sync_all()?;
            }
            std::fs::rename(&tmp, self.run_dir.join(RECORD))?;
            if durability == Durability::Synced {
                std::fs::File::open(&self.run_dir)?.sync_all()?;
            }
            Ok(())
        };
        write().map_err(|e| NodeError::io(format!("write {}/{RECORD}", self.run_dir.display()), e))
    }

    /// The sandbox a directory's record describes, with no VM (a paused one needs a
    /// complete save beside it; a running one's VMM is for the caller to take back), if
    /// the record is whole and its environment opens with `seal`.
    pub(crate) fn from_record(dir: &Path, seal: &SealKey) -> Option<ReadBack> {
        let record: Record = serde_json::from_slice(&std::fs::read(dir.join(RECORD)).ok()?).ok()?;
        if record.config.run_dir != dir || !record.config.root_disk.exists() {
            return None;
        }
        let paused = record.paused;
        if paused && saved_form(dir, record.own_memory).is_none() {
            return None;
        }
        let secret_file = record.config.secret_file.as_ref()?;
        let secret = Secret::from_hex(std::fs::read_to_string(secret_file).ok()?.trim()).ok()?;
        let plain_env = record.env_sealed.is_none();
        let env = match (&record.env_sealed, record.env) {
            (Some(sealed), _) => match seal.open(sealed).map(|json| serde_json::from_slice(&json)) {
                Ok(Ok(env)) => env,
                Ok(Err(_)) | Err(_) => {
                    tracing::warn!(id = %record.id, "the sealed environment in {} does not open", dir.display());
                    return None;
                }
            },
            (None, env) => env.unwrap_or_default(),
        };
        let who = Identity {
            id: record.id,
            template: record.template,
            vcpus: record.vcpus,
            memory_mib: record.memory_mib,
            started_at: SystemTime::UNIX_EPOCH + Duration::from_millis(record.started_at_ms),
            metadata: record.metadata,
            env,
            workdir: record.workdir,
            user: record.user,
            from_snapshot: record.from_snapshot,
            network_policy: record.network_policy,
            volume: record.volume,
        };
        let state = State { live: None, config: record.config, own_memory: record.own_memory, layers: record.layers };
        let sandbox = Sandbox::new(who, secret, state);
        let recorded = if paused { Recorded::Paused(sandbox) } else { Recorded::Running(sandbox) };
        Some(ReadBack { recorded, plain_env })
    }
}
