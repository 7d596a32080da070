//! Template operations over the store and a fake node (no VM, no root): every check of a
//! push, the build's record as it runs and ends, cancel, scopes, delete, and what a
//! sandbox of a pushed template is created from.

use super::templates as ops;
use super::tests::{app_in, BuildOutcome, FakeNode};
use crate::auth::Principal;
use crate::state::AppState;
use lizard_api::templates::{
    BuildEvent, BuildStatus, ContextEntry, ContextEntryKind, PushTemplateRequest, RecipeFormat,
};
use lizard_api::ErrorCode;
use lizard_store::scope::Scope;
use lizard_store::{BuildRecord, NewSandbox, OnTimeout, SandboxState, WorkspaceRecord};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::Arc;

const RECIPE: &str = r#"
name = "web"
from = "base"
[[steps]]
copy = { src = "site/", dest = "/srv/" }
[[steps]]
run = "echo built > /srv/built"
[start]
cmd = "python3 -m http.server 8080 --directory /srv"
ready = { port = 8080 }
"#;

struct World {
    _dir: tempfile::TempDir,
    node: Arc<FakeNode>,
    state: AppState,
}

async fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let node = Arc::new(FakeNode::default());
    let state = app_in(node.clone(), &[("ws_a", "prj_a"), ("ws_b", "prj_b")], dir.path().to_str().unwrap()).await;
    World { _dir: dir, node, state }
}

fn owner() -> Principal {
    Principal { account_id: "acc".into(), key_id: "key_owner".into(), key_name: "owner".into(), scope: None }
}

fn scoped(workspace: &str) -> Principal {
    Principal { scope: Some(Scope::new([workspace], Vec::<String>::new())), ..owner() }
}

async fn ws(state: &AppState, id: &str) -> WorkspaceRecord {
    state.server.store.get_workspace("acc", id).await.unwrap().unwrap()
}

fn sha(content: &[u8]) -> String {
    hex::encode(Sha256::digest(content))
}

fn file(path: &str, content: &[u8]) -> ContextEntry {
    ContextEntry {
        path: path.into(),
        mode: 0o644,
        kind: ContextEntryKind::File,
        sha256: Some(sha(content)),
        size: Some(content.len() as u64),
        target: None,
    }
}

fn dir(path: &str) -> ContextEntry {
    ContextEntry { path: path.into(), mode: 0o755, kind: ContextEntryKind::Dir, sha256: None, size: None, target: None }
}

fn push_req(recipe: &str, files: Vec<ContextEntry>) -> PushTemplateRequest {
    PushTemplateRequest {
        recipe: recipe.into(),
        format: RecipeFormat::Toml,
        name: None,
        files,
        workspace: None,
        project: None,
    }
}

async fn upload(state: &AppState, workspace: &WorkspaceRecord, content: &'static [u8]) {
    let body = futures_util::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from_static(content))]);
    ops::upload_blob(state, workspace, &sha(content), body).await.unwrap();
}

/// The site directory, uploaded to `workspace`.
async fn site(state: &AppState, workspace: &WorkspaceRecord) -> Vec<ContextEntry> {
    upload(state, workspace, b"<h1>hi</h1>").await;
    vec![dir("site"), file("site/index.html", b"<h1>hi</h1>")]
}

async fn until_ended(state: &AppState, build_id: &str) -> BuildRecord {
    for _ in 0..500 {
        let b = state.server.store.get_build(build_id).await.unwrap().unwrap();
        if b.status.is_final() && state.builds.get(build_id).is_none() {
            return b;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("build {build_id} did not end");
}

fn code(e: crate::error::AppError) -> (ErrorCode, String) {
    (e.code(), e.0.message)
}

#[tokio::test]
async fn uploads_are_per_workspace_and_checked() {
    let w = world().await;
    let (a, b) = (ws(&w.state, "ws_a").await, ws(&w.state, "ws_b").await);
    let h = sha(b"x");
    assert_eq!(ops::missing_blobs(&w.state, &a, std::slice::from_ref(&h)).await.unwrap(), std::slice::from_ref(&h));
    upload(&w.state, &a, b"x").await;
    assert!(ops::missing_blobs(&w.state, &a, std::slice::from_ref(&h)).await.unwrap().is_empty());
    // Workspace B never learns that A has it.
    assert_eq!(ops::missing_blobs(&w.state, &b, std::slice::from_ref(&h)).await.unwrap(), std::slice::from_ref(&h));
    let bad = ops::missing_blobs(&w.state, &a, &["../etc".into()]).await.unwrap_err();
    assert_eq!(bad.code(), ErrorCode::InvalidArgument);
    let wrong = futures_util::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"y"))]);
    let e = ops::upload_blob(&w.state, &b, &h, wrong).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert_eq!(ops::missing_blobs(&w.state, &b, std::slice::from_ref(&h)).await.unwrap(), [h]);
}

#[tokio::test]
async fn a_push_builds_records_and_a_rebuild_replaces_for_new_sandboxes() {
    let w = world().await;
    let a = ws(&w.state, "ws_a").await;
    let files = site(&w.state, &a).await;
    let queued = ops::push(&w.state, &a, &push_req(RECIPE, files.clone())).await.unwrap();
    assert_eq!(queued.template_ref, ops::template_ref(&queued.id));
    assert!(lizard_recipe::recipe::is_template_name(&queued.template_ref));
    let built = until_ended(&w.state, &queued.id).await;
    assert_eq!(built.status, BuildStatus::Ready, "{:?}", built.error);
    assert_eq!(built.steps.len(), 2);
    assert_eq!(built.layer_bytes, Some(4096));
    assert!(built.log.contains("step 2"));
    let events = crate::builds::from_ndjson(&built.events);
    assert!(matches!(events.first(), Some(BuildEvent::Step { index: 1, total: 2, .. })));
    assert!(matches!(events.last(), Some(BuildEvent::Done { status: BuildStatus::Ready, error: None })));

    let t = w.state.server.store.find_template("ws_a", "web").await.unwrap().unwrap();
    let info = ops::template_info(&t);
    assert!(info.ready && !info.builtin);
    assert_eq!(info.start_cmd.as_deref(), Some("python3 -m http.server 8080 --directory /srv"));
    let prj_a = w.state.server.store.get_project("acc", "prj_a").await.unwrap().unwrap();
    let prj_b = w.state.server.store.get_project("acc", "prj_b").await.unwrap().unwrap();
    assert_eq!(ops::node_template_for(&w.state, &prj_a, "web").await.unwrap(), Some(built.template_ref.clone()));
    assert_eq!(ops::node_template_for(&w.state, &prj_a, "base").await.unwrap(), None, "a built-in");
    let other = ops::node_template_for(&w.state, &prj_b, "web").await.unwrap_err();
    assert_eq!(other.code(), ErrorCode::NotFound, "another workspace's template");

    // A sandbox runs from the first build while a rebuild replaces it for new sandboxes.
    record_sandbox(&w.state, "sbx_1", "prj_a", &built.template_ref).await;
    let second = ops::push(&w.state, &a, &push_req(RECIPE, files)).await.unwrap();
    let second = until_ended(&w.state, &second.id).await;
    assert_eq!(second.status, BuildStatus::Ready);
    assert_eq!(ops::node_template_for(&w.state, &prj_a, "web").await.unwrap(), Some(second.template_ref.clone()));
    assert!(!w.node.calls().iter().any(|c| c.starts_with("delete_template")), "the old one is in use");

    // Deleting waits for the sandbox, then deletes every node template it had.
    let t = w.state.server.store.find_template("ws_a", "web").await.unwrap().unwrap();
    let busy = code(ops::delete(&w.state, &t).await.unwrap_err());
    assert_eq!(busy.0, ErrorCode::Conflict);
    assert!(busy.1.contains("sbx_1"), "{}", busy.1);
    w.state.server.store.end_sandbox("sbx_1", 10, "killed").await.unwrap();
    ops::delete(&w.state, &t).await.unwrap();
    let deleted: Vec<String> = w.node.calls().into_iter().filter(|c| c.starts_with("delete_template")).collect();
    assert_eq!(
        deleted,
        [format!("delete_template {}", built.template_ref), format!("delete_template {}", second.template_ref)]
    );
    assert!(w.state.server.store.find_template("ws_a", "web").await.unwrap().is_none());
}

async fn record_sandbox(state: &AppState, id: &str, project: &str, template_ref: &str) {
    let s = NewSandbox {
        id: id.into(),
        project_id: project.into(),
        template: "web".into(),
        state: SandboxState::Running,
        created_at: 1,
        timeout_at: None,
        metadata: BTreeMap::new(),
        meter: state.server.config.billing.pricing.meter(1, 512),
        on_timeout: OnTimeout::Kill,
        timeout_ms: None,
        template_ref: Some(template_ref.into()),
        node_id: "node_local".into(),
    };
    state.server.store.insert_sandbox(&s).await.unwrap();
}

#[tokio::test]
async fn a_replaced_build_nobody_uses_is_deleted_at_once() {
    let w = world().await;
    let a = ws(&w.state, "ws_a").await;
    let files = site(&w.state, &a).await;
    let first = ops::push(&w.state, &a, &push_req(RECIPE, files.clone())).await.unwrap();
    let first = until_ended(&w.state, &first.id).await;
    let second = ops::push(&w.state, &a, &push_req(RECIPE, files)).await.unwrap();
    until_ended(&w.state, &second.id).await;
    assert!(w.node.calls().contains(&format!("delete_template {}", first.template_ref)));
}

#[tokio::test]
async fn a_tag_keeps_its_build_for_creates_until_it_moves_or_goes() {
    let w = world().await;
    let a = ws(&w.state, "ws_a").await;
    let files = site(&w.state, &a).await;
    let prj = w.state.server.store.get_project("acc", "prj_a").await.unwrap().unwrap();
    let first = ops::push(&w.state, &a, &push_req(RECIPE, files.clone())).await.unwrap();
    let first = until_ended(&w.state, &first.id).await;
    let template = || async { w.state.server.store.find_template("ws_a", "web").await.unwrap().unwrap() };
    let created_from = |name: &'static str| ops::node_template_for(&w.state, &prj, name);
    assert_eq!(created_from("web:default").await.unwrap(), Some(first.template_ref.clone()));
    let untagged = created_from("web:stable").await.unwrap_err();
    assert_eq!(code(untagged), (ErrorCode::NotFound, "template web has no tag stable".into()));
    assert_eq!(ops::tags::assign(&w.state, &template().await, None, &["stable".into()]).await.unwrap(), first.id);

    // A rebuild moves `default` and not `stable`, whose build's node template stays.
    let second = ops::push(&w.state, &a, &push_req(RECIPE, files)).await.unwrap();
    let second = until_ended(&w.state, &second.id).await;
    assert_eq!(created_from("web").await.unwrap(), Some(second.template_ref.clone()));
    assert_eq!(created_from("web:stable").await.unwrap(), Some(first.template_ref.clone()));
    let deleted = |r: &str| w.node.calls().contains(&format!("delete_template {r}"));
    assert!(!deleted(&first.template_ref), "a tagged build's node template was deleted");
    let listed: Vec<(String, String)> =
        ops::tags::list(&w.state, &template().await).await.unwrap().into_iter().map(|t| (t.tag, t.build_id)).collect();
    assert_eq!(listed, [("default".into(), second.id.clone()), ("stable".into(), first.id.clone())]);

    // Refused, nothing changed: `default` moved by hand, a tag that is not there removed.
    let t = template().await;
    assert_eq!(
        code(ops::tags::assign(&w.state, &t, None, &["default".into()]).await.unwrap_err()).0,
        ErrorCode::InvalidArgument
    );
    let missing = ops::tags::remove(&w.state, &t, &["stable".into(), "nope".into()]).await.unwrap_err();
    assert_eq!(code(missing).0, ErrorCode::NotFound);
    assert_eq!(created_from("web:stable").await.unwrap(), Some(first.template_ref.clone()));

    // Moved to the latest build, the tag lets the first build's node template go.
    assert_eq!(ops::tags::assign(&w.state, &t, Some("default"), &["stable".into()]).await.unwrap(), second.id);
    assert!(deleted(&first.template_ref));
    ops::tags::remove(&w.state, &t, &["stable".into()]).await.unwrap();
    assert!(!deleted(&second.template_ref), "the current build's node template stays");
    assert_eq!(code(created_from("web:stable").await.unwrap_err()).0, ErrorCode::NotFound);
}

#[tokio::test]
async fn every_bad_push_is_refused_before_anything_is_built() {
    let w = world().await;
    let a = ws(&w.state, "ws_a").await;
    let files = site(&w.state, &a).await;
    let with = |recipe: &str| push_req(recipe, files.clone());
    let cases: Vec<(&str, PushTemplateRequest, ErrorCode, &str)> = vec![
        ("built-in name", with(&RECIPE.replace("\"web\"", "\"base\"")), ErrorCode::Conflict, "built-in"),
        ("invalid name", with(&RECIPE.replace("\"web\"", "\"Web_1\"")), ErrorCode::InvalidArgument, "name"),
        ("reserved name", with(&RECIPE.replace("\"web\"", "\"blobs\"")), ErrorCode::InvalidArgument, "reserved"),
        ("unknown base", with(&RECIPE.replace("from = \"base\"", "from = \"nope\"")), ErrorCode::NotFound, "nope"),
        (
            "a Debian base with packages of one's own",
            with(
                &RECIPE.replace("from = \"base\"", "from = { debian = \"bookworm\", packages = [\"openssh-server\"] }"),
            ),
            ErrorCode::InvalidArgument,
            "a Debian root of bookworm, trixie, forky, sid that names no packages",
        ),
        (
            "a Debian suite not offered",
            with(&RECIPE.replace("from = \"base\"", "from = { debian = \"jessie\" }")),
            ErrorCode::InvalidArgument,
            "other Debian bases are for built-in templates",
        ),
        ("syntax", with("name = "), ErrorCode::InvalidArgument, "recipe"),
        (
            "copy ../",
            with(&RECIPE.replace("src = \"site/\"", "src = \"../etc\"")),
            ErrorCode::InvalidArgument,
            "leaves the pushed directory",
        ),
        (
            "copy absolute",
            with(&RECIPE.replace("src = \"site/\"", "src = \"/etc\"")),
            ErrorCode::InvalidArgument,
            "copy.src",
        ),
        (
            "symlink out",
            push_req(
                RECIPE,
                vec![
                    dir("site"),
                    ContextEntry {
                        path: "site/passwd".into(),
                        mode: 0o777,
                        kind: ContextEntryKind::Symlink,
                        sha256: None,
                        size: None,
                        target: Some("../../etc/passwd".into()),
                    },
                ],
            ),
            ErrorCode::InvalidArgument,
            "outside the pushed directory",
        ),
        (
            "missing blob",
            push_req(RECIPE, vec![dir("site"), file("site/new.txt", b"never uploaded")]),
            ErrorCode::InvalidArgument,
            "site/new.txt",
        ),
        (
            "over the size limit",
            push_req(
                RECIPE,
                vec![
                    dir("site"),
                    ContextEntry { size: Some(ops::context_limits().max_bytes + 1), ..file("site/big", b"x") },
                ],
            ),
            ErrorCode::InvalidArgument,
            "more than",
        ),
        (
            "dockerfile without a name",
            PushTemplateRequest { format: RecipeFormat::Dockerfile, ..with("FROM base\n") },
            ErrorCode::InvalidArgument,
            "needs a name",
        ),
    ];
    for (what, req, expected, says) in cases {
        let (got, message) =
            code(ops::push(&w.state, &a, &req).await.err().unwrap_or_else(|| panic!("{what}: pushed")));
        assert_eq!(got, expected, "{what}: {message}");
        assert!(message.contains(says), "{what}: {message:?} does not say {says:?}");
        assert!(!message.contains(w._dir.path().to_str().unwrap()), "{what}: a host path in {message:?}");
    }
    assert!(w.node.calls().is_empty(), "nothing reached the node: {:?}", w.node.calls());
    assert!(w.state.server.store.list_templates("acc").await.unwrap().is_empty());
}

#[tokio::test]
async fn a_failed_step_is_recorded_with_the_step_and_nothing_is_usable() {
    let w = world().await;
    let a = ws(&w.state, "ws_a").await;
    let files = site(&w.state, &a).await;
    *w.node.outcome.lock().unwrap() = BuildOutcome::FailLastStep;
    let b = ops::push(&w.state, &a, &push_req(RECIPE, files)).await.unwrap();
    let b = until_ended(&w.state, &b.id).await;
    assert_eq!(b.status, BuildStatus::Failed);
    let error = b.error.clone().unwrap();
    assert_eq!((error.code.as_str(), error.step), ("STEP_FAILED", Some(2)));
    assert_eq!(b.steps.iter().map(|s| s.status).collect::<Vec<_>>(), [BuildStatus::Ready, BuildStatus::Failed]);
    let info = ops::build_info(&b, None);
    assert_eq!(info.error.unwrap().output_tail.as_deref(), Some("step 2\n"));
    let prj = w.state.server.store.get_project("acc", "prj_a").await.unwrap().unwrap();
    assert_eq!(ops::node_template_for(&w.state, &prj, "web").await.unwrap_err().code(), ErrorCode::NotFound);
    // Another template cannot build on it either.
    let on_it = RECIPE.replace("\"web\"", "\"web2\"").replace("from = \"base\"", "from = \"web\"");
    let e = ops::push(&w.state, &a, &push_req(&on_it, vec![])).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::NotFound);
}

#[tokio::test]
async fn one_build_at_a_time_and_cancel_ends_it() {
    let w = world().await;
    let a = ws(&w.state, "ws_a").await;
    let files = site(&w.state, &a).await;
    *w.node.outcome.lock().unwrap() = BuildOutcome::UntilCancelled;
    let b = ops::push(&w.state, &a, &push_req(RECIPE, files.clone())).await.unwrap();
    let again = ops::push(&w.state, &a, &push_req(RECIPE, files)).await.unwrap_err();
    assert_eq!(again.code(), ErrorCode::Conflict);
    let t = w.state.server.store.find_template("ws_a", "web").await.unwrap().unwrap();
    assert_eq!(ops::delete(&w.state, &t).await.unwrap_err().code(), ErrorCode::Conflict, "while building");
    ops::cancel(&w.state, &b).await.unwrap();
    let b = until_ended(&w.state, &b.id).await;
    assert_eq!(b.status, BuildStatus::Cancelled);
    assert_eq!(ops::cancel(&w.state, &b).await.unwrap_err().code(), ErrorCode::Conflict, "already ended");
    ops::delete(&w.state, &t).await.unwrap();
}

#[tokio::test]
async fn a_scoped_key_reaches_only_its_workspaces_templates() {
    let w = world().await;
    let b = ws(&w.state, "ws_b").await;
    let files = site(&w.state, &b).await;
    let built = ops::push(&w.state, &b, &push_req(RECIPE, files)).await.unwrap();
    until_ended(&w.state, &built.id).await;
    let store = w.state.server.store.as_ref();
    let key_a = scoped("ws_a");
    let seen: Vec<String> = ops::visible_workspaces(store, &key_a).await.unwrap().into_iter().map(|w| w.id).collect();
    assert_eq!(seen, ["ws_a"]);
    assert_eq!(ops::find(store, &key_a, "web", None).await.unwrap_err().code(), ErrorCode::NotFound);
    let named_b = ops::target_workspace(store, &key_a, Some("ws_b"), None).await.unwrap_err();
    assert_eq!(named_b.code(), ErrorCode::NotFound, "not 403: B's existence is not revealed");
    assert_eq!(ops::target_workspace(store, &key_a, None, None).await.unwrap().id, "ws_a", "its only workspace");
    assert_eq!(ops::find(store, &scoped("ws_b"), "web", None).await.unwrap().workspace_id, "ws_b");
    // A key scoped to a project reaches its workspace's templates (its sandboxes use them).
    let project_key = Principal { scope: Some(Scope::new(Vec::<String>::new(), ["prj_b"])), ..owner() };
    assert_eq!(ops::find(store, &project_key, "web", None).await.unwrap().workspace_id, "ws_b");
    // The owner must say which workspace when it has several.
    let e = ops::target_workspace(store, &owner(), None, None).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert_eq!(ops::target_workspace(store, &owner(), None, Some("prj_b")).await.unwrap().id, "ws_b");
}

#[tokio::test]
async fn a_restart_fails_the_builds_it_interrupted() {
    let w = world().await;
    let a = ws(&w.state, "ws_a").await;
    let files = site(&w.state, &a).await;
    *w.node.outcome.lock().unwrap() = BuildOutcome::UntilCancelled;
    let b = ops::push(&w.state, &a, &push_req(RECIPE, files)).await.unwrap();
    ops::fail_unfinished(&w.state).await;
    let b = w.state.server.store.get_build(&b.id).await.unwrap().unwrap();
    assert_eq!(b.status, BuildStatus::Failed);
    assert!(w.node.calls().contains(&format!("delete_template {}", b.template_ref)));
    w.state.builds.cancel_all();
}

#[tokio::test]
async fn a_forced_workspace_delete_hands_its_node_templates_to_the_reaper() {
    let w = world().await;
    let a = ws(&w.state, "ws_a").await;
    let files = site(&w.state, &a).await;
    let b = ops::push(&w.state, &a, &push_req(RECIPE, files)).await.unwrap();
    let b = until_ended(&w.state, &b.id).await;
    let removed = w.state.server.store.delete_workspace("acc", "ws_a", true).await.unwrap();
    assert_eq!(removed.template_refs, std::slice::from_ref(&b.template_ref));
    assert!(w.state.server.store.list_templates("acc").await.unwrap().is_empty(), "gone with the workspace");
    w.state.server.reaper.remove_templates(removed.template_refs).await;
    assert!(w.node.calls().contains(&format!("delete_template {}", b.template_ref)));
}

/// A key of the account with this scope, minted in the store; its plaintext.
async fn mint(state: &AppState, scope: Option<Scope>) -> String {
    let new = crate::keys::generate();
    let key = lizard_store::KeyRecord {
        id: lizard_api::ids::new_id("key"),
        account_id: "acc".into(),
        name: "test".into(),
        prefix: new.prefix,
        hash: new.hash.to_vec(),
        scope,
        created_at: 1,
        revoked_at: None,
    };
    state.server.store.insert_key(&key).await.unwrap();
    new.plaintext
}

/// One request through the whole router: status, content type, body.
async fn http(state: &AppState, method: &str, uri: &str, key: &str, body: Option<Vec<u8>>) -> (u16, String, Vec<u8>) {
    use tower::ServiceExt;
    let app = crate::build_router(state.clone(), crate::api::all_routes());
    let req = axum::http::Request::builder()
        .method(method)
        .uri(uri)
        .header("x-api-key", key)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.unwrap_or_default()))
        .unwrap();
    let resp = app.oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let ctype = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    (status, ctype, bytes.to_vec())
}

#[tokio::test]
async fn over_http_a_build_streams_ndjson_and_scopes_answer_404() {
    let w = world().await;
    let owner_key = mint(&w.state, None).await;
    let key_a = mint(&w.state, Some(Scope::new(["ws_a"], Vec::<String>::new()))).await;
    let key_b = mint(&w.state, Some(Scope::new(["ws_b"], Vec::<String>::new()))).await;
    let page = b"<h1>hi</h1>";
    let (status, _, _) =
        http(&w.state, "PUT", &format!("/v1/templates/blobs/{}", sha(page)), &key_a, Some(page.to_vec())).await;
    assert_eq!(status, 204);
    let push = serde_json::to_vec(&push_req(RECIPE, vec![dir("site"), file("site/index.html", page)])).unwrap();
    let (status, _, body) = http(&w.state, "POST", "/v1/templates", &key_a, Some(push)).await;
    assert_eq!(status, 202, "{}", String::from_utf8_lossy(&body));
    let build: lizard_api::templates::TemplateBuildInfo = serde_json::from_slice(&body).unwrap();
    let events_uri = format!("/v1/templates/web/builds/{}/events", build.build_id);
    let (status, ctype, body) = http(&w.state, "GET", &events_uri, &key_a, None).await;
    assert_eq!((status, ctype.as_str()), (200, "application/x-ndjson"));
    let events = crate::builds::from_ndjson(&String::from_utf8(body).unwrap());
    assert!(matches!(events.last(), Some(BuildEvent::Done { status: BuildStatus::Ready, .. })), "{events:?}");
    until_ended(&w.state, &build.build_id).await;

    // Workspace B's key: 404 everywhere, and not in its list; the owner sees it.
    let build_uri = format!("/v1/templates/web/builds/{}", build.build_id);
    for (method, uri) in
        [("GET", "/v1/templates/web"), ("DELETE", "/v1/templates/web"), ("GET", &build_uri), ("DELETE", &build_uri)]
    {
        let (status, _, body) = http(&w.state, method, uri, &key_b, None).await;
        assert_eq!(status, 404, "{method} {uri}: {}", String::from_utf8_lossy(&body));
    }
    let (_, _, body) = http(&w.state, "GET", "/v1/templates", &key_b, None).await;
    let listed: Vec<lizard_api::templates::TemplateInfo> = serde_json::from_slice(&body).unwrap();
    assert_eq!(listed.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["base"]);
    let (_, _, body) = http(&w.state, "GET", "/v1/templates", &owner_key, None).await;
    let listed: Vec<lizard_api::templates::TemplateInfo> = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        listed.iter().map(|t| (t.name.as_str(), t.builtin)).collect::<Vec<_>>(),
        [("base", true), ("web", false)]
    );
    // A built-in cannot be deleted.
    assert_eq!(http(&w.state, "DELETE", "/v1/templates/base", &owner_key, None).await.0, 403);

    // A manifest past axum's 2 MB default reaches the checks (here: its files were never uploaded).
    let many: Vec<ContextEntry> =
        (0..20_000).map(|i| file(&format!("site/f{i:05}.txt"), format!("{i}").as_bytes())).collect();
    let big = serde_json::to_vec(&push_req(RECIPE, [vec![dir("site")], many].concat())).unwrap();
    assert!(big.len() > 2 << 20, "{}", big.len());
    let (status, _, body) = http(&w.state, "POST", "/v1/templates", &key_a, Some(big)).await;
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("was not uploaded"), "{body}");
}

#[tokio::test]
async fn a_build_is_metered_and_at_zero_balance_cancelled_as_sandboxes_are_paused() {
    use crate::billing::SandboxPauser;
    let w = world().await;
    let a = ws(&w.state, "ws_a").await;
    let files = site(&w.state, &a).await;
    *w.node.outcome.lock().unwrap() = BuildOutcome::UntilCancelled;
    let b = ops::push(&w.state, &a, &push_req(RECIPE, files)).await.unwrap();
    let open = |state: AppState| async move { state.server.store.open_meters(Some("acc")).await.unwrap() };
    let meter = open(w.state.clone()).await.into_iter().find(|m| m.sandbox_id == b.id).expect("metered");
    assert_eq!((meter.workspace_id.as_str(), meter.project_id.as_str()), ("ws_a", ""));
    assert!(ops::is_build_id(&b.id) && !ops::is_build_id("sbx_1") && !ops::is_build_id("bldx"));
    // What the metering loop does for an account out of credits.
    super::hooks::BillingPauser(w.state.clone()).pause(&b.id).await.unwrap();
    let b = until_ended(&w.state, &b.id).await;
    assert_eq!(b.status, BuildStatus::Cancelled);
    assert!(open(w.state.clone()).await.iter().all(|m| m.sandbox_id != b.id), "an ended build is still metered");
}
