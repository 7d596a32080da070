//! Kernel-module dependency resolution without `depmod`.
//!
//! Debian's kernel package ships no `modules.dep` (it is generated at install time), so the
//! dependencies come straight from each module's `.modinfo` ELF section: NUL-separated
//! `key=value` strings, among them `name=` and `depends=a,b`. Module names may be spelled
//! with `-` or `_` (`virtio-rng.ko` declares `name=virtio_rng`); the kernel treats the two as
//! equal, so every name is normalised to `_` here.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSection};

use crate::ImageError;

/// The modules a Lizard guest needs, in the order we ask for them; their dependencies
/// (`virtio`, `virtio_ring`, `vsock`, ...) are pulled in from `.modinfo`.
pub const WANTED_MODULES: &[&str] = &[
    "virtio_mmio",
    "virtio_blk",
    "virtio_console",
    "virtio_net",
    "virtio_rng",
    "vmw_vsock_virtio_transport",
    // The sandbox secret arrives through QEMU's fw_cfg, not the command line.
    "qemu_fw_cfg",
];

/// Normalises a module name the way the kernel compares them (`-` and `_` are equal).
pub fn normalize(name: &str) -> String {
    name.trim().replace('-', "_")
}

/// What `.modinfo` tells us about one module.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModInfo {
    /// `name=`, normalised; absent in very old modules.
    pub name: Option<String>,
    /// `depends=`, normalised, in the declared order.
    pub depends: Vec<String>,
}

/// Parses the `.modinfo` section of a module's ELF bytes.
pub fn parse_modinfo(elf: &[u8]) -> Result<ModInfo, ImageError> {
    let file = object::File::parse(elf).map_err(|e| ImageError::Module(format!("not an ELF object: {e}")))?;
    let section = file.section_by_name(".modinfo").ok_or_else(|| ImageError::Module("no .modinfo section".into()))?;
    let data = section.data().map_err(|e| ImageError::Module(format!("unreadable .modinfo: {e}")))?;
    Ok(parse_modinfo_strings(data))
}

/// Parses the NUL-separated `key=value` strings of a `.modinfo` section.
pub fn parse_modinfo_strings(data: &[u8]) -> ModInfo {
    let mut info = ModInfo::default();
    for entry in data.split(|&b| b == 0) {
        let Ok(entry) = std::str::from_utf8(entry) else {
            continue;
        };
        if let Some(name) = entry.strip_prefix("name=") {
            info.name = Some(normalize(name));
        } else if let Some(deps) = entry.strip_prefix("depends=") {
            info.depends = deps.split(',').filter(|d| !d.trim().is_empty()).map(normalize).collect();
        }
    }
    info
}

/// Orders the closure of `wanted` so that every module comes after its dependencies.
///
/// `deps_of(name)` returns a module's dependencies, or `Ok(None)` for a module that needs no
/// loading (built into the kernel). The order is deterministic: `wanted` is walked in the
/// given order and each module's dependencies in sorted order.
pub fn load_order<F>(wanted: &[&str], mut deps_of: F) -> Result<Vec<String>, ImageError>
where
    F: FnMut(&str) -> Result<Option<Vec<String>>, ImageError>,
{
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Visiting,
        Done,
    }
    fn visit<F>(
        name: &str,
        deps_of: &mut F,
        marks: &mut HashMap<String, Mark>,
        order: &mut Vec<String>,
        path: &mut Vec<String>,
    ) -> Result<(), ImageError>
    where
        F: FnMut(&str) -> Result<Option<Vec<String>>, ImageError>,
    {
        match marks.get(name) {
            Some(Mark::Done) => return Ok(()),
            Some(Mark::Visiting) => {
                return Err(ImageError::Module(format!("dependency cycle: {} -> {name}", path.join(" -> "))))
            }
            None => {}
        }
        let Some(mut deps) = deps_of(name)? else {
            marks.insert(name.to_owned(), Mark::Done);
            return Ok(());
        };
        marks.insert(name.to_owned(), Mark::Visiting);
        path.push(name.to_owned());
        deps.sort();
        deps.dedup();
        for dep in &deps {
            visit(dep, deps_of, marks, order, path)?;
        }
        path.pop();
        marks.insert(name.to_owned(), Mark::Done);
        order.push(name.to_owned());
        Ok(())
    }

    let mut marks = HashMap::new();
    let mut order = Vec::new();
    for name in wanted {
        visit(&normalize(name), &mut deps_of, &mut marks, &mut order, &mut Vec::new())?;
    }
    Ok(order)
}

/// The modules of one extracted kernel tree (`lib/modules/<version>/`).
pub struct ModuleTree {
    /// Normalised name → `.ko` file.
    files: BTreeMap<String, PathBuf>,
    /// Normalised names of modules built into the kernel (`modules.builtin`).
    builtin: BTreeSet<String>,
}

impl ModuleTree {
    /// Indexes every `.ko` file under `root` (a `lib/modules/<version>` directory).
    pub fn scan(root: &Path) -> Result<Self, ImageError> {
        let mut files = BTreeMap::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in fs::read_dir(&dir).map_err(ImageError::io("read directory", &dir))? {
                let entry = entry.map_err(ImageError::io("read directory", &dir))?;
                let path = entry.path();
                let kind = entry.file_type().map_err(ImageError::io("stat", &path))?;
                if kind.is_dir() {
                    stack.push(path);
                } else if let Some(stem) = path.file_name().and_then(|n| n.to_str()).and_then(module_stem) {
                    files.insert(normalize(stem), path);
                }
            }
        }
        let builtin = match fs::read_to_string(root.join("modules.builtin")) {
            Ok(text) => {
                text.lines().filter_map(|l| l.rsplit('/').next()).filter_map(module_stem).map(normalize).collect()
            }
            Err(_) => BTreeSet::new(),
        };
        Ok(ModuleTree { files, builtin })
    }

    /// Resolves `wanted` plus dependencies into load order: `(name, file)` pairs.
    /// Wanted modules that are built into this kernel are skipped.
    pub fn resolve(&self, wanted: &[&str]) -> Result<Vec<(String, PathBuf)>, ImageError> {
        let order = load_order(wanted, |name| {
            let Some(path) = self.files.get(name) else {
                if self.builtin.contains(name) {
                    tracing::debug!(module = name, "built into the kernel; nothing to load");
                    return Ok(None);
                }
                return Err(ImageError::Module(format!("{name}: neither a module file nor built in")));
            };
            if path.extension().is_some_and(|e| e != "ko") {
                return Err(ImageError::Module(format!("{}: compressed modules are not supported", path.display())));
            }
            let bytes = fs::read(path).map_err(ImageError::io("read", path))?;
            let info = parse_modinfo(&bytes).map_err(|e| ImageError::Module(format!("{}: {e}", path.display())))?;
            Ok(Some(info.depends))
        })?;
        Ok(order
            .into_iter()
            .map(|name| {
                let path = self.files[&name].clone();
                (name, path)
            })
            .collect())
    }
}

/// `foo.ko` / `foo.ko.xz` / `foo.ko.zst` → `foo`.
fn module_stem(file_name: &str) -> Option<&str> {
    [".ko", ".ko.xz", ".ko.zst", ".ko.gz"].iter().find_map(|ext| file_name.strip_suffix(ext))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_modinfo_strings() {
        let data = b"license=GPL\0depends=virtio,virtio-ring\0retpoline=Y\0name=virtio-rng\0vermagic=6.1\0\0\0";
        let info = parse_modinfo_strings(data);
        assert_eq!(info.name.as_deref(), Some("virtio_rng"));
        assert_eq!(info.depends, ["virtio", "virtio_ring"]);
        let info = parse_modinfo_strings(b"depends=\0name=virtio_ring\0");
        assert!(info.depends.is_empty());
    }

    fn graph() -> HashMap<&'static str, Vec<String>> {
        let g: &[(&str, &[&str])] = &[
            ("virtio_ring", &[]),
            ("virtio", &["virtio_ring"]),
            ("virtio_mmio", &["virtio", "virtio_ring"]),
            ("virtio_blk", &["virtio", "virtio_ring"]),
            ("virtio_net", &["virtio_ring", "virtio", "net_failover"]),
            ("net_failover", &["failover"]),
            ("failover", &[]),
            ("vsock", &[]),
            ("vmw_vsock_virtio_transport_common", &["vsock"]),
            ("vmw_vsock_virtio_transport", &["virtio", "vmw_vsock_virtio_transport_common", "virtio_ring", "vsock"]),
        ];
        g.iter().map(|(k, v)| (*k, v.iter().map(|s| s.to_string()).collect())).collect()
    }

    #[test]
    fn orders_dependencies_first() {
        let g = graph();
        let order =
            load_order(&["virtio_mmio", "virtio-blk", "virtio_net", "vmw_vsock_virtio_transport", "ext4"], |n| {
                Ok(if n == "ext4" {
                    None
                } else {
                    Some(g.get(n).cloned().ok_or_else(|| ImageError::Module(n.into()))?)
                })
            })
            .unwrap();
        assert_eq!(
            order,
            [
                "virtio_ring",
                "virtio",
                "virtio_mmio",
                "virtio_blk",
                "failover",
                "net_failover",
                "virtio_net",
                "vsock",
                "vmw_vsock_virtio_transport_common",
                "vmw_vsock_virtio_transport"
            ]
        );
        let pos = |m: &str| order.iter().position(|x| x == m).unwrap();
        for (m, deps) in &g {
            for d in deps {
                assert!(pos(d) < pos(m), "{d} must load before {m}");
            }
        }
    }

    #[test]
    fn reports_cycles_and_missing_modules() {
        let e = load_order(&["a"], |n| Ok(Some(vec![if n == "a" { "b" } else { "a" }.to_string()]))).unwrap_err();
        assert!(e.to_string().contains("cycle"), "{e}");
        let e = load_order(&["a"], |n| Err(ImageError::Module(format!("{n} missing")))).unwrap_err();
        assert!(e.to_string().contains("a missing"));
    }

    #[test]
    fn module_stems() {
        assert_eq!(module_stem("virtio-rng.ko"), Some("virtio-rng"));
        assert_eq!(module_stem("ext4.ko.xz"), Some("ext4"));
        assert_eq!(module_stem("modules.order"), None);
    }
}
