//! The control plane killed with SIGKILL under running sandboxes: their VMMs run on in
//! process groups of their own, and the next start takes them back — processes, files,
//! network, API access and billing — instead of losing them (or leaving them running
//! unbilled and unreachable).

#![allow(clippy::unwrap_used)]

use lizard_attacks::system::System;
use lizard_attacks::{confine, leftovers};
use reqwest::Method;
use serde_json::json;
use std::time::Duration;

/// The sandbox's entry in `GET /v1/billing/live`, if it is metered.
async fn metered(system: &System, id: &str) -> Option<serde_json::Value> {
    let (status, live) = system.call(Method::GET, "/v1/billing/live", None).await;
    assert_eq!(status, 200, "{live}");
    live["sandboxes"].as_array().unwrap().iter().find(|s| s["sandboxId"] == id).cloned()
}

#[tokio::test(flavor = "multi_thread")]
async fn running_sandboxes_survive_a_server_crash_and_are_billed_on() {
    let mut system = System::start(&["--billing-tick-ms", "500"]).await;
    let id = system
        .create_sandbox("base", json!({"env": {"LIZARD_API_KEY": "lz_notARealKeyButASecret"}, "timeoutMs": 600_000}))
        .await;
    system.exec(&id, "echo kept > /root/note.txt; nohup sleep 1000 >/dev/null 2>&1 &").await;
    let (_, sleeper, _) = system.exec(&id, "pgrep -x sleep").await;
    assert!(!sleeper.trim().is_empty());
    assert!(metered(&system, &id).await.is_some(), "billed before the crash");
    let vmms = leftovers::vmm_pids(system.data_dir());
    assert_eq!(vmms.len(), 1, "{vmms:?}");
    let jail = (confine::status(vmms[0])["Uid"].clone(), confine::cgroups(vmms[0]));
    assert!(jail.1["memory"].to_string_lossy().contains("/lizard/vmm-"), "{jail:?}");

    system.kill9();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(leftovers::vmm_pids(system.data_dir()), vmms, "the VMM outlives the server");
    system.restart().await;

    let (status, info) = system.call(Method::GET, &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!((status, info["state"].as_str()), (200, Some("running")), "{info}");
    assert_eq!(leftovers::vmm_pids(system.data_dir()), vmms, "the same VMM, not a new one");
    assert_eq!((confine::status(vmms[0])["Uid"].clone(), confine::cgroups(vmms[0])), jail, "still in its jail");
    // Its processes, files and environment, and its way to the API, are as they were.
    assert_eq!(system.exec(&id, "pgrep -x sleep").await.1, sleeper);
    assert_eq!(system.exec(&id, "cat /root/note.txt").await.1, "kept\n");
    assert_eq!(system.exec(&id, "echo $LIZARD_API_KEY").await.1, "lz_notARealKeyButASecret\n");
    let (code, _, err) =
        system.exec(&id, "curl -s -o /dev/null --max-time 5 -w '%{http_code}' http://127.0.0.1:49171/health").await;
    assert_eq!(code, 0, "the guest reaches the API through the new process: {err}");
    // Still metered, and billed for the time it ran while the server was down.
    let entry = metered(&system, &id).await.expect("billed after the crash");
    assert_eq!(entry["state"], "running");
    // Its pause still saves only the pages it changed over its base (the VMM taken back is
    // traced to that file by its command line), and it resumes with what it ran.
    assert_eq!(system.call(Method::POST, &format!("/v1/sandboxes/{id}/pause"), None).await.0, 200);
    let run_dir = system.node_dir().join("sandboxes").join(&id);
    let saved = confine::dir_names(&run_dir);
    assert!(saved.contains(&"memory.delta".to_string()), "not a delta save: {saved:?}");
    let (status, info) = system.call(Method::POST, &format!("/v1/sandboxes/{id}/resume"), None).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(system.exec(&id, "pgrep -x sleep").await.1, sleeper);
    assert_eq!(system.exec(&id, "cat /root/note.txt").await.1, "kept\n");

    // Ending it ends everything of it.
    let (status, _) = system.call(Method::DELETE, &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(status, 204);
    assert!(leftovers::vmm_pids(system.data_dir()).is_empty());
    assert!(leftovers::netns(&system.net_prefix).is_empty(), "{:?}", leftovers::netns(&system.net_prefix));
    assert!(leftovers::sandbox_dirs(&system.node_dir()).is_empty());
    assert!(!jail.1["memory"].exists(), "the taken-back VMM's cgroup outlived it");
}
