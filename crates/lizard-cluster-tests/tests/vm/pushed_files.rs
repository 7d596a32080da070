//! A push whose three calls reach different replicas, as behind a load balancer: the
//! missing-files check through replica A, each upload through replica B, the push
//! through replica A (whose disk never saw the files). The build runs (its replica copies
//! the files from the shared store), and a sandbox of the template sees them intact.

use lizard_api::templates::{
    ContextEntry, ContextEntryKind, MissingBlobs, MissingBlobsRequest, PushTemplateRequest, RecipeFormat,
    TemplateBuildInfo,
};
use lizard_cluster_tests::fleet::Fleet;
use reqwest::Method;
use serde_json::json;
use sha2::{Digest, Sha256};
use std::time::{Duration, Instant};

const RECIPE: &str = "name = \"shared-tpl\"\nfrom = \"base\"\n[build]\nvcpus = 1\nmemory_mib = 1024\n\
    internet = false\n[[steps]]\ncopy = { src = \"files/\", dest = \"/opt/files/\" }\n";

fn sha(content: &[u8]) -> String {
    hex::encode(Sha256::digest(content))
}

fn entry(path: &str, content: &[u8]) -> ContextEntry {
    ContextEntry {
        path: path.into(),
        mode: 0o644,
        kind: ContextEntryKind::File,
        sha256: Some(sha(content)),
        size: Some(content.len() as u64),
        target: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_push_whose_calls_reach_different_replicas_builds_and_its_files_are_in_the_sandbox() {
    let fleet = Fleet::start(2, 1).await;
    let hello = b"hello from replica B's upload\n".to_vec();
    // Larger than one 4 MiB chunk of the store, and not all one byte.
    let big: Vec<u8> =
        (0..(9usize << 20) + 7).map(|i| (i.wrapping_mul(2_654_435_761) >> 13).to_le_bytes()[0]).collect();
    // In the manifest's order (sorted by path).
    let files = [("files/big.bin", &big), ("files/hello.txt", &hello)];
    let query = format!("?project={}", fleet.project);

    // 1. Which files are missing: through replica A.
    let hashes: Vec<String> = files.iter().map(|(_, c)| sha(c)).collect();
    let req = serde_json::to_value(MissingBlobsRequest { sha256: hashes.clone() }).unwrap();
    let (status, missing) =
        fleet.call(0, Method::POST, &format!("/v1/templates/blobs/missing{query}"), Some(req.clone())).await;
    assert_eq!(status, 200, "{missing}");
    let missing: MissingBlobs = serde_json::from_value(missing).unwrap();
    let mut expected = hashes.clone();
    expected.sort();
    assert_eq!(missing.missing, expected, "nothing uploaded yet");

    // 2. Each upload: through replica B.
    for (path, content) in files {
        let url = format!("{}/v1/templates/blobs/{}{query}", fleet.replicas[1].api, sha(content));
        let resp =
            fleet.http.put(url).header("x-api-key", &fleet.key).body(content.clone()).send().await.expect("upload");
        assert_eq!(resp.status().as_u16(), 204, "upload {path} through replica B: {}", resp.text().await.unwrap());
    }
    // Replica A's disk has none of them, yet it knows they were uploaded.
    let (status, missing) =
        fleet.call(0, Method::POST, &format!("/v1/templates/blobs/missing{query}"), Some(req)).await;
    assert_eq!(status, 200, "{missing}");
    assert_eq!(missing["missing"], json!([]), "replica A sees B's uploads through the store");

    // 3. The push: through replica A, which builds it.
    let mut entries = vec![ContextEntry {
        path: "files".into(),
        mode: 0o755,
        kind: ContextEntryKind::Dir,
        sha256: None,
        size: None,
        target: None,
    }];
    entries.extend(files.iter().map(|(p, c)| entry(p, c)));
    let push = PushTemplateRequest {
        recipe: RECIPE.into(),
        format: RecipeFormat::Toml,
        name: None,
        files: entries,
        workspace: None,
        project: Some(fleet.project.clone()),
    };
    let (status, build) = fleet.call(0, Method::POST, "/v1/templates", Some(serde_json::to_value(push).unwrap())).await;
    assert_eq!(status, 202, "push through replica A: {build}");
    let build: TemplateBuildInfo = serde_json::from_value(build).unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    let built = loop {
        let path = format!("/v1/templates/shared-tpl/builds/{}{query}", build.build_id);
        let (status, info) = fleet.call(1, Method::GET, &path, None).await;
        assert_eq!(status, 200, "{info}");
        let info: TemplateBuildInfo = serde_json::from_value(info).unwrap();
        if info.status.is_final() {
            break info;
        }
        assert!(Instant::now() < deadline, "the build did not end: {info:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(built.status, lizard_api::templates::BuildStatus::Ready, "{:?}\n{}", built.error, built.log);

    // A sandbox of it (created through replica B) holds both files, intact.
    let (status, info) = fleet.try_create(1, json!({"template": "shared-tpl"})).await;
    assert_eq!(status, 201, "create shared-tpl right after its build: {info}");
    let id = info["sandboxId"].as_str().expect("sandboxId").to_string();
    assert_eq!(fleet.exec(0, &id, "cat /opt/files/hello.txt").await, (0, String::from_utf8(hello.clone()).unwrap()));
    let (code, sum) = fleet.exec(0, &id, "sha256sum /opt/files/big.bin").await;
    assert_eq!(code, 0);
    assert_eq!(sum.split_whitespace().next(), Some(sha(&big).as_str()), "the large file arrived whole");
    assert_eq!(fleet.call(0, Method::DELETE, &format!("/v1/sandboxes/{id}"), None).await.0, 204);
}
