//! Resolve a user name or uid to credentials by reading `/etc/passwd` and `/etc/group`.
//!
//! The agent is a static glibc binary, where `getpwnam` and friends would need NSS
//! modules loaded at run time; the files are simple enough to parse directly.

use std::path::PathBuf;

/// Why a user could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    /// No passwd entry has this name.
    #[error("unknown user {0:?}")]
    Unknown(String),
}

/// Who a command runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
    /// Supplementary groups, the primary group included.
    pub groups: Vec<u32>,
}

/// Resolve `spec` (a name, or a numeric uid) against the system's files.
pub fn resolve(spec: &str) -> Result<User, UserError> {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let group = std::fs::read_to_string("/etc/group").unwrap_or_default();
    lookup(spec, &passwd, &group)
}

/// Resolve `spec` against the contents of a passwd and a group file. A numeric uid that
/// has no entry still resolves (uid = gid, home `/`), as `su`-less tools expect.
pub fn lookup(spec: &str, passwd: &str, group: &str) -> Result<User, UserError> {
    let by_uid = spec.parse::<u32>().ok();
    let entry = passwd.lines().filter_map(parse_passwd_line).find(|(name, uid, ..)| match by_uid {
        Some(u) => *uid == u,
        None => *name == spec,
    });
    let (name, uid, gid, home) = match entry {
        Some((name, uid, gid, home)) => (name.to_string(), uid, gid, PathBuf::from(home)),
        None => match by_uid {
            Some(uid) => (uid.to_string(), uid, uid, PathBuf::from("/")),
            None => return Err(UserError::Unknown(spec.to_string())),
        },
    };
    let mut groups = vec![gid];
    for line in group.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 4 {
            continue;
        }
        let Ok(g) = f[2].parse::<u32>() else { continue };
        if f[3].split(',').any(|m| m == name) && !groups.contains(&g) {
            groups.push(g);
        }
    }
    Ok(User { name, uid, gid, home, groups })
}

/// The names of `uid` and `gid` in the system's files (the numbers as text where there
/// are none), for a file's owner and group.
pub fn owner_names(uid: u32, gid: u32) -> (String, String) {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let group = std::fs::read_to_string("/etc/group").unwrap_or_default();
    names_in(uid, gid, &passwd, &group)
}

fn names_in(uid: u32, gid: u32, passwd: &str, group: &str) -> (String, String) {
    let owner = passwd.lines().filter_map(parse_passwd_line).find(|(_, u, ..)| *u == uid).map(|(name, ..)| name);
    let group = group.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.len() >= 3 && f[2].parse() == Ok(gid)).then_some(f[0])
    });
    (owner.map_or_else(|| uid.to_string(), str::to_string), group.map_or_else(|| gid.to_string(), str::to_string))
}

/// `name:x:uid:gid:gecos:home:shell` → (name, uid, gid, home).
fn parse_passwd_line(line: &str) -> Option<(&str, u32, u32, &str)> {
    let f: Vec<&str> = line.split(':').collect();
    if f.len() < 7 || line.starts_with('#') {
        return None;
    }
    Some((f[0], f[2].parse().ok()?, f[3].parse().ok()?, f[5]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
        # comment\n\
        broken line\n\
        user:x:1000:1000:User,,,:/home/user:/bin/bash\n";
    const GROUP: &str = "root:x:0:\nadm:x:4:user\ntty:x:5:\nsudo:x:27:other,user\nuser:x:1000:\n";

    #[test]
    fn by_name_and_uid() {
        let u = lookup("user", PASSWD, GROUP).unwrap();
        assert_eq!((u.uid, u.gid), (1000, 1000));
        assert_eq!(u.home, PathBuf::from("/home/user"));
        assert_eq!(u.groups, vec![1000, 4, 27]);
        assert_eq!(lookup("1000", PASSWD, GROUP).unwrap(), u);
        let r = lookup("0", PASSWD, GROUP).unwrap();
        assert_eq!((r.name.as_str(), r.groups.as_slice()), ("root", &[0][..]));
    }

    #[test]
    fn owner_and_group_names() {
        assert_eq!(names_in(1000, 27, PASSWD, GROUP), ("user".to_string(), "sudo".to_string()));
        assert_eq!(names_in(4242, 4343, PASSWD, GROUP), ("4242".to_string(), "4343".to_string()));
    }

    #[test]
    fn unknown_names_fail_but_bare_uids_resolve() {
        assert!(matches!(lookup("nobody2", PASSWD, GROUP), Err(UserError::Unknown(_))));
        let u = lookup("4242", PASSWD, GROUP).unwrap();
        assert_eq!((u.uid, u.gid, u.home), (4242, 4242, PathBuf::from("/")));
    }
}
