//! Builds and caches the artefacts a Lizard guest boots from:
//!
//! - the **kernel** ([`ImageStore::kernel`]): Debian's cloud kernel as an uncompressed ELF
//!   `vmlinux` (what QEMU `microvm` and Firecracker boot through PVH) plus the virtio and
//!   vsock modules the guest must load, with their dependency order;
//! - the **initramfs** ([`ImageStore::initramfs`]): the agent as `/init`, those modules and
//!   their load order, as an uncompressed `newc` cpio;
//! - **built-in templates**: their recipes (the repository's `templates/<name>/`), the
//!   Debian root at their bottom ([`ImageStore::debian_base`], mmdebstrap on the host) and
//!   the finished, flattened images ([`ImageStore::cached_builtin`]; the node runs the
//!   recipes' steps in build VMs and publishes the result with
//!   [`ImageStore::publish_builtin`]).
//!
//! Everything lives under `<data_dir>/images/`:
//!
//! ```text
//! images/kernel/<package_version>/{vmlinux, modules/<name>.ko, kernel.json}
//! images/initramfs/<hash>.cpio
//! images/debian/<hash>/{rootfs.ext4, debian.json}
//! images/templates/<name>/<key>/{rootfs.ext4, template.json}
//! images/.lock-kernel, .lock-initramfs, .lock-debian, .lock-template-<name>
//! ```
//!
//! Artefacts are built in a `.tmp-*` path next to their final place, synced, and renamed,
//! so a half-written artefact is never visible; a builder holds an exclusive `flock` on
//! `.lock-<kind>` and re-checks the cache after taking it, so concurrent processes build
//! each artefact once. A cache hit costs a few file reads and a hash of the inputs.
//!
//! One store serves a whole machine (the installed server, `lizard images`, the test suites
//! and the bench). A process holds every template directory it uses (a shared `flock` on
//! the directory, [`ImageStore::cached_builtin`] and [`ImageStore::publish_builtin`] take
//! it), and [`ImageStore::prune`] removes none that another process holds.
//!
//! All functions block (they run tools and hash files); call them from `spawn_blocking`.

#![forbid(unsafe_code)]

mod bzimage;
mod cpio;
mod error;
mod initramfs;
mod kernel;
mod modules;
mod template;
mod util;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub use bzimage::{decode_lz4_legacy, extract_vmlinux};
pub use cpio::{read_newc, CpioEntry, CpioWriter};
pub use error::ImageError;
pub use initramfs::{Initramfs, MODULES_DIR, MODULES_ORDER_PATH};
pub use kernel::{Kernel, KernelModule, KERNEL_METAPACKAGE};
pub use modules::WANTED_MODULES;
pub use template::{BuiltinContext, BuiltinLock, BuiltinOutcome, DebianImage, TemplateImage, HOST_CA_BUNDLE};

/// How long a resolved kernel package version is trusted before apt is asked again.
/// apt's answer only changes after an `apt-get update`, and asking costs ~0.5 s on hosts
/// whose apt has its binary cache disabled (Debian's Docker images).
pub const DEFAULT_APT_REFRESH: Duration = Duration::from_secs(600);

/// The artefact cache of one data directory.
#[derive(Debug)]
pub struct ImageStore {
    data_dir: PathBuf,
    /// CA bundle installed into templates; `None` keeps Debian's.
    ca_bundle: Option<PathBuf>,
    apt_refresh: Duration,
    kernel_memo: Mutex<Option<(Instant, kernel::KernelPackage)>>,
    /// Template directories this process uses, held against [`ImageStore::prune`] by
    /// another process (one store serves every process of a machine).
    in_use: Mutex<BTreeMap<PathBuf, util::InUse>>,
}

impl ImageStore {
    /// A store whose artefacts live under `<data_dir>/images/`. Nothing is touched until an
    /// artefact is asked for.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        ImageStore {
            data_dir: data_dir.into(),
            ca_bundle: Some(PathBuf::from(HOST_CA_BUNDLE)),
            apt_refresh: DEFAULT_APT_REFRESH,
            kernel_memo: Mutex::new(None),
            in_use: Mutex::new(BTreeMap::new()),
        }
    }

    /// The CA bundle installed over the guest's `/etc/ssl/certs/ca-certificates.crt`
    /// (default: the host's, [`HOST_CA_BUNDLE`]). Hosts behind a TLS-inspecting proxy
    /// need it for HTTPS from sandboxes; `None` keeps Debian's stock bundle. Its bytes are
    /// part of the template hash.
    pub fn with_ca_bundle(mut self, bundle: Option<PathBuf>) -> Self {
        self.ca_bundle = bundle;
        self
    }

    /// How long [`ImageStore::kernel`] reuses its last apt answer (default
    /// [`DEFAULT_APT_REFRESH`]; `Duration::ZERO` asks apt on every call).
    pub fn with_apt_refresh(mut self, refresh: Duration) -> Self {
        self.apt_refresh = refresh;
        self
    }

    /// The data directory this store was created with.
    pub fn data_dir(&self) -> &std::path::Path {
        &self.data_dir
    }

    /// Hold template directory `dir` for as long as this store lives; false if it is gone.
    fn hold(&self, dir: &std::path::Path) -> Result<bool, ImageError> {
        let mut in_use = self.in_use.lock().expect("in-use holds poisoned");
        if in_use.contains_key(dir) {
            return Ok(true);
        }
        let Some(held) = util::InUse::hold(dir)? else { return Ok(false) };
        in_use.insert(dir.to_owned(), held);
        Ok(true)
    }

    /// `<data_dir>/images`.
    pub fn images_dir(&self) -> PathBuf {
        self.data_dir.join("images")
    }
}
