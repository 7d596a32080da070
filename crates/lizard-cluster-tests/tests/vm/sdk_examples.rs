//! The reference's examples, as the Python SDK's suite runs them (`test_examples.py`:
//! the quickstart's web server, a volume outliving its first sandbox, a workspace per user
//! with a scoped key), through each replica of a two-replica, two-node fleet in turn.

use lizard_cluster_tests::fleet::Fleet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository's root (this crate is `crates/lizard-cluster-tests`).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the repository")
}

/// A virtual environment with the SDK and its test dependencies (made once, shared with
/// `scripts/test-sdk.sh`): its Python.
fn sdk_python() -> PathBuf {
    let venv = repo().join("target/sdk-venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        let made = Command::new("python3").args(["-m", "venv"]).arg(&venv).status().expect("python3 -m venv");
        assert!(made.success(), "python3 -m venv {}", venv.display());
    }
    let installed = Command::new(venv.join("bin/pip"))
        .args(["install", "-q"])
        .arg(format!("{}[test]", repo().join("sdk/python").display()))
        .status()
        .expect("pip install the SDK");
    assert!(installed.success(), "pip install ./sdk/python[test]");
    python
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_reference_examples_pass_through_either_replica() {
    let fleet = Fleet::start(2, 2).await;
    let python = sdk_python();
    for (r, replica) in fleet.replicas.iter().enumerate() {
        let out = Command::new(&python)
            .args([
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-o",
                "testpaths=.",
                "--rootdir=.",
                "test_examples.py",
            ])
            .current_dir(repo().join("sdk/python/tests"))
            .env_remove("LIZARD_API_URL")
            .env_remove("LIZARD_API_KEY")
            .env("LIZARD_SDK_TEST_API_URL", &replica.api)
            .env("LIZARD_SDK_TEST_API_KEY", &fleet.key)
            .env("LIZARD_SDK_TEST_PROXY", replica.proxy.to_string())
            .output()
            .expect("run pytest");
        let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "the examples through replica {r}:\n{report}");
        // pytest's summary, e.g. "6 passed in 14.52s": the sync and async examples all ran.
        let passed = report
            .split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .find(|w| w[1] == "passed")
            .and_then(|w| w[0].parse::<u32>().ok());
        assert!(passed.is_some_and(|n| n >= 6), "every example ran through replica {r}:\n{report}");
    }
    for n in 0..2 {
        fleet
            .wait_for(std::time::Duration::from_secs(30), &format!("no VM left on node {n}"), || async {
                fleet.host_counts(n).vmms == 0
            })
            .await;
    }
}
