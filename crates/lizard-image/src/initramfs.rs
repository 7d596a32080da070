//! The initramfs: an uncompressed `newc` cpio that holds the agent as `/init`, the kernel
//! modules it must load before it can see any virtio device, and their load order.
//!
//! ```text
//! /init                       the agent binary (0755)
//! /lib/modules/<name>.ko      every module of the closure
//! /etc/lizard/modules.order   module paths in load order, one per line
//! /dev /proc /sys /newroot /tmp   mount points (and /dev/console for early output)
//! ```
//!
//! Stored as `<data>/images/initramfs/<hash>.cpio`, where the hash covers everything that
//! goes in, so a rebuilt agent or kernel gives a new file and an unchanged one a cache hit.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::cpio::CpioWriter;
use crate::util::{self, BuildLock, Hasher};
use crate::{ImageError, ImageStore, Kernel};

/// Bumped whenever the layout of the archive changes.
const INITRAMFS_FORMAT: u32 = 1;

/// Where the agent finds its module list inside the initramfs.
pub const MODULES_ORDER_PATH: &str = "/etc/lizard/modules.order";
/// Where the modules live inside the initramfs.
pub const MODULES_DIR: &str = "/lib/modules";

/// A built initramfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Initramfs {
    /// The `newc` cpio archive, for `qemu -initrd`.
    pub path: PathBuf,
    /// SHA-256 (hex) over the kernel hash, the agent and the module list.
    pub hash: String,
}

impl ImageStore {
    /// newc cpio initramfs: `/init` = the agent binary (0755), the modules, and a load-order file.
    pub fn initramfs(&self, kernel: &Kernel, agent_bin: &Path) -> Result<Initramfs, ImageError> {
        self.initramfs_with_cli(kernel, agent_bin, None)
    }

    /// [`Self::initramfs`], plus the static `lizard` CLI at
    /// [`lizard_agent_proto::GUEST_CLI_INITRAMFS_PATH`] when `cli_bin` is given (the agent
    /// installs it in the guest's root filesystem at boot).
    pub fn initramfs_with_cli(
        &self,
        kernel: &Kernel,
        agent_bin: &Path,
        cli_bin: Option<&Path>,
    ) -> Result<Initramfs, ImageError> {
        let agent = fs::read(agent_bin).map_err(ImageError::io("read agent binary", agent_bin))?;
        let cli = match cli_bin {
            Some(p) => Some(fs::read(p).map_err(ImageError::io("read the guest CLI binary", p))?),
            None => None,
        };
        let mut hasher = Hasher::default();
        hasher.part(INITRAMFS_FORMAT.to_le_bytes()).part(&kernel.hash).part(&agent);
        for module in &kernel.modules {
            hasher.part(&module.name);
        }
        // Absent: the same hash as before the CLI existed, so those caches stay valid.
        if let Some(cli) = &cli {
            hasher.part(b"guest-cli").part(cli);
        }
        let hash = hasher.hex();

        let dir = self.images_dir().join("initramfs");
        let path = dir.join(format!("{hash}.cpio"));
        if path.is_file() {
            return Ok(Initramfs { path, hash });
        }
        let _lock = BuildLock::acquire(&self.images_dir(), "initramfs")?;
        if path.is_file() {
            return Ok(Initramfs { path, hash });
        }
        fs::create_dir_all(&dir).map_err(ImageError::io("create directory", &dir))?;
        util::remove_stale_temps(&dir);

        let tmp = tempfile::Builder::new()
            .prefix(".tmp-")
            .suffix(".cpio")
            .tempfile_in(&dir)
            .map_err(ImageError::io("create temporary file in", &dir))?;
        write_archive(tmp.as_file(), kernel, &agent, cli.as_deref()).map_err(ImageError::io("write", tmp.path()))?;
        tmp.as_file().sync_all().map_err(ImageError::io("sync", tmp.path()))?;
        tmp.persist(&path).map_err(|e| ImageError::Io {
            action: "rename into place",
            path: path.clone(),
            cause: e.error,
        })?;
        util::sync_path(&dir)?;
        tracing::info!(path = %path.display(), modules = kernel.modules.len(), "initramfs built");
        Ok(Initramfs { path, hash })
    }
}

/// Writes the archive described in the module docs.
fn write_archive(file: &File, kernel: &Kernel, agent: &[u8], cli: Option<&[u8]>) -> std::io::Result<()> {
    let mut cpio = CpioWriter::new(BufWriter::new(file));
    for dir in ["dev", "proc", "sys", "newroot", "tmp", "etc", "etc/lizard", "lib", "lib/modules"] {
        cpio.dir(dir, if dir == "tmp" { 0o1777 } else { 0o755 })?;
    }
    // The kernel opens /dev/console for init's stdio before init can mount devtmpfs.
    cpio.char_device("dev/console", 0o600, 5, 1)?;
    cpio.file("init", 0o755, agent)?;
    if let Some(cli) = cli {
        cpio.dir("bin", 0o755)?;
        cpio.file(lizard_agent_proto::GUEST_CLI_INITRAMFS_PATH.trim_start_matches('/'), 0o755, cli)?;
    }
    let mut order = String::new();
    for module in &kernel.modules {
        let target = format!("{MODULES_DIR}/{}.ko", module.name);
        cpio.file(&target, 0o644, &fs::read(&module.path)?)?;
        order.push_str(&target);
        order.push('\n');
    }
    cpio.file(MODULES_ORDER_PATH, 0o644, order.as_bytes())?;
    cpio.finish()?.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpio::read_newc;
    use crate::KernelModule;

    fn fake_kernel(dir: &Path, hash: &str) -> Kernel {
        let mut modules = Vec::new();
        for name in ["virtio_ring", "virtio", "virtio_mmio"] {
            let path = dir.join(format!("{name}.ko"));
            fs::write(&path, format!("module {name}")).unwrap();
            modules.push(KernelModule { name: name.into(), path });
        }
        Kernel {
            vmlinux: dir.join("vmlinux"),
            version: "6.1.0-1-cloud-amd64".into(),
            package_version: "6.1.1-1".into(),
            hash: hash.into(),
            package: "linux-image-6.1.0-1-cloud-amd64".into(),
            modules,
        }
    }

    #[test]
    fn carries_the_guest_cli_when_given() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::new(dir.path().join("data"));
        let kernel = fake_kernel(dir.path(), "k1");
        let agent = dir.path().join("agent");
        fs::write(&agent, b"\x7fELF agent").unwrap();
        let cli = dir.path().join("lizard");
        fs::write(&cli, b"\x7fELF cli").unwrap();
        let without = store.initramfs(&kernel, &agent).unwrap();
        // No CLI: the same archive (and hash) as before the CLI existed.
        assert_eq!(store.initramfs_with_cli(&kernel, &agent, None).unwrap(), without);
        let with = store.initramfs_with_cli(&kernel, &agent, Some(&cli)).unwrap();
        assert_ne!(with.hash, without.hash);
        let entries = read_newc(&fs::read(&with.path).unwrap()).unwrap();
        let e = entries.iter().find(|e| e.path == "bin/lizard").expect("bin/lizard");
        assert_eq!((e.mode, e.data.as_slice()), (0o100_755, &b"\x7fELF cli"[..]));
        assert!(read_newc(&fs::read(&without.path).unwrap()).unwrap().iter().all(|e| e.path != "bin/lizard"));
        // Another CLI build: another archive.
        fs::write(&cli, b"\x7fELF cli v2").unwrap();
        assert_ne!(store.initramfs_with_cli(&kernel, &agent, Some(&cli)).unwrap().hash, with.hash);
    }

    #[test]
    fn builds_archive_and_caches_by_inputs() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::new(dir.path().join("data"));
        let kernel = fake_kernel(dir.path(), "k1");
        let agent = dir.path().join("agent");
        fs::write(&agent, b"\x7fELF agent").unwrap();

        let a = store.initramfs(&kernel, &agent).unwrap();
        assert_eq!(a.path, dir.path().join(format!("data/images/initramfs/{}.cpio", a.hash)));
        let entries = read_newc(&fs::read(&a.path).unwrap()).unwrap();
        let get = |p: &str| entries.iter().find(|e| e.path == p).unwrap_or_else(|| panic!("{p} missing"));
        assert_eq!(get("init").mode, 0o100_755);
        assert_eq!(get("init").data, b"\x7fELF agent");
        assert_eq!(get("lib/modules/virtio.ko").data, b"module virtio");
        assert_eq!(
            String::from_utf8(get("etc/lizard/modules.order").data.clone()).unwrap(),
            "/lib/modules/virtio_ring.ko\n/lib/modules/virtio.ko\n/lib/modules/virtio_mmio.ko\n"
        );
        for d in ["dev", "proc", "sys", "newroot", "tmp"] {
            assert_eq!(get(d).mode & 0o170_000, 0o040_000, "{d} is a directory");
        }

        // Same inputs: same file. Other agent or kernel: another file.
        assert_eq!(store.initramfs(&kernel, &agent).unwrap(), a);
        fs::write(&agent, b"\x7fELF agent v2").unwrap();
        let b = store.initramfs(&kernel, &agent).unwrap();
        assert_ne!(a.hash, b.hash);
        let c = store.initramfs(&fake_kernel(dir.path(), "k2"), &agent).unwrap();
        assert_ne!(b.hash, c.hash);
        // No temporary files are left behind.
        let names: Vec<_> = fs::read_dir(dir.path().join("data/images/initramfs"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(names.iter().all(|n| n.ends_with(".cpio") && !n.starts_with('.')), "{names:?}");
    }
}
