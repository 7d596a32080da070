//! The build context: the directory a push sends, as a list of entries with content hashes.
//!
//! The list decides what is uploaded (only files whose hash the server lacks), what a `copy`
//! step takes, and the copy layers' cache keys. Paths are relative, `/`-separated and never
//! leave the directory: the walk does not follow symlinks, and a symlink is recorded with
//! whether its target stays inside, so a `copy` can refuse one that points out.
//! `.lizardignore` (gitignore syntax) leaves paths out.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Component, Path, PathBuf};

/// The ignore file of a context, in gitignore syntax.
pub const IGNORE_FILE: &str = ".lizardignore";

/// Bounds on what a push may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextLimits {
    /// Total size of the files.
    pub max_bytes: u64,
    pub max_entries: usize,
}

impl Default for ContextLimits {
    fn default() -> Self {
        ContextLimits { max_bytes: 512 << 20, max_entries: 100_000 }
    }
}

/// What an entry is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum EntryKind {
    /// A regular file: its SHA-256 (hex) and size.
    File {
        sha256: String,
        size: u64,
    },
    Dir,
    /// A symbolic link, and whether its target resolves inside the context.
    Symlink {
        target: String,
        inside: bool,
    },
}

/// One path of the context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// Relative, `/`-separated.
    pub path: String,
    /// Permission bits.
    pub mode: u32,
    #[serde(flatten)]
    pub kind: EntryKind,
}

/// A scanned directory (entries sorted by path).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Context {
    pub entries: Vec<Entry>,
}

/// Why a context was refused.
#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error("{path:?}: absolute paths are not allowed; paths are relative to the pushed directory")]
    Absolute { path: String },
    #[error("{path:?} leaves the pushed directory")]
    Escapes { path: String },
    #[error("{path:?} is not in the pushed directory")]
    Missing { path: String },
    #[error("{path:?} is a symbolic link to {target:?}, outside the pushed directory")]
    SymlinkOut { path: String, target: String },
    #[error("{path:?} is neither a file, a directory nor a symbolic link")]
    Special { path: String },
    #[error("{path:?}: the name is not UTF-8")]
    NotUtf8 { path: String },
    #[error("manifest entry {path:?}: {reason}")]
    BadManifest { path: String, reason: &'static str },
    #[error("the pushed directory holds more than {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("the pushed directory holds more than {limit} entries")]
    TooManyEntries { limit: usize },
    #[error("cannot read {path:?}: {cause}")]
    Io { path: String, cause: std::io::Error },
    #[error("cannot walk the pushed directory: {0}")]
    Walk(ignore::Error),
}

impl From<ignore::Error> for ContextError {
    fn from(e: ignore::Error) -> Self {
        ContextError::Walk(e)
    }
}

/// `a/./b/../c/` → `a/c`; `""` and `.` → `""` (the whole context). Refuses absolute paths
/// and any `..` that would climb above the context.
pub fn normalize(path: &str) -> Result<String, ContextError> {
    let mut parts: Vec<&str> = Vec::new();
    for component in Path::new(path).components() {
        match component {
            Component::Normal(part) => parts.push(part.to_str().unwrap_or_default()),
            Component::CurDir => {}
            Component::ParentDir => {
                if parts.pop().is_none() {
                    return Err(ContextError::Escapes { path: path.to_owned() });
                }
            }
            Component::RootDir | Component::Prefix(_) => return Err(ContextError::Absolute { path: path.to_owned() }),
        }
    }
    Ok(parts.join("/"))
}

impl Context {
    /// Walks `root` (without following symlinks), hashing every file.
    pub fn scan(root: &Path, limits: ContextLimits) -> Result<Context, ContextError> {
        Self::scan_with(root, limits, false)
    }

    /// An app directory (`lizard up`): as [`Context::scan`], and also without what its
    /// `.gitignore` files leave out and without `.git` itself.
    pub fn scan_app(root: &Path, limits: ContextLimits) -> Result<Context, ContextError> {
        Self::scan_with(root, limits, true)
    }

    fn scan_with(root: &Path, limits: ContextLimits, app: bool) -> Result<Context, ContextError> {
        let root = root.canonicalize().map_err(|cause| ContextError::Io { path: ".".into(), cause })?;
        let mut builder = ignore::WalkBuilder::new(&root);
        builder
            .standard_filters(false)
            .add_custom_ignore_filename(IGNORE_FILE)
            .follow_links(false)
            .sort_by_file_path(|a, b| a.cmp(b));
        if app {
            builder.add_custom_ignore_filename(".gitignore").filter_entry(|e| e.file_name() != ".git");
        }
        let walk = builder.build();
        let mut entries = Vec::new();
        let mut total = 0u64;
        for item in walk {
            let item = item?;
            let relative = item.path().strip_prefix(&root).unwrap_or(item.path());
            if relative.as_os_str().is_empty() {
                continue;
            }
            let path = relative
                .to_str()
                .ok_or_else(|| ContextError::NotUtf8 { path: relative.to_string_lossy().into_owned() })?
                .to_owned();
            let io = |cause| ContextError::Io { path: path.clone(), cause };
            let meta = std::fs::symlink_metadata(item.path()).map_err(io)?;
            let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777;
            let kind = if meta.is_symlink() {
                let target = std::fs::read_link(item.path()).map_err(io)?;
                let inside = resolves_inside(&root, item.path(), &target);
                EntryKind::Symlink { target: target.to_string_lossy().into_owned(), inside }
            } else if meta.is_dir() {
                EntryKind::Dir
            } else if meta.is_file() {
                total += meta.len();
                if total > limits.max_bytes {
                    return Err(ContextError::TooLarge { limit: limits.max_bytes });
                }
                EntryKind::File { sha256: hash_file(item.path()).map_err(io)?, size: meta.len() }
            } else {
                return Err(ContextError::Special { path });
            };
            entries.push(Entry { path, mode, kind });
            if entries.len() > limits.max_entries {
                return Err(ContextError::TooManyEntries { limit: limits.max_entries });
            }
        }
        // The walk sorts per directory ("a", "a/c", "a-b"); the context is in string order
        // ("a", "a-b", "a/c"), the order `select` and manifests rely on.
        entries.sort_by(|a: &Entry, b: &Entry| a.path.cmp(&b.path));
        Ok(Context { entries })
    }

    /// Takes a manifest received from a client: every path must be normalized, sorted and
    /// unique, and each symlink's `inside` is computed again here rather than trusted.
    pub fn from_manifest(mut entries: Vec<Entry>, limits: ContextLimits) -> Result<Context, ContextError> {
        if entries.len() > limits.max_entries {
            return Err(ContextError::TooManyEntries { limit: limits.max_entries });
        }
        let mut total = 0u64;
        let mut previous: Option<&str> = None;
        for entry in &mut entries {
            if entry.path.is_empty() || normalize(&entry.path)? != entry.path {
                return Err(ContextError::BadManifest { path: entry.path.clone(), reason: "not a normalized path" });
            }
            match &mut entry.kind {
                EntryKind::File { size, sha256 } => {
                    total = total.saturating_add(*size);
                    if sha256.len() != 64 || !sha256.chars().all(|c| c.is_ascii_hexdigit()) {
                        return Err(ContextError::BadManifest { path: entry.path.clone(), reason: "not a SHA-256" });
                    }
                }
                EntryKind::Symlink { target, inside } => {
                    let dir = Path::new(&entry.path).parent().unwrap_or(Path::new(""));
                    *inside = !Path::new(target).is_absolute()
                        && dir.join(target.as_str()).to_str().is_some_and(|p| normalize(p).is_ok());
                }
                EntryKind::Dir => {}
            }
            entry.mode &= 0o7777;
        }
        for entry in &entries {
            if previous.is_some_and(|p| p >= entry.path.as_str()) {
                return Err(ContextError::BadManifest { path: entry.path.clone(), reason: "out of order or repeated" });
            }
            previous = Some(&entry.path);
        }
        if total > limits.max_bytes {
            return Err(ContextError::TooLarge { limit: limits.max_bytes });
        }
        Ok(Context { entries })
    }

    /// The entries a `copy` of `src` takes: the file itself, or the directory and
    /// everything below it. Refuses sources outside the context and symlinks pointing out.
    pub fn select(&self, src: &str) -> Result<Vec<&Entry>, ContextError> {
        let src = normalize(src)?;
        let selected: Vec<&Entry> = if src.is_empty() {
            self.entries.iter().collect()
        } else {
            let own = self
                .entries
                .binary_search_by(|e| e.path.as_str().cmp(&src))
                .map_err(|_| ContextError::Missing { path: src.clone() })?;
            // Paths below `src` sort together: from "src/" up to "src0" ('0' follows '/').
            let below = |e: &Entry| e.path.as_str() < format!("{src}/").as_str();
            let after = |e: &Entry| e.path.as_str() < format!("{src}0").as_str();
            let (lo, hi) = (self.entries.partition_point(below), self.entries.partition_point(after));
            std::iter::once(&self.entries[own]).chain(&self.entries[lo..hi]).collect()
        };
        if let Some((path, target)) = selected.iter().find_map(|e| match &e.kind {
            EntryKind::Symlink { target, inside: false } => Some((e.path.clone(), target.clone())),
            _ => None,
        }) {
            return Err(ContextError::SymlinkOut { path, target });
        }
        Ok(selected)
    }

    /// The distinct file hashes, for asking the server which it lacks.
    pub fn hashes(&self) -> Vec<&str> {
        let mut hashes: Vec<&str> = self
            .entries
            .iter()
            .filter_map(|e| match &e.kind {
                EntryKind::File { sha256, .. } => Some(sha256.as_str()),
                _ => None,
            })
            .collect();
        hashes.sort_unstable();
        hashes.dedup();
        hashes
    }

    /// Total size of the files.
    pub fn size(&self) -> u64 {
        self.entries.iter().map(|e| if let EntryKind::File { size, .. } = e.kind { size } else { 0 }).sum()
    }
}

/// Whether `target`, the content of the symlink at `link`, names a path inside `root`
/// (lexically, from the link's directory: the context is a copy, its links are resolved there).
fn resolves_inside(root: &Path, link: &Path, target: &Path) -> bool {
    if target.is_absolute() {
        return false;
    }
    let dir = link.parent().unwrap_or(root);
    let Ok(from_root) = dir.strip_prefix(root) else { return false };
    let joined: PathBuf = from_root.join(target);
    joined.to_str().is_some_and(|p| normalize(p).is_ok())
}

/// SHA-256 of a file's content, hex.
pub fn hash_file(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(hex::encode(hasher.finalize()));
        }
        hasher.update(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::create_dir_all(p.join("tools/sub")).unwrap();
        std::fs::write(p.join("tools/setup.sh"), "#!/bin/sh\necho hi\n").unwrap();
        std::fs::write(p.join("tools/sub/data"), "data").unwrap();
        std::fs::write(p.join("toolsy"), "not under tools/").unwrap();
        std::fs::write(p.join("tools-b"), "between tools and tools/ in string order").unwrap();
        std::fs::write(p.join("same-as-data"), "data").unwrap();
        symlink("setup.sh", p.join("tools/run.sh")).unwrap();
        dir
    }

    #[test]
    fn normalize_keeps_paths_inside() {
        assert_eq!(normalize("tools/").unwrap(), "tools");
        assert_eq!(normalize("./a/./b/../c").unwrap(), "a/c");
        assert_eq!(normalize(".").unwrap(), "");
        assert!(matches!(normalize("../x"), Err(ContextError::Escapes { .. })));
        assert!(matches!(normalize("a/../../x"), Err(ContextError::Escapes { .. })));
        assert!(matches!(normalize("/etc"), Err(ContextError::Absolute { .. })));
    }

    #[test]
    fn scan_hashes_files_and_select_takes_a_subtree() {
        let dir = tree();
        let ctx = Context::scan(dir.path(), ContextLimits::default()).unwrap();
        let paths: Vec<_> = ctx.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "same-as-data",
                "tools",
                "tools-b",
                "tools/run.sh",
                "tools/setup.sh",
                "tools/sub",
                "tools/sub/data",
                "toolsy"
            ]
        );
        let selected: Vec<_> = ctx.select("tools/").unwrap().iter().map(|e| e.path.as_str()).collect();
        assert_eq!(selected, ["tools", "tools/run.sh", "tools/setup.sh", "tools/sub", "tools/sub/data"]);
        assert_eq!(ctx.select("./tools/sub/data").unwrap().len(), 1);
        assert_eq!(ctx.select(".").unwrap().len(), ctx.entries.len());
        let setup = ctx.entries.iter().find(|e| e.path == "tools/setup.sh").unwrap();
        assert_eq!(
            setup.kind,
            EntryKind::File { sha256: hex::encode(Sha256::digest(b"#!/bin/sh\necho hi\n")), size: 18 }
        );
        assert_eq!(ctx.hashes().len(), 4, "two files share a content: four distinct hashes");
        assert_eq!(ctx.size(), 18 + 4 + 16 + 4 + 40);
        assert!(matches!(ctx.select("nope"), Err(ContextError::Missing { .. })));
        assert!(matches!(ctx.select("../x"), Err(ContextError::Escapes { .. })));
    }

    #[test]
    fn a_symlink_out_is_refused_when_copied() {
        let dir = tree();
        symlink("/etc/passwd", dir.path().join("tools/passwd")).unwrap();
        symlink("../../..", dir.path().join("up")).unwrap();
        symlink("tools/sub/../setup.sh", dir.path().join("in")).unwrap();
        let ctx = Context::scan(dir.path(), ContextLimits::default()).unwrap();
        let e = ctx.select("tools").unwrap_err();
        assert!(matches!(e, ContextError::SymlinkOut { ref path, .. } if path == "tools/passwd"), "{e}");
        assert!(matches!(ctx.select("up"), Err(ContextError::SymlinkOut { .. })));
        assert!(ctx.select("in").is_ok(), "a link that stays inside is fine");
        assert!(ctx.select("tools/sub").is_ok(), "a subtree without the bad link is fine");
    }

    #[test]
    fn a_manifest_from_a_client_is_checked_not_trusted() {
        let dir = tree();
        let ctx = Context::scan(dir.path(), ContextLimits::default()).unwrap();
        assert_eq!(Context::from_manifest(ctx.entries.clone(), ContextLimits::default()).unwrap(), ctx);
        let file = |path: &str| Entry {
            path: path.into(),
            mode: 0o644,
            kind: EntryKind::File { sha256: "0".repeat(64), size: 1 },
        };
        for bad in [
            vec![file("../x")],
            vec![file("/x")],
            vec![file("a/./b")],
            vec![file("b"), file("a")],
            vec![file("a"), file("a")],
        ] {
            assert!(Context::from_manifest(bad.clone(), ContextLimits::default()).is_err(), "{bad:?}");
        }
        let lying = Entry {
            path: "a/l".into(),
            mode: 0o777,
            kind: EntryKind::Symlink { target: "../../etc".into(), inside: true },
        };
        let ctx = Context::from_manifest(vec![lying], ContextLimits::default()).unwrap();
        assert!(matches!(ctx.select("a/l"), Err(ContextError::SymlinkOut { .. })));
    }

    #[test]
    fn limits_and_ignore_file() {
        let dir = tree();
        let e = Context::scan(dir.path(), ContextLimits { max_bytes: 20, max_entries: 100 }).unwrap_err();
        assert!(matches!(e, ContextError::TooLarge { limit: 20 }), "{e}");
        let e = Context::scan(dir.path(), ContextLimits { max_bytes: 1 << 20, max_entries: 3 }).unwrap_err();
        assert!(matches!(e, ContextError::TooManyEntries { limit: 3 }), "{e}");
        std::fs::write(dir.path().join(IGNORE_FILE), "tools/sub/\n*.sh\n").unwrap();
        let ctx = Context::scan(dir.path(), ContextLimits::default()).unwrap();
        let paths: Vec<_> = ctx.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, [IGNORE_FILE, "same-as-data", "tools", "tools-b", "toolsy"]);
    }

    #[test]
    fn an_app_scan_also_honours_gitignore_and_leaves_git_out() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(".git/objects")).unwrap();
        std::fs::write(dir.path().join(".git/HEAD"), "ref").unwrap();
        std::fs::create_dir_all(dir.path().join("node_modules/x")).unwrap();
        std::fs::write(dir.path().join("node_modules/x/i.js"), "1").unwrap();
        std::fs::write(dir.path().join(".gitignore"), "node_modules/\n").unwrap();
        std::fs::write(dir.path().join("server.js"), "2").unwrap();
        let app = Context::scan_app(dir.path(), ContextLimits::default()).unwrap();
        let paths: Vec<_> = app.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, [".gitignore", "server.js"]);
        // A template push keeps its own rules: only .lizardignore.
        let all = Context::scan(dir.path(), ContextLimits::default()).unwrap();
        assert!(all.entries.iter().any(|e| e.path == ".git/HEAD"));
    }
}
