//! The recipe itself and its TOML form, `lizard.template.toml`:
//!
//! ```toml
//! name = "my-agent"
//! from = "base"                      # or { debian = "bookworm", packages = ["bash"] }
//! [build]                            # the VM the steps run in (all optional)
//! vcpus = 2
//! memory_mib = 2048
//! timeout_s = 1800
//! [sandbox]                          # the size of a sandbox whose create names none
//! vcpus = 2
//! memory_mib = 2048
//! [[steps]]
//! apt = ["ripgrep", "jq"]
//! [[steps]]
//! copy = { src = "tools/", dest = "/opt/tools/" }
//! [[steps]]
//! run = "/opt/tools/setup.sh"
//! [env]
//! TOOLS = "/opt/tools"
//! [start]
//! cmd = "python3 -m http.server 8080"
//! ready = { port = 8080 }
//! ```
//!
//! Every field is checked here, before anything is built, so a bad recipe is refused with the
//! field that is wrong rather than failing minutes into a build.

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// At most this many steps (each is a layer).
pub const MAX_STEPS: usize = 256;

/// A template's recipe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// The template's name: lower-case letters, digits and `-`, 1–63 characters.
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    pub from: Base,
    #[serde(default)]
    pub build: BuildVm,
    /// The default size of the template's sandboxes (and so of its template snapshot).
    #[serde(default, skip_serializing_if = "SandboxSize::is_unset")]
    pub sandbox: SandboxSize,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<Step>,
    /// Environment of every process in the template's sandboxes (after the steps' `env`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// A process started at the end of the build and kept running in the template snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<Start>,
}

/// What a template is built on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Base {
    /// Another Lizard template, built-in or the account's own.
    Template(String),
    /// A Debian root file system made from scratch (built-in templates, and pushed ones
    /// on [`DebianBase::for_push`]).
    Debian(DebianBase),
}

/// `from = { debian = "bookworm", packages = [...] }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DebianBase {
    /// The Debian suite (`bookworm`, `trixie`, `forky`, `sid`).
    pub debian: String,
    /// Packages installed with the base system.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<String>,
}

impl DebianBase {
    /// The suites a pushed template may start from.
    pub const PUSH_SUITES: &'static [&'static str] = &["bookworm", "trixie", "forky", "sid"];
    /// What a pushed template's Debian root holds beyond Debian's required packages: what
    /// a build needs (`useradd`, `sudo`, `resize2fs`), nothing else.
    const PUSH_PACKAGES: &'static [&'static str] =
        &["bash", "ca-certificates", "coreutils", "e2fsprogs", "passwd", "procps", "sudo"];

    /// The Debian root a pushed template may start from on `suite`: made on the node's
    /// host from Debian's signed archive with a fixed package set, so its inputs are as
    /// trusted as a built-in's (the host runs no package a user chose). `None` for a suite
    /// that is not offered.
    pub fn for_push(suite: &str) -> Option<DebianBase> {
        Self::PUSH_SUITES.contains(&suite).then(|| DebianBase {
            debian: suite.to_owned(),
            packages: Self::PUSH_PACKAGES.iter().map(|p| (*p).to_owned()).collect(),
        })
    }

    /// Whether this is a root [`DebianBase::for_push`] makes (pushed templates stand on it).
    pub fn is_push_root(&self) -> bool {
        Self::for_push(&self.debian).as_ref() == Some(self)
    }

    /// The root a pushed template gets for this base: [`DebianBase::for_push`] of its
    /// suite, when it names no packages (or exactly those).
    pub fn pushable(&self) -> Option<DebianBase> {
        let root = Self::for_push(&self.debian)?;
        (self.packages.is_empty() || self.packages == root.packages).then_some(root)
    }
}

// A hand-written visitor: serde's untagged enums report "did not match any variant", which
// tells a user nothing about which key of the table was wrong.
impl<'de> Deserialize<'de> for Base {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct BaseVisitor;
        impl<'de> Visitor<'de> for BaseVisitor {
            type Value = Base;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(r#"a template name or { debian = "<suite>", packages = [...] }"#)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Base, E> {
                Ok(Base::Template(v.to_owned()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Base, A::Error> {
                DebianBase::deserialize(de::value::MapAccessDeserializer::new(map)).map(Base::Debian)
            }
        }
        d.deserialize_any(BaseVisitor)
    }
}

/// The VM a build runs in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BuildVm {
    pub vcpus: u32,
    pub memory_mib: u32,
    /// The whole build's time limit.
    pub timeout_s: u32,
    /// Size of the template's root file system.
    pub disk_gb: u32,
    /// Whether the build may reach the internet (package registries); the platform's
    /// private-range rules hold regardless.
    pub internet: bool,
}

impl Default for BuildVm {
    fn default() -> Self {
        BuildVm { vcpus: 2, memory_mib: 2048, timeout_s: 1800, disk_gb: 4, internet: true }
    }
}

/// `[sandbox]`: the size a create that names none gets. Unset fields fall back to the
/// base template's, then to the node's defaults; a create that names a size wins.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSize {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u32>,
}

impl SandboxSize {
    /// Bounds of a sandbox's vCPUs and memory (MiB), wherever its size comes from.
    pub const VCPUS: (u32, u32) = (1, 16);
    pub const MEMORY_MIB: (u32, u32) = (128, 16384);

    fn is_unset(&self) -> bool {
        *self == SandboxSize::default()
    }

    /// `self`'s fields where set, else `base`'s.
    pub fn or(self, base: SandboxSize) -> SandboxSize {
        SandboxSize { vcpus: self.vcpus.or(base.vcpus), memory_mib: self.memory_mib.or(base.memory_mib) }
    }
}

/// One step; each becomes a layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Step {
    /// Debian packages (`name` or `name=version`), installed with apt.
    Apt(Vec<String>),
    /// Python requirements, installed with pip into the system Python.
    Pip(Vec<String>),
    /// npm packages, installed globally.
    Npm(Vec<String>),
    /// A shell command (`sh -c`), run as the current user in the current directory.
    Run(String),
    /// Files from the pushed directory.
    Copy(Copy),
    /// Variables for the following steps and for the template's sandboxes.
    Env(BTreeMap<String, String>),
    /// The directory of the following steps and of the sandboxes' processes.
    Workdir(String),
    /// The user of the following steps and of the sandboxes' processes.
    User(String),
}

/// `copy = { src = "tools/", dest = "/opt/tools/" }`: `src` relative to the pushed
/// directory (a file or a directory), `dest` absolute in the template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Copy {
    pub src: String,
    pub dest: String,
    /// `user` or `user:group` owning the copied files (default: root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// `[start]`: started at the end of the build; the snapshot is taken once it is ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Start {
    /// A shell command, run in the background as the recipe's final user and directory.
    pub cmd: String,
    #[serde(default)]
    pub ready: Ready,
    /// How long `ready` may take before the build fails.
    #[serde(default = "default_ready_timeout_s")]
    pub ready_timeout_s: u32,
}

fn default_ready_timeout_s() -> u32 {
    120
}

/// When a start command counts as ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Ready {
    /// Something accepts TCP connections on this port of the guest's loopback.
    Port(u16),
    /// A GET of this `http://127.0.0.1…` URL answers 2xx.
    Url(String),
    /// This file exists.
    File(String),
    /// A process whose command name is this runs.
    Process(String),
    /// Simply this many seconds after the start.
    DelayS(u32),
    /// This shell command (`sh -c`, as root) exits 0: E2B's ready commands.
    Cmd(String),
}

impl Default for Ready {
    fn default() -> Self {
        Ready::DelayS(0)
    }
}

/// What a built template carries besides its disk: the environment, directory and user
/// its sandboxes' processes start with, and their default size.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateConfig {
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub user: Option<String>,
    /// Left out when unset, so that the hashes of templates without one stay as they were.
    #[serde(default, skip_serializing_if = "SandboxSize::is_unset")]
    pub size: SandboxSize,
}

/// A recipe that cannot be built, with the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecipeError {
    #[error("{0}")]
    Syntax(String),
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("line {line}: {reason}")]
    Dockerfile { line: usize, reason: String },
}

impl RecipeError {
    fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        RecipeError::Invalid { field: field.into(), reason: reason.into() }
    }
}

impl Recipe {
    /// Parses and checks `lizard.template.toml`.
    pub fn from_toml(text: &str) -> Result<Recipe, RecipeError> {
        let recipe: Recipe = toml::from_str(text).map_err(|e| RecipeError::Syntax(e.to_string()))?;
        recipe.validate()?;
        Ok(recipe)
    }

    /// The recipe as `lizard.template.toml`.
    pub fn to_toml(&self) -> Result<String, RecipeError> {
        toml::to_string(self).map_err(|e| RecipeError::Syntax(e.to_string()))
    }

    /// Checks every field (the builder relies on it: names and packages become argv).
    pub fn validate(&self) -> Result<(), RecipeError> {
        check_name("name", &self.name)?;
        match &self.from {
            Base::Template(t) => check_name("from", t)?,
            Base::Debian(d) => {
                if d.debian.is_empty() || !d.debian.chars().all(|c| c.is_ascii_lowercase()) {
                    return Err(RecipeError::invalid("from.debian", format!("{:?} is not a Debian suite", d.debian)));
                }
                for p in &d.packages {
                    check_apt_package("from.packages", p)?;
                }
            }
        }
        let b = &self.build;
        check_range("build.vcpus", b.vcpus, 1, 16)?;
        check_range("build.memory_mib", b.memory_mib, 256, 16384)?;
        check_range("build.timeout_s", b.timeout_s, 10, 4 * 3600)?;
        check_range("build.disk_gb", b.disk_gb, 1, 1024)?;
        if let Some(vcpus) = self.sandbox.vcpus {
            let (min, max) = SandboxSize::VCPUS;
            check_range("sandbox.vcpus", vcpus, min, max)?;
        }
        if let Some(memory_mib) = self.sandbox.memory_mib {
            let (min, max) = SandboxSize::MEMORY_MIB;
            check_range("sandbox.memory_mib", memory_mib, min, max)?;
        }
        if self.steps.len() > MAX_STEPS {
            return Err(RecipeError::invalid("steps", format!("{} steps; at most {MAX_STEPS}", self.steps.len())));
        }
        for (i, step) in self.steps.iter().enumerate() {
            step.validate(&format!("steps[{}]", i + 1))?;
        }
        check_env("env", &self.env)?;
        if let Some(start) = &self.start {
            check_text("start.cmd", &start.cmd)?;
            check_range("start.ready_timeout_s", start.ready_timeout_s, 1, 3600)?;
            match &start.ready {
                Ready::Port(0) => return Err(RecipeError::invalid("start.ready.port", "port 0")),
                Ready::Url(u) if !u.starts_with("http://127.0.0.1") && !u.starts_with("http://localhost") => {
                    return Err(RecipeError::invalid(
                        "start.ready.url",
                        "must be http://127.0.0.1… or http://localhost…",
                    ))
                }
                Ready::File(f) => check_absolute("start.ready.file", f)?,
                Ready::Process(p) => check_text("start.ready.process", p)?,
                Ready::Cmd(c) => check_text("start.ready.cmd", c)?,
                Ready::DelayS(s) => check_range("start.ready.delay_s", *s, 0, 600)?,
                Ready::Port(_) | Ready::Url(_) => {}
            }
        }
        Ok(())
    }

    /// The environment, directory and user the template's sandboxes start with: the
    /// steps' `env`, `workdir` and `user` in order, then `[env]`.
    pub fn config(&self) -> TemplateConfig {
        let mut config = TemplateConfig::default();
        for step in &self.steps {
            match step {
                Step::Env(vars) => config.env.extend(vars.clone()),
                Step::Workdir(dir) => config.workdir = Some(dir.clone()),
                Step::User(user) => config.user = Some(user.clone()),
                _ => {}
            }
        }
        config.env.extend(self.env.clone());
        config.size = self.sandbox;
        config
    }
}

impl Step {
    fn validate(&self, field: &str) -> Result<(), RecipeError> {
        let list = |kind: &str, items: &[String], check: fn(&str, &str) -> Result<(), RecipeError>| {
            if items.is_empty() {
                return Err(RecipeError::invalid(format!("{field}.{kind}"), "an empty list"));
            }
            items.iter().try_for_each(|item| check(&format!("{field}.{kind}"), item))
        };
        match self {
            Step::Apt(p) => list("apt", p, check_apt_package),
            Step::Pip(p) => list("pip", p, check_argument),
            Step::Npm(p) => list("npm", p, check_argument),
            Step::Run(cmd) => check_text(&format!("{field}.run"), cmd),
            Step::Copy(c) => {
                check_relative(&format!("{field}.copy.src"), &c.src)?;
                check_absolute(&format!("{field}.copy.dest"), &c.dest)?;
                match &c.owner {
                    Some(owner) => check_owner(&format!("{field}.copy.owner"), owner),
                    None => Ok(()),
                }
            }
            Step::Env(vars) => check_env(&format!("{field}.env"), vars),
            Step::Workdir(dir) => check_absolute(&format!("{field}.workdir"), dir),
            Step::User(user) => check_owner(&format!("{field}.user"), user),
        }
    }

    /// One line for build logs: `apt ripgrep jq`, `copy tools/ → /opt/tools/`.
    pub fn summary(&self) -> String {
        let mut line = match self {
            Step::Apt(p) => format!("apt {}", p.join(" ")),
            Step::Pip(p) => format!("pip {}", p.join(" ")),
            Step::Npm(p) => format!("npm {}", p.join(" ")),
            Step::Run(cmd) => format!("run {}", cmd.lines().next().unwrap_or_default()),
            Step::Copy(c) => format!("copy {} → {}", c.src, c.dest),
            Step::Env(vars) => format!("env {}", vars.keys().cloned().collect::<Vec<_>>().join(" ")),
            Step::Workdir(dir) => format!("workdir {dir}"),
            Step::User(user) => format!("user {user}"),
        };
        if line.chars().count() > 100 {
            line = line.chars().take(99).chain(['…']).collect();
        }
        line
    }
}

/// Template names: `[a-z0-9]` then `[a-z0-9-]`, 1–63 characters, no trailing `-`.
pub fn is_template_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && !name.ends_with('-')
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

fn check_name(field: &str, name: &str) -> Result<(), RecipeError> {
    if is_template_name(name) {
        Ok(())
    } else {
        Err(RecipeError::invalid(
            field,
            format!("{name:?} is not a template name (lower-case letters, digits and '-', 1-63 characters)"),
        ))
    }
}

fn check_range(field: &str, value: u32, min: u32, max: u32) -> Result<(), RecipeError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(RecipeError::invalid(field, format!("{value} is outside {min}..={max}")))
    }
}

/// Non-empty, no NUL (it would cut an argument short).
fn check_text(field: &str, text: &str) -> Result<(), RecipeError> {
    if text.trim().is_empty() {
        Err(RecipeError::invalid(field, "empty"))
    } else if text.contains('\0') {
        Err(RecipeError::invalid(field, "contains a NUL byte"))
    } else {
        Ok(())
    }
}

/// A package manager's argument: it must not read as an option (`--index-url=…`).
fn check_argument(field: &str, arg: &str) -> Result<(), RecipeError> {
    check_text(field, arg)?;
    if arg.starts_with('-') {
        return Err(RecipeError::invalid(
            field,
            format!("{arg:?} looks like an option; only package specs are allowed"),
        ));
    }
    if arg.chars().any(char::is_control) {
        return Err(RecipeError::invalid(field, format!("{arg:?} contains control characters")));
    }
    Ok(())
}

/// Debian policy names (`[a-z0-9][a-z0-9+.-]+`), optionally `=version`.
fn check_apt_package(field: &str, spec: &str) -> Result<(), RecipeError> {
    let (name, version) = spec.split_once('=').unwrap_or((spec, ""));
    let name_ok = name.len() >= 2
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c));
    let version_ok = !spec.contains('=')
        || (!version.is_empty() && version.chars().all(|c| c.is_ascii_alphanumeric() || ".+~:-".contains(c)));
    if name_ok && version_ok {
        Ok(())
    } else {
        Err(RecipeError::invalid(field, format!("{spec:?} is not a Debian package (name or name=version)")))
    }
}

fn check_absolute(field: &str, path: &str) -> Result<(), RecipeError> {
    check_text(field, path)?;
    if path.starts_with('/') {
        Ok(())
    } else {
        Err(RecipeError::invalid(field, format!("{path:?} is not an absolute path")))
    }
}

/// A path inside the pushed directory: relative, and never above it.
fn check_relative(field: &str, path: &str) -> Result<(), RecipeError> {
    check_text(field, path)?;
    crate::context::normalize(path).map(|_| ()).map_err(|e| RecipeError::invalid(field, e.to_string()))
}

/// `user` or `user:group` (POSIX portable names).
fn check_owner(field: &str, owner: &str) -> Result<(), RecipeError> {
    let portable = |n: &str| {
        (1..=32).contains(&n.len())
            && n.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && n.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_-".contains(c))
    };
    let ok = match owner.split_once(':') {
        Some((user, group)) => portable(user) && portable(group),
        None => portable(owner),
    };
    if ok {
        Ok(())
    } else {
        Err(RecipeError::invalid(field, format!("{owner:?} is not a user name (or user:group)")))
    }
}

fn check_env(field: &str, vars: &BTreeMap<String, String>) -> Result<(), RecipeError> {
    for (key, value) in vars {
        let key_ok = key.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !key_ok {
            return Err(RecipeError::invalid(field, format!("{key:?} is not a variable name")));
        }
        if value.contains('\0') {
            return Err(RecipeError::invalid(format!("{field}.{key}"), "contains a NUL byte"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pushed_debian_root_is_one_of_the_offered_suites_with_the_fixed_packages() {
        let bookworm = DebianBase::for_push("bookworm").unwrap();
        assert!(bookworm.packages.contains(&"sudo".to_owned()));
        assert_eq!(bookworm.pushable(), Some(bookworm.clone()));
        assert!(bookworm.is_push_root());
        let bare = DebianBase { debian: "bookworm".into(), packages: vec![] };
        assert_eq!(bare.pushable(), Some(bookworm.clone()));
        assert!(!bare.is_push_root());
        assert!(DebianBase::for_push("jessie").is_none());
        let more = DebianBase { packages: vec!["openssh-server".into()], ..bookworm.clone() };
        assert_eq!(more.pushable(), None);
        assert_eq!(DebianBase { debian: "jessie".into(), ..bare }.pushable(), None);
    }

    const FULL: &str = r#"
        name = "my-agent"
        from = "base"
        [build]
        vcpus = 1
        memory_mib = 1024
        [[steps]]
        apt = ["ripgrep", "jq=1.6-2.1"]
        [[steps]]
        pip = ["requests==2.32.3"]
        [[steps]]
        npm = ["typescript@5"]
        [[steps]]
        copy = { src = "tools/", dest = "/opt/tools/" }
        [[steps]]
        run = "chmod +x /opt/tools/*.sh && /opt/tools/setup.sh"
        [[steps]]
        env = { TOOLS = "/opt/tools" }
        [[steps]]
        workdir = "/srv"
        [[steps]]
        user = "user"
        [env]
        MODE = "prod"
        [start]
        cmd = "python3 -m http.server 8080 --directory /srv"
        ready = { port = 8080 }
    "#;

    #[test]
    fn every_step_kind_parses_in_order() {
        let r = Recipe::from_toml(FULL).unwrap();
        assert_eq!(r.name, "my-agent");
        assert_eq!(r.from, Base::Template("base".into()));
        assert_eq!((r.build.vcpus, r.build.memory_mib, r.build.timeout_s), (1, 1024, 1800));
        let kinds: Vec<_> = r.steps.iter().map(|s| s.summary().split(' ').next().unwrap().to_owned()).collect();
        assert_eq!(kinds, ["apt", "pip", "npm", "copy", "run", "env", "workdir", "user"]);
        assert_eq!(r.start.as_ref().unwrap().ready, Ready::Port(8080));
        let config = r.config();
        assert_eq!(config.workdir.as_deref(), Some("/srv"));
        assert_eq!(config.user.as_deref(), Some("user"));
        assert_eq!(config.env.get("TOOLS").map(String::as_str), Some("/opt/tools"));
        assert_eq!(config.env.get("MODE").map(String::as_str), Some("prod"));
    }

    #[test]
    fn a_recipe_survives_its_own_toml() {
        let r = Recipe::from_toml(FULL).unwrap();
        assert_eq!(Recipe::from_toml(&r.to_toml().unwrap()).unwrap(), r);
    }

    #[test]
    fn a_debian_base_is_a_table() {
        let r = Recipe::from_toml("name = \"base\"\nfrom = { debian = \"bookworm\", packages = [\"bash\"] }").unwrap();
        assert_eq!(r.from, Base::Debian(DebianBase { debian: "bookworm".into(), packages: vec!["bash".into()] }));
        let e = Recipe::from_toml("name = \"x\"\nfrom = { debain = \"bookworm\" }").unwrap_err().to_string();
        assert!(e.contains("debain"), "{e}");
    }

    fn error(text: &str) -> String {
        Recipe::from_toml(text).unwrap_err().to_string()
    }

    #[test]
    fn bad_recipes_name_the_field() {
        let head = "name = \"t\"\nfrom = \"base\"\n";
        for (body, want) in [
            ("[[steps]]\napt = [\"-o=APT::x\"]", "steps[1].apt"),
            ("[[steps]]\npip = [\"--index-url=http://x\"]", "looks like an option"),
            ("[[steps]]\nnpm = []", "an empty list"),
            ("[[steps]]\ncopy = { src = \"../etc\", dest = \"/x\" }", "steps[1].copy.src"),
            ("[[steps]]\ncopy = { src = \"/etc/passwd\", dest = \"/x\" }", "steps[1].copy.src"),
            ("[[steps]]\ncopy = { src = \"a\", dest = \"x\" }", "not an absolute path"),
            ("[[steps]]\nrun = \"  \"", "steps[1].run: empty"),
            ("[[steps]]\nuser = \"Root\"", "not a user name"),
            ("[[steps]]\nenv = { \"1X\" = \"y\" }", "not a variable name"),
            ("[[steps]]\nrun = \"a\"\napt = [\"b\"]", "steps"),
            ("[[steps]]\nfrobnicate = \"a\"", "frobnicate"),
            ("[build]\nvcpus = 99", "build.vcpus: 99 is outside 1..=16"),
            ("[sandbox]\nvcpus = 0", "sandbox.vcpus: 0 is outside 1..=16"),
            ("[sandbox]\nmemory_mib = 64", "sandbox.memory_mib: 64 is outside 128..=16384"),
            ("[sandbox]\ndisk_gb = 4", "disk_gb"),
            ("[start]\ncmd = \"x\"\nready = { url = \"http://example.test/\" }", "start.ready.url"),
            ("[start]\ncmd = \"x\"\nready = { port = 0 }", "start.ready.port"),
            ("colour = \"blue\"", "colour"),
        ] {
            let e = error(&format!("{head}{body}"));
            assert!(e.contains(want), "{body:?}: {e:?} lacks {want:?}");
        }
        assert!(error("name = \"Bad_Name\"\nfrom = \"base\"").starts_with("name:"));
        assert!(error("name = \"ok\"\nfrom = \"python:3.12\"").starts_with("from:"));
        assert!(error("name = \"ok\"").contains("from"));
    }

    #[test]
    fn sandbox_sizes_reach_the_config_and_fall_back_field_by_field() {
        let r = Recipe::from_toml("name = \"t\"\nfrom = \"base\"\n[sandbox]\nmemory_mib = 2048").unwrap();
        let size = r.config().size;
        assert_eq!(size, SandboxSize { vcpus: None, memory_mib: Some(2048) });
        let base = SandboxSize { vcpus: Some(4), memory_mib: Some(1024) };
        assert_eq!(size.or(base), SandboxSize { vcpus: Some(4), memory_mib: Some(2048) });
        assert_eq!(Recipe::from_toml(&r.to_toml().unwrap()).unwrap(), r);
        // A recipe without one serializes its config as before (template hashes stay put).
        let plain = Recipe::from_toml("name = \"t\"\nfrom = \"base\"").unwrap();
        assert!(!serde_json::to_string(&plain.config()).unwrap().contains("size"));
        assert!(!plain.to_toml().unwrap().contains("sandbox"));
    }

    #[test]
    fn template_names() {
        for ok in ["base", "code-interpreter-v1", "a", "0x"] {
            assert!(is_template_name(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64)] {
            assert!(!is_template_name(bad), "{bad}");
        }
    }

    #[test]
    fn summaries_are_one_short_line() {
        let s = Step::Run(format!("{}\nsecond line", "x".repeat(300))).summary();
        assert!(!s.contains('\n'));
        assert_eq!(s.chars().count(), 100);
    }
}
