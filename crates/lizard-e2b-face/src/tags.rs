//! Process tags: the `tag` a `Start` names, so that later calls can name the process by
//! it instead of its pid. Kept in the server process that started it (as the polling
//! watchers are), at most [`MAX_TAGS`] at once; a tag named again names the newer process.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

/// Tags one server keeps at once; past it a new tag is not kept (the process runs all
/// the same, found by its pid).
pub const MAX_TAGS: usize = 100_000;

/// (sandbox, tag) → pid.
static TAGS: LazyLock<Mutex<HashMap<(String, String), u32>>> = LazyLock::new(Default::default);

fn tags() -> std::sync::MutexGuard<'static, HashMap<(String, String), u32>> {
    TAGS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Name `pid` of `sandbox` by `tag`; false when the server keeps as many as it may.
pub fn remember(sandbox: &str, tag: &str, pid: u32) -> bool {
    let mut all = tags();
    let key = (sandbox.to_owned(), tag.to_owned());
    if all.len() >= MAX_TAGS && !all.contains_key(&key) {
        return false;
    }
    all.insert(key, pid);
    true
}

/// The pid `tag` names in `sandbox`.
pub fn pid(sandbox: &str, tag: &str) -> Option<u32> {
    tags().get(&(sandbox.to_owned(), tag.to_owned())).copied()
}

/// The tag `pid` of `sandbox` was started with.
pub fn of(sandbox: &str, pid: u32) -> Option<String> {
    tags().iter().find(|((s, _), p)| s == sandbox && **p == pid).map(|((_, tag), _)| tag.clone())
}

/// Forget the tags of `sandbox`'s processes that are not in `running`.
pub fn keep_only(sandbox: &str, running: &[u32]) {
    tags().retain(|(s, _), pid| s != sandbox || running.contains(pid));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_names_one_process_of_one_sandbox() {
        assert!(remember("sbx_t1", "web", 7));
        assert_eq!(pid("sbx_t1", "web"), Some(7));
        assert_eq!(pid("sbx_t2", "web"), None);
        assert_eq!(of("sbx_t1", 7).as_deref(), Some("web"));
        assert!(remember("sbx_t1", "web", 9));
        assert_eq!(pid("sbx_t1", "web"), Some(9));
        keep_only("sbx_t1", &[]);
        assert_eq!(pid("sbx_t1", "web"), None);
    }
}
