//! Template layers: `<data>/template-layers/<key>.qcow2`, each the disk after one build
//! step, backed by the layer of the step before (the bottom one by the base's disk).
//!
//! A layer appears under its final name only once it is complete: the builder freezes
//! the build VM's overlay, syncs it, and only then links it in. One lock per key keeps two
//! builds of one key apart (the second finds the first's layer), and keeps garbage
//! collection away from the layers a running build stands on.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

/// Prefix of files being made; any at node start is a leftover.
const TMP_PREFIX: &str = ".tmp-";
const EXT: &str = ".qcow2";

/// A held lock on one layer key: shared while a build stands on the layer, exclusive
/// while one makes it.
pub enum LayerLock {
    Read(#[allow(dead_code)] OwnedRwLockReadGuard<()>),
    Write(#[allow(dead_code)] OwnedRwLockWriteGuard<()>),
}

/// The layer files and their locks.
pub struct LayerStore {
    dir: PathBuf,
    locks: Mutex<HashMap<String, Arc<RwLock<()>>>>,
}

impl LayerStore {
    pub fn new(dir: PathBuf) -> LayerStore {
        LayerStore { dir, locks: Mutex::new(HashMap::new()) }
    }

    #[cfg(test)]
    fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of layer `key`.
    pub fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}{EXT}"))
    }

    /// A name to make a layer's file under before it is complete.
    pub fn temp_path(&self, key: &str, nonce: &str) -> PathBuf {
        self.dir.join(format!("{TMP_PREFIX}{nonce}-{key}{EXT}"))
    }

    pub fn exists(&self, key: &str) -> bool {
        self.path(key).is_file()
    }

    fn lock_of(&self, key: &str) -> Arc<RwLock<()>> {
        self.locks.lock().expect("layer locks poisoned").entry(key.to_owned()).or_default().clone()
    }

    /// Stand on layer `key` (it is not collected or replaced while held).
    pub async fn read(&self, key: &str) -> LayerLock {
        LayerLock::Read(self.lock_of(key).read_owned().await)
    }

    /// Make layer `key` (nobody else makes or reads it while held).
    pub async fn write(&self, key: &str) -> LayerLock {
        LayerLock::Write(self.lock_of(key).write_owned().await)
    }

    /// Publish the complete file `made` as layer `key`: made read-only, synced, then
    /// linked under a temporary name and renamed, so a reader never finds it half made.
    pub fn publish(&self, key: &str, made: &Path, nonce: &str) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(&self.dir)?;
        let f = std::fs::File::open(made)?;
        f.sync_all()?;
        let mut perm = f.metadata()?.permissions();
        perm.set_readonly(true);
        std::fs::set_permissions(made, perm)?;
        let tmp = self.temp_path(key, nonce);
        let _ = std::fs::remove_file(&tmp);
        std::fs::hard_link(made, &tmp)?;
        let path = self.path(key);
        if let Err(e) = std::fs::rename(&tmp, &path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(path)
    }

    /// Bytes a layer takes on disk (allocated, not its virtual size).
    pub fn bytes(&self, key: &str) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(self.path(key)).map(|m| m.blocks() * 512).unwrap_or(0)
    }

    /// Delete layer `key` (a build's own, when the build fails).
    pub fn remove(&self, key: &str) {
        let _ = std::fs::remove_file(self.path(key));
    }

    /// Delete every layer file not in `in_use` and not held by a build, and every
    /// leftover temporary file (only when no build is running: `sweep_temps`). Returns
    /// the keys removed.
    pub fn collect(&self, in_use: &HashSet<String>, sweep_temps: bool) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return vec![] };
        let mut removed = vec![];
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(TMP_PREFIX) {
                if sweep_temps {
                    let _ = std::fs::remove_file(entry.path());
                }
                continue;
            }
            let Some(key) = name.strip_suffix(EXT) else { continue };
            if in_use.contains(key) {
                continue;
            }
            // A build holds it (making it or standing on it): not garbage yet.
            let lock = self.lock_of(key);
            let Ok(_held) = lock.try_write() else { continue };
            if std::fs::remove_file(entry.path()).is_ok() {
                removed.push(key.to_owned());
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn published_layers_are_whole_and_unused_ones_are_collected() {
        let dir = tempfile::tempdir().unwrap();
        let store = LayerStore::new(dir.path().join("layers"));
        let made = dir.path().join("overlay.qcow2");
        std::fs::write(&made, b"layer bytes").unwrap();
        let path = store.publish("k1", &made, "n1").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"layer bytes");
        assert!(store.exists("k1"));
        std::fs::write(dir.path().join("o2"), b"2").unwrap();
        store.publish("k2", &dir.path().join("o2"), "n2").unwrap();
        std::fs::write(store.temp_path("k3", "n3"), b"half").unwrap();

        // A held layer stays; a temp stays while builds may run.
        let held = store.read("k2").await;
        assert_eq!(store.collect(&HashSet::new(), false), ["k1"]);
        assert!(store.exists("k2") && store.temp_path("k3", "n3").exists());
        drop(held);
        assert_eq!(store.collect(&HashSet::from(["k2".to_owned()]), true), Vec::<String>::new());
        assert!(store.exists("k2") && !store.temp_path("k3", "n3").exists());
        assert_eq!(store.collect(&HashSet::new(), true), ["k2"]);
        assert_eq!(std::fs::read_dir(store.dir()).unwrap().count(), 0);
    }
}
