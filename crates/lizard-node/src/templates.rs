//! Node templates: what a sandbox is created from, built-in or built by this node.
//!
//! Both kinds resolve to one [`NodeTemplate`]: a root disk (a built-in's raw ext4 image,
//! or the top of a built template's qcow2 layer chain), a hash that template snapshots
//! are keyed by, the environment, directory and user its processes start with, and the
//! start command that runs in every sandbox of it.
//!
//! Built templates are recorded in `<data>/templates/<ref>/template.json` (written to a
//! temporary file and renamed, so a record that exists is complete); the [`Registry`]
//! reads them back when the node starts, so they survive a restart.

use lizard_image::TemplateImage;
pub use lizard_recipe::StartSpec;
use lizard_recipe::TemplateConfig;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Bumped when `template.json` changes incompatibly (older records are then ignored).
pub const RECORD_FORMAT: u32 = 1;

const RECORD: &str = "template.json";

/// Which image format a root disk is in (what its overlays name as backing format).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskFormat {
    Raw,
    Qcow2,
}

impl DiskFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            DiskFormat::Raw => "raw",
            DiskFormat::Qcow2 => "qcow2",
        }
    }
}

/// A template as the node creates sandboxes from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTemplate {
    /// Built-in name or built template's ref.
    pub name: String,
    /// The root disk every sandbox's overlay is backed by.
    pub disk: PathBuf,
    pub disk_format: DiskFormat,
    /// Changes whenever anything a sandbox of it sees changes (disk, config, start
    /// command): template snapshots are keyed by it.
    pub hash: String,
    pub config: TemplateConfig,
    pub start: Option<StartSpec>,
    pub description: String,
    pub builtin: bool,
}

impl NodeTemplate {
    /// A built-in template, from its finished image.
    pub fn builtin(image: TemplateImage) -> NodeTemplate {
        NodeTemplate {
            name: image.name,
            disk: image.rootfs,
            disk_format: if image.layered { DiskFormat::Qcow2 } else { DiskFormat::Raw },
            hash: image.hash,
            config: image.config,
            start: image.start,
            description: image.description,
            builtin: true,
        }
    }

    /// The key of the disk state the first step of a build over this template starts
    /// from: its disk and its config, since steps inherit env, directory and user.
    pub fn layer_base_key(&self) -> String {
        hash_parts(&["layer-base/1", &self.hash, &serde_json::to_string(&self.config).expect("configs serialize")])
    }
}

/// `template.json`: a template this node built.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateRecord {
    pub format: u32,
    pub template_ref: String,
    pub display_name: String,
    pub base_ref: String,
    /// The bottom of the chain: the built-in image the first layer is backed by.
    pub root_disk: PathBuf,
    pub root_format: DiskFormat,
    /// Layer keys of the whole chain, bottom first (the base's layers included), each a
    /// file in the layer store.
    pub layers: Vec<String>,
    /// How many of `layers` (the top ones) this template's own build added.
    pub own_layers: usize,
    pub hash: String,
    pub config: TemplateConfig,
    pub start: Option<StartSpec>,
    pub description: String,
    /// Bytes of this template's own layers.
    pub layer_bytes: u64,
    pub created_at_ms: u64,
}

impl TemplateRecord {
    /// The template a sandbox is created from; `layer_path` names a layer's file.
    pub fn template(&self, layer_path: impl Fn(&str) -> PathBuf) -> NodeTemplate {
        let (disk, disk_format) = match self.layers.last() {
            Some(top) => (layer_path(top), DiskFormat::Qcow2),
            None => (self.root_disk.clone(), self.root_format),
        };
        NodeTemplate {
            name: self.template_ref.clone(),
            disk,
            disk_format,
            hash: self.hash.clone(),
            config: self.config.clone(),
            start: self.start.clone(),
            description: self.description.clone(),
            builtin: false,
        }
    }
}

/// The hash of a built template: its top layer (or its base's disk), config and start
/// command.
pub fn built_hash(top: &str, config: &TemplateConfig, start: Option<&StartSpec>) -> String {
    hash_parts(&[
        "built/1",
        top,
        &serde_json::to_string(config).expect("configs serialize"),
        &serde_json::to_string(&start).expect("start commands serialize"),
    ])
}

fn hash_parts(parts: &[&str]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in parts {
        h.update(part.as_bytes());
        h.update([0]);
    }
    hex::encode(h.finalize())
}

/// Whether `name` may be a built template's ref: `[a-z0-9-]{1,64}`.
pub fn is_valid_ref(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// Why the registry could not record a template.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("write {path}: {cause}")]
    Write { path: PathBuf, cause: std::io::Error },
    #[error("remove {path}: {cause}")]
    Remove { path: PathBuf, cause: std::io::Error },
}

/// The node's built templates, in memory and under `<data>/templates/`.
pub struct Registry {
    dir: PathBuf,
    records: Mutex<BTreeMap<String, TemplateRecord>>,
}

impl Registry {
    /// Read every complete record under `dir`; a directory without one (a build that
    /// ended half way) is removed.
    pub fn open(dir: &Path) -> Registry {
        let mut records = BTreeMap::new();
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                let path = entry.path();
                let record = std::fs::read(path.join(RECORD))
                    .ok()
                    .and_then(|b| serde_json::from_slice::<TemplateRecord>(&b).ok())
                    .filter(|r| r.format == RECORD_FORMAT && entry.file_name().to_str() == Some(&r.template_ref));
                match record {
                    Some(r) => {
                        records.insert(r.template_ref.clone(), r);
                    }
                    None => {
                        tracing::warn!("removing incomplete template record {}", path.display());
                        let _ = std::fs::remove_dir_all(&path);
                    }
                }
            }
        }
        Registry { dir: dir.to_path_buf(), records: Mutex::new(records) }
    }

    fn records(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, TemplateRecord>> {
        self.records.lock().expect("template registry poisoned")
    }

    pub fn get(&self, template_ref: &str) -> Option<TemplateRecord> {
        self.records().get(template_ref).cloned()
    }

    pub fn contains(&self, template_ref: &str) -> bool {
        self.records().contains_key(template_ref)
    }

    pub fn refs(&self) -> Vec<String> {
        self.records().keys().cloned().collect()
    }

    /// Every layer key some registered template's chain holds.
    pub fn layers_in_use(&self) -> HashSet<String> {
        self.records().values().flat_map(|r| r.layers.iter().cloned()).collect()
    }

    /// Record `record` on disk (temporary file, fsync, rename), then in memory.
    pub fn insert(&self, record: TemplateRecord) -> Result<(), RegistryError> {
        let dir = self.dir.join(&record.template_ref);
        let tmp = dir.join(format!("{RECORD}.tmp"));
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&dir)?;
            let mut f = std::fs::File::create(&tmp)?;
            std::io::Write::write_all(&mut f, &serde_json::to_vec_pretty(&record).expect("records serialize"))?;
            f.sync_all()?;
            std::fs::rename(&tmp, dir.join(RECORD))
        };
        write().map_err(|cause| RegistryError::Write { path: dir.join(RECORD), cause })?;
        self.records().insert(record.template_ref.clone(), record);
        Ok(())
    }

    /// Forget `template_ref` (its record first, then its directory).
    pub fn remove(&self, template_ref: &str) -> Result<Option<TemplateRecord>, RegistryError> {
        let dir = self.dir.join(template_ref);
        match std::fs::remove_file(dir.join(RECORD)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(cause) => return Err(RegistryError::Remove { path: dir.join(RECORD), cause }),
        }
        let _ = std::fs::remove_dir_all(&dir);
        Ok(self.records().remove(template_ref))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str, layers: &[&str]) -> TemplateRecord {
        TemplateRecord {
            format: RECORD_FORMAT,
            template_ref: name.into(),
            display_name: "shown".into(),
            base_ref: "base".into(),
            root_disk: "/images/base.ext4".into(),
            root_format: DiskFormat::Raw,
            layers: layers.iter().map(|s| (*s).to_owned()).collect(),
            own_layers: layers.len(),
            hash: built_hash(layers.last().copied().unwrap_or("b"), &TemplateConfig::default(), None),
            config: TemplateConfig::default(),
            start: None,
            description: String::new(),
            layer_bytes: 0,
            created_at_ms: 0,
        }
    }

    #[test]
    fn records_survive_a_reopen_and_half_made_ones_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::open(dir.path());
        reg.insert(record("tb-1", &["k1", "k2"])).unwrap();
        reg.insert(record("tb-2", &["k1", "k3"])).unwrap();
        std::fs::create_dir_all(dir.path().join("tb-half")).unwrap();
        std::fs::write(dir.path().join("tb-half").join(format!("{RECORD}.tmp")), "{").unwrap();
        let again = Registry::open(dir.path());
        assert_eq!(again.refs(), ["tb-1", "tb-2"]);
        assert!(!dir.path().join("tb-half").exists());
        assert_eq!(again.get("tb-1"), Some(record("tb-1", &["k1", "k2"])));
        let keys = again.layers_in_use();
        assert!(["k1", "k2", "k3"].iter().all(|k| keys.contains(*k)));
        again.remove("tb-1").unwrap();
        assert!(!again.layers_in_use().contains("k2"));
        assert_eq!(Registry::open(dir.path()).refs(), ["tb-2"]);
    }

    #[test]
    fn the_disk_is_the_top_layer_or_the_base_image() {
        let t = record("tb-1", &["k1", "k2"]).template(|k| PathBuf::from(format!("/layers/{k}.qcow2")));
        assert_eq!((t.disk, t.disk_format), (PathBuf::from("/layers/k2.qcow2"), DiskFormat::Qcow2));
        let t = record("tb-0", &[]).template(|k| PathBuf::from(k));
        assert_eq!((t.disk, t.disk_format), (PathBuf::from("/images/base.ext4"), DiskFormat::Raw));
    }

    #[test]
    fn the_hash_covers_config_and_start() {
        let config = TemplateConfig { workdir: Some("/srv".into()), ..Default::default() };
        let start = StartSpec {
            command: lizard_recipe::Command {
                argv: vec!["serve".into()],
                env: BTreeMap::new(),
                cwd: "/".into(),
                user: "root".into(),
            },
            ready: lizard_recipe::Ready::Port(80),
            ready_timeout_s: 10,
        };
        let plain = built_hash("k", &TemplateConfig::default(), None);
        assert_ne!(plain, built_hash("k", &config, None));
        assert_ne!(plain, built_hash("k", &TemplateConfig::default(), Some(&start)));
        assert_ne!(plain, built_hash("k2", &TemplateConfig::default(), None));
    }

    #[test]
    fn refs() {
        assert!(is_valid_ref("tb-0123abc"));
        assert!(!is_valid_ref(""));
        assert!(!is_valid_ref("Tb"));
        assert!(!is_valid_ref("../x"));
        assert!(!is_valid_ref(&"a".repeat(65)));
    }
}
