//! Template builds: one at a time per template, a bounded number at once per workspace.

use super::harness::TestDb;
use super::store_tests;
use crate::store::templates::{FinishedBuild, NewBuild, NewTemplate};
use crate::store::StoreError;
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

fn build(id: &str) -> NewBuild {
    NewBuild { id: id.into(), template_ref: format!("ref-{id}"), created_at: 1, workspace_limit: 2 }
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

store_tests!(a_workspace_runs_a_bounded_number_of_builds_at_once);
