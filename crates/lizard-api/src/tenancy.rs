//! Tenancy: accounts, workspaces, projects, scoped API keys, regions, whoami.
//!
//! An account owns workspaces; a workspace owns projects; a project owns sandboxes and
//! volumes (and is what they are billed to). An API key belongs to an account and is either
//! unscoped (everything the account reaches) or scoped to a list of workspaces and/or
//! projects. Ids are opaque strings; timestamps are RFC 3339 (UTC).
//!
//! With the `openapi` feature each type also derives `utoipa::ToSchema`, so the control
//! plane's OpenAPI document is generated from these very types.

use serde::{Deserialize, Serialize};

/// A workspace: the unit of isolation between the users of one account.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Workspace {
    pub id: String,
    pub name: String,
    /// Derived from the name at creation; unique within the account.
    pub slug: String,
    pub created_at: String,
    /// GiB of volumes the workspace may hold, all its projects together, within the
    /// account's own quota; `null`: the account's quota alone bounds it.
    #[serde(default)]
    pub volume_quota_gb: Option<u32>,
}

/// `PATCH /v1/workspaces/{id}` (unscoped keys only: a workspace's key cannot raise its
/// own quota).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdateWorkspaceRequest {
    /// GiB of volumes the workspace may hold; `null` lifts the workspace's own quota.
    pub volume_quota_gb: Option<u32>,
}

/// `POST /v1/workspaces`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateWorkspaceRequest {
    pub name: String,
}

/// A project: what sandboxes and volumes live in and are billed to.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Project {
    pub id: String,
    pub workspace_id: String,
    pub name: String,
    /// Derived from the name at creation and kept on rename (clients pin projects by
    /// slug); unique within the workspace.
    pub slug: String,
    pub created_at: String,
}

/// `POST /v1/projects`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateProjectRequest {
    pub workspace_id: String,
    pub name: String,
}

/// `PATCH /v1/projects/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdateProjectRequest {
    pub name: String,
}

/// An API key as listed: never the key itself.
///
/// `workspaces` and `projects` are both `null` for an unscoped key (full access to the
/// account); a scoped key has both as lists (one may be empty).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ApiKey {
    pub id: String,
    pub name: String,
    /// The key's first characters, to recognise it (`lz_` + 8).
    pub prefix: String,
    pub workspaces: Option<Vec<String>>,
    pub projects: Option<Vec<String>>,
    pub created_at: String,
}

/// `POST /v1/api-keys`. Give `workspaces` and/or `projects` (ids) for a scoped key; omit
/// both for an unscoped one. Both given and empty is refused (it would reach nothing).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateApiKeyRequest {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspaces: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub projects: Option<Vec<String>>,
}

/// Answer to `POST /v1/api-keys`: the only time `key` is ever shown.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct CreatedApiKey {
    pub id: String,
    pub name: String,
    pub prefix: String,
    pub workspaces: Option<Vec<String>>,
    pub projects: Option<Vec<String>>,
    pub created_at: String,
    /// The secret. Store it now: the server keeps only its hash.
    pub key: String,
}

/// `GET /v1/whoami`. An unscoped key sees the account (email, plan); a scoped key sees
/// only its identity and its own scopes — the account fields are absent, not null.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct WhoAmI {
    pub account_id: String,
    pub key_id: String,
    pub key_name: String,
    pub scoped: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspaces: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub projects: Option<Vec<String>>,
}

/// `GET /v1/account` (unscoped keys only).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Account {
    pub id: String,
    pub email: String,
    pub plan: String,
    pub created_at: String,
}

/// A region sandboxes and volumes can be placed in.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Region {
    /// What `region` options take, e.g. `local`.
    pub id: String,
    pub name: String,
    /// Public sandbox hosts of this region are `{sandboxId}-{port}.{sandboxDomain}`.
    pub sandbox_domain: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_reject_unknown_fields() {
        assert!(serde_json::from_str::<CreateWorkspaceRequest>(r#"{"name":"a","x":1}"#).is_err());
        assert!(serde_json::from_str::<CreateProjectRequest>(r#"{"workspaceId":"w","name":"a","x":1}"#).is_err());
        assert!(serde_json::from_str::<UpdateProjectRequest>(r#"{"name":"a","slug":"b"}"#).is_err());
        assert!(serde_json::from_str::<CreateApiKeyRequest>(r#"{"name":"a","scope":[]}"#).is_err());
        let r: CreateApiKeyRequest = serde_json::from_str(r#"{"name":"k","workspaces":["ws_1"]}"#).unwrap();
        assert_eq!(r.workspaces, Some(vec!["ws_1".to_string()]));
        assert_eq!(r.projects, None);
    }

    #[test]
    fn scoped_whoami_has_no_account_fields() {
        let w = WhoAmI {
            account_id: "acc".into(),
            key_id: "key".into(),
            key_name: "n".into(),
            scoped: true,
            email: None,
            plan: None,
            workspaces: Some(vec!["ws".into()]),
            projects: Some(vec![]),
        };
        let v = serde_json::to_value(&w).unwrap();
        assert!(v.get("email").is_none() && v.get("plan").is_none());
        assert_eq!(v["workspaces"][0], "ws");
    }
}
