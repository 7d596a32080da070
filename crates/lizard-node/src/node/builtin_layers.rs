//! The step layers of each built-in's last build, kept in the node's layer store: the next
//! build of that built-in (its recipe or files changed) takes its unchanged steps from the
//! cache, as a push does, instead of running every step again (the interpreter's data
//! stack alone is minutes under TCG).
//!
//! `<data>/builtin-layers/<name>.json` lists the layers and the identity of the disk they
//! stand on. A built-in's key names its recipe, not its bytes: a base made again (its image
//! pruned, then rebuilt from the same recipe) is a new file with other contents, so layers
//! kept over the old one are deleted, never stood on.

use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Which file a disk is: a file made again has another inode or modification time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskIdentity {
    dev: u64,
    ino: u64,
    mtime_ns: i64,
}

impl DiskIdentity {
    pub fn of(disk: &Path) -> std::io::Result<DiskIdentity> {
        let meta = std::fs::metadata(disk)?;
        let mtime_ns = meta.mtime().saturating_mul(1_000_000_000).saturating_add(meta.mtime_nsec());
        Ok(DiskIdentity { dev: meta.dev(), ino: meta.ino(), mtime_ns })
    }
}

/// One built-in's kept layers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptLayers {
    pub base: DiskIdentity,
    pub layers: Vec<String>,
}

/// The records of every built-in's kept layers.
pub struct BuiltinLayers {
    dir: PathBuf,
}

impl BuiltinLayers {
    pub fn new(data_dir: &Path) -> BuiltinLayers {
        BuiltinLayers { dir: data_dir.join("builtin-layers") }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.json"))
    }

    /// Built-in `name`'s record, if there is a readable one.
    pub fn get(&self, name: &str) -> Option<KeptLayers> {
        serde_json::from_slice(&std::fs::read(self.path(name)).ok()?).ok()
    }

    /// Replace built-in `name`'s record (written whole, then renamed into place).
    pub fn set(&self, name: &str, kept: &KeptLayers) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join(format!(".{name}.json.tmp"));
        std::fs::write(&tmp, serde_json::to_vec(kept).map_err(std::io::Error::other)?)?;
        std::fs::rename(tmp, self.path(name))
    }

    pub fn remove(&self, name: &str) {
        let _ = std::fs::remove_file(self.path(name));
    }

    /// Every layer a record keeps (not garbage for the layer store's collection).
    pub fn in_use(&self) -> HashSet<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return HashSet::new() };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".json").map(str::to_owned))
            .filter(|name| !name.starts_with('.'))
            .filter_map(|name| self.get(&name))
            .flat_map(|kept| kept.layers)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_keep_their_layers_and_a_disk_made_again_is_another_disk() {
        let dir = tempfile::tempdir().unwrap();
        let disk = dir.path().join("rootfs.raw");
        std::fs::write(&disk, b"one").unwrap();
        let first = DiskIdentity::of(&disk).unwrap();
        assert_eq!(DiskIdentity::of(&disk).unwrap(), first);
        let kept = BuiltinLayers::new(dir.path());
        assert!(kept.get("interpreter").is_none() && kept.in_use().is_empty());
        let record = KeptLayers { base: first, layers: vec!["k1".into(), "k2".into()] };
        kept.set("interpreter", &record).unwrap();
        kept.set("desktop", &KeptLayers { base: first, layers: vec!["k3".into()] }).unwrap();
        assert_eq!(kept.get("interpreter"), Some(record));
        assert_eq!(kept.in_use(), ["k1", "k2", "k3"].map(String::from).into());
        kept.remove("desktop");
        assert_eq!(kept.in_use(), ["k1", "k2"].map(String::from).into());
        // The same recipe's base made again: a new file.
        std::fs::remove_file(&disk).unwrap();
        std::fs::write(dir.path().join("other"), b"x").unwrap();
        std::fs::write(&disk, b"two").unwrap();
        assert_ne!(DiskIdentity::of(&disk).unwrap(), first);
    }
}
