//! `node.json` in the node's data directory: who this node is in its cluster, kept from
//! its join so that a restart heartbeats instead of joining again. It holds the node's
//! credential, so it is written owner-only, atomically.

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The file's name in the data directory.
pub const FILE: &str = "node.json";
/// How often to heartbeat when the file predates the server telling us.
pub const DEFAULT_HEARTBEAT_MS: u64 = 5_000;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("read {path}: {cause}")]
    Read { path: PathBuf, cause: std::io::Error },
    #[error("{path} is not a node state file: {cause}")]
    Parse { path: PathBuf, cause: serde_json::Error },
    #[error("{path} is readable by others (mode {mode:o}): it holds the node's credential; chmod 600 it")]
    Exposed { path: PathBuf, mode: u32 },
    #[error("write {path}: {cause}")]
    Write { path: PathBuf, cause: std::io::Error },
    #[error(
        "{path} belongs to the cluster at {joined}, not {asked}: use another data directory, or delete it to join anew"
    )]
    OtherServer { path: PathBuf, joined: String, asked: String },
    #[error(
        "{path}: this node joined as {joined}, and the servers reach it there only; it would now serve at {now}: \
         use --listen/--advertise as at its join, or delete {path} to join anew"
    )]
    OtherAddress { path: PathBuf, joined: String, now: String },
}

/// What a join gave this node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NodeState {
    pub node_id: String,
    pub credential: String,
    /// The server URL it joined through.
    pub server: String,
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// The node API's address it joined with: the one the servers have (absent in files
    /// written before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

fn default_heartbeat_ms() -> u64 {
    DEFAULT_HEARTBEAT_MS
}

impl NodeState {
    pub fn path(data_dir: &Path) -> PathBuf {
        data_dir.join(FILE)
    }

    /// The state kept in `data_dir`, if the node joined before; refused when others may
    /// read it or when it names another server.
    pub fn load(data_dir: &Path, server: &str) -> Result<Option<NodeState>, StateError> {
        let path = NodeState::path(data_dir);
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(cause) => return Err(StateError::Read { path, cause }),
        };
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(StateError::Exposed { path, mode });
        }
        let bytes = std::fs::read(&path).map_err(|cause| StateError::Read { path: path.clone(), cause })?;
        let state: NodeState =
            serde_json::from_slice(&bytes).map_err(|cause| StateError::Parse { path: path.clone(), cause })?;
        if same_server(&state.server, server) {
            Ok(Some(state))
        } else {
            Err(StateError::OtherServer { path, joined: state.server, asked: server.to_owned() })
        }
    }

    /// Refused when this node would serve at another address than it joined with: the
    /// servers would hold it `up` (it heartbeats) and reach nothing.
    pub fn check_address(&self, data_dir: &Path, now: &str) -> Result<(), StateError> {
        match &self.address {
            Some(joined) if joined.trim_end_matches('/') != now.trim_end_matches('/') => {
                Err(StateError::OtherAddress {
                    path: NodeState::path(data_dir),
                    joined: joined.clone(),
                    now: now.to_owned(),
                })
            }
            _ => Ok(()),
        }
    }

    /// Write the state (0600), replacing any earlier one in one step.
    pub fn save(&self, data_dir: &Path) -> Result<(), StateError> {
        let path = NodeState::path(data_dir);
        let tmp = data_dir.join(format!(".{FILE}.tmp"));
        let write = || -> std::io::Result<()> {
            let _ = std::fs::remove_file(&tmp);
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
            f.write_all(&serde_json::to_vec_pretty(self).expect("the state serializes"))?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|cause| StateError::Write { path, cause })
    }
}

/// URLs that differ only in a trailing `/` name the same server.
fn same_server(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> NodeState {
        NodeState {
            node_id: "node_1".into(),
            credential: "c0ffee".into(),
            server: "http://api:7171".into(),
            heartbeat_ms: 2000,
            address: Some("http://10.0.0.5:7180".into()),
        }
    }

    #[test]
    fn kept_owner_only_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(NodeState::load(dir.path(), "http://api:7171").unwrap(), None);
        state().save(dir.path()).unwrap();
        let mode = std::fs::metadata(NodeState::path(dir.path())).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(NodeState::load(dir.path(), "http://api:7171/").unwrap(), Some(state()));
        // Saving again replaces it.
        NodeState { heartbeat_ms: 1000, ..state() }.save(dir.path()).unwrap();
        assert_eq!(NodeState::load(dir.path(), "http://api:7171").unwrap().unwrap().heartbeat_ms, 1000);
    }

    #[test]
    fn refused_when_exposed_broken_or_of_another_cluster() {
        let dir = tempfile::tempdir().unwrap();
        state().save(dir.path()).unwrap();
        let e = NodeState::load(dir.path(), "http://other:7171").unwrap_err();
        assert!(matches!(e, StateError::OtherServer { .. }), "{e}");
        let path = NodeState::path(dir.path());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(NodeState::load(dir.path(), "http://api:7171"), Err(StateError::Exposed { .. })));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "{").unwrap();
        assert!(matches!(NodeState::load(dir.path(), "http://api:7171"), Err(StateError::Parse { .. })));
        // An old file without the interval gets the default.
        std::fs::write(&path, r#"{"nodeId":"n","credential":"c","server":"http://api:7171"}"#).unwrap();
        assert_eq!(NodeState::load(dir.path(), "http://api:7171").unwrap().unwrap().heartbeat_ms, DEFAULT_HEARTBEAT_MS);
    }

    #[test]
    fn another_address_than_at_the_join_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(state().check_address(dir.path(), "http://10.0.0.5:7180/").is_ok());
        let e = state().check_address(dir.path(), "http://10.0.0.5:7181").unwrap_err();
        assert!(matches!(e, StateError::OtherAddress { .. }), "{e}");
        // A file from before the address was kept cannot tell: accepted.
        assert!(NodeState { address: None, ..state() }.check_address(dir.path(), "http://x:1").is_ok());
    }
}
