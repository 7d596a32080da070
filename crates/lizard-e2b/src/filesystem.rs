//! envd's `filesystem.Filesystem` messages (proto3 JSON).

use serde::{Deserialize, Serialize};

/// `Stat`, `MakeDir`, `Remove`: one path.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct PathRequest {
    pub path: String,
}

/// `Move`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct MoveRequest {
    pub source: String,
    pub destination: String,
}

/// `ListDir`: entries down to `depth` levels (0 is read as 1).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct ListDirRequest {
    pub path: String,
    #[serde(default)]
    pub depth: u32,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub enum FileType {
    #[serde(rename = "FILE_TYPE_UNSPECIFIED")]
    Unspecified,
    #[serde(rename = "FILE_TYPE_FILE")]
    File,
    #[serde(rename = "FILE_TYPE_DIRECTORY")]
    Directory,
    #[serde(rename = "FILE_TYPE_SYMLINK")]
    Symlink,
}

/// One file, directory or link.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EntryInfo {
    pub name: String,
    #[serde(rename = "type")]
    pub file_type: FileType,
    pub path: String,
    /// `int64`: a string in proto3 JSON.
    #[serde(with = "int64")]
    pub size: u64,
    pub mode: u32,
    /// As `ls -l` writes them: `-rw-r--r--`.
    pub permissions: String,
    pub owner: String,
    pub group: String,
    /// RFC 3339.
    pub modified_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    /// The file's metadata (`map<string, string>`, envd 0.6.2), absent when none.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub metadata: std::collections::BTreeMap<String, String>,
}

/// `{"entry": …}`: `Stat`, `MakeDir`, `Move`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct EntryResponse {
    pub entry: EntryInfo,
}

/// `ListDir`'s answer.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ListDirResponse {
    pub entries: Vec<EntryInfo>,
}

/// `WatchDir` and `CreateWatcher`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct WatchRequest {
    pub path: String,
    #[serde(default)]
    pub recursive: bool,
}

/// `GetWatcherEvents` and `RemoveWatcher`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct WatcherRequest {
    pub watcher_id: String,
}

/// `CreateWatcher`'s answer.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CreateWatcherResponse {
    pub watcher_id: String,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub enum EventType {
    #[serde(rename = "EVENT_TYPE_CREATE")]
    Create,
    #[serde(rename = "EVENT_TYPE_WRITE")]
    Write,
    #[serde(rename = "EVENT_TYPE_REMOVE")]
    Remove,
    #[serde(rename = "EVENT_TYPE_RENAME")]
    Rename,
}

/// What happened to one path under a watched directory (`name`: relative to it).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FilesystemEvent {
    pub name: String,
    #[serde(rename = "type")]
    pub event_type: EventType,
}

/// One message of a `WatchDir` stream (a oneof: its member names the message's one field).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum WatchEvent {
    Start {},
    Filesystem(FilesystemEvent),
    Keepalive {},
}

/// `GetWatcherEvents`'s answer.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct WatcherEvents {
    pub events: Vec<FilesystemEvent>,
}

/// `path` relative to the watched `dir` (as given when it lies outside).
pub fn relative_name(dir: &str, path: &str) -> String {
    let dir = dir.trim_end_matches('/');
    path.strip_prefix(dir).and_then(|rest| rest.strip_prefix('/')).unwrap_or(path).to_owned()
}

/// `rwxr-xr-x` with the type's letter in front, from the kind and the permission bits.
pub fn permissions(file_type: FileType, mode: u32) -> String {
    let kind = match file_type {
        FileType::Directory => 'd',
        FileType::Symlink => 'l',
        FileType::File | FileType::Unspecified => '-',
    };
    let bits = "rwxrwxrwx".chars().enumerate().map(|(i, c)| if mode & (0o400 >> i) != 0 { c } else { '-' });
    std::iter::once(kind).chain(bits).collect()
}

mod int64 {
    use serde::Serializer;

    pub fn serialize<S: Serializer>(n: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&n.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_events_take_proto3_json_form() {
        let e = WatchEvent::Filesystem(FilesystemEvent { name: "a/b.txt".into(), event_type: EventType::Write });
        // A oneof's member stands in the message itself: `{"filesystem": …}`.
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"filesystem":{"name":"a/b.txt","type":"EVENT_TYPE_WRITE"}}"#
        );
        assert_eq!(serde_json::to_string(&WatchEvent::Start {}).unwrap(), r#"{"start":{}}"#);
        assert_eq!(relative_name("/tmp/w/", "/tmp/w/a/b"), "a/b");
        assert_eq!(relative_name("/tmp/w", "/elsewhere"), "/elsewhere");
    }

    #[test]
    fn entries_take_proto3_json_form() {
        let e = EntryInfo {
            name: "a.txt".into(),
            file_type: FileType::File,
            path: "/home/user/a.txt".into(),
            size: 10,
            mode: 0o644,
            permissions: permissions(FileType::File, 0o644),
            owner: "user".into(),
            group: "user".into(),
            modified_time: "2026-12-06T00:00:00Z".into(),
            symlink_target: None,
            metadata: [("kind".to_string(), "report".to_string())].into(),
        };
        let v = serde_json::to_value(EntryResponse { entry: e.clone() }).unwrap();
        assert_eq!(v["entry"]["metadata"], serde_json::json!({"kind": "report"}));
        // None is no field at all.
        let plain = serde_json::to_value(EntryInfo { metadata: Default::default(), ..e }).unwrap();
        assert!(plain.get("metadata").is_none());
        assert_eq!(v["entry"]["type"], "FILE_TYPE_FILE");
        assert_eq!(v["entry"]["size"], "10");
        assert_eq!(v["entry"]["permissions"], "-rw-r--r--");
        assert_eq!(v["entry"]["modifiedTime"], "2026-12-06T00:00:00Z");
        assert_eq!(permissions(FileType::Directory, 0o755), "drwxr-xr-x");
    }
}
