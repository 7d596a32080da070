//! The control plane over real HTTP: axum on 127.0.0.1:0, a real SQLite file in a temp dir.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use crate::common;

use async_trait::async_trait;
use common::{start, Running};
use lizard_server::SandboxReaper;
use lizard_store::{NewSandbox, SandboxRecord};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

fn ids(v: &Value) -> BTreeSet<String> {
    v.as_array().unwrap().iter().map(|x| x["id"].as_str().unwrap().to_string()).collect()
}

fn set(items: &[&Value]) -> BTreeSet<String> {
    items.iter().map(|v| v.as_str().unwrap().to_string()).collect()
}

#[tokio::test]
async fn first_start_returns_a_key_once_and_later_starts_none() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), |s| s).await;
    let key = s.initial_key.clone().expect("first start returns the owner's key");
    assert!(key.starts_with("lz_"));
    assert_eq!(s.call("GET", "/health", None, None).await, (200, json!("ok")));
    let me = s.ok("GET", "/v1/whoami", &key, None).await;
    assert_eq!(me["scoped"], false);
    s.stop().await;

    let s = start(dir.path(), |s| s).await;
    assert_eq!(s.initial_key, None, "a second start must not mint or show a key");
    let again = s.ok("GET", "/v1/whoami", &key, None).await;
    assert_eq!(again["accountId"], me["accountId"], "same account, key still valid after restart");
    s.stop().await;
}

/// Every file SQLite keeps for the database (main file, WAL, shared memory). The WAL and
/// shared-memory files come and go with the pool's connections: one that is gone between
/// the listing and the read holds nothing.
fn db_bytes(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("lizard.db"))
        .filter_map(|e| Some((e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).ok()?)))
        .collect()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test]
async fn keys_are_stored_as_hashes_only() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), |s| s).await;
    let owner = s.initial_key.clone().unwrap();
    let ws = s.ok("POST", "/v1/workspaces", &owner, Some(json!({"name": "w"}))).await;
    let minted = s.ok("POST", "/v1/api-keys", &owner, Some(json!({"name": "m", "workspaces": [ws["id"]]}))).await;
    let minted = minted["key"].as_str().unwrap().to_string();
    let keys = [owner.clone(), minted.clone()];

    let check = |when: &str| {
        let files = db_bytes(dir.path());
        assert!(files.iter().any(|(n, _)| n == "lizard.db"), "{when}: no database file");
        for (name, bytes) in &files {
            for k in &keys {
                // Neither the key nor its secret part (after the stored lookup prefix).
                assert!(!contains(bytes, k.as_bytes()), "{when}: plaintext key in {name}");
                assert!(!contains(bytes, &k.as_bytes()[11..]), "{when}: secret part of a key in {name}");
            }
        }
    };
    check("while running (WAL not checkpointed)");

    // The rows hold SHA-256 and the short prefix, nothing else of the key.
    let pool =
        sqlx::SqlitePool::connect(&format!("sqlite://{}", dir.path().join("lizard.db").display())).await.unwrap();
    let rows: Vec<(String, Vec<u8>, String)> =
        sqlx::query_as("SELECT prefix, hash, name FROM api_keys ORDER BY created_at").fetch_all(&pool).await.unwrap();
    assert_eq!(rows.len(), 2);
    for k in &keys {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(k.as_bytes()).to_vec();
        let row = rows.iter().find(|r| r.1 == digest).expect("a row with the key's SHA-256");
        assert_eq!(row.0, k[..11]);
    }
    pool.close().await;
    s.stop().await;
    check("after shutdown");
}

#[tokio::test]
async fn scoped_keys_see_and_touch_only_their_scope() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), |s| s).await;
    let owner = s.initial_key.clone().unwrap();
    let wa = s.ok("POST", "/v1/workspaces", &owner, Some(json!({"name": "user-a"}))).await;
    let wb = s.ok("POST", "/v1/workspaces", &owner, Some(json!({"name": "user-b"}))).await;
    let (a, b) = (wa["id"].as_str().unwrap(), wb["id"].as_str().unwrap());
    let pa = s.ok("POST", "/v1/projects", &owner, Some(json!({"workspaceId": a, "name": "default"}))).await;
    let pb = s.ok("POST", "/v1/projects", &owner, Some(json!({"workspaceId": b, "name": "default"}))).await;
    let (pa, pb) = (pa["id"].as_str().unwrap(), pb["id"].as_str().unwrap());

    let ka = s.ok("POST", "/v1/api-keys", &owner, Some(json!({"name": "user-a", "workspaces": [a]}))).await;
    assert_eq!(ka["workspaces"], json!([a]));
    assert_eq!(ka["projects"], json!([]));
    let ka = ka["key"].as_str().unwrap().to_string();
    let ka = ka.as_str();

    // Sees its workspace and the projects in it, nothing of B.
    assert_eq!(ids(&s.ok("GET", "/v1/workspaces", ka, None).await), set(&[&wa["id"]]));
    assert_eq!(ids(&s.ok("GET", "/v1/projects", ka, None).await), set(&[&json!(pa)]));
    assert_eq!(s.ok("GET", &format!("/v1/projects?workspaceId={b}"), ka, None).await, json!([]));
    assert_eq!(s.ok("GET", "/v1/projects/default", ka, None).await["id"], pa, "slug resolves within scope only");
    s.fails("GET", &format!("/v1/workspaces/{b}"), Some(ka), None, 404, "NOT_FOUND").await;
    s.fails("GET", "/v1/workspaces/user-b", Some(ka), None, 404, "NOT_FOUND").await;
    s.fails("GET", &format!("/v1/projects/{pb}"), Some(ka), None, 404, "NOT_FOUND").await;
    // Cannot touch B.
    s.fails("PATCH", &format!("/v1/projects/{pb}"), Some(ka), Some(json!({"name": "x"})), 404, "NOT_FOUND").await;
    s.fails("DELETE", &format!("/v1/projects/{pb}"), Some(ka), None, 404, "NOT_FOUND").await;
    s.fails("DELETE", &format!("/v1/workspaces/{b}?force=true"), Some(ka), None, 404, "NOT_FOUND").await;
    let body = json!({"workspaceId": b, "name": "sneaky"});
    s.fails("POST", "/v1/projects", Some(ka), Some(body), 404, "NOT_FOUND").await;
    s.fails("POST", "/v1/workspaces", Some(ka), Some(json!({"name": "mine"})), 403, "FORBIDDEN").await;
    assert_eq!(s.ok("GET", &format!("/v1/projects/{pb}"), &owner, None).await["name"], "default", "B untouched");
    // Account-wide routes are refused outright.
    s.fails("GET", "/v1/account", Some(ka), None, 403, "ACCOUNT_SCOPE_REQUIRED").await;

    // Cannot mint broader keys — the answer is 403 whether or not the id exists.
    for scope in [
        json!({"name": "x"}),
        json!({"name": "x", "workspaces": [a, b]}),
        json!({"name": "x", "workspaces": [b]}),
        json!({"name": "x", "projects": [pb]}),
        json!({"name": "x", "workspaces": ["ws_doesnotexist00"]}),
        json!({"name": "x", "projects": ["prj_doesnotexist0"]}),
    ] {
        s.fails("POST", "/v1/api-keys", Some(ka), Some(scope), 403, "FORBIDDEN").await;
    }
    // Can mint narrower ones.
    let kp = s.ok("POST", "/v1/api-keys", ka, Some(json!({"name": "agent", "projects": [pa]}))).await;
    assert_eq!((kp["workspaces"].clone(), kp["projects"].clone()), (json!([]), json!([pa])));
    let kp_id = kp["id"].as_str().unwrap().to_string();
    let kp = kp["key"].as_str().unwrap().to_string();
    s.ok("POST", "/v1/api-keys", ka, Some(json!({"name": "same", "workspaces": [a]}))).await;
    // The project key reaches its project but not the workspace, so it creates nothing there.
    assert_eq!(s.ok("GET", "/v1/workspaces", &kp, None).await, json!([]));
    assert_eq!(ids(&s.ok("GET", "/v1/projects", &kp, None).await), set(&[&json!(pa)]));
    let body = json!({"workspaceId": a, "name": "more"});
    s.fails("POST", "/v1/projects", Some(&kp), Some(body), 404, "NOT_FOUND").await;
    s.fails("POST", "/v1/api-keys", Some(&kp), Some(json!({"name": "up", "workspaces": [a]})), 403, "FORBIDDEN").await;
    let me = s.ok("GET", "/v1/whoami", &kp, None).await;
    assert_eq!((me["scoped"].clone(), me["projects"].clone()), (json!(true), json!([pa])));
    assert!(me.get("email").is_none() && me.get("plan").is_none());

    // A scoped key lists only keys within its scope: never the owner's.
    let listed = s.ok("GET", "/v1/api-keys", ka, None).await;
    let names: BTreeSet<&str> = listed.as_array().unwrap().iter().map(|k| k["name"].as_str().unwrap()).collect();
    assert_eq!(names, BTreeSet::from(["user-a", "agent", "same"]));
    let owner_id = s.ok("GET", "/v1/whoami", &owner, None).await["keyId"].as_str().unwrap().to_string();
    s.fails("DELETE", &format!("/v1/api-keys/{owner_id}"), Some(ka), None, 404, "NOT_FOUND").await;
    assert_eq!(s.ok("GET", "/v1/api-keys", &owner, None).await.as_array().unwrap().len(), 4);

    // Revocation is immediate.
    assert_eq!(s.call("DELETE", &format!("/v1/api-keys/{kp_id}"), Some(ka), None).await.0, 204);
    s.fails("GET", "/v1/whoami", Some(&kp), None, 401, "UNAUTHENTICATED").await;
    let ka_id = s.ok("GET", "/v1/whoami", ka, None).await["keyId"].as_str().unwrap().to_string();
    assert_eq!(s.call("DELETE", &format!("/v1/api-keys/{ka_id}"), Some(&owner), None).await.0, 204);
    s.fails("GET", "/v1/projects", Some(ka), None, 401, "UNAUTHENTICATED").await;
    s.fails("GET", "/v1/whoami", None, None, 401, "UNAUTHENTICATED").await;
    s.stop().await;
}

/// Records what it was asked to kill.
#[derive(Default)]
struct Recorder(Mutex<Vec<String>>);

#[async_trait]
impl SandboxReaper for Recorder {
    async fn reap(&self, sandboxes: Vec<SandboxRecord>) {
        self.0.lock().unwrap().extend(sandboxes.into_iter().map(|s| s.id));
    }
}

#[tokio::test]
async fn workspace_delete_is_empty_only_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let reaper = Arc::new(Recorder::default());
    let r = reaper.clone();
    let s: Running = start(dir.path(), move |st| st.with_reaper(r)).await;
    let owner = s.initial_key.clone().unwrap();
    let ws = s.ok("POST", "/v1/workspaces", &owner, Some(json!({"name": "doomed"}))).await;
    let w = ws["id"].as_str().unwrap();
    let p = s.ok("POST", "/v1/projects", &owner, Some(json!({"workspaceId": w, "name": "p"}))).await;
    let p = p["id"].as_str().unwrap();
    // What the sandbox routes will record when they start one.
    let store = s.state.store.clone();
    for id in ["sbx_live", "sbx_done"] {
        let sbx = NewSandbox {
            id: id.into(),
            project_id: p.into(),
            template: "base".into(),
            template_ref: None,
            node_id: "node_local".into(),
            state: lizard_store::SandboxState::Running,
            created_at: 1,
            timeout_at: None,
            metadata: Default::default(),
            meter: lizard_store::MeterSpec {
                vcpus: 1,
                memory_mib: 512,
                running_nanos_per_sec: 0,
                paused_nanos_per_sec: 0,
            },
            on_timeout: lizard_store::OnTimeout::Kill,
            timeout_ms: None,
        };
        store.insert_sandbox(&sbx).await.unwrap();
    }
    store.end_sandbox("sbx_done", 2, "killed").await.unwrap();

    s.fails("DELETE", &format!("/v1/workspaces/{w}"), Some(&owner), None, 409, "CONFLICT").await;
    s.fails("DELETE", &format!("/v1/workspaces/{w}?force=false"), Some(&owner), None, 409, "CONFLICT").await;
    s.fails("DELETE", &format!("/v1/projects/{p}"), Some(&owner), None, 409, "CONFLICT").await;
    assert!(reaper.0.lock().unwrap().is_empty());

    assert_eq!(s.call("DELETE", &format!("/v1/workspaces/{w}?force=true"), Some(&owner), None).await.0, 204);
    assert_eq!(*reaper.0.lock().unwrap(), vec!["sbx_live".to_string()], "live sandboxes are reaped, ended ones not");
    s.fails("GET", &format!("/v1/workspaces/{w}"), Some(&owner), None, 404, "NOT_FOUND").await;
    s.fails("GET", &format!("/v1/projects/{p}"), Some(&owner), None, 404, "NOT_FOUND").await;
    assert!(store.get_sandbox("sbx_live").await.unwrap().is_none());
    assert!(store.get_sandbox("sbx_done").await.unwrap().is_none());
    assert_eq!(s.ok("GET", "/v1/projects", &owner, None).await, json!([]));

    // Empty: deleted without force; a project whose sandboxes ended goes too.
    let e = s.ok("POST", "/v1/workspaces", &owner, Some(json!({"name": "empty"}))).await;
    assert_eq!(
        s.call("DELETE", &format!("/v1/workspaces/{}", e["id"].as_str().unwrap()), Some(&owner), None).await.0,
        204
    );
    s.fails("DELETE", "/v1/workspaces/ws_gone", Some(&owner), None, 404, "NOT_FOUND").await;
    s.stop().await;
}

#[tokio::test]
async fn unknown_fields_are_rejected_with_422() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), |s| s).await;
    let owner = s.initial_key.clone().unwrap();
    let ws = s.ok("POST", "/v1/workspaces", &owner, Some(json!({"name": "w"}))).await;
    let p = s.ok("POST", "/v1/projects", &owner, Some(json!({"workspaceId": ws["id"], "name": "p"}))).await;
    let cases = [
        ("POST", "/v1/workspaces".to_string(), json!({"name": "x", "slug": "y"})),
        ("POST", "/v1/projects".to_string(), json!({"workspaceId": ws["id"], "name": "x", "region": "eu"})),
        ("PATCH", format!("/v1/projects/{}", p["id"].as_str().unwrap()), json!({"name": "x", "workspaceId": "w"})),
        ("POST", "/v1/api-keys".to_string(), json!({"name": "x", "scope": {"workspaces": []}})),
        ("POST", "/v1/api-keys".to_string(), json!({"name": "x", "workspace_ids": []})),
    ];
    for (m, path, body) in cases {
        s.fails(m, &path, Some(&owner), Some(body), 422, "INVALID_ARGUMENT").await;
    }
    // Nothing was created by the refused calls.
    assert_eq!(s.ok("GET", "/v1/workspaces", &owner, None).await.as_array().unwrap().len(), 1);
    assert_eq!(s.ok("GET", "/v1/api-keys", &owner, None).await.as_array().unwrap().len(), 1);
    s.stop().await;
}

#[tokio::test]
async fn every_error_is_code_and_message() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), |s| s).await;
    let owner = s.initial_key.clone().unwrap();
    // `call` asserts the shape (exactly code + message, code matching the status) on
    // every failure; this walks one failure of each kind.
    s.fails("GET", "/v1/workspaces", None, None, 401, "UNAUTHENTICATED").await;
    s.fails("GET", "/v1/workspaces", Some("not-a-key"), None, 401, "UNAUTHENTICATED").await;
    s.fails("GET", "/v1/workspaces/nope", Some(&owner), None, 404, "NOT_FOUND").await;
    s.fails("GET", "/v1/no/such/route", Some(&owner), None, 404, "NOT_FOUND").await;
    s.fails("POST", "/v1/whoami", Some(&owner), None, 404, "NOT_FOUND").await;
    s.fails("POST", "/v1/workspaces", Some(&owner), Some(json!({"nom": "x"})), 422, "INVALID_ARGUMENT").await;
    s.ok("POST", "/v1/workspaces", &owner, Some(json!({"name": "dup"}))).await;
    s.fails("POST", "/v1/workspaces", Some(&owner), Some(json!({"name": "dup"})), 409, "CONFLICT").await;
    let ws = s.ok("GET", "/v1/workspaces/dup", &owner, None).await;
    let k = s.ok("POST", "/v1/api-keys", &owner, Some(json!({"name": "k", "workspaces": [ws["id"]]}))).await;
    let k = k["key"].as_str().unwrap();
    s.fails("POST", "/v1/workspaces", Some(k), Some(json!({"name": "x"})), 403, "FORBIDDEN").await;
    s.fails("GET", "/v1/account", Some(k), None, 403, "ACCOUNT_SCOPE_REQUIRED").await;
    // Malformed JSON.
    let resp = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("{}/v1/workspaces", s.base))
        .header("X-API-Key", &owner)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 422);
    common::assert_error_shape("malformed json", 422, &resp.json::<Value>().await.unwrap());
    s.stop().await;
}

#[tokio::test]
async fn openapi_document_is_served_without_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), |s| s).await;
    let (status, doc) = s.call("GET", "/openapi.json", None, None).await;
    assert_eq!(status, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for p in
        ["/v1/workspaces", "/v1/projects/{id}", "/v1/api-keys", "/v1/whoami", "/v1/account", "/v1/regions", "/health"]
    {
        assert!(doc["paths"][p].is_object(), "{p} missing from the served document");
    }
    s.stop().await;
}
