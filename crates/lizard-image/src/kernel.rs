//! The guest kernel: Debian's cloud kernel, unpacked to an ELF `vmlinux` plus the modules a
//! guest loads from its initramfs.
//!
//! `linux-image-cloud-amd64` is a metapackage that depends on exactly one versioned image
//! package (`linux-image-6.1.0-57-cloud-amd64 (= 6.1.192-3)`). That package is downloaded
//! with `apt-get download`, unpacked with `dpkg-deb -x`, its bzImage decompressed in Rust
//! ([`crate::bzimage`]) and the module closure resolved from `.modinfo`
//! ([`crate::modules`]). Result, per package version:
//!
//! ```text
//! <data>/images/kernel/<package_version>/vmlinux
//!                                       /modules/<name>.ko
//!                                       /kernel.json        (written last: marks it complete)
//! ```

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Instant, SystemTime};

use serde::{Deserialize, Serialize};

use crate::modules::{ModuleTree, WANTED_MODULES};
use crate::util::{self, BuildLock, Hasher, Step};
use crate::{bzimage, ImageError, ImageStore};

/// The metapackage that always points at the current cloud kernel.
pub const KERNEL_METAPACKAGE: &str = "linux-image-cloud-amd64";

/// Bumped whenever the layout or contents of a cached kernel directory change.
const KERNEL_FORMAT: u32 = 1;

/// An unpacked guest kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    /// Uncompressed ELF kernel, for `qemu -M microvm -kernel` / Firecracker.
    pub vmlinux: PathBuf,
    /// The kernel release (`uname -r`), e.g. `6.1.0-57-cloud-amd64`.
    pub version: String,
    /// The Debian package version, e.g. `6.1.192-3`.
    pub package_version: String,
    /// SHA-256 (hex) over the vmlinux and the modules; changes whenever either does.
    pub hash: String,
    /// The Debian package the kernel came from, e.g. `linux-image-6.1.0-57-cloud-amd64`.
    pub package: String,
    /// The modules to load in the guest, dependencies first.
    pub modules: Vec<KernelModule>,
}

/// One loadable kernel module kept in the kernel's cache directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelModule {
    /// Normalised module name (`virtio_rng`, never `virtio-rng`).
    pub name: String,
    /// The cached `.ko` file.
    pub path: PathBuf,
}

/// A resolved versioned kernel package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KernelPackage {
    pub name: String,
    pub version: String,
}

/// `kernel.json`.
#[derive(Debug, Serialize, Deserialize)]
struct KernelMeta {
    format: u32,
    package: String,
    package_version: String,
    version: String,
    hash: String,
    /// The wanted list the closure was computed for; a different list means a rebuild.
    wanted: Vec<String>,
    /// Module names in load order; files are `modules/<name>.ko`.
    modules: Vec<String>,
}

impl ImageStore {
    /// The Debian cloud kernel: uncompressed vmlinux + the guest's modules.
    ///
    /// Resolves the current package version with apt (memoised for
    /// [`ImageStore::with_apt_refresh`]), and builds it unless that version is cached. If apt
    /// cannot answer, the newest complete cached kernel is used instead.
    pub fn kernel(&self) -> Result<Kernel, ImageError> {
        let kernels = self.images_dir().join("kernel");
        let package = match self.resolve_kernel_package() {
            Ok(package) => package,
            Err(e) => {
                return match newest_cached(&kernels) {
                    Some(kernel) => {
                        tracing::warn!(error = %e, version = %kernel.package_version,
                            "cannot resolve the kernel package with apt; using the newest cached kernel");
                        Ok(kernel)
                    }
                    None => Err(e),
                }
            }
        };
        let dir = kernels.join(dir_name(&package.version));
        if let Some(kernel) = load_cached(&dir) {
            return Ok(kernel);
        }

        let _lock = BuildLock::acquire(&self.images_dir(), "kernel")?;
        if let Some(kernel) = load_cached(&dir) {
            return Ok(kernel);
        }
        util::remove_stale_temps(&kernels);
        let started = Instant::now();
        if let Err(e) = build(&package, &kernels, &dir) {
            // A host with stale apt lists or no mirror can still boot the kernel it has.
            if let (ImageError::Apt(_), Some(kernel)) = (&e, newest_cached(&kernels)) {
                tracing::warn!(error = %e, version = %kernel.package_version,
                    "cannot download the current kernel; using the newest cached kernel");
                return Ok(kernel);
            }
            return Err(e);
        }
        let kernel = load_cached(&dir).ok_or_else(|| ImageError::Metadata {
            path: dir.join("kernel.json"),
            reason: "incomplete after build".into(),
        })?;
        tracing::info!(version = %kernel.version, package_version = %kernel.package_version,
            elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX), "kernel built");
        Ok(kernel)
    }

    /// Whether a complete kernel is cached here: [`ImageStore::kernel`] then answers
    /// without building anything unless apt names a newer package.
    pub fn has_kernel(&self) -> bool {
        newest_cached(&self.images_dir().join("kernel")).is_some()
    }

    /// The versioned kernel package, from apt or the memo.
    fn resolve_kernel_package(&self) -> Result<KernelPackage, ImageError> {
        let mut memo = self.kernel_memo.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, package)) = memo.as_ref() {
            if at.elapsed() < self.apt_refresh {
                return Ok(package.clone());
            }
        }
        let package = resolve_with_apt()?;
        *memo = Some((Instant::now(), package.clone()));
        Ok(package)
    }
}

/// Asks apt for the versioned package behind [`KERNEL_METAPACKAGE`], running
/// `apt-get update` once when apt knows nothing yet (a fresh host or container).
fn resolve_with_apt() -> Result<KernelPackage, ImageError> {
    if let Some(package) = query_apt()? {
        return Ok(package);
    }
    tracing::info!("apt does not know {KERNEL_METAPACKAGE}; running apt-get update");
    let step = Step::start("apt-get update");
    util::run(apt_command("apt-get").arg("update"), "(apt is part of Debian; is this a Debian host?)")?;
    step.finish();
    query_apt()?.ok_or_else(|| {
        ImageError::Apt(format!(
            "no installable {KERNEL_METAPACKAGE} even after `apt-get update`; \
             check /etc/apt/sources.list(.d) for a Debian `main` source"
        ))
    })
}

/// `Ok(None)` when apt has no candidate for the metapackage.
fn query_apt() -> Result<Option<KernelPackage>, ImageError> {
    const APT_HINT: &str = "(apt is part of Debian; is this a Debian host?)";
    // One call gives the candidate's Depends, which Debian pins with `(= version)`.
    let show =
        match util::run(apt_command("apt-cache").args(["show", "--no-all-versions", KERNEL_METAPACKAGE]), APT_HINT) {
            Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned(),
            Err(ImageError::Command { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
    let Some((name, pinned)) = parse_depends(&show) else {
        return Ok(None);
    };
    let version = match pinned {
        Some(v) => v,
        None => {
            let out = util::run(apt_command("apt-cache").args(["policy", &name]), APT_HINT)?;
            match parse_candidate(&String::from_utf8_lossy(&out.stdout)) {
                Some(v) => v,
                None => return Ok(None),
            }
        }
    };
    tracing::debug!(package = %name, %version, "resolved kernel package");
    Ok(Some(KernelPackage { name, version }))
}

fn apt_command(program: &str) -> Command {
    let mut cmd = Command::new(program);
    cmd.env("LC_ALL", "C").env("DEBIAN_FRONTEND", "noninteractive");
    cmd
}

/// Finds `linux-image-<release>-cloud-amd64` (and its pinned version, if any) in the
/// `Depends:` field of `apt-cache show` output.
fn parse_depends(show: &str) -> Option<(String, Option<String>)> {
    let depends = show.lines().find_map(|l| l.strip_prefix("Depends:"))?;
    depends.split([',', '|']).find_map(|item| {
        let item = item.trim();
        let (name, rest) = item.split_once(' ').unwrap_or((item, ""));
        if !(name.starts_with("linux-image-") && name != KERNEL_METAPACKAGE) {
            return None;
        }
        let pinned = rest
            .trim()
            .strip_prefix('(')
            .and_then(|r| r.strip_suffix(')'))
            .and_then(|r| r.trim().strip_prefix('='))
            .map(|v| v.trim().to_owned());
        Some((name.to_owned(), pinned))
    })
}

/// `Candidate: <version>` from `apt-cache policy` output.
fn parse_candidate(policy: &str) -> Option<String> {
    let candidate = policy.lines().find_map(|l| l.trim().strip_prefix("Candidate:"))?.trim();
    (candidate != "(none)" && !candidate.is_empty()).then(|| candidate.to_owned())
}

/// The cache directory name for a package version (`:` of an epoch is not path-friendly).
fn dir_name(package_version: &str) -> String {
    package_version.replace(':', "_")
}

/// Loads a complete cached kernel directory, or `None`.
fn load_cached(dir: &Path) -> Option<Kernel> {
    let meta: KernelMeta = util::read_meta(&dir.join("kernel.json"))?;
    if meta.format != KERNEL_FORMAT || meta.wanted != WANTED_MODULES {
        tracing::info!(dir = %dir.display(), "cached kernel has an older layout; rebuilding");
        return None;
    }
    let vmlinux = dir.join("vmlinux");
    let modules: Vec<_> = meta
        .modules
        .iter()
        .map(|name| KernelModule { name: name.clone(), path: dir.join("modules").join(format!("{name}.ko")) })
        .collect();
    if !vmlinux.is_file() || !modules.iter().all(|m| m.path.is_file()) {
        tracing::warn!(dir = %dir.display(), "cached kernel is missing files; rebuilding");
        return None;
    }
    Some(Kernel {
        vmlinux,
        version: meta.version,
        package_version: meta.package_version,
        hash: meta.hash,
        package: meta.package,
        modules,
    })
}

/// The most recently built complete kernel under `kernels`, for when apt cannot answer.
fn newest_cached(kernels: &Path) -> Option<Kernel> {
    let entries = fs::read_dir(kernels).ok()?;
    entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| {
            let built = fs::metadata(e.path().join("kernel.json")).and_then(|m| m.modified()).ok()?;
            Some((built, load_cached(&e.path())?))
        })
        .max_by_key(|(built, _): &(SystemTime, Kernel)| *built)
        .map(|(_, k)| k)
}

/// Downloads, unpacks and publishes `package` as `dest`.
fn build(package: &KernelPackage, kernels: &Path, dest: &Path) -> Result<(), ImageError> {
    let tmp = util::temp_dir_in(kernels)?;
    let download = tmp.path().join("download");
    let extracted = tmp.path().join("extracted");
    let out = tmp.path().join("out");
    for dir in [&download, &out.join("modules")] {
        fs::create_dir_all(dir).map_err(ImageError::io("create directory", dir))?;
    }

    let step = Step::start(format!("downloading {} {}", package.name, package.version));
    // apt warns that `_apt` cannot write here and downloads as root instead; harmless.
    util::run(
        apt_command("apt-get")
            .args(["download", &format!("{}={}", package.name, package.version)])
            .current_dir(&download),
        "(apt is part of Debian; is this a Debian host?)",
    )
    .map_err(|e| ImageError::Apt(format!("downloading {}: {e}", package.name)))?;
    step.finish();
    let deb = fs::read_dir(&download)
        .map_err(ImageError::io("read directory", &download))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or_else(|| ImageError::Apt(format!("apt-get download left no .deb for {}", package.name)))?;

    let step = Step::start(format!("unpacking {}", package.name));
    util::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&extracted), "apt-get install dpkg")?;
    let (version, vmlinuz) = find_vmlinuz(&extracted.join("boot"))?;
    let bzimage = fs::read(&vmlinuz).map_err(ImageError::io("read", &vmlinuz))?;
    let vmlinux = bzimage::extract_vmlinux(&bzimage)?;
    step.finish();

    let mut hasher = Hasher::default();
    hasher.part(KERNEL_FORMAT.to_le_bytes()).part(&package.name).part(&package.version).part(&vmlinux);
    util::write_synced(&out.join("vmlinux"), &vmlinux)?;

    let tree = ModuleTree::scan(&extracted.join("lib/modules").join(&version))?;
    let order = tree.resolve(WANTED_MODULES)?;
    for (name, src) in &order {
        let bytes = fs::read(src).map_err(ImageError::io("read", src))?;
        hasher.part(name).part(&bytes);
        util::write_synced(&out.join("modules").join(format!("{name}.ko")), &bytes)?;
    }
    util::sync_path(&out.join("modules"))?;

    let meta = KernelMeta {
        format: KERNEL_FORMAT,
        package: package.name.clone(),
        package_version: package.version.clone(),
        version,
        hash: hasher.hex(),
        wanted: WANTED_MODULES.iter().map(|s| s.to_string()).collect(),
        modules: order.into_iter().map(|(name, _)| name).collect(),
    };
    util::write_meta(&out.join("kernel.json"), &meta)?;
    util::publish(&out, dest)
}

/// The single `vmlinuz-<release>` in an unpacked `/boot`, with its release.
fn find_vmlinuz(boot: &Path) -> Result<(String, PathBuf), ImageError> {
    let mut found = fs::read_dir(boot)
        .map_err(ImageError::io("read directory", boot))?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            Some((name.strip_prefix("vmlinuz-")?.to_owned(), e.path()))
        })
        .collect::<Vec<_>>();
    match found.len() {
        1 => Ok(found.pop().expect("one element")),
        n => Err(ImageError::BzImage(format!("expected one vmlinuz-* in the package's /boot, found {n}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pinned_depends() {
        let show = "Package: linux-image-cloud-amd64\nVersion: 6.1.192-3\n\
                    Depends: linux-image-6.1.0-57-cloud-amd64 (= 6.1.192-3)\nDescription: x\n";
        assert_eq!(parse_depends(show), Some(("linux-image-6.1.0-57-cloud-amd64".into(), Some("6.1.192-3".into()))));
        let show = "Depends: foo (>= 1), linux-image-6.1.0-9-cloud-amd64\n";
        assert_eq!(parse_depends(show), Some(("linux-image-6.1.0-9-cloud-amd64".into(), None)));
        assert_eq!(parse_depends("Package: x\n"), None);
    }

    /// Writes a cached kernel directory by hand; `complete = false` leaves out a module.
    fn fake_cached(kernels: &Path, version: &str, complete: bool) {
        let dir = kernels.join(version);
        fs::create_dir_all(dir.join("modules")).unwrap();
        fs::write(dir.join("vmlinux"), b"\x7fELF").unwrap();
        if complete {
            fs::write(dir.join("modules/virtio_ring.ko"), b"ko").unwrap();
        }
        let meta = KernelMeta {
            format: KERNEL_FORMAT,
            package: "linux-image-6.1.0-1-cloud-amd64".into(),
            package_version: version.into(),
            version: "6.1.0-1-cloud-amd64".into(),
            hash: format!("hash-{version}"),
            wanted: WANTED_MODULES.iter().map(|s| s.to_string()).collect(),
            modules: vec!["virtio_ring".into()],
        };
        util::write_meta(&dir.join("kernel.json"), &meta).unwrap();
    }

    #[test]
    fn cached_kernels_must_be_complete() {
        let tmp = tempfile::tempdir().unwrap();
        let kernels = tmp.path();
        assert_eq!(newest_cached(kernels), None);
        fake_cached(kernels, "6.1.1-1", true);
        std::thread::sleep(std::time::Duration::from_millis(20));
        fake_cached(kernels, "6.1.2-1", false);
        assert_eq!(load_cached(&kernels.join("6.1.2-1")), None, "a missing module makes it incomplete");
        let k = load_cached(&kernels.join("6.1.1-1")).unwrap();
        assert_eq!(k.modules[0].path, kernels.join("6.1.1-1/modules/virtio_ring.ko"));
        assert_eq!(newest_cached(kernels).unwrap().package_version, "6.1.1-1");
        fake_cached(kernels, "6.1.2-1", true);
        assert_eq!(newest_cached(kernels).unwrap().package_version, "6.1.2-1");
    }

    #[test]
    fn parses_policy_candidate() {
        let policy =
            "linux-image-6.1.0-57-cloud-amd64:\n  Installed: (none)\n  Candidate: 6.1.192-3\n  Version table:\n";
        assert_eq!(parse_candidate(policy).as_deref(), Some("6.1.192-3"));
        assert_eq!(parse_candidate("x:\n  Installed: (none)\n  Candidate: (none)\n"), None);
        assert_eq!(dir_name("1:2.3-4"), "1_2.3-4");
    }
}
