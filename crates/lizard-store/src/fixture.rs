//! A store seeded for unit tests: the account, owner key, workspaces and projects that
//! every test over sandboxes, billing or volumes needs before it can start, and the
//! sandbox record such tests insert.

// Test support: a failure here is the calling test's failure, so it panics.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::sql::SqlStore;
use super::{
    AccountRecord, KeyRecord, MeterSpec, NewSandbox, OnTimeout, ProjectRecord, SandboxState, Store, WorkspaceRecord,
};

/// An in-memory store with `account` (and its owner key) and, for each `(workspace, project)`
/// pair, that workspace holding that project. Ids double as names and slugs.
pub async fn seeded_store(account: &str, projects: &[(&str, &str)]) -> SqlStore {
    let store = SqlStore::memory().await.unwrap();
    seed(&store, account, projects).await;
    store
}

/// Seed `store` as [`seeded_store`] does (any engine: the shared store suite uses it too).
pub async fn seed(store: &dyn Store, account: &str, projects: &[(&str, &str)]) {
    let acc = AccountRecord { id: account.into(), email: "o@x".into(), plan: "free".into(), created_at: 1 };
    let key = KeyRecord {
        id: "key_owner".into(),
        account_id: account.into(),
        name: "owner".into(),
        prefix: "lz_owner".into(),
        hash: vec![0; 32],
        scope: None,
        created_at: 1,
        revoked_at: None,
    };
    store.bootstrap(&acc, &key).await.unwrap();
    for &(ws, prj) in projects {
        let workspace = WorkspaceRecord {
            id: ws.into(),
            account_id: account.into(),
            name: ws.into(),
            slug: ws.into(),
            created_at: 1,
            volume_quota_gb: None,
        };
        store.insert_workspace(&workspace).await.unwrap();
        let project = ProjectRecord {
            id: prj.into(),
            workspace_id: ws.into(),
            name: prj.into(),
            slug: prj.into(),
            created_at: 1,
        };
        store.insert_project(account, &project).await.unwrap();
    }
}

/// A running `base` sandbox of `project` on `node`, recorded at `at`, with no timeout,
/// billed as 1 vCPU / 512 MiB at 1,000 nano-dollars a second running and nothing paused.
/// Tests that need other fields set them with `..running_sandbox(…)`.
pub fn running_sandbox(id: &str, project: &str, node: &str, at: i64) -> NewSandbox {
    NewSandbox {
        id: id.into(),
        project_id: project.into(),
        template: "base".into(),
        state: SandboxState::Running,
        created_at: at,
        timeout_at: None,
        metadata: Default::default(),
        on_timeout: OnTimeout::Kill,
        timeout_ms: None,
        template_ref: None,
        node_id: node.into(),
        meter: MeterSpec { vcpus: 1, memory_mib: 512, running_nanos_per_sec: 1_000, paused_nanos_per_sec: 0 },
    }
}
