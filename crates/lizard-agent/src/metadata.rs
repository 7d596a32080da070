//! A file's metadata: extended attributes under [`METADATA_XATTR_PREFIX`], which a write
//! sets (E2B's uploads send them as `X-Metadata-*` headers) and stat and list read back.
//! Keys are lowercased, as E2B's envd does.

use lizard_agent_proto::types::METADATA_XATTR_PREFIX;
use std::collections::BTreeMap;
use std::io;
use std::path::Path;

/// Most keys on one file, and the longest value: far past what uploads carry, and within
/// what one ext4 inode's attribute block holds.
const MAX_KEYS: usize = 32;
const MAX_VALUE: usize = 1024;
/// The longest key: the attribute's name (prefix included) stays within `XATTR_NAME_MAX`.
const MAX_KEY: usize = 255 - METADATA_XATTR_PREFIX.len();

/// `metadata` as it is kept (keys lowercased), or why it cannot be: keys of HTTP token
/// characters, values of printable ASCII.
pub(crate) fn checked(metadata: BTreeMap<String, String>) -> Result<BTreeMap<String, String>, String> {
    if metadata.len() > MAX_KEYS {
        return Err(format!("at most {MAX_KEYS} metadata keys, got {}", metadata.len()));
    }
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    let mut kept = BTreeMap::new();
    for (key, value) in metadata {
        if key.is_empty() || key.len() > MAX_KEY || !key.chars().all(token) {
            return Err(format!("metadata key {key:?}: 1 to {MAX_KEY} letters, digits or !#$%&'*+-.^_`|~"));
        }
        if value.len() > MAX_VALUE || !value.chars().all(|c| c == ' ' || c.is_ascii_graphic()) {
            return Err(format!("metadata value of {key:?}: at most {MAX_VALUE} printable ASCII characters"));
        }
        kept.insert(key.to_ascii_lowercase(), value);
    }
    Ok(kept)
}

/// Set `metadata` on the open `file`.
pub(crate) fn set(file: &std::fs::File, metadata: &BTreeMap<String, String>) -> io::Result<()> {
    for (key, value) in metadata {
        let name = format!("{METADATA_XATTR_PREFIX}{key}");
        rustix::fs::fsetxattr(file, name.as_str(), value.as_bytes(), rustix::fs::XattrFlags::empty())?;
    }
    Ok(())
}

/// The metadata of `path` (a link's own, not its target's); none where the file system
/// keeps no attributes or the file vanished.
pub(crate) fn read(path: &Path) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    // Most files have no attributes at all: one call says so.
    let size = match rustix::fs::llistxattr_query(path) {
        Ok(0) | Err(_) => return found,
        Ok(size) => size,
    };
    let mut names = vec![0u8; size];
    let Ok(len) = rustix::fs::llistxattr(path, &mut names[..]) else { return found };
    let mut value = vec![0u8; 64 * 1024];
    for name in names[..len].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let Ok(name) = std::str::from_utf8(name) else { continue };
        let Some(key) = name.strip_prefix(METADATA_XATTR_PREFIX) else { continue };
        if let Ok(n) = rustix::fs::lgetxattr(path, name, &mut value[..]) {
            found.insert(key.to_owned(), String::from_utf8_lossy(&value[..n]).into_owned());
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_checked_lowercased_kept_on_the_file_and_read_back() {
        let given = BTreeMap::from([("Owner".to_string(), "a b".to_string()), ("v.2".to_string(), "x".to_string())]);
        let kept = checked(given).unwrap();
        assert_eq!(kept.keys().collect::<Vec<_>>(), ["owner", "v.2"]);
        for bad in [("", "v"), ("a b", "v"), ("a/b", "v"), ("k", "\n"), ("k", "é")] {
            let one = BTreeMap::from([(bad.0.to_string(), bad.1.to_string())]);
            assert!(checked(one).is_err(), "{bad:?}");
        }
        let many = (0..=MAX_KEYS).map(|i| (format!("k{i}"), String::new())).collect();
        assert!(checked(many).is_err());

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = std::fs::File::create(&path).unwrap();
        assert!(read(&path).is_empty());
        set(&file, &kept).unwrap();
        // Other attributes are not metadata.
        rustix::fs::fsetxattr(&file, "user.other", b"no", rustix::fs::XattrFlags::empty()).unwrap();
        assert_eq!(read(&path), kept);
        assert!(read(&dir.path().join("missing")).is_empty());
    }
}
