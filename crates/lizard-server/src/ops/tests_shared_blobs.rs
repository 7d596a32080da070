//! Pushed files shared through the store: two replicas (one store, their own data
//! directories, a fake node each) serve the calls of one push, and a stored content found
//! corrupt fails the build clearly and is asked for again.

use super::templates as ops;
use super::tests::FakeNode;
use crate::config::BlobSharing;
use crate::state::{AppState, ServerState};
use crate::ServerConfig;
use lizard_api::templates::{BuildStatus, ContextEntry, ContextEntryKind, PushTemplateRequest, RecipeFormat};
use lizard_node_client::{Nodes, LOCAL_NODE_ID};
use lizard_store::fixture::seeded_store;
use lizard_store::{BuildRecord, Store, WorkspaceRecord};
use sha2::{Digest, Sha256};
use std::sync::Arc;

const RECIPE: &str = r#"
name = "web"
from = "base"
[[steps]]
copy = { src = "index.html", dest = "/srv/index.html" }
"#;

const CONTENT: &[u8] = b"<h1>shared</h1>";

struct Replicas {
    _dirs: [tempfile::TempDir; 2],
    a: AppState,
    b: AppState,
    store: Arc<dyn Store>,
}

/// Two replicas on one store, each with its own disk, sharing pushed files.
async fn replicas() -> Replicas {
    let store: Arc<dyn Store> = Arc::new(seeded_store("acc", &[("ws_a", "prj_a")]).await);
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let replica = |dir: &tempfile::TempDir| {
        let mut config = ServerConfig::new(dir.path());
        config.blob_sharing = BlobSharing::On;
        AppState::new(
            ServerState::new(store.clone(), config),
            Nodes::single(LOCAL_NODE_ID, Arc::new(FakeNode::default())),
        )
    };
    let (a, b) = (replica(&dirs[0]), replica(&dirs[1]));
    Replicas { _dirs: dirs, a, b, store }
}

fn sha(content: &[u8]) -> String {
    hex::encode(Sha256::digest(content))
}

fn push_req() -> PushTemplateRequest {
    let file = ContextEntry {
        path: "index.html".into(),
        mode: 0o644,
        kind: ContextEntryKind::File,
        sha256: Some(sha(CONTENT)),
        size: Some(CONTENT.len() as u64),
        target: None,
    };
    PushTemplateRequest {
        recipe: RECIPE.into(),
        format: RecipeFormat::Toml,
        name: None,
        files: vec![file],
        workspace: None,
        project: None,
    }
}

async fn upload(state: &AppState, workspace: &WorkspaceRecord) {
    let body = futures_util::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from_static(CONTENT))]);
    ops::upload_blob(state, workspace, &sha(CONTENT), body).await.unwrap();
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

#[tokio::test]
async fn an_upload_through_one_replica_builds_through_the_other() {
    let r = replicas().await;
    let ws = r.store.get_workspace("acc", "ws_a").await.unwrap().unwrap();
    let h = sha(CONTENT);
    assert_eq!(ops::missing_blobs(&r.a, &ws, std::slice::from_ref(&h)).await.unwrap(), std::slice::from_ref(&h));
    upload(&r.b, &ws).await;
    assert!(!r.a.blobs.has(&h).await, "replica A's disk never saw it");
    assert!(ops::missing_blobs(&r.a, &ws, std::slice::from_ref(&h)).await.unwrap().is_empty(), "in the store");
    let queued = ops::push(&r.a, &ws, &push_req()).await.unwrap();
    let built = until_ended(&r.a, &queued.id).await;
    assert_eq!(built.status, BuildStatus::Ready, "{:?}", built.error);
    assert!(r.a.blobs.has(&h).await, "copied to the building replica's disk");
    assert_eq!(std::fs::read(r.a.blobs.dir().join(&h)).unwrap(), CONTENT);
}

#[tokio::test]
async fn a_corrupt_stored_content_fails_the_build_clearly_and_is_asked_for_again() {
    let r = replicas().await;
    let ws = r.store.get_workspace("acc", "ws_a").await.unwrap().unwrap();
    let h = sha(CONTENT);
    upload(&r.b, &ws).await;
    // The stored bytes rot (same length, other content).
    let rotten = vec![b'x'; CONTENT.len()];
    r.store.put_blob_chunk(&h, 0, &rotten).await.unwrap();
    let queued = ops::push(&r.a, &ws, &push_req()).await.unwrap();
    let failed = until_ended(&r.a, &queued.id).await;
    assert_eq!(failed.status, BuildStatus::Failed);
    let error = failed.error.unwrap();
    assert_eq!(error.code, "BLOB_UNAVAILABLE");
    assert!(error.message.contains("\"index.html\"") && error.message.contains("push again"), "{}", error.message);
    assert!(!error.message.contains('/'), "no host path: {}", error.message);
    assert!(!r.a.blobs.has(&h).await, "nothing corrupt reached the disk");
    // Forgotten: replica A asks for it again, and a new upload repairs the push.
    assert_eq!(ops::missing_blobs(&r.a, &ws, std::slice::from_ref(&h)).await.unwrap(), std::slice::from_ref(&h));
    upload(&r.b, &ws).await;
    let again = ops::push(&r.a, &ws, &push_req()).await.unwrap();
    assert_eq!(until_ended(&r.a, &again.id).await.status, BuildStatus::Ready);
}

#[tokio::test]
async fn a_stored_content_longer_than_its_record_is_refused() {
    let r = replicas().await;
    let ws = r.store.get_workspace("acc", "ws_a").await.unwrap().unwrap();
    let h = sha(CONTENT);
    upload(&r.b, &ws).await;
    r.store.put_blob_chunk(&h, 0, &[CONTENT, b"more"].concat()).await.unwrap();
    let fetched = crate::shared_blobs::fetch(r.store.clone(), &r.a.blobs, &h).await.unwrap_err();
    assert!(matches!(fetched, crate::shared_blobs::SharedBlobError::Corrupt { .. }), "{fetched:?}");
    assert!(!r.a.blobs.has(&h).await);
    assert_eq!(r.store.blob_content(&h).await.unwrap(), None, "forgotten");
}

#[tokio::test]
async fn without_sharing_a_replica_asks_for_what_it_lacks() {
    let r = replicas().await;
    let ws = r.store.get_workspace("acc", "ws_a").await.unwrap().unwrap();
    let mut config = (*r.a.server.config).clone();
    config.blob_sharing = BlobSharing::Off;
    let lone = AppState::new(
        ServerState::new(r.store.clone(), config),
        Nodes::single(LOCAL_NODE_ID, Arc::new(FakeNode::default())),
    );
    let h = sha(CONTENT);
    upload(&r.b, &ws).await;
    assert_eq!(ops::missing_blobs(&lone, &ws, std::slice::from_ref(&h)).await.unwrap(), [h]);
}
