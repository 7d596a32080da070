//! What of the host's filesystem a confined VMM sees: in a mount namespace of its own,
//! every top-level directory it has no use for is covered by an empty read-only tmpfs
//! (`/root`, `/home`, `/run`, `/srv`, `/opt`, other trees of the host). It keeps the
//! system's own (`/usr`, `/lib*`, `/bin`, `/sbin`, `/etc`, `/dev`, `/proc`, `/sys`) and the
//! trees that hold its files: run directory, disks and their backing chains, kernel,
//! initramfs, memory file — found by their paths as given and as resolved.

use std::ffi::CString;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

/// Top-level directories a VMM always keeps: the system it runs on.
const SYSTEM: [&str; 11] = ["usr", "lib", "lib32", "lib64", "libx32", "bin", "sbin", "etc", "dev", "proc", "sys"];
/// Longest backing chain followed (template layers are at most a few dozen deep).
const MAX_CHAIN: usize = 64;

/// The top-level directory `path` lies in (`/var` for `/var/lib/x`).
fn top(path: &Path) -> Option<PathBuf> {
    let mut parts = path.components();
    match (parts.next(), parts.next()) {
        (Some(Component::RootDir), Some(Component::Normal(name))) => Some(Path::new("/").join(name)),
        _ => None,
    }
}

/// The top-level directories of `/` to cover, given the files the VMM needs.
pub fn hidden_dirs(needed: &[PathBuf]) -> Vec<CString> {
    use std::os::unix::ffi::OsStrExt;
    let mut keep: Vec<PathBuf> = SYSTEM.iter().map(|d| Path::new("/").join(d)).collect();
    for path in needed {
        keep.extend(top(path));
        if let Ok(resolved) = std::fs::canonicalize(path) {
            keep.extend(top(&resolved));
        }
    }
    let Ok(entries) = std::fs::read_dir("/") else { return vec![] };
    let mut hide: Vec<CString> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .filter(|p| !keep.contains(p))
        .filter_map(|p| CString::new(p.as_os_str().as_bytes()).ok())
        .collect();
    hide.sort();
    hide
}

/// Where `binary` is: itself when it is a path, else the first match on `PATH`.
pub fn executable(binary: &Path) -> Option<PathBuf> {
    if binary.components().count() > 1 {
        return Some(binary.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(binary)).find(|p| p.is_file())
}

/// `disk` and the files it is backed by, when it is a qcow2 image (a raw one ends it).
pub fn backing_chain(disk: &Path) -> Vec<PathBuf> {
    let mut chain = vec![disk.to_path_buf()];
    while chain.len() < MAX_CHAIN {
        let current = chain.last().expect("the chain starts with the disk");
        match backing_file(current) {
            Some(next) => {
                // A relative name is relative to the image that names it.
                let next = match current.parent() {
                    Some(dir) if next.is_relative() => dir.join(next),
                    _ => next,
                };
                chain.push(next);
            }
            None => break,
        }
    }
    chain
}

/// The backing file a qcow2 header names, if any.
fn backing_file(image: &Path) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let mut header = [0u8; 20];
    std::fs::File::open(image).ok()?.read_exact(&mut header).ok()?;
    if &header[..4] != b"QFI\xfb" {
        return None;
    }
    let offset = u64::from_be_bytes(header[8..16].try_into().ok()?);
    let len = u32::from_be_bytes(header[16..20].try_into().ok()?);
    if offset == 0 || len == 0 || len > 1023 {
        return None;
    }
    let mut name = vec![0u8; usize::try_from(len).ok()?];
    let file = std::fs::File::open(image).ok()?;
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut name, offset).ok()?;
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(&name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_level_dirs_of_paths() {
        assert_eq!(top(Path::new("/var/lib/lizard/x")), Some(PathBuf::from("/var")));
        assert_eq!(top(Path::new("/tmp")), Some(PathBuf::from("/tmp")));
        assert_eq!(top(Path::new("relative/x")), None);
    }

    #[test]
    fn the_system_and_the_trees_of_needed_files_stay_visible() {
        let hidden: Vec<String> =
            hidden_dirs(&[PathBuf::from("/tmp/some/run-dir")]).into_iter().map(|c| c.into_string().unwrap()).collect();
        for kept in ["/usr", "/etc", "/dev", "/tmp"] {
            assert!(!hidden.contains(&kept.to_string()), "{kept} hidden: {hidden:?}");
        }
        if Path::new("/root").is_dir() {
            assert!(hidden.contains(&"/root".to_string()), "{hidden:?}");
        }
    }

    #[test]
    fn a_backing_chain_is_followed_to_its_raw_base() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base.raw");
        std::fs::write(&base, vec![0u8; 4096]).unwrap();
        // A minimal qcow2 header naming `base.raw` (relative) as its backing file.
        let name = b"base.raw";
        let mut header = vec![0u8; 512];
        header[..4].copy_from_slice(b"QFI\xfb");
        header[8..16].copy_from_slice(&200u64.to_be_bytes());
        header[16..20].copy_from_slice(&u32::try_from(name.len()).unwrap().to_be_bytes());
        header[200..200 + name.len()].copy_from_slice(name);
        let top_image = dir.path().join("top.qcow2");
        std::fs::write(&top_image, &header).unwrap();
        assert_eq!(backing_chain(&top_image), vec![top_image.clone(), base]);
    }
}
