//! Template builds: one at a time per template, a bounded number at once per workspace.

use crate::harness::TestDb;
use crate::store_tests;
use crate::templates::{FinishedBuild, NewBuild, NewTemplate};
use crate::{MeterSpec, MeterState, StoreError};
use lizard_api::templates::BuildStatus;

fn template(id: &str, workspace: &str, name: &str) -> NewTemplate {
    NewTemplate {
        id: id.into(),
        workspace_id: workspace.into(),
        name: name.into(),
        description: String::new(),
        base: "base".into(),
        start_cmd: None,
        created_at: 1,
    }
}

/// A build machine's price per second, in nano-dollars.
const RATE: i64 = 12_345;

fn build(id: &str) -> NewBuild {
    let meter = MeterSpec { vcpus: 2, memory_mib: 2048, running_nanos_per_sec: RATE, paused_nanos_per_sec: 0 };
    NewBuild { id: id.into(), template_ref: format!("ref-{id}"), created_at: 1, workspace_limit: 2, meter }
}

fn failed() -> FinishedBuild {
    FinishedBuild {
        status: BuildStatus::Failed,
        steps: vec![],
        error: None,
        log: String::new(),
        events: String::new(),
        layer_bytes: None,
        finished_at: 2,
        description: String::new(),
        base: "base".into(),
        start_cmd: None,
    }
}

async fn a_workspace_runs_a_bounded_number_of_builds_at_once(db: TestDb) {
    let s = db.seeded("acc", &[("ws_a", "prj_a"), ("ws_b", "prj_b")]).await;
    s.insert_build(&template("tpl_1", "ws_a", "one"), &build("bld_1")).await.unwrap();
    // The same template again while its build is queued: refused.
    let again = s.insert_build(&template("tpl_x", "ws_a", "one"), &build("bld_x")).await.unwrap_err();
    assert!(matches!(again, StoreError::Conflict(ref m) if m.contains("being built")), "{again:?}");
    s.insert_build(&template("tpl_2", "ws_a", "two"), &build("bld_2")).await.unwrap();
    s.start_build("bld_2").await.unwrap();
    // Two queued or running in the workspace: a third template's build is refused…
    let third = s.insert_build(&template("tpl_3", "ws_a", "three"), &build("bld_3")).await.unwrap_err();
    assert!(matches!(third, StoreError::Conflict(ref m) if m.contains("at once")), "{third:?}");
    assert!(s.find_template("ws_a", "three").await.unwrap().is_none(), "a refused build left its template");
    // …while another workspace builds on…
    s.insert_build(&template("tpl_4", "ws_b", "three"), &build("bld_4")).await.unwrap();
    // …and once one ended, it is taken.
    s.finish_build("bld_1", &failed()).await.unwrap();
    s.insert_build(&template("tpl_3", "ws_a", "three"), &build("bld_3")).await.unwrap();
}

async fn a_build_is_metered_from_its_record_until_it_is_finished(db: TestDb) {
    let s = db.seeded("acc", &[("ws_a", "prj_a")]).await;
    s.insert_build(&template("tpl_1", "ws_a", "one"), &build("bld_1")).await.unwrap();
    let open = s.open_meters(Some("acc")).await.unwrap();
    let meter = open.iter().find(|m| m.sandbox_id == "bld_1").expect("the build's meter is open");
    assert_eq!((meter.workspace_id.as_str(), meter.state), ("ws_a", MeterState::Running));
    assert_eq!((meter.spec.vcpus, meter.spec.memory_mib), (2, 2048), "billed at the build VM's size");
    // A refused build opens none.
    s.insert_build(&template("tpl_x", "ws_a", "one"), &build("bld_x")).await.unwrap_err();
    let finished = FinishedBuild { finished_at: 5_001, ..failed() };
    s.finish_build("bld_1", &finished).await.unwrap();
    let open = s.open_meters(Some("acc")).await.unwrap();
    assert!(open.iter().all(|m| m.sandbox_id != "bld_1" && m.sandbox_id != "bld_x"), "{open:?}");
    let charged = s.charged_by_sandbox("acc", &["bld_1".to_string()]).await.unwrap();
    assert_eq!(charged.get("bld_1"), Some(&(RATE * 5)), "5 s of a 2 vCPU / 2 GiB machine");
}

fn ready() -> FinishedBuild {
    FinishedBuild { status: BuildStatus::Ready, layer_bytes: Some(1), ..failed() }
}

/// A ready build `bld` of template `tpl_1` ("one" in ws_a).
async fn built(s: &dyn crate::Store, bld: &str) {
    s.insert_build(&template("tpl_1", "ws_a", "one"), &build(bld)).await.unwrap();
    s.finish_build(bld, &ready()).await.unwrap();
}

async fn tags_name_ready_builds_and_keep_their_node_templates(db: TestDb) {
    let s = db.seeded("acc", &[("ws_a", "prj_a")]).await;
    built(&*s, "bld_1").await;
    let tags = |t: &[&str]| t.iter().map(|t| t.to_string()).collect::<Vec<_>>();
    assert!(s.template_ref_in_use("ref-bld_1").await.unwrap(), "the current build's");
    assert_eq!(s.assign_tags("tpl_1", "bld_1", &tags(&["stable", "v1"]), 10).await.unwrap(), Vec::<String>::new());
    // A rebuild: the first build is no longer current but its tags keep it.
    built(&*s, "bld_2").await;
    assert!(s.template_ref_in_use("ref-bld_1").await.unwrap(), "tagged");
    let stable = s.tagged_build("tpl_1", "stable").await.unwrap().unwrap();
    assert_eq!((stable.build_id.as_str(), stable.template_ref.as_str(), stable.created_at), ("bld_1", "ref-bld_1", 10));
    assert_eq!(s.tagged_build("tpl_1", "nope").await.unwrap(), None);
    // Moving one tag reports the build that lost it; the other still keeps it.
    assert_eq!(s.assign_tags("tpl_1", "bld_2", &tags(&["stable"]), 20).await.unwrap(), ["ref-bld_1"]);
    assert!(s.template_ref_in_use("ref-bld_1").await.unwrap(), "v1 still names it");
    let listed: Vec<(String, String)> =
        s.list_tags("tpl_1").await.unwrap().into_iter().map(|t| (t.tag, t.build_id)).collect();
    assert_eq!(listed, [("stable".into(), "bld_2".into()), ("v1".into(), "bld_1".into())]);
    // Removing is all or none.
    let missing = s.remove_tags("tpl_1", &tags(&["v1", "nope"])).await.unwrap_err();
    assert!(matches!(missing, StoreError::NotFound(ref m) if m.contains("nope")), "{missing:?}");
    assert_eq!(s.list_tags("tpl_1").await.unwrap().len(), 2);
    assert_eq!(s.remove_tags("tpl_1", &tags(&["v1"])).await.unwrap(), ["ref-bld_1"]);
    assert!(!s.template_ref_in_use("ref-bld_1").await.unwrap(), "nothing keeps it now");
    // Only a ready build of the template takes a tag.
    s.insert_build(&template("tpl_1", "ws_a", "one"), &build("bld_3")).await.unwrap();
    assert!(matches!(s.assign_tags("tpl_1", "bld_3", &tags(&["x"]), 30).await, Err(StoreError::NotFound(_))));
    assert!(matches!(s.assign_tags("tpl_9", "bld_2", &tags(&["x"]), 30).await, Err(StoreError::NotFound(_))));
    s.finish_build("bld_3", &failed()).await.unwrap();
    // The template's delete takes its tags along.
    s.delete_template("tpl_1").await.unwrap();
    assert!(s.list_tags("tpl_1").await.unwrap().is_empty());
}

/// Builds made in the same millisecond come back in the order they were made, on both
/// engines (ids sort the other way round here).
async fn builds_of_one_millisecond_keep_the_order_they_were_made_in(db: TestDb) {
    let s = db.seeded("acc", &[("ws_a", "prj_a")]).await;
    for bld in ["bld_z", "bld_m", "bld_a"] {
        built(&*s, bld).await;
    }
    assert_eq!(s.delete_template("tpl_1").await.unwrap(), ["ref-bld_z", "ref-bld_m", "ref-bld_a"]);
}

/// A build's record from queued to running with progress to failed by a restart; the
/// account's templates; the blobs a workspace has uploaded.
async fn builds_record_progress_and_a_restart_fails_the_unfinished(db: TestDb) {
    use lizard_api::templates::{BuildFailure, BuildStepInfo};
    let s = db.seeded("acc", &[("ws_a", "prj_a"), ("ws_b", "prj_b")]).await;
    s.insert_build(&template("tpl_1", "ws_a", "one"), &build("bld_1")).await.unwrap();
    s.insert_build(&template("tpl_2", "ws_b", "two"), &build("bld_2")).await.unwrap();
    let queued = s.get_build("bld_1").await.unwrap().unwrap();
    assert_eq!(
        (queued.status, queued.template_name.as_str(), queued.account_id.as_str()),
        (BuildStatus::Queued, "one", "acc")
    );
    assert_eq!(s.get_build("bld_x").await.unwrap(), None);
    s.start_build("bld_1").await.unwrap();
    let step = BuildStepInfo {
        index: 1,
        description: "run make".into(),
        cached: false,
        status: BuildStatus::Running,
        duration_ms: None,
    };
    s.record_progress("bld_1", std::slice::from_ref(&step), "making\n").await.unwrap();
    let running = s.get_build("bld_1").await.unwrap().unwrap();
    assert_eq!((running.status, running.steps, running.log.as_str()), (BuildStatus::Running, vec![step], "making\n"));
    let listed: Vec<String> = s.list_templates("acc").await.unwrap().into_iter().map(|t| t.name).collect();
    assert_eq!(listed, ["one", "two"], "by workspace then name");
    assert!(s.list_templates("acc_x").await.unwrap().is_empty());
    // A server that stopped mid-build: both unfinished builds fail, naming why.
    let why =
        BuildFailure { code: "INTERNAL".into(), message: "the server restarted".into(), step: None, output_tail: None };
    let mut refs = s.fail_unfinished_builds(&why, 9).await.unwrap();
    refs.sort();
    assert_eq!(refs, ["ref-bld_1", "ref-bld_2"]);
    let failed = s.get_build("bld_1").await.unwrap().unwrap();
    assert_eq!((failed.status, failed.error, failed.finished_at), (BuildStatus::Failed, Some(why.clone()), Some(9)));
    assert!(s.fail_unfinished_builds(&why, 10).await.unwrap().is_empty(), "none left");
    // Blobs: those a workspace has not uploaded, in the order asked; per workspace.
    let (h1, h2, h3) = ("a".repeat(64), "b".repeat(64), "c".repeat(64));
    s.insert_blob("ws_a", &h2, 10, 1).await.unwrap();
    s.insert_blob("ws_a", &h2, 10, 2).await.unwrap();
    let asked = [h3.clone(), h2.clone(), h1.clone()];
    assert_eq!(s.missing_blobs("ws_a", &asked).await.unwrap(), [h3.clone(), h1.clone()]);
    assert_eq!(s.missing_blobs("ws_b", &asked).await.unwrap(), asked);
    assert!(s.missing_blobs("ws_a", &[]).await.unwrap().is_empty());
}

store_tests!(
    builds_record_progress_and_a_restart_fails_the_unfinished,
    builds_of_one_millisecond_keep_the_order_they_were_made_in,
    a_workspace_runs_a_bounded_number_of_builds_at_once,
    a_build_is_metered_from_its_record_until_it_is_finished,
    tags_name_ready_builds_and_keep_their_node_templates
);
