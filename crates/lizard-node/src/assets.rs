//! Boot assets for a sandbox: kernel, initramfs (with this node's agent) and template disk.
//!
//! Building them can take minutes the first time (apt download, mmdebstrap, a built-in's
//! build VM); afterwards [`lizard_image::ImageStore`] answers from its cache, and this
//! module memoizes its answers for the node's lifetime so the create path costs no
//! hashing or apt lookups.

use lizard_image::{ImageError, ImageStore, Initramfs, Kernel, TemplateImage};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::Mutex;

/// Kernel and initramfs: the parts every sandbox of this node shares.
#[derive(Debug, Clone)]
pub struct BootFiles {
    pub kernel: Kernel,
    pub initramfs: Initramfs,
}

/// Memoizing front of the image store.
pub struct Assets {
    images: Arc<ImageStore>,
    agent_bin: PathBuf,
    /// The static `lizard` CLI for guests, carried in the initramfs.
    guest_cli: Option<PathBuf>,
    boot: Mutex<Option<(AgentStamp, BootFiles)>>,
    templates: Mutex<HashMap<String, TemplateImage>>,
}

/// Identifies one build of the agent binary (and of the guest CLI) cheaply (no hashing on
/// the hot path).
#[derive(Debug, Clone, PartialEq, Eq)]
struct AgentStamp(u64, std::time::SystemTime, Option<(u64, std::time::SystemTime)>);

impl Assets {
    pub fn new(images: ImageStore, agent_bin: PathBuf, guest_cli: Option<PathBuf>) -> Self {
        Assets {
            images: Arc::new(images),
            agent_bin,
            guest_cli,
            boot: Mutex::new(None),
            templates: Mutex::new(HashMap::new()),
        }
    }

    fn stamp(&self) -> Result<AgentStamp, ImageError> {
        let m = std::fs::metadata(&self.agent_bin).map_err(|source| ImageError::Io {
            action: "read the agent binary (build it with scripts/build-agent.sh)",
            path: self.agent_bin.clone(),
            cause: source,
        })?;
        let cli = match &self.guest_cli {
            Some(p) => {
                let c = std::fs::metadata(p).map_err(|source| ImageError::Io {
                    action: "read the guest CLI (build it with scripts/build-agent.sh)",
                    path: p.clone(),
                    cause: source,
                })?;
                Some((c.len(), c.modified().unwrap_or(std::time::UNIX_EPOCH)))
            }
            None => None,
        };
        Ok(AgentStamp(m.len(), m.modified().unwrap_or(std::time::UNIX_EPOCH), cli))
    }

    /// Kernel and initramfs, rebuilt when the agent binary changes.
    pub async fn boot_files(&self) -> Result<BootFiles, ImageError> {
        let mut guard = self.boot.lock().await;
        let stamp = self.stamp()?;
        if let Some((s, files)) = guard.as_ref() {
            if *s == stamp {
                return Ok(files.clone());
            }
        }
        let images = self.images.clone();
        let agent = self.agent_bin.clone();
        let cli = self.guest_cli.clone();
        let files = tokio::task::spawn_blocking(move || -> Result<BootFiles, ImageError> {
            let kernel = images.kernel()?;
            let initramfs = images.initramfs_with_cli(&kernel, &agent, cli.as_deref())?;
            Ok(BootFiles { kernel, initramfs })
        })
        .await
        .expect("image build task panicked")?;
        *guard = Some((stamp, files.clone()));
        Ok(files)
    }

    /// Whether [`Assets::boot_files`] has an answer memoized (false while one is being
    /// made).
    pub fn has_boot_files(&self) -> bool {
        self.boot.try_lock().is_ok_and(|boot| boot.is_some())
    }

    /// The image store (for building what is not cached).
    pub fn images(&self) -> Arc<ImageStore> {
        self.images.clone()
    }

    /// Built-in `name`'s finished image if the image store has it for its current recipe.
    /// Unknown names are [`ImageError::UnknownTemplate`].
    pub async fn cached_builtin(&self, name: &str) -> Result<Option<TemplateImage>, ImageError> {
        if let Some(t) = self.templates.lock().await.get(name) {
            return Ok(Some(t.clone()));
        }
        let images = self.images.clone();
        let n = name.to_string();
        let found = tokio::task::spawn_blocking(move || images.cached_builtin(&n))
            .await
            .expect("image lookup task panicked")?;
        if let Some(t) = &found {
            self.remember_builtin(t.clone()).await;
        }
        Ok(found)
    }

    /// Keep a built-in's image for the node's lifetime.
    pub async fn remember_builtin(&self, image: TemplateImage) {
        self.templates.lock().await.insert(image.name.clone(), image);
    }
}
