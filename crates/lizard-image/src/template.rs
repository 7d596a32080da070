//! Templates: recipes (TOML, embedded from the repository's `templates/` directory) and the
//! ext4 root filesystems built from them.
//!
//! A build runs `mmdebstrap` into a temporary tree, adjusts it for a sandbox (host CA
//! bundle, empty machine-id, hostname, hosts, no apt lists), and packs it with
//! `mkfs.ext4 -d` into a sparse image:
//!
//! ```text
//! <data>/images/templates/<name>/<hash>/rootfs.ext4
//!                                      /template.json   (written last: marks it complete)
//! ```
//!
//! The hash covers the resolved recipe, the CA bundle and [`TEMPLATE_FORMAT`], so editing a
//! recipe or changing the bundle gives a new image while the old one stays usable.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::util::{self, BuildLock, Hasher, Step};
use crate::{ImageError, ImageStore};

/// Bumped whenever the build steps change in a way that changes the image.
const TEMPLATE_FORMAT: u32 = 2;

/// The Debian release every template is built from.
pub const SUITE: &str = "bookworm";

/// The default CA bundle installed into templates: the host's.
pub const HOST_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Path of the CA bundle inside the guest (Debian's).
const GUEST_CA_BUNDLE: &str = "etc/ssl/certs/ca-certificates.crt";

/// mmdebstrap's options besides the package list; part of the template hash.
const MMDEBSTRAP_OPTIONS: &[&str] = &[
    "--variant=apt",
    "--mode=root",
    "--aptopt=Acquire::Retries \"3\"",
    // Sandboxes need no manuals or translations (about 60 MB); keep the licences. The
    // settings stay in /etc/dpkg/dpkg.cfg.d, so packages installed later follow them too.
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/info/*",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "--dpkgopt=path-include=/usr/share/locale/locale.alias",
];

/// The recipes compiled into the binary, by name.
const RECIPES: &[(&str, &str)] = &[
    ("base", include_str!("../../../templates/base.toml")),
    ("code-interpreter-v1", include_str!("../../../templates/code-interpreter-v1.toml")),
];

/// Default size of a template's file system, in GiB.
pub const DEFAULT_DISK_GB: u64 = 4;

/// A recipe file as written (`templates/<name>.toml`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    pub name: String,
    pub description: String,
    /// Another template whose packages (and, unless overridden, settings) are included.
    #[serde(default)]
    pub extends: Option<String>,
    /// Debian packages to install on top of mmdebstrap's `apt` variant.
    #[serde(default)]
    pub packages: Vec<String>,
    /// Size of the ext4 file system; inherited, else [`DEFAULT_DISK_GB`].
    #[serde(default)]
    pub disk_gb: Option<u64>,
    /// Sandboxes of this template always cold-boot (no snapshot clone); inherited, else false.
    #[serde(default)]
    pub cold_boot_only: Option<bool>,
}

/// A recipe with `extends` applied: what a build actually uses (and what is hashed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolvedRecipe {
    pub name: String,
    pub description: String,
    /// The `extends` chain, root first, ending with this template.
    pub lineage: Vec<String>,
    /// Packages of the whole chain, parents first, without duplicates.
    pub packages: Vec<String>,
    pub disk_gb: u64,
    pub cold_boot_only: bool,
}

/// A built template root filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateImage {
    pub name: String,
    /// Raw ext4 image (sparse); sandboxes get copy-on-write clones of it.
    pub rootfs: PathBuf,
    /// SHA-256 (hex) over the resolved recipe, the CA bundle and the build format.
    pub hash: String,
    pub disk_gb: u64,
    pub cold_boot_only: bool,
    pub description: String,
}

/// `template.json`.
#[derive(Debug, Serialize, Deserialize)]
struct TemplateMeta {
    format: u32,
    hash: String,
    suite: String,
    recipe: ResolvedRecipe,
    /// Where the CA bundle came from (`None`: Debian's own).
    ca_bundle: Option<PathBuf>,
    build_seconds: f64,
}

/// The recipe text compiled in for `name`.
fn embedded(name: &str) -> Option<&'static str> {
    RECIPES.iter().find(|(n, _)| *n == name).map(|(_, text)| *text)
}

/// Resolves `name` and its `extends` chain using `source` to look recipes up.
pub fn resolve_recipe_with<'a>(
    name: &str,
    source: impl Fn(&str) -> Option<&'a str>,
) -> Result<ResolvedRecipe, ImageError> {
    // Walk up the chain first, child to root.
    let mut chain: Vec<Recipe> = Vec::new();
    let mut next = Some(name.to_owned());
    while let Some(current) = next {
        if chain.iter().any(|r| r.name == current) {
            let path: Vec<_> = chain.iter().map(|r| r.name.as_str()).collect();
            return Err(ImageError::Recipe {
                name: name.into(),
                reason: format!("`extends` cycle: {} -> {current}", path.join(" -> ")),
            });
        }
        let text = source(&current).ok_or_else(|| {
            if chain.is_empty() {
                ImageError::UnknownTemplate(current.clone())
            } else {
                ImageError::Recipe {
                    name: chain[chain.len() - 1].name.clone(),
                    reason: format!("extends unknown template {current:?}"),
                }
            }
        })?;
        let recipe = parse_recipe(&current, text)?;
        next = recipe.extends.clone();
        chain.push(recipe);
    }

    let own = &chain[0];
    let mut seen = BTreeSet::new();
    let mut packages = Vec::new();
    for recipe in chain.iter().rev() {
        for package in &recipe.packages {
            if seen.insert(package.clone()) {
                packages.push(package.clone());
            }
        }
    }
    Ok(ResolvedRecipe {
        name: own.name.clone(),
        description: own.description.clone(),
        lineage: chain.iter().rev().map(|r| r.name.clone()).collect(),
        packages,
        disk_gb: chain.iter().find_map(|r| r.disk_gb).unwrap_or(DEFAULT_DISK_GB),
        cold_boot_only: chain.iter().find_map(|r| r.cold_boot_only).unwrap_or(false),
    })
}

/// Parses and validates one recipe file.
fn parse_recipe(file_name: &str, text: &str) -> Result<Recipe, ImageError> {
    let bad = |reason: String| ImageError::Recipe { name: file_name.into(), reason };
    let recipe: Recipe = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
    if recipe.name != file_name {
        return Err(bad(format!("`name = {:?}` does not match the file name", recipe.name)));
    }
    if let Some(p) = recipe.packages.iter().find(|p| !is_package_name(p)) {
        return Err(bad(format!("{p:?} is not a Debian package name")));
    }
    if let Some(gb) = recipe.disk_gb.filter(|gb| !(1..=1024).contains(gb)) {
        return Err(bad(format!("disk_gb = {gb} is outside 1..=1024")));
    }
    Ok(recipe)
}

/// Debian policy: lower-case letters, digits, `+ - .`, at least two characters, starting
/// alphanumeric. Checked because the list is joined with commas for mmdebstrap.
fn is_package_name(name: &str) -> bool {
    name.len() >= 2
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c))
}

/// The cache key of a template.
fn template_hash(recipe: &ResolvedRecipe, ca_bundle: Option<&[u8]>) -> String {
    let recipe_toml = toml::to_string(recipe).expect("a resolved recipe serialises");
    let mut h = Hasher::default();
    h.part(TEMPLATE_FORMAT.to_le_bytes()).part(SUITE).part(recipe_toml);
    for option in MMDEBSTRAP_OPTIONS {
        h.part(option);
    }
    match ca_bundle {
        Some(bytes) => h.part("ca-bundle").part(bytes),
        None => h.part("debian-ca-bundle"),
    };
    h.hex()
}

impl ImageStore {
    /// The names of the templates compiled into this binary.
    pub fn template_names() -> Vec<&'static str> {
        RECIPES.iter().map(|(name, _)| *name).collect()
    }

    /// The recipe of a template with `extends` applied.
    pub fn recipe(name: &str) -> Result<ResolvedRecipe, ImageError> {
        resolve_recipe_with(name, embedded)
    }

    /// ext4 root filesystem image for a template name ("base", "code-interpreter-v1").
    ///
    /// Cached by the hash of its inputs; a build takes a minute or so (mmdebstrap from the
    /// Debian mirror) and holds `<data>/images/.lock-template-<name>`.
    pub fn template(&self, name: &str) -> Result<TemplateImage, ImageError> {
        let recipe = Self::recipe(name)?;
        let ca_bundle = match &self.ca_bundle {
            Some(path) => Some(fs::read(path).map_err(ImageError::io("read CA bundle", path))?),
            None => None,
        };
        let hash = template_hash(&recipe, ca_bundle.as_deref());
        let parent = self.images_dir().join("templates").join(name);
        let dir = parent.join(&hash);
        if let Some(image) = load_cached(&dir, &hash) {
            return Ok(image);
        }

        let _lock = BuildLock::acquire(&self.images_dir(), &format!("template-{name}"))?;
        if let Some(image) = load_cached(&dir, &hash) {
            return Ok(image);
        }
        util::remove_stale_temps(&parent);
        let started = Instant::now();
        let tmp = util::temp_dir_in(&parent)?;
        let out = tmp.path().join("out");
        fs::create_dir(&out).map_err(ImageError::io("create directory", &out))?;
        build_rootfs(&recipe, ca_bundle.as_deref(), tmp.path(), &out.join("rootfs.ext4"))?;
        let meta = TemplateMeta {
            format: TEMPLATE_FORMAT,
            hash: hash.clone(),
            suite: SUITE.into(),
            recipe,
            ca_bundle: self.ca_bundle.clone(),
            build_seconds: started.elapsed().as_secs_f64(),
        };
        util::write_meta(&out.join("template.json"), &meta)?;
        util::publish(&out, &dir)?;
        tracing::info!(template = name, %hash, seconds = meta.build_seconds, "template built");
        load_cached(&dir, &hash).ok_or_else(|| ImageError::Metadata {
            path: dir.join("template.json"),
            reason: "incomplete after build".into(),
        })
    }
}

/// Loads a complete cached template directory, or `None`.
fn load_cached(dir: &Path, hash: &str) -> Option<TemplateImage> {
    let meta: TemplateMeta = util::read_meta(&dir.join("template.json"))?;
    let rootfs = dir.join("rootfs.ext4");
    if meta.hash != hash || !rootfs.is_file() {
        return None;
    }
    Some(TemplateImage {
        name: meta.recipe.name,
        rootfs,
        hash: meta.hash,
        disk_gb: meta.recipe.disk_gb,
        cold_boot_only: meta.recipe.cold_boot_only,
        description: meta.recipe.description,
    })
}

/// mmdebstrap → sandbox adjustments → mkfs.ext4, all inside `work`.
fn build_rootfs(
    recipe: &ResolvedRecipe,
    ca_bundle: Option<&[u8]>,
    work: &Path,
    image: &Path,
) -> Result<(), ImageError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(ImageError::NeedsRoot(format!("building template {:?} (mmdebstrap --mode=root)", recipe.name)));
    }
    let root = work.join("root");
    let step =
        Step::start(format!("mmdebstrap {SUITE} for template {} ({} packages)", recipe.name, recipe.packages.len()));
    let mut cmd = Command::new("mmdebstrap");
    cmd.args(MMDEBSTRAP_OPTIONS)
        .arg(format!("--include={}", recipe.packages.join(",")))
        .arg(SUITE)
        .arg(&root)
        .env("LC_ALL", "C");
    util::run(&mut cmd, "apt-get install mmdebstrap")?;
    step.finish();

    let step = Step::start(format!("configuring template {}", recipe.name));
    customize(&root, ca_bundle)?;
    step.finish();

    let step = Step::start(format!("mkfs.ext4 for template {} ({} GiB)", recipe.name, recipe.disk_gb));
    let mut cmd = Command::new("mkfs.ext4");
    cmd.args(["-q", "-F", "-L", "lizard-root", "-d"])
        .arg(&root)
        .args(["-E", "root_owner=0:0"])
        .arg(image)
        .arg(format!("{}G", recipe.disk_gb));
    util::run(&mut cmd, "apt-get install e2fsprogs")?;
    util::sync_path(image)?;
    step.finish();
    Ok(())
}

/// Makes an mmdebstrap tree fit to be a sandbox's root.
fn customize(root: &Path, ca_bundle: Option<&[u8]>) -> Result<(), ImageError> {
    let write = |rel: &str, bytes: &[u8]| -> Result<(), ImageError> {
        let path = root.join(rel);
        // Replace symlinks rather than writing through them to the host.
        if path.symlink_metadata().is_ok() {
            fs::remove_file(&path).map_err(ImageError::io("remove", &path))?;
        }
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(ImageError::io("create directory", dir))?;
        }
        fs::write(&path, bytes).map_err(ImageError::io("write", &path))
    };

    // Every sandbox must get its own machine-id (systemd-style: empty = generate at boot).
    write("etc/machine-id", b"")?;
    let dbus_id = root.join("var/lib/dbus/machine-id");
    if dbus_id.symlink_metadata().is_ok() {
        fs::remove_file(&dbus_id).map_err(ImageError::io("remove", &dbus_id))?;
    }
    write("etc/hostname", b"lizard\n")?;
    write(
        "etc/hosts",
        b"127.0.0.1\tlocalhost\n127.0.1.1\tlizard\n::1\tlocalhost ip6-localhost ip6-loopback\n\
          ff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n",
    )?;

    if let Some(bundle) = ca_bundle {
        // Certificates the host trusts beyond Debian's set also go where
        // update-ca-certificates looks, so a later package install that regenerates the
        // bundle inside the sandbox keeps them.
        let stock = fs::read(root.join(GUEST_CA_BUNDLE)).unwrap_or_default();
        let stock: BTreeSet<String> = pem_certificates(&String::from_utf8_lossy(&stock)).collect();
        let bundle_text = String::from_utf8_lossy(bundle);
        for (i, cert) in pem_certificates(&bundle_text).filter(|c| !stock.contains(c)).enumerate() {
            write(&format!("usr/local/share/ca-certificates/lizard-host-{i:03}.crt"), cert.as_bytes())?;
        }
        write(GUEST_CA_BUNDLE, bundle)?;
        // npm ships its own CA list; point it at the system bundle.
        write("etc/npmrc", b"cafile=/etc/ssl/certs/ca-certificates.crt\n")?;
    }

    // A sandbox is a disposable machine: `pip install` goes into its system Python, as in
    // a container image (Debian's PEP 668 marker would refuse it).
    for lib in fs::read_dir(root.join("usr/lib")).into_iter().flatten().flatten() {
        let marker = lib.path().join("EXTERNALLY-MANAGED");
        if lib.file_name().to_string_lossy().starts_with("python3") && marker.exists() {
            fs::remove_file(&marker).map_err(ImageError::io("remove", &marker))?;
        }
    }

    // The equivalent of `apt-get clean` plus dropping the package lists.
    for dir in ["var/lib/apt/lists", "var/cache/apt/archives"] {
        let dir = root.join(dir);
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if is_dir && entry.file_name() != "partial" {
                fs::remove_dir_all(&path).map_err(ImageError::io("remove", &path))?;
            } else if !is_dir && entry.file_name() != "lock" {
                fs::remove_file(&path).map_err(ImageError::io("remove", &path))?;
            }
        }
    }
    for bin in ["var/cache/apt/pkgcache.bin", "var/cache/apt/srcpkgcache.bin"] {
        let _ = fs::remove_file(root.join(bin));
    }
    Ok(())
}

/// The PEM certificate blocks of a bundle, normalised (trimmed, `\n` line ends).
fn pem_certificates(text: &str) -> impl Iterator<Item = String> + '_ {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    text.split(BEGIN).skip(1).filter_map(|rest| {
        let body = &rest[..rest.find(END)?];
        let lines: Vec<&str> = body.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        Some(format!("{BEGIN}\n{}\n{END}\n", lines.join("\n")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_recipes_resolve() {
        assert_eq!(ImageStore::template_names(), ["base", "code-interpreter-v1"]);
        let base = ImageStore::recipe("base").unwrap();
        assert_eq!(base.lineage, ["base"]);
        assert_eq!(base.disk_gb, 4);
        assert!(!base.cold_boot_only);
        for p in ["nodejs", "npm", "bash", "coreutils", "curl", "git", "procps", "ca-certificates", "iproute2"] {
            assert!(base.packages.iter().any(|x| x == p), "base lacks {p}");
        }
        let ci = ImageStore::recipe("code-interpreter-v1").unwrap();
        assert_eq!(ci.lineage, ["base", "code-interpreter-v1"]);
        assert_eq!(ci.packages[..base.packages.len()], base.packages[..], "parent packages come first");
        for p in ["python3", "python3-pip", "python3-venv"] {
            assert!(ci.packages.iter().any(|x| x == p), "code-interpreter-v1 lacks {p}");
        }
        assert_eq!(ci.disk_gb, base.disk_gb, "disk_gb is inherited");
    }

    #[test]
    fn unknown_template_is_its_own_error() {
        let e = ImageStore::recipe("nope").unwrap_err();
        assert!(matches!(&e, ImageError::UnknownTemplate(n) if n == "nope"));
        assert!(e.to_string().contains("base"), "{e}");
        let store = ImageStore::new("/nonexistent");
        assert!(matches!(store.template("nope"), Err(ImageError::UnknownTemplate(_))));
    }

    fn source<'a>(files: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<&'a str> {
        move |name| files.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
    }

    #[test]
    fn extends_merges_and_overrides() {
        let files = [
            ("a", "name = \"a\"\ndescription = \"A\"\npackages = [\"curl\", \"git\"]\ndisk_gb = 8\ncold_boot_only = true\n"),
            ("b", "name = \"b\"\ndescription = \"B\"\nextends = \"a\"\npackages = [\"git\", \"python3\"]\n"),
            ("c", "name = \"c\"\ndescription = \"C\"\nextends = \"b\"\ndisk_gb = 2\ncold_boot_only = false\n"),
        ];
        let b = resolve_recipe_with("b", source(&files)).unwrap();
        assert_eq!(b.packages, ["curl", "git", "python3"]);
        assert_eq!((b.disk_gb, b.cold_boot_only), (8, true));
        let c = resolve_recipe_with("c", source(&files)).unwrap();
        assert_eq!(c.lineage, ["a", "b", "c"]);
        assert_eq!((c.disk_gb, c.cold_boot_only), (2, false));
        assert_eq!(c.description, "C");
    }

    #[test]
    fn bad_recipes_are_rejected() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[
                    ("a", "name = \"a\"\ndescription = \"\"\nextends = \"b\"\n"),
                    ("b", "name = \"b\"\ndescription = \"\"\nextends = \"a\"\n"),
                ],
                "cycle",
            ),
            (&[("a", "name = \"a\"\ndescription = \"\"\nextends = \"zz\"\n")], "unknown template \"zz\""),
            (&[("a", "name = \"x\"\ndescription = \"\"\n")], "file name"),
            (&[("a", "name = \"a\"\ndescription = \"\"\npackages = [\"curl,git\"]\n")], "package name"),
            (&[("a", "name = \"a\"\ndescription = \"\"\ndisk_gb = 0\n")], "disk_gb"),
            (&[("a", "name = \"a\"\ndescription = \"\"\ncolour = \"red\"\n")], "unknown field"),
        ];
        for (files, expected) in cases {
            let e = resolve_recipe_with("a", source(files)).unwrap_err().to_string();
            assert!(e.contains(expected), "expected {expected:?} in {e:?}");
        }
    }

    #[test]
    fn hash_follows_recipe_and_ca_bundle() {
        let files = [("a", "name = \"a\"\ndescription = \"A\"\npackages = [\"curl\"]\n")];
        let changed = [("a", "name = \"a\"\ndescription = \"A\"\npackages = [\"curl\", \"git\"]\n")];
        let bigger = [("a", "name = \"a\"\ndescription = \"A\"\npackages = [\"curl\"]\ndisk_gb = 5\n")];
        let a = resolve_recipe_with("a", source(&files)).unwrap();
        let h = template_hash(&a, Some(b"bundle"));
        assert_eq!(h, template_hash(&resolve_recipe_with("a", source(&files)).unwrap(), Some(b"bundle")));
        assert_ne!(h, template_hash(&resolve_recipe_with("a", source(&changed)).unwrap(), Some(b"bundle")));
        assert_ne!(h, template_hash(&resolve_recipe_with("a", source(&bigger)).unwrap(), Some(b"bundle")));
        assert_ne!(h, template_hash(&a, Some(b"other bundle")));
        assert_ne!(h, template_hash(&a, None));
        // A parent's change reaches its children.
        let child = |parent: &'static str| {
            let files = [("p", parent), ("c", "name = \"c\"\ndescription = \"\"\nextends = \"p\"\n")];
            template_hash(&resolve_recipe_with("c", source(&files)).unwrap(), None)
        };
        assert_ne!(
            child("name = \"p\"\ndescription = \"\"\npackages = [\"curl\"]\n"),
            child("name = \"p\"\ndescription = \"\"\npackages = [\"wget\"]\n")
        );
    }

    #[test]
    fn pem_blocks_are_split_and_normalised() {
        let bundle = "# comment\n-----BEGIN CERTIFICATE-----\r\nAAAA\r\nBBBB\r\n-----END CERTIFICATE-----\n\
                      -----BEGIN CERTIFICATE-----\nCCCC\n-----END CERTIFICATE-----\n";
        let certs: Vec<_> = pem_certificates(bundle).collect();
        assert_eq!(certs.len(), 2);
        assert_eq!(certs[0], "-----BEGIN CERTIFICATE-----\nAAAA\nBBBB\n-----END CERTIFICATE-----\n");
    }

    #[test]
    fn customize_writes_sandbox_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let stock = "-----BEGIN CERTIFICATE-----\nSTOCK\n-----END CERTIFICATE-----\n";
        fs::create_dir_all(root.join("etc/ssl/certs")).unwrap();
        fs::write(root.join(GUEST_CA_BUNDLE), stock).unwrap();
        fs::write(root.join("etc/machine-id"), "0123456789abcdef\n").unwrap();
        fs::create_dir_all(root.join("var/lib/apt/lists/partial")).unwrap();
        fs::write(root.join("var/lib/apt/lists/mirror.example_InRelease"), "x").unwrap();
        let host = format!("{stock}-----BEGIN CERTIFICATE-----\nPROXY\n-----END CERTIFICATE-----\n");

        fs::create_dir_all(root.join("usr/lib/python3.11")).unwrap();
        fs::write(root.join("usr/lib/python3.11/EXTERNALLY-MANAGED"), "[externally-managed]\n").unwrap();

        customize(root, Some(host.as_bytes())).unwrap();
        assert!(!root.join("usr/lib/python3.11/EXTERNALLY-MANAGED").exists(), "pip installs are allowed");
        assert_eq!(fs::read(root.join("etc/machine-id")).unwrap(), b"");
        assert_eq!(fs::read_to_string(root.join("etc/hostname")).unwrap(), "lizard\n");
        assert!(fs::read_to_string(root.join("etc/hosts")).unwrap().starts_with("127.0.0.1\tlocalhost\n"));
        assert_eq!(fs::read_to_string(root.join(GUEST_CA_BUNDLE)).unwrap(), host);
        let extra: Vec<_> = fs::read_dir(root.join("usr/local/share/ca-certificates")).unwrap().collect();
        assert_eq!(extra.len(), 1, "only the certificate Debian lacks is added");
        let lists: Vec<_> =
            fs::read_dir(root.join("var/lib/apt/lists")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(lists, ["partial"]);
    }
}
