//! Built-in templates, host side: their recipes (the repository's
//! `templates/<name>/lizard.template.toml`, compiled in), the Debian root file systems at
//! the bottom of them, and the cache of finished built-ins.
//!
//! A built-in is built like any pushed template: the node runs its steps in a build
//! microVM. Only the part with trusted, pinned inputs happens on the host: `mmdebstrap` of
//! a Debian suite into a temporary tree, sandbox adjustments (host CA bundle, empty
//! machine-id, hostname, hosts, no apt lists), and `mkfs.ext4 -d` into a sparse image. A
//! built-in over the Debian root is flattened into one raw image; one over another built-in
//! is published as a qcow2 layer backed by its parent's image:
//!
//! ```text
//! <data>/images/debian/<hash>/{rootfs.ext4, debian.json}
//! <data>/images/templates/<name>/<key>/{rootfs.ext4 | rootfs.qcow2, template.json}   (json last)
//! ```
//!
//! A recipe's `copy` steps take the files beside it in `templates/<name>/`, compiled in
//! ([`BUILTINS`]); their paths, modes and contents are part of the key.
//!
//! A Debian image's hash covers the suite, the packages, mmdebstrap's options, the disk
//! size, the CA bundle and [`TEMPLATE_FORMAT`]; a built-in's key covers its recipe, its
//! files and its base's hash or key. Editing a recipe or changing the bundle gives a new image while the
//! old one stays usable.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use lizard_recipe::{Base, Context, ContextLimits, DebianBase, Entry, EntryKind, Recipe, StartSpec, TemplateConfig};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::util::{self, BuildLock, Hasher, InUse, Step};
use crate::{ImageError, ImageStore};

/// Bumped whenever the build steps change in a way that changes the image.
const TEMPLATE_FORMAT: u32 = 3;

/// The default CA bundle installed into templates: the host's.
pub const HOST_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Path of the CA bundle inside the guest (Debian's).
const GUEST_CA_BUNDLE: &str = "etc/ssl/certs/ca-certificates.crt";

/// mmdebstrap's options besides the suite and package list; part of the image hash.
/// mmdebstrap also writes the apt and dpkg options into the image, so apt inside a build VM
/// follows them too.
const MMDEBSTRAP_OPTIONS: &[&str] = &[
    "--variant=apt",
    "--mode=root",
    "--aptopt=Acquire::Retries \"3\"",
    // Debian's testing suites carry a `Valid-Until` a few weeks ahead that a mirror's copy
    // can outlive; the archive signature is still checked.
    "--aptopt=Acquire::Check-Valid-Until \"false\"",
    // Sandboxes need no manuals or translations (about 60 MB); keep the licences.
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/info/*",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "--dpkgopt=path-include=/usr/share/locale/locale.alias",
    // A failed build VM is thrown away and a sandbox is disposable: dpkg need not fsync each
    // file it unpacks (under TCG every sync is a journal commit in the guest and a flush on
    // the host; the builder syncs once at the end of each step).
    "--dpkgopt=force-unsafe-io",
];

/// A built-in template compiled into the binary: `templates/<name>/` of the repository.
struct Builtin {
    name: &'static str,
    /// `lizard.template.toml`.
    recipe: &'static str,
    /// The files beside the recipe that its `copy` steps take.
    files: &'static [BuiltinFile],
}

/// One file of a built-in's build context.
struct BuiltinFile {
    /// Relative to the template's directory, `/`-separated.
    path: &'static str,
    mode: u32,
    bytes: &'static [u8],
}

/// A [`Builtin`] from `templates/<name>/`: its recipe, and the files beside it (path and
/// mode) that its `copy` steps take.
macro_rules! builtin {
    ($name:literal $(, $path:literal => $mode:literal)* $(,)?) => {
        Builtin {
            name: $name,
            recipe: include_str!(concat!("../../../templates/", $name, "/lizard.template.toml")),
            files: &[$(BuiltinFile {
                path: $path,
                mode: $mode,
                bytes: include_bytes!(concat!("../../../templates/", $name, "/", $path)),
            }),*],
        }
    };
}

/// The built-in templates, parents before children.
const BUILTINS: &[Builtin] = &[
    builtin!("base"),
    builtin!("code-interpreter-v1"),
    builtin!(
        "interpreter",
        "code_server.py" => 0o644,
        "js_context.js" => 0o644,
        "lizard_charts.py" => 0o644,
        "r_context.R" => 0o644
    ),
    builtin!("desktop", "lizard-desktop.sh" => 0o755, "stream.py" => 0o644, "xvfb.sh" => 0o755),
    builtin!("claude"),
    builtin!("codex"),
    builtin!("opencode"),
    builtin!("pi"),
    builtin!("prime"),
];

/// A built-in's build context: its files as a [`Context`], and each content by SHA-256.
pub struct BuiltinContext {
    pub context: Context,
    pub contents: Vec<(String, &'static [u8])>,
}

/// A finished built-in's root file system: one raw image over a Debian root, or one qcow2
/// layer over its parent built-in's image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateImage {
    pub name: String,
    /// Sandboxes get copy-on-write overlays of it: a raw ext4 image (sparse), or, when
    /// [`TemplateImage::layered`], a qcow2 layer over its parent built-in's image.
    pub rootfs: PathBuf,
    pub layered: bool,
    /// The built-in's key: its recipe and everything below it.
    pub hash: String,
    pub disk_gb: u64,
    pub description: String,
    /// Environment, directory and user of its processes (its recipe over its base's).
    pub config: TemplateConfig,
    /// The process every sandbox of it starts with, running in its snapshot.
    pub start: Option<StartSpec>,
}

/// A Debian root file system made on the host: the bottom of a built-in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebianImage {
    /// Raw ext4 image (sparse).
    pub rootfs: PathBuf,
    pub hash: String,
}

/// `debian.json`.
#[derive(Debug, Serialize, Deserialize)]
struct DebianMeta {
    format: u32,
    hash: String,
    base: DebianBase,
    disk_gb: u32,
    /// Where the CA bundle came from (`None`: Debian's own).
    ca_bundle: Option<PathBuf>,
    build_seconds: f64,
}

/// `template.json` of a finished built-in.
#[derive(Debug, Serialize, Deserialize)]
struct BuiltinMeta {
    format: u32,
    key: String,
    recipe: Recipe,
    config: TemplateConfig,
    start: Option<StartSpec>,
    build_seconds: f64,
    /// `rootfs.qcow2` over the parent's image, else a flat `rootfs.ext4`.
    #[serde(default)]
    layered: bool,
}

/// What a finished built-in carries besides its disk, for [`ImageStore::publish_builtin`].
#[derive(Debug, Clone)]
pub struct BuiltinOutcome {
    pub config: TemplateConfig,
    pub start: Option<StartSpec>,
    pub build_seconds: f64,
}

/// Held while a built-in is built, so that concurrent processes build it once.
pub struct BuiltinLock(#[allow(dead_code)] BuildLock);

impl ImageStore {
    /// The names of the templates compiled into this binary.
    pub fn template_names() -> Vec<&'static str> {
        BUILTINS.iter().map(|b| b.name).collect()
    }

    fn builtin(name: &str) -> Result<&'static Builtin, ImageError> {
        BUILTINS.iter().find(|b| b.name == name).ok_or_else(|| ImageError::UnknownTemplate(name.into()))
    }

    /// The build context of built-in `name`: the files beside its recipe, with the
    /// directories their paths imply.
    pub fn builtin_context(name: &str) -> Result<BuiltinContext, ImageError> {
        context_of(Self::builtin(name)?.files)
            .map_err(|e| ImageError::Recipe { name: name.into(), reason: e.to_string() })
    }

    /// The recipe of built-in `name`.
    pub fn builtin_recipe(name: &str) -> Result<Recipe, ImageError> {
        let recipe = Recipe::from_toml(Self::builtin(name)?.recipe)
            .map_err(|e| ImageError::Recipe { name: name.into(), reason: e.to_string() })?;
        if recipe.name != name {
            return Err(ImageError::Recipe {
                name: name.into(),
                reason: format!("`name = {:?}` does not match", recipe.name),
            });
        }
        Ok(recipe)
    }

    fn ca_bundle_bytes(&self) -> Result<Option<Vec<u8>>, ImageError> {
        match &self.ca_bundle {
            Some(path) => Ok(Some(fs::read(path).map_err(ImageError::io("read CA bundle", path))?)),
            None => Ok(None),
        }
    }

    /// The hash a Debian image of `base` at `disk_gb` GiB would have.
    pub fn debian_hash(&self, base: &DebianBase, disk_gb: u32) -> Result<String, ImageError> {
        Ok(debian_hash(base, disk_gb, self.ca_bundle_bytes()?.as_deref()))
    }

    /// The Debian root file system of `base` (cached by its hash; a build takes a minute or
    /// so and holds `<data>/images/.lock-debian`).
    pub fn debian_base(&self, base: &DebianBase, disk_gb: u32) -> Result<DebianImage, ImageError> {
        check_debian_base(base)?;
        let ca_bundle = self.ca_bundle_bytes()?;
        let hash = debian_hash(base, disk_gb, ca_bundle.as_deref());
        let parent = self.images_dir().join("debian");
        let dir = parent.join(&hash);
        let cached = |dir: &Path| -> Option<DebianImage> {
            let meta: DebianMeta = util::read_meta(&dir.join("debian.json"))?;
            let rootfs = dir.join("rootfs.ext4");
            (meta.hash == hash && rootfs.is_file()).then(|| DebianImage { rootfs, hash: hash.clone() })
        };
        if let Some(image) = cached(&dir) {
            return Ok(image);
        }
        let _lock = BuildLock::acquire(&self.images_dir(), "debian")?;
        if let Some(image) = cached(&dir) {
            return Ok(image);
        }
        util::remove_stale_temps(&parent);
        let started = Instant::now();
        let tmp = util::temp_dir_in(&parent)?;
        let out = tmp.path().join("out");
        fs::create_dir(&out).map_err(ImageError::io("create directory", &out))?;
        build_rootfs(base, disk_gb, ca_bundle.as_deref(), tmp.path(), &out.join("rootfs.ext4"))?;
        let meta = DebianMeta {
            format: TEMPLATE_FORMAT,
            hash: hash.clone(),
            base: base.clone(),
            disk_gb,
            ca_bundle: self.ca_bundle.clone(),
            build_seconds: started.elapsed().as_secs_f64(),
        };
        util::write_meta(&out.join("debian.json"), &meta)?;
        util::publish(&out, &dir)?;
        tracing::info!(suite = %base.debian, %hash, seconds = meta.build_seconds, "Debian root file system built");
        cached(&dir).ok_or_else(|| ImageError::Metadata {
            path: dir.join("debian.json"),
            reason: "incomplete after build".into(),
        })
    }

    /// The cache key of built-in `name`: its recipe and its base's hash (a Debian image) or
    /// key (another built-in).
    pub fn builtin_key(&self, name: &str) -> Result<String, ImageError> {
        let recipe = Self::builtin_recipe(name)?;
        let below = match &recipe.from {
            Base::Debian(debian) => format!("debian:{}", self.debian_hash(debian, recipe.build.disk_gb)?),
            Base::Template(parent) if parent == name => {
                return Err(ImageError::Recipe { name: name.into(), reason: "`from` names itself".into() })
            }
            Base::Template(parent) => format!("builtin:{}", self.builtin_key(parent)?),
        };
        let recipe_json = serde_json::to_string(&recipe).expect("a recipe serializes");
        let mut h = Hasher::default();
        h.part(TEMPLATE_FORMAT.to_le_bytes()).part(below).part(recipe_json);
        for file in Self::builtin(name)?.files {
            h.part(file.path).part(file.mode.to_le_bytes()).part(Sha256::digest(file.bytes));
        }
        Ok(h.hex())
    }

    fn builtin_dir(&self, name: &str, key: &str) -> PathBuf {
        self.images_dir().join("templates").join(name).join(key)
    }

    /// Built-in `name` if it is built for its current recipe, else `None`. Found, it is held
    /// (with the parent a layered image is backed by) until this store is dropped.
    pub fn cached_builtin(&self, name: &str) -> Result<Option<TemplateImage>, ImageError> {
        let key = self.builtin_key(name)?;
        let dir = self.builtin_dir(name, &key);
        // Held before it is read: a prune either removed it already or now leaves it alone.
        if !self.hold(&dir)? {
            return Ok(None);
        }
        if let Base::Template(parent) = &Self::builtin_recipe(name)?.from {
            if self.cached_builtin(parent)?.is_none() {
                return Ok(None);
            }
        }
        let Some(meta) = util::read_meta::<BuiltinMeta>(&dir.join("template.json")) else { return Ok(None) };
        let rootfs = dir.join(if meta.layered { "rootfs.qcow2" } else { "rootfs.ext4" });
        if meta.key != key || meta.format != TEMPLATE_FORMAT || !rootfs.is_file() {
            return Ok(None);
        }
        Ok(Some(TemplateImage {
            name: meta.recipe.name,
            rootfs,
            layered: meta.layered,
            hash: key,
            disk_gb: meta.recipe.build.disk_gb.into(),
            description: meta.recipe.description,
            config: meta.config,
            start: meta.start,
        }))
    }

    /// Delete the images no built-in of this build uses: templates of other recipes (older
    /// keys, names no longer built in) and Debian roots under none of them. Each name is
    /// pruned holding its build lock, so nothing being built is touched, and a template
    /// another process holds (a running server of another version) is kept. Returns the
    /// directories removed.
    pub fn prune(&self) -> Result<Vec<PathBuf>, ImageError> {
        let mut keep_debian = BTreeSet::new();
        for name in Self::template_names() {
            let recipe = Self::builtin_recipe(name)?;
            if let Base::Debian(debian) = &recipe.from {
                keep_debian.insert(self.debian_hash(debian, recipe.build.disk_gb)?);
            }
        }
        let mut removed = vec![];
        let templates = self.images_dir().join("templates");
        for name in subdirs(&templates)? {
            let current = match Self::builtin(&name) {
                Ok(_) => Some(self.builtin_key(&name)?),
                Err(_) => None,
            };
            let _lock = self.lock_builtin(&name)?;
            let mut held = false;
            for key in subdirs(&templates.join(&name))? {
                if current.as_deref() != Some(key.as_str()) {
                    let dir = templates.join(&name).join(key);
                    let Some(_unused) = InUse::unused(&dir)? else {
                        tracing::info!(dir = %dir.display(), "kept: a running process uses it");
                        held = true;
                        continue;
                    };
                    removed.push(remove_dir(&dir)?);
                }
            }
            if current.is_none() && !held {
                removed.push(remove_dir(&templates.join(&name))?);
            }
        }
        let debian = self.images_dir().join("debian");
        let _lock = BuildLock::acquire(&self.images_dir(), "debian")?;
        for hash in subdirs(&debian)? {
            // A pushed template's root (DebianBase::for_push) is kept: templates stand on it.
            let meta: Option<DebianMeta> = util::read_meta(&debian.join(&hash).join("debian.json"));
            let pushed = meta.is_some_and(|m| m.base.is_push_root());
            if !keep_debian.contains(&hash) && !pushed {
                removed.push(remove_dir(&debian.join(hash))?);
            }
        }
        Ok(removed)
    }

    /// Take the build lock of built-in `name`; re-check [`ImageStore::cached_builtin`] once
    /// it is held.
    pub fn lock_builtin(&self, name: &str) -> Result<BuiltinLock, ImageError> {
        Ok(BuiltinLock(BuildLock::acquire(&self.images_dir(), &format!("template-{name}"))?))
    }

    /// Publish built-in `name` under `key` from its finished disk (`disk`, a raw or qcow2
    /// image). Over a Debian root it is flattened into one sparse raw image; over another
    /// built-in (`parent`, the bottom of `disk`'s chain) it keeps only what differs from the
    /// parent, as a qcow2 layer backed by the parent's image, so each built-in costs only
    /// its own additions.
    pub fn publish_builtin(
        &self,
        name: &str,
        key: &str,
        disk: &Path,
        parent: Option<&TemplateImage>,
        outcome: BuiltinOutcome,
    ) -> Result<TemplateImage, ImageError> {
        let recipe = Self::builtin_recipe(name)?;
        let dir = self.builtin_dir(name, key);
        let name_dir = dir.parent().expect("a template dir has a parent").to_path_buf();
        util::remove_stale_temps(&name_dir);
        let tmp = util::temp_dir_in(&name_dir)?;
        let out = tmp.path().join("out");
        fs::create_dir(&out).map_err(ImageError::io("create directory", &out))?;
        let mut cmd = Command::new("qemu-img");
        let step = match parent {
            None => {
                cmd.args(["convert", "-O", "raw"]).arg(disk).arg(out.join("rootfs.ext4"));
                Step::start(format!("flattening template {name}"))
            }
            Some(parent) => {
                // `disk` is the top of a chain of step layers over the parent's image. A copy
                // of it rebased onto that image (rebase's safe mode writes every cluster the
                // chain in between changed) holds all the steps' changes; `convert -B` would
                // keep only the top layer's.
                let layer = out.join("rootfs.qcow2");
                fs::copy(disk, &layer).map_err(ImageError::io("copy the top layer", disk))?;
                let format = if parent.layered { "qcow2" } else { "raw" };
                // The layer names its parent by this path for good: resolved, so that a data
                // directory reached through a link (a test node sharing an image cache) does
                // not leave it naming a path that goes away with the link.
                let parent_rootfs =
                    fs::canonicalize(&parent.rootfs).map_err(ImageError::io("resolve", &parent.rootfs))?;
                cmd.args(["rebase", "-f", "qcow2", "-F", format, "-b"]).arg(&parent_rootfs).arg(&layer);
                Step::start(format!("writing template {name} as a layer over {}", parent.name))
            }
        };
        util::run(&mut cmd, "apt-get install qemu-utils")?;
        step.finish();
        let meta = BuiltinMeta {
            format: TEMPLATE_FORMAT,
            key: key.into(),
            recipe,
            config: outcome.config,
            start: outcome.start,
            build_seconds: outcome.build_seconds,
            layered: parent.is_some(),
        };
        util::write_meta(&out.join("template.json"), &meta)?;
        util::publish(&out, &dir)?;
        tracing::info!(template = name, %key, seconds = meta.build_seconds, "built-in template published");
        self.cached_builtin(name)?.ok_or_else(|| ImageError::Metadata {
            path: dir.join("template.json"),
            reason: "incomplete after build".into(),
        })
    }
}

/// Names of the directories in `dir` (none if it does not exist), leaving out hidden ones
/// (temporary directories of a publish under way).
fn subdirs(dir: &Path) -> Result<Vec<String>, ImageError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(ImageError::io("read directory", dir)(e)),
    };
    Ok(entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| !name.starts_with('.'))
        .collect())
}

fn remove_dir(dir: &Path) -> Result<PathBuf, ImageError> {
    fs::remove_dir_all(dir).map_err(ImageError::io("remove directory", dir))?;
    Ok(dir.to_owned())
}

fn context_of(files: &'static [BuiltinFile]) -> Result<BuiltinContext, lizard_recipe::ContextError> {
    let mut entries = BTreeMap::new();
    let mut contents = Vec::new();
    for file in files {
        let sha256 = hex::encode(Sha256::digest(file.bytes));
        let mut dir = Path::new(file.path).parent();
        while let Some(d) = dir.filter(|d| !d.as_os_str().is_empty()) {
            let path = d.to_str().expect("built-in paths are UTF-8").to_owned();
            entries.insert(path.clone(), Entry { path, mode: 0o755, kind: EntryKind::Dir });
            dir = d.parent();
        }
        let kind = EntryKind::File { sha256: sha256.clone(), size: file.bytes.len() as u64 };
        entries.insert(file.path.to_owned(), Entry { path: file.path.to_owned(), mode: file.mode, kind });
        contents.push((sha256, file.bytes));
    }
    let context = Context::from_manifest(entries.into_values().collect(), ContextLimits::default())?;
    Ok(BuiltinContext { context, contents })
}

/// Debian policy: lower-case letters, digits, `+ - .`, at least two characters, starting
/// alphanumeric. Checked because the list is joined with commas for mmdebstrap.
fn is_package_name(name: &str) -> bool {
    name.len() >= 2
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c))
}

fn check_debian_base(base: &DebianBase) -> Result<(), ImageError> {
    let bad = |reason: String| ImageError::Recipe { name: format!("debian {}", base.debian), reason };
    if !base.debian.chars().all(|c| c.is_ascii_lowercase() || c == '-') || base.debian.is_empty() {
        return Err(bad(format!("{:?} is not a Debian suite name", base.debian)));
    }
    if let Some(p) = base.packages.iter().find(|p| !is_package_name(p)) {
        return Err(bad(format!("{p:?} is not a Debian package name")));
    }
    Ok(())
}

/// The cache key of a Debian image.
fn debian_hash(base: &DebianBase, disk_gb: u32, ca_bundle: Option<&[u8]>) -> String {
    let mut h = Hasher::default();
    h.part(TEMPLATE_FORMAT.to_le_bytes()).part(&base.debian).part(disk_gb.to_le_bytes());
    for package in &base.packages {
        h.part(package);
    }
    h.part("options");
    for option in MMDEBSTRAP_OPTIONS {
        h.part(option);
    }
    match ca_bundle {
        Some(bytes) => h.part("ca-bundle").part(bytes),
        None => h.part("debian-ca-bundle"),
    };
    h.hex()
}

/// mmdebstrap → sandbox adjustments → mkfs.ext4, all inside `work`.
fn build_rootfs(
    base: &DebianBase,
    disk_gb: u32,
    ca_bundle: Option<&[u8]>,
    work: &Path,
    image: &Path,
) -> Result<(), ImageError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(ImageError::NeedsRoot(format!("building a Debian {} root (mmdebstrap --mode=root)", base.debian)));
    }
    let root = work.join("root");
    let step = Step::start(format!("mmdebstrap {} ({} packages)", base.debian, base.packages.len()));
    let mut cmd = Command::new("mmdebstrap");
    cmd.args(MMDEBSTRAP_OPTIONS);
    if !base.packages.is_empty() {
        cmd.arg(format!("--include={}", base.packages.join(",")));
    }
    cmd.arg(&base.debian).arg(&root).env("LC_ALL", "C");
    util::run(&mut cmd, "apt-get install mmdebstrap")?;
    step.finish();

    let step = Step::start(format!("configuring the Debian {} root", base.debian));
    customize(&root, ca_bundle)?;
    step.finish();

    let step = Step::start(format!("mkfs.ext4 ({disk_gb} GiB)"));
    let mut cmd = Command::new("mkfs.ext4");
    cmd.args(["-q", "-F", "-L", "lizard-root", "-d"])
        .arg(&root)
        .args(["-E", "root_owner=0:0"])
        .arg(image)
        .arg(format!("{disk_gb}G"));
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
    fn a_builtins_files_become_a_context_with_their_directories() {
        static FILES: &[BuiltinFile] = &[
            BuiltinFile { path: "bin/tools/run.sh", mode: 0o755, bytes: b"#!/bin/sh\n" },
            BuiltinFile { path: "server.py", mode: 0o644, bytes: b"print(1)\n" },
        ];
        let built = context_of(FILES).unwrap();
        let paths: Vec<(&str, u32)> = built.context.entries.iter().map(|e| (e.path.as_str(), e.mode)).collect();
        assert_eq!(paths, [("bin", 0o755), ("bin/tools", 0o755), ("bin/tools/run.sh", 0o755), ("server.py", 0o644)]);
        let copied: Vec<&str> = built.context.select("bin").unwrap().iter().map(|e| e.path.as_str()).collect();
        assert_eq!(copied, ["bin", "bin/tools", "bin/tools/run.sh"]);
        let sha = hex::encode(Sha256::digest(b"print(1)\n"));
        assert!(built.contents.iter().any(|(h, bytes)| *h == sha && *bytes == b"print(1)\n"));
        assert!(built.context.hashes().contains(&sha.as_str()));
    }

    /// `qemu-img create` with `args`.
    fn qemu_img(args: &[&str]) {
        let status = Command::new("qemu-img").args(args).stdout(std::process::Stdio::null()).status().unwrap();
        assert!(status.success(), "qemu-img {args:?}");
    }

    #[test]
    fn a_layer_names_its_parent_by_its_resolved_path_not_through_a_link() {
        // A data directory whose images are reached through a link (a test node sharing a
        // cache): the published layer must name the parent where it really is.
        let root = tempfile::tempdir().unwrap();
        let (cache, data) = (root.path().join("cache"), root.path().join("node"));
        fs::create_dir_all(cache.join("images")).unwrap();
        fs::create_dir_all(&data).unwrap();
        std::os::unix::fs::symlink(cache.join("images"), data.join("images")).unwrap();
        let store = ImageStore::new(&data);
        let parent_dir = store.images_dir().join("templates").join("base").join("k0");
        fs::create_dir_all(&parent_dir).unwrap();
        let parent_rootfs = parent_dir.join("rootfs.ext4");
        qemu_img(&["create", "-q", "-f", "raw", parent_rootfs.to_str().unwrap(), "1M"]);
        let top = root.path().join("top.qcow2");
        qemu_img(&[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-F",
            "raw",
            "-b",
            parent_rootfs.to_str().unwrap(),
            top.to_str().unwrap(),
        ]);
        let parent = TemplateImage {
            name: "base".into(),
            rootfs: parent_rootfs.clone(),
            layered: false,
            hash: "k0".into(),
            disk_gb: 1,
            description: String::new(),
            config: TemplateConfig::default(),
            start: None,
        };
        let outcome = BuiltinOutcome { config: TemplateConfig::default(), start: None, build_seconds: 0.0 };
        // Its answer needs the whole chain built; what is published is what this checks.
        let _ = store.publish_builtin("interpreter", "k1", &top, Some(&parent), outcome);
        let layer = cache.join("images/templates/interpreter/k1/rootfs.qcow2");
        let info = Command::new("qemu-img").args(["info", "--output=json", "-U"]).arg(&layer).output().unwrap();
        let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
        let backing = info["backing-filename"].as_str().unwrap_or_default();
        assert_eq!(Path::new(backing), fs::canonicalize(&parent_rootfs).unwrap(), "{info}");
        assert!(!backing.starts_with(data.to_str().unwrap()), "the layer names its parent through the link");
    }

    #[test]
    fn builtin_recipes_parse_and_chain() {
        let names = ImageStore::template_names();
        assert_eq!(
            names,
            ["base", "code-interpreter-v1", "interpreter", "desktop", "claude", "codex", "opencode", "pi", "prime"]
        );
        // Every built-in parses, builds on Debian or an earlier built-in, and its files make
        // a context.
        for (i, name) in names.iter().enumerate() {
            let recipe = ImageStore::builtin_recipe(name).unwrap();
            if let Base::Template(parent) = &recipe.from {
                assert!(names[..i].contains(&parent.as_str()), "{name}: {parent} must come before it");
            }
            ImageStore::builtin_context(name).unwrap();
        }
        let base = ImageStore::builtin_recipe("base").unwrap();
        let Base::Debian(debian) = &base.from else { panic!("base is built from Debian") };
        assert_eq!(debian.debian, "forky", "the suite with Python 3.14");
        for p in ["bash", "curl", "git", "procps", "ca-certificates", "iproute2", "python3"] {
            assert!(debian.packages.iter().any(|x| x == p), "base lacks {p}");
        }
        check_debian_base(debian).unwrap();
        let ci = ImageStore::builtin_recipe("code-interpreter-v1").unwrap();
        assert_eq!(ci.from, Base::Template("base".into()));
        for agent in ["claude", "codex", "opencode", "pi"] {
            let recipe = ImageStore::builtin_recipe(agent).unwrap();
            assert_eq!(recipe.from, Base::Template("code-interpreter-v1".into()), "{agent}");
        }
        assert!(matches!(ImageStore::builtin_recipe("nope"), Err(ImageError::UnknownTemplate(_))));
    }

    #[test]
    fn keys_follow_the_recipe_chain_and_the_ca_bundle() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("bundle.pem");
        fs::write(&bundle, "one").unwrap();
        let store = ImageStore::new(dir.path()).with_ca_bundle(Some(bundle.clone()));
        let base = store.builtin_key("base").unwrap();
        let ci = store.builtin_key("code-interpreter-v1").unwrap();
        assert_ne!(base, ci);
        assert_eq!(base, store.builtin_key("base").unwrap(), "deterministic");
        fs::write(&bundle, "two").unwrap();
        assert_ne!(base, store.builtin_key("base").unwrap(), "the CA bundle is an input");
        assert_ne!(ci, store.builtin_key("code-interpreter-v1").unwrap(), "a base change reaches its children");
        assert!(store.cached_builtin("base").unwrap().is_none());
    }

    #[test]
    fn prune_keeps_only_the_current_recipes_images() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("bundle.pem");
        fs::write(&bundle, "one").unwrap();
        let store = ImageStore::new(dir.path().join("data")).with_ca_bundle(Some(bundle));
        let images = store.images_dir();
        let base = store.builtin_key("base").unwrap();
        let recipe = ImageStore::builtin_recipe("base").unwrap();
        let Base::Debian(debian) = &recipe.from else { panic!("base is built from Debian") };
        let root = store.debian_hash(debian, recipe.build.disk_gb).unwrap();
        let kept = [
            images.join("templates/base").join(&base),
            images.join("debian").join(&root),
            images.join("templates/base/.tmp-publish"),
        ];
        let gone = [images.join("templates/base/0ld"), images.join("templates/retired/k1"), images.join("debian/0ld")];
        for d in kept.iter().chain(&gone) {
            fs::create_dir_all(d).unwrap();
            fs::write(d.join("rootfs.ext4"), "x").unwrap();
        }
        // A pushed template's Debian root stays; another Debian root no recipe names goes.
        let meta = |base: DebianBase| DebianMeta {
            format: 3,
            hash: String::new(),
            base,
            disk_gb: 4,
            ca_bundle: None,
            build_seconds: 1.0,
        };
        let pushed = images.join("debian/pushed");
        let other = images.join("debian/other");
        for (dir, base) in [
            (&pushed, DebianBase::for_push("bookworm").unwrap()),
            (&other, DebianBase { debian: "bookworm".into(), packages: vec!["openssh-server".into()] }),
        ] {
            fs::create_dir_all(dir).unwrap();
            util::write_meta(&dir.join("debian.json"), &meta(base)).unwrap();
        }
        let mut removed = store.prune().unwrap();
        assert!(pushed.join("debian.json").is_file() && !other.exists());
        removed.retain(|d| d != &other);
        removed.sort();
        let mut expected = vec![gone[0].clone(), gone[1].clone(), images.join("templates/retired"), gone[2].clone()];
        expected.sort();
        assert_eq!(removed, expected);
        for d in &kept {
            assert!(d.join("rootfs.ext4").is_file(), "{} was removed", d.display());
        }
        for d in &gone {
            assert!(!d.exists(), "{} is still there", d.display());
        }
        assert!(store.prune().unwrap().is_empty(), "nothing left to prune");
    }

    #[test]
    fn prune_leaves_what_another_process_holds() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::new(dir.path().join("data")).with_ca_bundle(None);
        let templates = store.images_dir().join("templates");
        let (old, retired) = (templates.join("base/0ld"), templates.join("retired/k1"));
        for d in [&old, &retired] {
            fs::create_dir_all(d).unwrap();
            fs::write(d.join("rootfs.ext4"), "x").unwrap();
        }
        // A lock of its own open file, as another process's server would hold it.
        let held = [InUse::hold(&old).unwrap().unwrap(), InUse::hold(&retired).unwrap().unwrap()];
        assert!(store.prune().unwrap().is_empty(), "a held image was removed");
        assert!(old.join("rootfs.ext4").is_file() && retired.join("rootfs.ext4").is_file());
        drop(held);
        let mut removed = store.prune().unwrap();
        removed.sort();
        assert_eq!(removed, [old, templates.join("retired"), retired.clone()]);
        assert!(InUse::hold(&retired).unwrap().is_none(), "a removed directory cannot be held");
    }

    #[test]
    fn a_found_template_is_held_while_its_store_lives() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::new(dir.path().join("data")).with_ca_bundle(None);
        let key = store.builtin_key("base").unwrap();
        let published = store.builtin_dir("base", &key);
        fs::create_dir_all(&published).unwrap();
        fs::write(published.join("rootfs.ext4"), "x").unwrap();
        let meta = BuiltinMeta {
            format: TEMPLATE_FORMAT,
            key,
            recipe: ImageStore::builtin_recipe("base").unwrap(),
            config: TemplateConfig::default(),
            start: None,
            build_seconds: 0.0,
            layered: false,
        };
        util::write_meta(&published.join("template.json"), &meta).unwrap();
        assert!(InUse::unused(&published).unwrap().is_some(), "nothing holds it yet");
        assert!(store.cached_builtin("base").unwrap().is_some());
        assert!(InUse::unused(&published).unwrap().is_none(), "the store that found it holds it");
        drop(store);
        assert!(InUse::unused(&published).unwrap().is_some(), "released with its store");
    }

    #[test]
    fn bad_debian_bases_are_refused() {
        for (suite, packages) in [("forky", vec!["curl,git"]), ("Forky", vec![]), ("", vec![])] {
            let base = DebianBase { debian: suite.into(), packages: packages.into_iter().map(String::from).collect() };
            assert!(check_debian_base(&base).is_err(), "{base:?}");
        }
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
