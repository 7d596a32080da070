//! Services: unique names, revision-checked writes.

use crate::harness::TestDb;
use crate::services::{InstanceRecord, ServiceBody, ServiceRecord, VersionRecord};
use crate::store_tests;
use crate::StoreError;
use lizard_api::services::{InstanceState, ServiceSpec, ServiceStatus, VersionStatus};

fn service(id: &str, account: &str, name: &str) -> ServiceRecord {
    let spec: ServiceSpec = serde_json::from_str(r#"{"cmd":"python3 -m http.server 8000","port":8000}"#).unwrap();
    ServiceRecord {
        id: id.into(),
        account_id: account.into(),
        workspace_id: "ws_1".into(),
        project_id: "prj_1".into(),
        name: name.into(),
        body: ServiceBody {
            status: ServiceStatus::Deploying,
            error: None,
            live_version: None,
            versions: vec![VersionRecord {
                version: 1,
                status: VersionStatus::Building,
                spec,
                template: format!("svc-{name}-v1"),
                build_id: Some("bld_1".into()),
                template_ref: None,
                error: None,
                created_at: 5,
            }],
            instances: vec![],
        },
        revision: 0,
        created_at: 5,
        updated_at: 5,
    }
}

async fn service_names_are_unique_and_writes_name_their_revision(db: TestDb) {
    let s = db.open().await;
    let a = service("svc_a", "acc_1", "my-app");
    s.insert_service(&a).await.unwrap();
    // Another account cannot take the name: it is a host name.
    let taken = s.insert_service(&service("svc_b", "acc_2", "my-app")).await.unwrap_err();
    assert!(matches!(taken, StoreError::Conflict(ref m) if m.contains("my-app")), "{taken:?}");
    s.insert_service(&service("svc_c", "acc_2", "other")).await.unwrap();
    assert_eq!(s.service_by_name("my-app").await.unwrap().unwrap(), a);
    assert_eq!(s.service_by_name("nope").await.unwrap(), None);
    let names = |v: Vec<ServiceRecord>| v.into_iter().map(|s| s.name).collect::<Vec<_>>();
    assert_eq!(names(s.list_services(Some("acc_1")).await.unwrap()), ["my-app"]);
    assert_eq!(names(s.list_services(None).await.unwrap()), ["my-app", "other"]);

    // A write from the revision read succeeds and moves it on; one from a stale read fails.
    let mut first = a.clone();
    first.body.instances.push(InstanceRecord {
        sandbox_id: "sbx1".into(),
        version: 1,
        state: InstanceState::Starting,
        restarts: 0,
        since: 9,
        failures: 0,
    });
    let written = s.update_service(&first).await.unwrap();
    assert_eq!(written.revision, 1);
    let mut stale = a.clone();
    stale.body.status = ServiceStatus::Failed;
    assert!(matches!(s.update_service(&stale).await.unwrap_err(), StoreError::Conflict(_)));
    let read = s.service_by_name("my-app").await.unwrap().unwrap();
    assert_eq!((read.revision, read.body.instances.len(), read.body.status), (1, 1, ServiceStatus::Deploying));

    // Deleted: the name is free, and a late write says so.
    s.delete_service("svc_a").await.unwrap();
    assert!(matches!(s.update_service(&written).await.unwrap_err(), StoreError::NotFound(_)));
    s.insert_service(&service("svc_d", "acc_2", "my-app")).await.unwrap();
}

store_tests!(service_names_are_unique_and_writes_name_their_revision);
