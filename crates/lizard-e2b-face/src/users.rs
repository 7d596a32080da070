//! E2B's default user: `user` (home `/home/user`, passwordless sudo), which E2B's code
//! assumes and Lizard's built-in templates have, where the sandbox's guest has that
//! account; root where it has not (a pushed template from a bare root, say). Which it is
//! is read from a guest's `/etc/passwd` once per template (its build's node template: the
//! sandboxes of one start with the same accounts) and kept in the server process, at most
//! [`MAX_KEPT`] answers at once (past it, asked again): a create's first command does not
//! wait for a read of the guest's files.
//!
//! Lizard's own API keeps its default (the template's user, root in the built-ins).

use futures_util::TryStreamExt;
use lizard_server::ops::sandboxes::LiveSandbox;
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

/// E2B's default user.
pub const DEFAULT_USER: &str = "user";
/// Answers one server keeps at once.
pub const MAX_KEPT: usize = 100_000;
/// Most of `/etc/passwd` read.
const MAX_PASSWD: usize = 1 << 20;

/// template (a build's node template, or a built-in's name) → whether its guests have
/// [`DEFAULT_USER`].
static HAS_USER: LazyLock<Mutex<HashMap<String, bool>>> = LazyLock::new(Default::default);

fn kept() -> std::sync::MutexGuard<'static, HashMap<String, bool>> {
    HAS_USER.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether a passwd file has an entry named `name`.
fn has_entry(passwd: &str, name: &str) -> bool {
    passwd.lines().any(|line| line.split(':').next() == Some(name))
}

/// Who an envd request runs as when it names nobody: [`DEFAULT_USER`] where the guest
/// has it, else root (`None`).
pub async fn default_user(sandbox: &LiveSandbox) -> Option<String> {
    let id = sandbox.id();
    let template = sandbox.record.template_ref.as_deref().unwrap_or(&sandbox.record.template);
    let known = kept().get(template).copied();
    let has = match known {
        Some(has) => has,
        None => {
            let has = match sandbox.node.read_file(id, "/etc/passwd").await {
                Ok(read) => {
                    let mut bytes = Vec::new();
                    let mut body = read.body;
                    while let Ok(Some(chunk)) = body.try_next().await {
                        bytes.extend_from_slice(&chunk);
                        if bytes.len() > MAX_PASSWD {
                            break;
                        }
                    }
                    has_entry(&String::from_utf8_lossy(&bytes), DEFAULT_USER)
                }
                // Not known now (the guest busy, say): root this time, asked again next.
                Err(_) => return None,
            };
            let mut all = kept();
            if all.len() >= MAX_KEPT {
                all.clear();
            }
            all.insert(template.to_owned(), has);
            has
        }
    };
    has.then(|| DEFAULT_USER.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_entry_of_that_name_counts() {
        let passwd =
            "root:x:0:0:root:/root:/bin/bash\nusers:x:100:100::/:/bin/false\nuser:x:1000:1000::/home/user:/bin/bash\n";
        assert!(has_entry(passwd, "user"));
        assert!(!has_entry("root:x:0:0:root:/root:/bin/bash\nusers:x:100:100::/:/bin/false\n", "user"));
        assert!(!has_entry("", "user"));
    }
}
