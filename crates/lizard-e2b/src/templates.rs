//! E2B's Template SDK on the wire: request a build (`POST /v3/templates`), upload each
//! `COPY` step's files (`GET /templates/{id}/files/{hash}`, then a `PUT` of a tar), start
//! it with its steps (`POST /v2/templates/{id}/builds/{build}`), and poll its status with
//! its log entries.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `POST /v3/templates` (older SDKs: `alias` instead of `name`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BuildRequest {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub alias: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub cpu_count: Option<u32>,
    #[serde(default, rename = "memoryMB")]
    pub memory_mb: Option<u32>,
}

/// Its 202 answer: every field is required by the SDKs' parsers.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BuildRequested {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub public: bool,
    pub names: Vec<String>,
    pub tags: Vec<String>,
    pub aliases: Vec<String>,
}

/// `GET /templates/{id}/files/{hash}` → 201: whether the server has this file set, and
/// where to `PUT` it if not, with the headers to send.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FileUpload {
    pub present: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

/// `POST /v2/templates/{id}/builds/{build}`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BuildStart {
    #[serde(default)]
    pub from_image: Option<String>,
    #[serde(default)]
    pub from_template: Option<String>,
    /// A registry's credentials (`fromImageRegistry`): a base from a registry.
    #[serde(default)]
    pub from_image_registry: Option<serde_json::Value>,
    /// Rebuild every step, the cache unused.
    #[serde(default)]
    pub force: Option<bool>,
    #[serde(default)]
    pub steps: Vec<BuildStep>,
    #[serde(default)]
    pub start_cmd: Option<String>,
    #[serde(default)]
    pub ready_cmd: Option<String>,
}

/// One instruction: `RUN [cmd, user?]`, `COPY [src, dest, user?, mode?]` with its files'
/// hash, `ENV [k, v, …]`, `WORKDIR [dir]`, `USER [user]`. `force` rebuilds it and what
/// follows.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BuildStep {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub files_hash: Option<String>,
    #[serde(default)]
    pub force: Option<bool>,
}

/// A build's state as the SDKs know it.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BuildState {
    Building,
    Waiting,
    Ready,
    Error,
}

/// `GET /templates/{id}/builds/{build}/status?logsOffset=N` → 200.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BuildStatus {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub status: BuildState,
    /// The entries' messages (older SDKs read these).
    pub logs: Vec<String>,
    pub log_entries: Vec<LogEntry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<BuildReason>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LogEntry {
    /// RFC 3339.
    pub timestamp: String,
    pub message: String,
    /// `debug`, `info`, `warn` or `error`.
    pub level: &'static str,
}

/// Why a build failed, and at which step (`"<n>"`, counted from 1 as the SDK's stack
/// traces are).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BuildReason {
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_start_reads_as_the_sdks_send_it() {
        let python = r#"{"fromTemplate":"base","force":false,"steps":[
            {"type":"RUN","args":["echo hi","root"],"force":false},
            {"type":"COPY","args":["app","/app","",""],"force":false,"filesHash":"ab12"},
            {"type":"ENV","args":["A","1","B","2"],"force":true}],
            "startCmd":"python -m http.server 8000","readyCmd":"[ -n \"$(ss -Htuln sport = :8000)\" ]"}"#;
        let start: BuildStart = serde_json::from_str(python).unwrap();
        assert_eq!(start.from_template.as_deref(), Some("base"));
        assert_eq!(start.steps[1].files_hash.as_deref(), Some("ab12"));
        assert_eq!(start.steps[2].force, Some(true));
        let request: BuildRequest = serde_json::from_str(r#"{"name":"t","cpuCount":2,"memoryMB":1024}"#).unwrap();
        assert_eq!((request.cpu_count, request.memory_mb), (Some(2), Some(1024)));
        let status = BuildStatus {
            template_id: "t".into(),
            build_id: "b".into(),
            status: BuildState::Error,
            logs: vec![],
            log_entries: vec![],
            reason: Some(BuildReason { message: "m".into(), step: Some("2".into()) }),
        };
        let v = serde_json::to_value(status).unwrap();
        assert_eq!((v["status"].as_str(), v["reason"]["step"].as_str()), (Some("error"), Some("2")));
        assert!(v["logEntries"].as_array().unwrap().is_empty());
    }
}

/// `POST /templates/tags`: give `tags` to the build `target` (`name` or `name:tag`) names.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct AssignTags {
    pub target: String,
    pub tags: Vec<String>,
}

/// Its 201 answer.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TagsAssigned {
    pub tags: Vec<String>,
    #[serde(rename = "buildID")]
    pub build_id: String,
}

/// `DELETE /templates/tags`: take `tags` from template `name`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct RemoveTags {
    pub name: String,
    pub tags: Vec<String>,
}

/// One entry of `GET /templates/{id}/tags`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TemplateTag {
    pub tag: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    /// RFC 3339.
    pub created_at: String,
}
