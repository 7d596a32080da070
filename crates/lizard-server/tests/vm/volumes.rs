//! Volumes through the control plane, on a real SQLite file and a real node (disk
//! images made with mkfs.ext4): create / 409 / get by name and id / list / scopes /
//! delete, forced workspace deletes that remove the disks — and, with real microVMs,
//! data that survives kills (a SIGKILLed VMM included), the size limit inside the guest,
//! and one writer at a time.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::Api;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// The control plane with the timeout reaper; the owner's key.
async fn start() -> (Api, String) {
    let api = Api::builder("lizard-volume-test-").reaper().start().await;
    let owner = api.owner.clone();
    (api, owner)
}

fn volumes_dir(api: &Api) -> PathBuf {
    api.dir.path().join("node/volumes")
}

fn image(api: &Api, id: &str) -> PathBuf {
    volumes_dir(api).join(format!("{id}.img"))
}

/// A file's content as the host sees it in a volume image: the image copied (sparse),
/// its journal replayed by e2fsck, then read with debugfs.
fn read_from_image(image: &Path, file: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("copy.img");
    let st = std::process::Command::new("cp").arg("--sparse=always").arg(image).arg(&copy).status().unwrap();
    assert!(st.success());
    let fsck = std::process::Command::new("e2fsck").arg("-fy").arg(&copy).output().unwrap();
    assert!(fsck.status.code().is_some_and(|c| c <= 1), "e2fsck: {}", String::from_utf8_lossy(&fsck.stdout));
    let out = std::process::Command::new("debugfs").arg("-R").arg(format!("cat {file}")).arg(&copy).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Free space on the filesystem holding `dir`.
fn free_bytes(dir: &Path) -> u64 {
    let st = nix::sys::statvfs::statvfs(dir).unwrap();
    st.blocks_available() as u64 * st.fragment_size() as u64
}

fn s(v: &Value) -> String {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v}")).to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn volume_routes_with_names_ids_scopes_and_deletes() {
    let (api, owner) = start().await;
    let w1 = api.ok("POST", "/v1/workspaces", &owner, Some(json!({"name": "w1"}))).await;
    let w2 = api.ok("POST", "/v1/workspaces", &owner, Some(json!({"name": "w2"}))).await;
    let p1 = api.ok("POST", "/v1/projects", &owner, Some(json!({"workspaceId": w1["id"], "name": "p1"}))).await;
    let p1b = api.ok("POST", "/v1/projects", &owner, Some(json!({"workspaceId": w1["id"], "name": "p1b"}))).await;
    let p2 = api.ok("POST", "/v1/projects", &owner, Some(json!({"workspaceId": w2["id"], "name": "p2"}))).await;
    let k1 =
        s(&api.ok("POST", "/v1/api-keys", &owner, Some(json!({"name": "u1", "workspaces": [w1["id"]]}))).await["key"]);
    let k2 =
        s(&api.ok("POST", "/v1/api-keys", &owner, Some(json!({"name": "u2", "projects": [p2["id"]]}))).await["key"]);

    // Create: defaults, placement in the server's region, the disk on the node.
    let v = api.ok("POST", "/v1/volumes", &k1, Some(json!({"name": "data", "project": "p1", "sizeGb": 1}))).await;
    let id = s(&v["id"]);
    assert!(id.starts_with("vol_"), "{v}");
    assert_eq!(
        (v["name"].clone(), v["projectId"].clone(), v["workspaceId"].clone()),
        (json!("data"), p1["id"].clone(), w1["id"].clone())
    );
    assert_eq!((v["sizeGb"].clone(), v["region"].clone()), (json!(1), json!("local")));
    assert!(v.get("attachedTo").is_none(), "{v}");
    let meta = std::fs::metadata(image(&api, &id)).unwrap();
    assert_eq!(meta.len(), 1 << 30);
    use std::os::unix::fs::MetadataExt;
    assert!(meta.blocks() * 512 < 64 << 20, "the image is not sparse");
    // The default size is 10 GiB, and a volume is refused (422, nothing left behind)
    // unless the host has room for it to fill up: what happens depends on this host.
    let body = json!({"name": "big-default", "projectId": p1["id"]});
    let free = free_bytes(&volumes_dir(&api));
    if free > 12 << 30 {
        let d = api.ok("POST", "/v1/volumes", &owner, Some(body)).await;
        assert_eq!(d["sizeGb"], 10);
        // Gone again at once: while it exists it may grow by 10 GiB, which the host's
        // space must cover for every later volume of this test.
        api.ok("DELETE", &format!("/v1/volumes/{}", s(&d["id"])), &owner, None).await;
        assert!(!image(&api, &s(&d["id"])).exists());
    } else if free < 10 << 30 {
        let m = api.fails("POST", "/v1/volumes", &owner, Some(body), "INVALID_ARGUMENT").await;
        assert!(m.contains("not enough disk"), "{m}");
    } // else: too close to call while other processes write
      // Quotas: the account's (100 GiB unless the operator sets another) refuses what no
      // disk could hold, before any node is asked; a workspace's own, which only an
      // unscoped key sets, refuses within it.
    let huge = json!({"name": "huge", "project": "p1", "sizeGb": 1024});
    let m = api.fails("POST", "/v1/volumes", &owner, Some(huge), "QUOTA_EXCEEDED").await;
    assert!(m.contains("account's volume quota of 100 GiB: 1 GiB in use, 99 GiB left"), "{m}");
    api.fails("GET", "/v1/volumes/huge?project=p1", &owner, None, "NOT_FOUND").await;
    let w1_path = format!("/v1/workspaces/{}", s(&w1["id"]));
    let raise = json!({"volumeQuotaGb": 1000});
    api.fails("PATCH", &w1_path, &k1, Some(raise), "ACCOUNT_SCOPE_REQUIRED").await;
    let w = api.ok("PATCH", &w1_path, &owner, Some(json!({"volumeQuotaGb": 1}))).await;
    assert_eq!(w["volumeQuotaGb"], 1, "{w}");
    assert_eq!(api.ok("GET", &w1_path, &k1, None).await["volumeQuotaGb"], 1);
    let more = json!({"name": "more", "project": "p1b", "sizeGb": 1});
    let m = api.fails("POST", "/v1/volumes", &k1, Some(more), "QUOTA_EXCEEDED").await;
    assert!(m.contains("workspace's volume quota of 1 GiB: 1 GiB in use, 0 GiB left"), "{m}");
    let w = api.ok("PATCH", &w1_path, &owner, Some(json!({"volumeQuotaGb": null}))).await;
    assert!(w["volumeQuotaGb"].is_null(), "{w}");

    // The name is the key inside a project: taken → 409; another project may reuse it.
    let m = api.fails("POST", "/v1/volumes", &k1, Some(json!({"name": "data", "project": "p1"})), "CONFLICT").await;
    assert!(m.contains("data"), "{m}");
    let other = api.ok("POST", "/v1/volumes", &k1, Some(json!({"name": "data", "project": "p1b", "sizeGb": 1}))).await;
    assert_ne!(other["id"], v["id"]);

    // Bad requests, and nothing recorded or made for them.
    for (body, code) in [
        (json!({"name": "x", "project": "p1", "sizeGb": 0}), "INVALID_ARGUMENT"),
        (json!({"name": "x", "project": "p1", "sizeGb": 1025}), "INVALID_ARGUMENT"),
        (json!({"name": "vol_x", "project": "p1"}), "INVALID_ARGUMENT"),
        (json!({"name": "a/b", "project": "p1"}), "INVALID_ARGUMENT"),
        (json!({"name": "", "project": "p1"}), "INVALID_ARGUMENT"),
        (json!({"name": "x", "project": "p1", "region": "mars"}), "INVALID_ARGUMENT"),
        (json!({"name": "x", "project": "p1", "bogus": 1}), "INVALID_ARGUMENT"),
        (json!({"name": "x"}), "INVALID_ARGUMENT"), // k1 reaches two projects
        (json!({"name": "x", "project": "p2"}), "NOT_FOUND"), // outside k1's scope
    ] {
        api.fails("POST", "/v1/volumes", &k1, Some(body.clone()), code).await;
    }
    let files = std::fs::read_dir(volumes_dir(&api)).unwrap().count();
    assert_eq!(files, 2, "only the created volumes have disks");

    // A key that reaches one project may leave the project out.
    let v2 = api.ok("POST", "/v1/volumes", &k2, Some(json!({"name": "scratch", "sizeGb": 1}))).await;
    assert_eq!(v2["projectId"], p2["id"]);
    assert_eq!(api.ok("GET", "/v1/volumes/scratch", &k2, None).await["id"], v2["id"]);

    // Get by name (in a project) and by id; out of scope is 404 either way.
    assert_eq!(api.ok("GET", "/v1/volumes/data?project=p1", &k1, None).await["id"], v["id"]);
    assert_eq!(
        api.ok("GET", &format!("/v1/volumes/data?projectId={}", s(&p1b["id"])), &k1, None).await["id"],
        other["id"]
    );
    assert_eq!(api.ok("GET", &format!("/v1/volumes/{id}"), &k1, None).await["name"], "data");
    api.fails("GET", "/v1/volumes/data", &k1, None, "INVALID_ARGUMENT").await;
    api.fails("GET", "/v1/volumes/nope?project=p1", &k1, None, "NOT_FOUND").await;
    api.fails("GET", &format!("/v1/volumes/{id}"), &k2, None, "NOT_FOUND").await;
    api.fails("GET", &format!("/v1/volumes/{id}?project=p1b"), &k1, None, "NOT_FOUND").await;
    api.fails("DELETE", &format!("/v1/volumes/{id}"), &k2, None, "NOT_FOUND").await;
    api.fails("GET", "/v1/volumes/data?project=p1", &k2, None, "NOT_FOUND").await;

    // List: per project, or everything the key reaches.
    let names = |l: Value| -> Vec<String> { l.as_array().unwrap().iter().map(|v| s(&v["id"])).collect() };
    assert_eq!(names(api.ok("GET", "/v1/volumes?project=p1", &k1, None).await), std::slice::from_ref(&id));
    assert_eq!(names(api.ok("GET", "/v1/volumes", &k1, None).await), [id.clone(), s(&other["id"])]);
    assert_eq!(names(api.ok("GET", "/v1/volumes", &k2, None).await), [s(&v2["id"])]);
    assert_eq!(api.ok("GET", "/v1/volumes", &owner, None).await.as_array().unwrap().len(), 3);
    api.fails("GET", "/v1/volumes?project=p2", &k1, None, "NOT_FOUND").await;

    // A project with volumes cannot be deleted.
    api.fails("DELETE", &format!("/v1/projects/{}", s(&p1b["id"])), &owner, None, "CONFLICT").await;

    // Delete by name: record and disk go; again → 404.
    api.ok("DELETE", "/v1/volumes/data?project=p1b", &k1, None).await;
    assert!(!image(&api, &s(&other["id"])).exists());
    api.fails("DELETE", "/v1/volumes/data?project=p1b", &k1, None, "NOT_FOUND").await;
    api.ok("DELETE", &format!("/v1/projects/{}", s(&p1b["id"])), &owner, None).await;

    // Workspace deletes: refused while volumes remain, forced removes records and disks.
    api.fails("DELETE", &format!("/v1/workspaces/{}", s(&w1["id"])), &owner, None, "CONFLICT").await;
    assert!(image(&api, &id).exists());
    api.ok("DELETE", &format!("/v1/workspaces/{}?force=true", s(&w1["id"])), &owner, None).await;
    assert!(!image(&api, &id).exists(), "forced delete left a disk");
    api.fails("GET", &format!("/v1/volumes/{id}"), &owner, None, "NOT_FOUND").await;
    assert_eq!(names(api.ok("GET", "/v1/volumes", &owner, None).await), [s(&v2["id"])]);
    let left: Vec<_> = std::fs::read_dir(volumes_dir(&api)).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(left.len(), 1, "{left:?}");

    // Every route is in the document.
    let doc = api.ok("GET", "/openapi.json", &owner, None).await;
    for path in ["/v1/volumes", "/v1/volumes/{nameOrId}"] {
        assert!(doc["paths"][path].is_object(), "{path} missing from /openapi.json");
    }
    assert!(doc["components"]["schemas"]["NewSandboxRequest"]["properties"]["volumeName"].is_object());
}

/// Real microVMs, every one restored from the template snapshot: a volume keeps what a
/// command synced across a SIGKILLed VMM, keeps what a command wrote (unsynced) across a
/// kill, stops at its size inside the guest, and has one writer at a time.
#[tokio::test(flavor = "multi_thread")]
async fn volume_data_outlives_its_sandboxes() {
    let (api, owner) = start().await;
    let w = api.ok("POST", "/v1/workspaces", &owner, Some(json!({"name": "w"}))).await;
    api.ok("POST", "/v1/projects", &owner, Some(json!({"workspaceId": w["id"], "name": "p"}))).await;
    let vol = api.ok("POST", "/v1/volumes", &owner, Some(json!({"name": "state", "project": "p", "sizeGb": 1}))).await;
    let vol_id = s(&vol["id"]);
    let create = json!({"template": "base", "project": "p", "volumeName": "state"});

    // An unknown volume is 404 and boots nothing.
    let m = api
        .fails(
            "POST",
            "/v1/sandboxes",
            &owner,
            Some(json!({"template": "base", "project": "p", "volumeName": "nope"})),
            "NOT_FOUND",
        )
        .await;
    assert!(m.contains("nope"), "{m}");

    let a = s(&api.ok("POST", "/v1/sandboxes", &owner, Some(create.clone())).await["sandboxId"]);
    assert!(api.node.get(&a).unwrap().from_snapshot(), "expected a restored sandbox");
    assert_eq!(api.ok("GET", "/v1/volumes/state?project=p", &owner, None).await["attachedTo"], a);

    // One writer: a second sandbox, and a delete, are refused naming the holder.
    let m = api.fails("POST", "/v1/sandboxes", &owner, Some(create.clone()), "CONFLICT").await;
    assert!(m.contains(&a), "{m}");
    let m = api.fails("DELETE", "/v1/volumes/state?project=p", &owner, None, "CONFLICT").await;
    assert!(m.contains(&a), "{m}");
    assert_eq!(api.node.list().len(), 1);

    // Mounted at /workspace with the volume's size; writable by any user; ENOSPC past it.
    let (code, out, err) = api
        .sh(&owner, &a, "findmnt -n -o SOURCE,FSTYPE /workspace && df -B1M --output=size /workspace | tail -1")
        .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("/dev/vdb ext4"), "{out}");
    let size_mib: u64 = out.lines().last().unwrap().trim().parse().unwrap();
    assert!((900..=1024).contains(&size_mib), "filesystem of {size_mib} MiB");
    let (code, _, err) = api.sh(&owner, &a, "fallocate -l 1100M /workspace/too-big").await;
    assert_ne!(code, 0);
    assert!(err.contains("No space left on device"), "{err}");
    // fallocate keeps what it got: the filesystem is now full, and so are writes.
    let (code, out, _) =
        api.sh(&owner, &a, "df --output=avail /workspace | tail -1; head -c 1M /dev/zero > /workspace/more").await;
    assert_ne!(code, 0, "a write to a full volume succeeded");
    assert_eq!(out.trim(), "0");
    let (code, _, err) =
        api.sh(&owner, &a, "rm /workspace/too-big /workspace/more && head -c 1M /dev/zero > /workspace/more").await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::metadata(image(&api, &vol_id)).unwrap().len(), 1 << 30, "the image changed size");
    let r = api
        .ok(
            "POST",
            &format!("/v1/sandboxes/{a}/exec"),
            &owner,
            Some(json!({"argv": ["touch", "/workspace/by-nobody"], "user": "nobody"})),
        )
        .await;
    assert_eq!(r["exitCode"], 0, "{r}");

    // Synced data survives SIGKILL of the VMM (no agent sync on the way out).
    let (code, _, err) =
        api.sh(&owner, &a, "echo synced-$(hostname) > /workspace/a.txt && sync && touch /root/installed").await;
    assert_eq!(code, 0, "{err}");
    let pid = api.node.get(&a).unwrap().live().unwrap().vm().pid();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while api.node.get(&a).is_ok() {
        assert!(std::time::Instant::now() < deadline, "the node did not notice the dead VMM");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    // A new sandbox gets the volume (the dead holder is let go) and reads it.
    let b = s(&api.ok("POST", "/v1/sandboxes", &owner, Some(create.clone())).await["sandboxId"]);
    assert!(api.node.get(&b).unwrap().from_snapshot());
    let (code, out, err) = api
        .sh(&owner, &b, "cat /workspace/a.txt; test -e /root/installed && echo root-survived || echo root-fresh")
        .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, format!("synced-{a}\nroot-fresh\n"));

    // Written but not synced by the command: the kill syncs it first.
    let (code, _, err) = api.sh(&owner, &b, "echo unsynced > /workspace/b.txt").await;
    assert_eq!(code, 0, "{err}");
    api.ok("DELETE", &format!("/v1/sandboxes/{b}"), &owner, None).await;
    assert_eq!(api.ok("GET", "/v1/volumes/state?project=p", &owner, None).await.get("attachedTo"), None);
    let c = s(&api.ok("POST", "/v1/sandboxes", &owner, Some(create.clone())).await["sandboxId"]);
    let (_, out, _) = api.sh(&owner, &c, "cat /workspace/a.txt /workspace/b.txt").await;
    assert_eq!(out, format!("synced-{a}\nunsynced\n"));

    // Pause: the volume is synced to its disk first (read here from the host) and stays
    // held; resume: still mounted, same data. Forking a sandbox with a volume is refused.
    let (code, _, err) = api.sh(&owner, &c, "echo before-pause > /workspace/p.txt").await;
    assert_eq!(code, 0, "{err}");
    let m = api.fails("POST", &format!("/v1/sandboxes/{c}/fork"), &owner, Some(json!({"count": 1})), "CONFLICT").await;
    assert!(m.contains("volume"), "{m}");
    assert_eq!(api.ok("POST", &format!("/v1/sandboxes/{c}/pause"), &owner, None).await["state"], "paused");
    assert_eq!(read_from_image(&image(&api, &vol_id), "/p.txt"), "before-pause\n");
    assert_eq!(api.ok("GET", "/v1/volumes/state?project=p", &owner, None).await["attachedTo"], c);
    let m = api.fails("POST", "/v1/sandboxes", &owner, Some(create.clone()), "CONFLICT").await;
    assert!(m.contains(&c), "{m}");
    api.fails("DELETE", "/v1/volumes/state?project=p", &owner, None, "CONFLICT").await;
    assert_eq!(api.ok("POST", &format!("/v1/sandboxes/{c}/resume"), &owner, None).await["state"], "running");
    let (_, out, _) = api.sh(&owner, &c, "cat /workspace/p.txt && findmnt -n -o SOURCE /workspace").await;
    assert_eq!(out, "before-pause\n/dev/vdb\n");

    // A sandbox without a volume has no /workspace mount.
    let plain =
        s(&api.ok("POST", "/v1/sandboxes", &owner, Some(json!({"template": "base", "project": "p"}))).await
            ["sandboxId"]);
    let (code, _, _) = api.sh(&owner, &plain, "findmnt /workspace").await;
    assert_ne!(code, 0, "a sandbox without a volume mounted something at /workspace");

    // Killing the holder frees the volume; then it can be deleted with its disk.
    api.ok("DELETE", &format!("/v1/sandboxes/{c}"), &owner, None).await;
    api.ok("DELETE", "/v1/volumes/state?project=p", &owner, None).await;
    assert!(!image(&api, &vol_id).exists());
    api.node.shutdown().await;
    assert!(std::fs::read_dir(api.dir.path().join("node/sandboxes")).unwrap().next().is_none(), "sandbox dirs left");
}
