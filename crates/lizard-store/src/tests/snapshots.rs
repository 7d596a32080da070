//! Sandbox snapshots: kept per account, one per name in a project, a second under a name
//! taking the first's id.

use crate::harness::TestDb;
use crate::store_tests;
use crate::SnapshotRecord;

fn snapshot(id: &str, name: Option<&str>, node_snapshot_id: &str, created_at: i64) -> SnapshotRecord {
    SnapshotRecord {
        id: id.into(),
        account_id: "acc".into(),
        workspace_id: "ws".into(),
        project_id: "prj".into(),
        node_id: "node".into(),
        node_snapshot_id: node_snapshot_id.into(),
        source_sandbox_id: "sbx".into(),
        template: "base".into(),
        template_ref: None,
        name: name.map(Into::into),
        created_at,
    }
}

async fn snapshots_are_kept_per_account_and_a_name_keeps_its_id(db: TestDb) {
    let s = db.open().await;
    let plain = snapshot("snp_a", None, "n1", 1);
    assert_eq!(s.put_snapshot(&plain).await.unwrap(), (plain.clone(), None));
    assert_eq!(s.get_snapshot("acc", "snp_a").await.unwrap(), Some(plain.clone()));
    assert_eq!(s.get_snapshot("other", "snp_a").await.unwrap(), None);
    // Two without a name are two snapshots.
    let second = snapshot("snp_b", None, "n2", 2);
    s.put_snapshot(&second).await.unwrap();
    let named = snapshot("snp_c", Some("mine"), "n3", 3);
    assert_eq!(s.put_snapshot(&named).await.unwrap(), (named.clone(), None));
    // Again under the name: the same id, the new save, and the old save to delete.
    let again = SnapshotRecord { source_sandbox_id: "sbx2".into(), ..snapshot("snp_d", Some("mine"), "n4", 4) };
    let (kept, replaced) = s.put_snapshot(&again).await.unwrap();
    assert_eq!(kept, SnapshotRecord { id: "snp_c".into(), ..again.clone() });
    assert_eq!(replaced, Some(("node".into(), "n3".into())));
    assert_eq!(s.snapshot_named("acc", "prj", "mine").await.unwrap(), Some(kept.clone()));
    assert_eq!(s.snapshot_named("acc", "other", "mine").await.unwrap(), None);
    assert_eq!(s.snapshot_named("other", "prj", "mine").await.unwrap(), None);
    assert_eq!(s.list_snapshots("acc").await.unwrap(), vec![plain, second, kept]);
    assert!(s.list_snapshots("other").await.unwrap().is_empty());
    assert!(!s.delete_snapshot("other", "snp_a").await.unwrap());
    assert!(s.delete_snapshot("acc", "snp_a").await.unwrap());
    assert!(!s.delete_snapshot("acc", "snp_a").await.unwrap());
    assert_eq!(s.list_snapshots("acc").await.unwrap().len(), 2);
}

store_tests!(snapshots_are_kept_per_account_and_a_name_keeps_its_id);
