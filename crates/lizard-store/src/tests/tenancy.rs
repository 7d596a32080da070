//! Accounts, keys, workspaces, projects, sandbox records, and the schema itself.

use crate::harness::TestDb;
use crate::scope::Scope;
use crate::store_tests;
use crate::*;
use std::collections::BTreeMap;

fn acc() -> AccountRecord {
    AccountRecord { id: "acc_1".into(), email: "o@x".into(), plan: "free".into(), created_at: 1 }
}

fn k(id: &str, scope: Option<Scope>) -> KeyRecord {
    KeyRecord {
        id: id.into(),
        account_id: "acc_1".into(),
        name: id.into(),
        prefix: format!("lz_{id}"),
        hash: vec![7; 32],
        scope,
        created_at: 2,
        revoked_at: None,
    }
}

fn ws(id: &str, name: &str) -> WorkspaceRecord {
    WorkspaceRecord {
        id: id.into(),
        account_id: "acc_1".into(),
        name: name.into(),
        slug: name.into(),
        created_at: 3,
        volume_quota_gb: None,
    }
}

fn prj(id: &str, ws: &str, name: &str) -> ProjectRecord {
    ProjectRecord { id: id.into(), workspace_id: ws.into(), name: name.into(), slug: name.into(), created_at: 4 }
}

fn sbx(id: &str, project: &str) -> NewSandbox {
    NewSandbox {
        id: id.into(),
        project_id: project.into(),
        template: "base".into(),
        state: SandboxState::Running,
        created_at: 5,
        timeout_at: Some(100),
        metadata: BTreeMap::from([("a".into(), "b".into())]),
        meter: MeterSpec { vcpus: 1, memory_mib: 512, running_nanos_per_sec: 2_500, paused_nanos_per_sec: 0 },
        on_timeout: OnTimeout::Pause,
        timeout_ms: Some(95),
        template_ref: None,
        node_id: "node_local".into(),
    }
}

async fn seeded(db: &TestDb) -> crate::harness::TestStore {
    let s = db.open().await;
    assert!(s.bootstrap(&acc(), &k("key_root", None)).await.unwrap());
    s
}

async fn bootstrap_happens_once(db: TestDb) {
    let s = db.open().await;
    assert_eq!(s.owner_account_id().await.unwrap(), None, "no owner before the first start");
    assert!(s.bootstrap(&acc(), &k("key_root", None)).await.unwrap());
    assert_eq!(s.owner_account_id().await.unwrap().as_deref(), Some("acc_1"));
    assert_eq!(s.get_account("acc_1").await.unwrap(), Some(acc()));
    assert_eq!(s.get_account("acc_2").await.unwrap(), None);
    assert!(!s.bootstrap(&acc(), &k("key_other", None)).await.unwrap());
    assert_eq!(s.list_keys("acc_1").await.unwrap().len(), 1);
    assert_eq!(s.schema_version().await, db.known_version());
}

async fn the_ledger_keeps_its_rows_balances_and_guards_through_migration_7(db: TestDb) {
    // A database as migration 6 left it, with an account and ledger rows.
    db.raw("CREATE TABLE lizard_schema (version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)")
        .await;
    for &(version, name, sql) in db.migrations().iter().filter(|m| m.0 <= 6) {
        db.raw(sql).await;
        db.raw(&format!("INSERT INTO lizard_schema VALUES ({version}, '{name}', 0)")).await;
    }
    db.raw(
        "INSERT INTO accounts (id, email, plan, created_at) VALUES ('acc_1', 'o@x', 'free', 1); \
         INSERT INTO ledger (id, account_id, kind, amount_nanos, description, created_at) \
         VALUES ('txn_1', 'acc_1', 'credit', 1000, 'c', 1), ('txn_2', 'acc_1', 'usage', -300, 'u', 2);",
    )
    .await;
    let s = db.open().await;
    assert_eq!(s.schema_version().await, db.known_version());
    assert_eq!((s.balance("acc_1").await.unwrap().balance_nanos, s.ledger_sum("acc_1").await.unwrap()), (700, 700));
    let page = s.ledger_page("acc_1", None, 10, true).await.unwrap();
    assert_eq!(page.iter().map(|e| (e.seq, e.id.as_str())).collect::<Vec<_>>(), [(2, "txn_2"), (1, "txn_1")]);
    assert!(s.exec("UPDATE ledger SET amount_nanos = 0").await.is_err(), "still append-only");
    assert!(s.exec("DELETE FROM ledger").await.is_err(), "still append-only");
    s.grant_signup_credits(50, 3).await.unwrap();
    assert_eq!(s.balance("acc_1").await.unwrap().balance_nanos, 750, "the balance trigger is back");
    let next = s.ledger_page("acc_1", None, 1, true).await.unwrap();
    assert_eq!(next[0].seq, 3, "seq goes on where it was");
}

async fn migrations_are_idempotent_and_refuse_newer_schema(db: TestDb) {
    let s = db.open().await;
    s.close().await;
    let s = db.open().await;
    assert_eq!(s.schema_version().await, db.known_version());
    s.exec("INSERT INTO lizard_schema VALUES (999, 'future', 0)").await.unwrap();
    s.close().await;
    assert!(matches!(db.try_open().await, Err(StoreError::SchemaTooNew { found: 999, .. })));
    if let Some(file) = db.sqlite_file() {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}

async fn scopes_round_trip(db: TestDb) {
    let s = seeded(&db).await;
    let scoped = k("key_s", Some(Scope::new(["ws_a"], Vec::<String>::new())));
    s.insert_key(&scoped).await.unwrap();
    let got = s.keys_by_prefix("lz_key_s").await.unwrap();
    assert_eq!(got, vec![scoped]);
    assert_eq!(s.get_key("acc_1", "key_root").await.unwrap().unwrap().scope, None);
    assert_eq!(s.get_key("acc_other", "key_root").await.unwrap(), None, "other account");
}

async fn duplicates_conflict_per_parent(db: TestDb) {
    let s = seeded(&db).await;
    s.insert_workspace(&ws("ws_a", "a")).await.unwrap();
    assert!(matches!(s.insert_workspace(&ws("ws_b", "a")).await, Err(StoreError::Conflict(_))));
    s.insert_workspace(&ws("ws_b", "b")).await.unwrap();
    s.insert_project("acc_1", &prj("prj_1", "ws_a", "p")).await.unwrap();
    assert!(matches!(s.insert_project("acc_1", &prj("prj_2", "ws_a", "p")).await, Err(StoreError::Conflict(_))));
    s.insert_project("acc_1", &prj("prj_2", "ws_b", "p")).await.unwrap();
    assert!(matches!(s.insert_project("acc_x", &prj("prj_3", "ws_b", "q")).await, Err(StoreError::NotFound(_))));
    s.insert_project("acc_1", &prj("prj_3", "ws_b", "q")).await.unwrap();
    assert_eq!(s.get_project("acc_1", "prj_3").await.unwrap(), Some(prj("prj_3", "ws_b", "q")));
    assert_eq!(s.get_project("acc_x", "prj_3").await.unwrap(), None, "another account's id reaches nothing");
    assert!(matches!(s.rename_project("acc_1", "prj_3", "p").await, Err(StoreError::Conflict(_))));
    let r = s.rename_project("acc_1", "prj_3", "Q2").await.unwrap();
    assert_eq!((r.name.as_str(), r.slug.as_str()), ("Q2", "q"));
}

async fn deletes_refuse_non_empty_and_force_returns_live_sandboxes(db: TestDb) {
    let s = seeded(&db).await;
    s.insert_workspace(&ws("ws_a", "a")).await.unwrap();
    s.insert_project("acc_1", &prj("prj_1", "ws_a", "p")).await.unwrap();
    s.insert_sandbox(&sbx("sb_1", "prj_1")).await.unwrap();
    s.insert_sandbox(&sbx("sb_2", "prj_1")).await.unwrap();
    assert!(s.end_sandbox("sb_2", 9, "killed").await.unwrap());
    assert!(!s.end_sandbox("sb_2", 10, "timeout").await.unwrap(), "first reason wins");
    assert!(matches!(s.insert_sandbox(&sbx("sb_3", "prj_nope")).await, Err(StoreError::NotFound(_))));

    assert!(matches!(s.delete_project("acc_1", "prj_1").await, Err(StoreError::NotEmpty(_))));
    assert!(matches!(s.delete_workspace("acc_1", "ws_a", false).await, Err(StoreError::NotEmpty(_))));
    assert!(matches!(s.delete_workspace("acc_x", "ws_a", true).await, Err(StoreError::NotFound(_))));
    let removed = s.delete_workspace("acc_1", "ws_a", true).await.unwrap();
    assert_eq!(removed.live_sandboxes.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["sb_1"]);
    assert_eq!(s.get_sandbox("sb_1").await.unwrap(), None);
    assert!(s.list_projects("acc_1", None).await.unwrap().is_empty());
    assert!(s.list_workspaces("acc_1").await.unwrap().is_empty());
}

async fn project_delete_after_sandboxes_end(db: TestDb) {
    let s = seeded(&db).await;
    s.insert_workspace(&ws("ws_a", "a")).await.unwrap();
    s.insert_project("acc_1", &prj("prj_1", "ws_a", "p")).await.unwrap();
    s.insert_sandbox(&sbx("sb_1", "prj_1")).await.unwrap();
    s.end_sandbox("sb_1", 9, "killed").await.unwrap();
    s.delete_project("acc_1", "prj_1").await.unwrap();
    s.delete_workspace("acc_1", "ws_a", false).await.unwrap();
}

async fn sandboxes_by_scope_and_due(db: TestDb) {
    let s = seeded(&db).await;
    s.insert_workspace(&ws("ws_a", "a")).await.unwrap();
    s.insert_workspace(&ws("ws_b", "b")).await.unwrap();
    s.insert_project("acc_1", &prj("prj_1", "ws_a", "p")).await.unwrap();
    s.insert_project("acc_1", &prj("prj_2", "ws_b", "p")).await.unwrap();
    s.insert_sandbox(&sbx("sb_1", "prj_1")).await.unwrap();
    s.insert_sandbox(&sbx("sb_2", "prj_2")).await.unwrap();
    let all = s.list_sandboxes("acc_1", None, &SandboxFilter::default()).await.unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].workspace_id, "ws_a");
    assert_eq!(all[0].metadata.get("a").map(String::as_str), Some("b"));
    let scope = Scope::new(Vec::<String>::new(), ["prj_2"]);
    let seen = s.list_sandboxes("acc_1", Some(&scope), &SandboxFilter::default()).await.unwrap();
    assert_eq!(seen.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["sb_2"]);
    let f = SandboxFilter { workspace_id: Some("ws_a".into()), ..Default::default() };
    assert_eq!(s.list_sandboxes("acc_1", None, &f).await.unwrap().len(), 1);
    assert!(s.list_sandboxes("acc_other", None, &SandboxFilter::default()).await.unwrap().is_empty());

    s.set_sandbox_timeout("sb_2", Some(1000)).await.unwrap();
    s.set_sandbox_state("sb_1", SandboxState::Paused).await.unwrap();
    let sb1 = s.get_sandbox("sb_1").await.unwrap().unwrap();
    assert_eq!((sb1.state, sb1.on_timeout, sb1.timeout_ms), (SandboxState::Paused, OnTimeout::Pause, Some(95)));
    assert_eq!(s.sandboxes_due(500).await.unwrap().iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["sb_1"]);
    s.end_sandbox("sb_1", 600, "timeout").await.unwrap();
    assert!(s.sandboxes_due(500).await.unwrap().is_empty());
    assert_eq!(s.list_sandboxes("acc_1", None, &SandboxFilter::default()).await.unwrap().len(), 1);
    let f = SandboxFilter { include_ended: true, ..Default::default() };
    assert_eq!(s.list_sandboxes("acc_1", None, &f).await.unwrap().len(), 2);
}

async fn unknown_states_and_policies_are_errors_not_guesses(db: TestDb) {
    let s = seeded(&db).await;
    s.insert_workspace(&ws("ws_a", "a")).await.unwrap();
    s.insert_project("acc_1", &prj("prj_1", "ws_a", "p")).await.unwrap();
    s.insert_sandbox(&sbx("sb_1", "prj_1")).await.unwrap();
    for (column, value, what) in [("state", "zombie", "sandbox state"), ("on_timeout", "explode", "on-timeout policy")]
    {
        s.exec(&format!("UPDATE sandboxes SET {column} = '{value}' WHERE id = 'sb_1'")).await.unwrap();
        match s.get_sandbox("sb_1").await {
            Err(StoreError::UnknownValue { what: w, value: v }) => assert_eq!((w, v.as_str()), (what, value)),
            other => panic!("{column} = {value}: {other:?}"),
        }
        assert!(s.sandboxes_due(i64::MAX).await.is_err());
        let fix = if column == "state" { "running" } else { "kill" };
        s.exec(&format!("UPDATE sandboxes SET {column} = '{fix}' WHERE id = 'sb_1'")).await.unwrap();
    }
    let sb = s.get_sandbox("sb_1").await.unwrap().unwrap();
    assert_eq!((sb.state, sb.on_timeout), (SandboxState::Running, OnTimeout::Kill));
}

async fn key_hashes_are_read_by_creation_time(db: TestDb) {
    let s = seeded(&db).await;
    let later = KeyRecord { hash: vec![9; 32], created_at: 50, ..k("key_later", None) };
    s.insert_key(&later).await.unwrap();
    s.revoke_key("acc_1", "key_later", 60).await.unwrap();
    assert_eq!(s.key_hashes_since(50).await.unwrap(), vec![vec![9; 32]], "revoked ones too");
    assert_eq!(s.key_hashes_since(51).await.unwrap(), Vec::<Vec<u8>>::new());
    assert!(s.key_hashes_since(0).await.unwrap().len() >= 2, "the seeded key as well");
}

async fn last_unscoped_key_cannot_be_revoked(db: TestDb) {
    let s = seeded(&db).await;
    assert!(matches!(s.revoke_key("acc_1", "key_root", 5).await, Err(StoreError::Conflict(_))));
    s.insert_key(&k("key_two", None)).await.unwrap();
    s.revoke_key("acc_1", "key_root", 5).await.unwrap();
    assert!(matches!(s.revoke_key("acc_1", "key_root", 6).await, Err(StoreError::NotFound(_))));
    assert_eq!(s.keys_by_prefix("lz_key_root").await.unwrap()[0].revoked_at, Some(5));
    assert_eq!(s.get_key("acc_1", "key_root").await.unwrap(), None);
}

store_tests!(
    bootstrap_happens_once,
    the_ledger_keeps_its_rows_balances_and_guards_through_migration_7,
    migrations_are_idempotent_and_refuse_newer_schema,
    scopes_round_trip,
    duplicates_conflict_per_parent,
    deletes_refuse_non_empty_and_force_returns_live_sandboxes,
    project_delete_after_sandboxes_end,
    sandboxes_by_scope_and_due,
    unknown_states_and_policies_are_errors_not_guesses,
    key_hashes_are_read_by_creation_time,
    last_unscoped_key_cannot_be_revoked
);
