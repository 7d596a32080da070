//! Volumes: one holder at a time, deletes.

use crate::harness::{TestDb, TestStore};
use crate::store_tests;
use crate::volumes::*;
use crate::{NewSandbox, StoreError};

async fn seeded(db: &TestDb) -> TestStore {
    let s = db.seeded("acc_1", &[("ws_a", "prj_a")]).await;
    s.upsert_node(&NodeRecord { id: "node_1".into(), region: "local".into(), created_at: 1 }).await.unwrap();
    s
}

fn vol(id: &str, name: &str) -> NewVolume {
    NewVolume {
        id: id.into(),
        project_id: "prj_a".into(),
        name: name.into(),
        size_gb: 1,
        node_id: "node_1".into(),
        region: "local".into(),
        created_at: 2,
        nanos_per_sec: 0,
        account_quota_gb: 100,
    }
}

async fn one_holder_at_a_time_until_the_sandbox_ends(db: TestDb) {
    let s = seeded(&db).await;
    s.insert_volume(&vol("vol_1", "data")).await.unwrap();
    assert!(matches!(s.insert_volume(&vol("vol_2", "data")).await, Err(StoreError::Conflict(_))));
    assert_eq!(s.find_volume("acc_1", "prj_a", "data").await.unwrap().map(|v| v.id), Some("vol_1".into()));
    assert_eq!(s.find_volume("acc_2", "prj_a", "data").await.unwrap(), None, "another account's");
    assert_eq!(s.find_volume("acc_1", "prj_a", "other").await.unwrap(), None);
    // Released only by its holder.
    s.attach_volume("vol_1", "creating:w").await.unwrap();
    s.release_volume("vol_1", "creating:other").await.unwrap();
    assert_eq!(s.get_volume("acc_1", "vol_1").await.unwrap().unwrap().attached_to.as_deref(), Some("creating:w"));
    s.release_volume("vol_1", "creating:w").await.unwrap();
    assert_eq!(s.get_volume("acc_1", "vol_1").await.unwrap().unwrap().attached_to, None);
    s.attach_volume("vol_1", "creating:x").await.unwrap();
    let e = s.attach_volume("vol_1", "creating:y").await.unwrap_err();
    assert!(e.to_string().contains("being created"), "{e}");
    s.reassign_volume("vol_1", "creating:x", "sbx_1").await.unwrap();
    let e = s.attach_volume("vol_1", "creating:y").await.unwrap_err();
    assert!(e.to_string().contains("sbx_1"), "{e}");
    let e = s.delete_volume("acc_1", "vol_1").await.unwrap_err();
    assert!(matches!(&e, StoreError::Conflict(m) if m.contains("sbx_1")), "{e}");
    assert!(matches!(s.delete_project("acc_1", "prj_a").await, Err(StoreError::NotEmpty(_))));
    let sbx = NewSandbox {
        meter: crate::MeterSpec { vcpus: 1, memory_mib: 512, running_nanos_per_sec: 0, paused_nanos_per_sec: 0 },
        ..crate::fixture::running_sandbox("sbx_1", "prj_a", "node_local", 3)
    };
    s.insert_sandbox(&sbx).await.unwrap();
    assert_eq!(s.release_stale_attachments().await.unwrap(), 0);
    assert!(s.end_sandbox("sbx_1", 4, "killed").await.unwrap());
    assert_eq!(s.get_volume("acc_1", "vol_1").await.unwrap().unwrap().attached_to, None);
    s.attach_volume("vol_1", "creating:z").await.unwrap();
    assert_eq!(s.release_stale_attachments().await.unwrap(), 1);
    assert_eq!(s.delete_volume("acc_1", "vol_1").await.unwrap().name, "data");
    assert!(s.get_volume("acc_1", "vol_1").await.unwrap().is_none());
}

async fn forced_workspace_delete_returns_its_volumes(db: TestDb) {
    let s = seeded(&db).await;
    s.insert_volume(&vol("vol_1", "data")).await.unwrap();
    assert!(matches!(s.delete_workspace("acc_1", "ws_a", false).await, Err(StoreError::NotEmpty(_))));
    let removed = s.delete_workspace("acc_1", "ws_a", true).await.unwrap();
    assert_eq!(removed.volumes.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(), ["vol_1"]);
    assert!(s.list_volumes("acc_1", None, None).await.unwrap().is_empty());
    assert_eq!(s.node_loads().await.unwrap()[0].volumes, 0);
}

/// The account's quota counts every workspace's volumes; a workspace's own bounds it
/// alone; a refused volume leaves no record.
async fn quotas_bound_an_accounts_and_a_workspaces_volumes(db: TestDb) {
    let s = db.seeded("acc_1", &[("ws_a", "prj_a"), ("ws_b", "prj_b")]).await;
    s.upsert_node(&NodeRecord { id: "node_1".into(), region: "local".into(), created_at: 1 }).await.unwrap();
    let sized = |id: &str, project: &str, size_gb| NewVolume {
        project_id: project.into(),
        size_gb,
        account_quota_gb: 10,
        ..vol(id, id)
    };
    s.insert_volume(&sized("vol_1", "prj_a", 6)).await.unwrap();
    let over = s.insert_volume(&sized("vol_2", "prj_b", 5)).await;
    assert!(matches!(&over, Err(StoreError::OverQuota(m)) if m.contains("account's")), "{over:?}");
    s.insert_volume(&sized("vol_2", "prj_b", 4)).await.unwrap();

    let w = s.set_workspace_volume_quota("acc_1", "ws_a", Some(7)).await.unwrap();
    assert_eq!(w.volume_quota_gb, Some(7));
    assert_eq!(s.get_workspace("acc_1", "ws_a").await.unwrap().unwrap().volume_quota_gb, Some(7));
    s.delete_volume("acc_1", "vol_2").await.unwrap();
    let over = s.insert_volume(&sized("vol_3", "prj_a", 2)).await;
    assert!(matches!(&over, Err(StoreError::OverQuota(m)) if m.contains("workspace's")), "{over:?}");
    s.insert_volume(&sized("vol_3", "prj_b", 2)).await.unwrap();
    let ids: Vec<_> = s.list_volumes("acc_1", None, None).await.unwrap().into_iter().map(|v| v.id).collect();
    assert_eq!(ids, ["vol_1", "vol_3"]);
    assert_eq!(s.set_workspace_volume_quota("acc_1", "ws_a", None).await.unwrap().volume_quota_gb, None);
    s.insert_volume(&sized("vol_4", "prj_a", 1)).await.unwrap();
    assert!(matches!(s.set_workspace_volume_quota("acc_2", "ws_a", Some(1)).await, Err(StoreError::NotFound(_))));
}

store_tests!(
    one_holder_at_a_time_until_the_sandbox_ends,
    forced_workspace_delete_returns_its_volumes,
    quotas_bound_an_accounts_and_a_workspaces_volumes
);
