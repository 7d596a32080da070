//! Template builds as a tenant's way around admission and billing: before, a build VM of
//! any size the recipe allowed ran on a node that refused a sandbox of that size, left no
//! meter or ledger row, and a workspace could run any number of builds at once. Now a
//! build VM is admitted like a sandbox (and counted with them while it runs), its disk
//! must fit, a workspace runs a bounded number of builds at once, and a build is metered
//! like a sandbox of its VM's size until it ends.

#![allow(clippy::unwrap_used)]

use lizard_attacks::system::System;
use lizard_attacks::{control, leftovers};
use reqwest::Method;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Push a recipe (TOML) into the harness's project; status and body.
async fn push(system: &System, recipe: &str) -> (u16, Value) {
    let body = json!({"recipe": recipe, "format": "toml", "project": system.project});
    system.call(Method::POST, "/v1/templates", Some(body)).await
}

/// The build `build` of template `name`, once it has ended (within `limit`).
async fn ended(system: &System, name: &str, build: &Value, limit: Duration) -> Value {
    let path = format!("/v1/templates/{name}/builds/{}", build["buildId"].as_str().unwrap());
    let deadline = Instant::now() + limit;
    loop {
        let (status, info) = system.call(Method::GET, &path, None).await;
        assert_eq!(status, 200, "{info}");
        if matches!(info["status"].as_str(), Some("ready" | "failed" | "cancelled")) {
            return info;
        }
        assert!(Instant::now() < deadline, "the build did not end: {info}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn recipe(name: &str, build: &str, run: &str) -> String {
    format!("name = \"{name}\"\nfrom = \"base\"\n[build]\n{build}\ninternet = false\n[[steps]]\nrun = \"{run}\"\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_build_vm_is_admitted_like_a_sandbox_and_a_workspace_runs_few_at_once() {
    // One vCPU promised per host CPU: a 4-vCPU machine does not fit a 2-core host.
    let system = System::start(&["--cpu-overcommit", "1", "--builds-per-workspace", "1"]).await;
    let cpus = std::thread::available_parallelism().unwrap().get();
    assert!(cpus < 4, "the test needs fewer than 4 host CPUs to ask for more than the node promises");

    // Control: a sandbox of that size is refused.
    let body = json!({"template": "base", "projectId": system.project, "vcpus": 4, "memoryMib": 8192});
    let (code, err) = system.call(Method::POST, "/v1/sandboxes", Some(body)).await;
    assert_eq!((code, err["code"].as_str()), (503, Some("UNAVAILABLE")), "{err}");

    // The attack: the same machine as a build VM. Refused the same way, no VM started.
    let (code, build) = push(&system, &recipe("big", "vcpus = 4\nmemory_mib = 8192", "true")).await;
    assert_eq!(code, 202, "{build}");
    let info = ended(&system, "big", &build, Duration::from_secs(120)).await;
    assert_eq!(info["status"], "failed", "a build VM beyond the node's promise ran: {info}");
    assert_eq!(info["error"]["code"], "UNAVAILABLE", "{info}");
    assert!(info["error"]["message"].as_str().unwrap().contains("promised"), "{info}");
    // A disk beyond the node's free space is refused before any VM too.
    let (code, build) = push(&system, &recipe("huge", "vcpus = 1\nmemory_mib = 1024\ndisk_gb = 1024", "true")).await;
    assert_eq!(code, 202, "{build}");
    let info = ended(&system, "huge", &build, Duration::from_secs(120)).await;
    assert_eq!(
        (info["status"].as_str(), info["error"]["code"].as_str()),
        (Some("failed"), Some("INVALID_ARGUMENT")),
        "{info}"
    );
    assert!(leftovers::vmm_pids(system.data_dir()).is_empty(), "a refused build started a VM");

    // A workspace runs one build at a time here: a second push is refused while one runs.
    let (code, slow) = push(&system, &recipe("slow", "vcpus = 1\nmemory_mib = 1024", "sleep 600")).await;
    assert_eq!(code, 202, "{slow}");
    let (code, err) = push(&system, &recipe("second", "vcpus = 1\nmemory_mib = 1024", "true")).await;
    assert_eq!((code, err["code"].as_str()), (409, Some("CONFLICT")), "a second build at once: {err}");
    assert!(err["message"].as_str().unwrap().contains("at once"), "{err}");
    // The running build is metered like a sandbox of its size…
    let slow_id = slow["buildId"].as_str().unwrap().to_string();
    assert!(control::billed(&system).await.contains(&slow_id), "the build is not metered");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cancel = format!("/v1/templates/slow/builds/{}", slow["buildId"].as_str().unwrap());
    let (code, body) = system.call(Method::DELETE, &cancel, None).await;
    assert_eq!(code, 204, "cancel: {body}");
    let info = ended(&system, "slow", &slow, Duration::from_secs(120)).await;
    assert_eq!(info["status"], "cancelled", "{info}");
    // …until it ended, with its time in the ledger, the balance still the ledger's sum.
    assert!(!control::billed(&system).await.contains(&slow_id), "an ended build is still metered");
    let (status, page) = system.call(Method::GET, "/v1/billing/transactions?includeUsage=true&limit=1000", None).await;
    assert_eq!(status, 200, "{page}");
    let charged: i64 = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["sandboxId"] == slow_id.as_str())
        .filter_map(|t| t["amountNanos"].as_i64())
        .sum();
    // At least the 2 s it surely ran, at 1 vCPU / 1 GiB (3000 n$/s by default).
    assert!(charged <= -6_000, "the build's compute was not billed: {charged} n$");
    control::assert_balance_is_ledger_sum(&system).await;
    // Once it ended, the workspace builds again.
    let (code, again) = push(&system, &recipe("second", "vcpus = 1\nmemory_mib = 1024", "true")).await;
    assert_eq!(code, 202, "{again}");
}
