//! The control plane against clients that vanish, servers that crash and VMMs that die:
//! whatever happens, what runs is what is recorded and billed, nothing is left behind,
//! and the balance stays the sum of the ledger.

#![allow(clippy::unwrap_used)]

use lizard_attacks::control::{self, Restarted};
use lizard_attacks::leftovers;
use lizard_attacks::system::System;
use reqwest::Method;
use std::time::Duration;

/// Metering ticks often, so that a meter left running shows within a second.
const FAST_BILLING: [&str; 2] = ["--billing-tick-ms", "200"];

#[tokio::test(flavor = "multi_thread")]
async fn a_create_whose_client_vanishes_is_recorded_and_billed() {
    let system = System::start(&FAST_BILLING).await;
    control::send_and_vanish(&system, &control::raw_create(&system, "base"), Duration::from_millis(100)).await;
    // The create goes on without its client (the first of a template also makes its snapshot).
    let recorded =
        control::eventually(Duration::from_secs(120), || async { !control::listed(&system).await.is_empty() }).await;
    let vmms = leftovers::vmm_pids(system.data_dir());
    assert!(recorded, "a VM runs unrecorded after its client went away: {} VMM(s), nothing listed", vmms.len());
    let listed = control::listed(&system).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(vmms.len(), 1, "one VMM for the one sandbox");
    assert_eq!(control::billed(&system).await, listed, "the sandbox is billed");
    let (status, got) = system.call(Method::GET, &format!("/v1/sandboxes/{}", listed[0]), None).await;
    assert_eq!(status, 200, "{got}");
    control::assert_balance_is_ledger_sum(&system).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_killed_mid_create_leaves_nothing_after_its_restart() {
    let mut system = System::start(&FAST_BILLING).await;
    // One sandbox first: its template's snapshot exists, and a running sandbox is lost too.
    let before = system.create_sandbox("base", serde_json::json!({})).await;
    let request = control::raw_create(&system, "base");
    let api = system.api.clone();
    let create = tokio::spawn(async move {
        let addr = api.strip_prefix("http://").unwrap().to_string();
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut conn, request.as_bytes()).await.unwrap();
        let mut sink = Vec::new();
        let _ = tokio::io::AsyncReadExt::read_to_end(&mut conn, &mut sink).await;
    });
    // Killed once the second VM exists, before (or while) the create records it.
    let booting =
        control::eventually(Duration::from_secs(60), || async { leftovers::vmm_pids(system.data_dir()).len() >= 2 })
            .await;
    assert!(booting, "the second create started a VM");
    system.kill9();
    create.abort();

    let restarted = Restarted::start(&system, &FAST_BILLING).await;
    let clean = control::eventually(Duration::from_secs(30), || async {
        leftovers::vmm_pids(system.data_dir()).is_empty()
            && leftovers::netns(&system.net_prefix).is_empty()
            && leftovers::sandbox_dirs(&system.node_dir()).is_empty()
    })
    .await;
    assert!(
        clean,
        "left after the restart: VMMs {:?}, namespaces {:?}, sandbox dirs {:?}",
        leftovers::vmm_pids(system.data_dir()),
        leftovers::netns(&system.net_prefix),
        leftovers::sandbox_dirs(&system.node_dir())
    );
    assert!(control::listed(&system).await.is_empty(), "nothing runs, so nothing is listed");
    assert!(control::billed(&system).await.is_empty(), "nothing runs, so nothing is billed");
    let (status, _) = system.call(Method::GET, &format!("/v1/sandboxes/{before}"), None).await;
    assert_eq!(status, 404);
    control::assert_balance_is_ledger_sum(&system).await;
    drop(restarted);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_whose_vmm_is_killed_stops_being_billed_at_once() {
    let system = System::start(&FAST_BILLING).await;
    let id = system.create_sandbox("base", serde_json::json!({})).await;
    assert_eq!(control::billed(&system).await, std::slice::from_ref(&id));
    let pid = control::vmm_pid_of(&system, &id).expect("the sandbox's VMM");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    // No call touches the sandbox: the server must learn of the death by itself.
    let stopped =
        control::eventually(Duration::from_secs(5), || async { control::billed(&system).await.is_empty() }).await;
    assert!(stopped, "a dead VM is still metered 5 s after its VMM was killed");
    let balance = control::balance(&system).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(control::balance(&system).await, balance, "the ledger stopped growing");
    let (status, got) = system.call(Method::GET, &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(status, 404, "{got}");
    assert!(got["message"].as_str().unwrap().contains("stopped unexpectedly"), "{got}");
    assert!(control::listed(&system).await.is_empty());
    control::assert_balance_is_ledger_sum(&system).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn client_and_guest_sized_buffers_are_bounded() {
    let system = System::start(&[]).await;
    // A 1.5 MB env value used to be accepted, then made every exec fail in a handler.
    let huge = "x".repeat(1_500_000);
    let body = serde_json::json!({"template": "base", "projectId": system.project, "env": {"BIG": huge}});
    let (status, e) = system.call(Method::POST, "/v1/sandboxes", Some(body)).await;
    assert_eq!((status, e["code"].as_str()), (422, Some("INVALID_ARGUMENT")), "{e}");
    let body =
        serde_json::json!({"template": "base", "projectId": system.project, "metadata": {"k": "v".repeat(5000)}});
    let (status, e) = system.call(Method::POST, "/v1/sandboxes", Some(body)).await;
    assert_eq!((status, e["code"].as_str()), (422, Some("INVALID_ARGUMENT")), "{e}");
    assert!(leftovers::vmm_pids(system.data_dir()).is_empty(), "a refused create starts nothing");

    let id = system.create_sandbox("base", serde_json::json!({})).await;
    // 20 MiB of output, not streamed: refused with a code that points to streaming.
    let exec = format!("/v1/sandboxes/{id}/exec");
    let (status, e) =
        system.call(Method::POST, &exec, Some(serde_json::json!({"cmd": "head -c 20971520 /dev/zero"}))).await;
    assert_eq!((status, e["code"].as_str()), (422, Some("OUTPUT_TOO_LARGE")), "{e}");
    assert!(e["message"].as_str().unwrap().contains("stream=true"), "{e}");
    // Streamed, the same output arrives whole.
    let streamed = system
        .request(Method::POST, &format!("{exec}?stream=true"))
        .json(&serde_json::json!({"cmd": "head -c 20971520 /dev/zero"}))
        .send()
        .await
        .unwrap();
    assert_eq!(streamed.status(), 200);
    assert!(streamed.bytes().await.unwrap().len() > 20 * 1024 * 1024);
    // An exec's own fields are bounded too; the sandbox still answers.
    let (status, e) = system.call(Method::POST, &exec, Some(serde_json::json!({"cmd": huge}))).await;
    assert_eq!((status, e["code"].as_str()), (422, Some("INVALID_ARGUMENT")), "{e}");
    assert_eq!(system.exec(&id, "echo ok").await.1, "ok\n");
}
