//! The control plane against clients that vanish, servers that crash and VMMs that die:
//! whatever happens, what runs is what is recorded and billed, nothing is left behind,
//! and the balance stays the sum of the ledger.

#![allow(clippy::unwrap_used)]

use lizard_attacks::control;
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
async fn a_server_killed_mid_create_leaves_only_what_it_recorded_after_its_restart() {
    let mut system = System::start(&FAST_BILLING).await;
    // One sandbox first: its template's snapshot exists, and a recorded running sandbox
    // is taken back by the restart (server_crash.rs) while the unrecorded one goes.
    let before = system.create_sandbox("base", serde_json::json!({})).await;
    let before_vmm = leftovers::vmm_pids(system.data_dir());
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

    system.restart().await;
    let only_before = || async {
        leftovers::vmm_pids(system.data_dir()) == before_vmm
            && leftovers::netns(&system.net_prefix).len() == 1
            && leftovers::sandbox_dirs(&system.node_dir()) == [before.clone()]
    };
    let clean = control::eventually(Duration::from_secs(30), only_before).await;
    assert!(
        clean,
        "left after the restart beside {before}: VMMs {:?}, namespaces {:?}, sandbox dirs {:?}",
        leftovers::vmm_pids(system.data_dir()),
        leftovers::netns(&system.net_prefix),
        leftovers::sandbox_dirs(&system.node_dir())
    );
    assert_eq!(control::listed(&system).await, std::slice::from_ref(&before), "only the recorded sandbox runs");
    assert_eq!(control::billed(&system).await, std::slice::from_ref(&before), "only the recorded sandbox is billed");
    let (status, got) = system.call(Method::GET, &format!("/v1/sandboxes/{before}"), None).await;
    assert_eq!((status, got["state"].as_str()), (200, Some("running")), "{got}");
    // Ended, it leaves nothing.
    let (status, _) = system.call(Method::DELETE, &format!("/v1/sandboxes/{before}"), None).await;
    assert_eq!(status, 204);
    assert!(leftovers::vmm_pids(system.data_dir()).is_empty());
    assert!(leftovers::netns(&system.net_prefix).is_empty());
    assert!(leftovers::sandbox_dirs(&system.node_dir()).is_empty());
    control::assert_balance_is_ledger_sum(&system).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vmm_killed_mid_create_leaves_a_running_sandbox_or_nothing() {
    let system = System::start(&FAST_BILLING).await;
    // The template's snapshot first, so that the next create is a restore.
    let first = system.create_sandbox("base", serde_json::json!({})).await;
    let (status, _) = system.call(Method::DELETE, &format!("/v1/sandboxes/{first}"), None).await;
    assert_eq!(status, 204);
    let create = {
        let req = system
            .request(Method::POST, "/v1/sandboxes")
            .json(&serde_json::json!({"template": "base", "projectId": system.project}));
        tokio::spawn(async move {
            let resp = req.send().await.unwrap();
            (resp.status().as_u16(), resp.json::<serde_json::Value>().await.unwrap_or_default())
        })
    };
    // SIGKILL the VMM as soon as it exists, while the create restores and connects to it.
    let mut killed = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while killed.is_none() && std::time::Instant::now() < deadline {
        if let Some(&pid) = leftovers::vmm_pids(system.data_dir()).first() {
            let cgroup = lizard_attacks::confine::cgroups(pid).remove("memory");
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
                nix::sys::signal::Signal::SIGKILL,
            );
            killed = Some(cgroup);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let cgroup = killed.expect("the create started no VMM").expect("the VMM's memory cgroup");
    assert!(cgroup.to_string_lossy().contains("/lizard/vmm-"), "{cgroup:?}");
    let (status, body) = create.await.unwrap();
    if status == 201 {
        // The node noticed and started the sandbox another way (a restore that fails falls
        // back to a cold boot): then it runs for real, in one VMM, recorded and billed.
        let id = body["sandboxId"].as_str().unwrap().to_string();
        assert_eq!(system.exec(&id, "echo alive").await.1, "alive\n");
        assert_eq!(leftovers::vmm_pids(system.data_dir()).len(), 1);
        assert_eq!(control::listed(&system).await, std::slice::from_ref(&id));
        assert_eq!(control::billed(&system).await, std::slice::from_ref(&id));
        let (status, _) = system.call(Method::DELETE, &format!("/v1/sandboxes/{id}"), None).await;
        assert_eq!(status, 204);
    } else {
        assert!(status >= 500 && body["code"].is_string(), "{status} {body}");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(!message.contains(&*system.data_dir().to_string_lossy()), "a host path reached the client: {message}");
    }
    // Either way, the killed VMM left nothing behind.
    let clean = control::eventually(Duration::from_secs(30), || async {
        leftovers::vmm_pids(system.data_dir()).is_empty()
            && leftovers::netns(&system.net_prefix).is_empty()
            && leftovers::sandbox_dirs(&system.node_dir()).is_empty()
            && !cgroup.exists()
    })
    .await;
    assert!(
        clean,
        "left behind: VMMs {:?}, namespaces {:?}, dirs {:?}, cgroup {cgroup:?}: {}",
        leftovers::vmm_pids(system.data_dir()),
        leftovers::netns(&system.net_prefix),
        leftovers::sandbox_dirs(&system.node_dir()),
        cgroup.exists()
    );
    assert!(control::listed(&system).await.is_empty());
    assert!(control::billed(&system).await.is_empty());
    control::assert_balance_is_ledger_sum(&system).await;
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

#[tokio::test(flavor = "multi_thread")]
async fn a_slowloris_client_is_cut_off_and_blocks_nobody() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let system = System::start(&["--header-read-timeout-ms", "1000", "--max-connections", "8"]).await;
    let addr = system.api.strip_prefix("http://").unwrap().to_string();
    // Every connection slot taken by a client that never finishes its request's head.
    let mut slow = Vec::new();
    for _ in 0..8 {
        let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
        conn.write_all(b"GET /health HTTP/1.1\r\nHost: lizard\r\nX-Slow: ").await.unwrap();
        slow.push(conn);
    }
    // Another client still gets its answer: the slow ones are cut off after a second.
    let started = std::time::Instant::now();
    let (status, _) = tokio::time::timeout(Duration::from_secs(10), system.call(Method::GET, "/health", None))
        .await
        .expect("a normal request is answered while slow clients hold every slot");
    assert_eq!(status, 200);
    assert!(started.elapsed() < Duration::from_secs(5), "answered after {:?}", started.elapsed());
    for mut conn in slow {
        let mut buf = Vec::new();
        let cut = tokio::time::timeout(Duration::from_secs(3), conn.read_to_end(&mut buf)).await;
        assert!(cut.is_ok(), "a slow client still holds its connection 3 s after its head was due");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_from_one_key_is_rate_limited_and_another_key_is_not() {
    let system = System::start(&["--rate-limit", "5", "--rate-burst", "10"]).await;
    let (status, other) = system.call(Method::POST, "/v1/api-keys", Some(serde_json::json!({"name": "other"}))).await;
    assert_eq!(status, 201, "{other}");
    let other = other["key"].as_str().unwrap().to_string();
    let flood: Vec<_> = (0..40).map(|_| tokio::spawn(system.request(Method::GET, "/v1/workspaces").send())).collect();
    let mut limited = Vec::new();
    for answer in flood {
        let answer = answer.await.unwrap().unwrap();
        if answer.status() == 429 {
            limited.push(answer);
        }
    }
    assert!(limited.len() >= 25, "{} of 40 requests over a burst of 10 were limited", limited.len());
    // The other key, right after: not slowed, not limited.
    let started = std::time::Instant::now();
    let (status, _) = system.call_as(&other, Method::GET, "/v1/workspaces", None).await;
    assert_eq!(status, 200);
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
    let first = limited.remove(0);
    let retry_after = first.headers().get("retry-after").expect("Retry-After on a 429").to_str().unwrap().to_string();
    assert!(retry_after.parse::<u64>().unwrap() >= 1, "{retry_after}");
    let e: serde_json::Value = first.json().await.unwrap();
    assert_eq!(e["code"], "RATE_LIMITED", "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_invalid_keys_from_clients_and_guests_refuses_no_valid_key_even_after_a_restart() {
    let mut system = System::start(&[]).await;
    let (status, other) = system.call(Method::POST, "/v1/api-keys", Some(serde_json::json!({"name": "other"}))).await;
    assert_eq!(status, 201, "{other}");
    let other = other["key"].as_str().unwrap().to_string();
    let (status, revoked) = system.call(Method::POST, "/v1/api-keys", Some(serde_json::json!({"name": "gone"}))).await;
    assert_eq!(status, 201, "{revoked}");
    let (status, body) =
        system.call(Method::DELETE, &format!("/v1/api-keys/{}", revoked["id"].as_str().unwrap()), None).await;
    assert!(status < 300, "{status} {body}");
    let revoked = revoked["key"].as_str().unwrap().to_string();
    let guest = system.create_sandbox("base", serde_json::json!({})).await;
    // A restart: this process has seen no key yet (before: every valid key then paid from
    // the failures' global budget, and got 429 once a flood had spent it).
    system.restart().await;

    // From the guest, with no key of its own: random well-formed keys to its API address,
    // as fast as it can for 20 s (at most 20,000), counting the answers.
    let flood = "import http.client, random, string, time, collections, json\n\
                 seen = collections.Counter()\n\
                 end = time.time() + 20\n\
                 c = http.client.HTTPConnection('127.0.0.1', 49171, timeout=10)\n\
                 for _ in range(20000):\n\
                 \x20   if time.time() > end:\n\
                 \x20       break\n\
                 \x20   key = 'lz_' + ''.join(random.choices(string.ascii_letters + string.digits, k=43))\n\
                 \x20   c.request('GET', '/v1/workspaces', headers={'X-API-Key': key})\n\
                 \x20   r = c.getresponse()\n\
                 \x20   r.read()\n\
                 \x20   seen[r.status] += 1\n\
                 print(json.dumps({str(k): n for k, n in seen.items()}), flush=True)\n";
    system.write_file(&guest, "/tmp/flood.py", flood).await;
    system.exec(&guest, "nohup python3 /tmp/flood.py >/tmp/flood.out 2>&1 &").await;
    // From clients: well-formed keys nobody holds, malformed ones, the revoked one, all at once.
    let bad: Vec<String> = (0..300)
        .map(|i| match i % 3 {
            0 => format!("lz_{}", (0..43).map(|_| char::from(b'a' + rand::random::<u8>() % 26)).collect::<String>()),
            1 => format!("not-a-key-{i}"),
            _ => revoked.clone(),
        })
        .collect();
    let clients: Vec<_> =
        bad.iter().map(|k| tokio::spawn(system.request_as(k, Method::GET, "/v1/workspaces").send())).collect();
    // Meanwhile the keys that work, neither used since the restart: never refused.
    for _ in 0..10 {
        for key in [&other, &system.key] {
            let (status, body) = system.call_as(key, Method::GET, "/v1/workspaces", None).await;
            assert_eq!(status, 200, "a valid key during a flood of invalid ones: {body}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for answer in clients {
        let answer = answer.await.unwrap().unwrap();
        assert_eq!(answer.status(), 401, "an invalid key is told so, never made to wait");
    }
    let done = control::eventually(Duration::from_secs(60), || async {
        !system.exec(&guest, "cat /tmp/flood.out").await.1.trim().is_empty()
    })
    .await;
    assert!(done, "the guest's flood ended");
    let counted = system.exec(&guest, "cat /tmp/flood.out").await.1;
    let counted: std::collections::BTreeMap<String, u64> =
        serde_json::from_str(counted.trim()).unwrap_or_else(|e| panic!("{counted}: {e}"));
    eprintln!("the guest's flood: {counted:?}");
    assert_eq!(counted.keys().collect::<Vec<_>>(), ["401"], "every key the guest made up: 401, none 429");
    // Each unknown key waits for a read of new keys begun after it (at most ten a second):
    // one connection's flood is slowed to that pace.
    assert!(counted["401"] > 20, "the guest flooded: {counted:?}");
    // A new key made now works at once.
    let (status, fresh) = system.call(Method::POST, "/v1/api-keys", Some(serde_json::json!({"name": "fresh"}))).await;
    assert_eq!(status, 201, "{fresh}");
    assert_eq!(system.call_as(fresh["key"].as_str().unwrap(), Method::GET, "/v1/workspaces", None).await.0, 200);
    assert_eq!(system.call_as(&revoked, Method::GET, "/v1/workspaces", None).await.0, 401);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_internal_failure_answers_a_request_id_and_no_host_detail() {
    let system = System::start(&[]).await;
    // Another process holds the database's write lock: the server's next write fails inside.
    let db = system.data_dir().join("lizard.db");
    let script = "import sqlite3, sys, time\n\
                  c = sqlite3.connect(sys.argv[1], isolation_level=None)\n\
                  c.execute('BEGIN EXCLUSIVE')\n\
                  print('locked', flush=True)\n\
                  time.sleep(60)\n";
    let mut locker = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&db)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut locked = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(locker.stdout.take().unwrap()), &mut locked).unwrap();
    assert_eq!(locked.trim(), "locked");
    let resp =
        system.request(Method::POST, "/v1/workspaces").json(&serde_json::json!({"name": "w2"})).send().await.unwrap();
    let _ = locker.kill();
    let _ = locker.wait();
    let status = resp.status().as_u16();
    let request_id = resp.headers().get("x-request-id").expect("X-Request-Id").to_str().unwrap().to_string();
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!((status, body["code"].as_str()), (500, Some("INTERNAL")), "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(!message.contains('/') && !message.contains("lizard.db"), "no host detail reaches the client: {message}");
    assert!(!message.contains("locked"), "the cause stays in the operator's log: {message}");
    assert!(message.contains(&request_id), "the answer names its request id: {message}");
    let log = system.log();
    let line = log.lines().find(|l| l.contains(&request_id) && l.contains("internal error"));
    let line = line.unwrap_or_else(|| panic!("the operator's log has the cause under {request_id}:\n{log}"));
    assert!(line.contains("locked"), "{line}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retry_with_an_idempotency_key_runs_nothing_twice() {
    let system = System::start(&[]).await;
    // A create whose client vanished, retried with its key: one sandbox, the first's.
    let body = serde_json::json!({"template": "base", "projectId": system.project}).to_string();
    let raw = format!(
        "POST /v1/sandboxes HTTP/1.1\r\nHost: lizard\r\nX-API-Key: {}\r\nIdempotency-Key: create-1\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        system.key,
        body.len()
    );
    control::send_and_vanish(&system, &raw, Duration::from_millis(100)).await;
    let retry = || async {
        let r = system
            .request(Method::POST, "/v1/sandboxes")
            .header("idempotency-key", "create-1")
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let replayed = r.headers().get("idempotency-replayed").is_some();
        (r.status().as_u16(), replayed, r.json::<serde_json::Value>().await.unwrap())
    };
    let mut answer = retry().await;
    for _ in 0..600 {
        if answer.0 != 409 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        answer = retry().await;
    }
    let (status, replayed, info) = answer;
    assert_eq!((status, replayed), (201, true), "the retry gets the first create's answer: {info}");
    let id = info["sandboxId"].as_str().unwrap().to_string();
    assert_eq!(control::listed(&system).await, std::slice::from_ref(&id), "one sandbox for two requests");

    // An exec retried with its key: the command ran once, the retry gets its output.
    let exec = format!("/v1/sandboxes/{id}/exec");
    let cmd = serde_json::json!({"cmd": "echo run >> /tmp/runs; wc -l < /tmp/runs"});
    let run = |cmd: serde_json::Value| {
        let req = system.request(Method::POST, &exec).header("idempotency-key", "exec-1").json(&cmd);
        async move {
            let r = req.send().await.unwrap();
            let replayed = r.headers().get("idempotency-replayed").is_some();
            (r.status().as_u16(), replayed, r.json::<serde_json::Value>().await.unwrap())
        }
    };
    let first = run(cmd.clone()).await;
    assert_eq!((first.0, first.1, first.2["stdout"].as_str()), (200, false, Some("1\n")), "{:?}", first.2);
    let again = run(cmd.clone()).await;
    assert_eq!((again.0, again.1, &again.2), (200, true, &first.2), "replayed, not run again");
    assert_eq!(system.exec(&id, "wc -l < /tmp/runs").await.1, "1\n", "the command ran once");
    let other = run(serde_json::json!({"cmd": "echo other"})).await;
    assert_eq!((other.0, other.2["code"].as_str()), (422, Some("IDEMPOTENCY_KEY_REUSED")), "{:?}", other.2);
    // Without a key nothing is kept: each call runs.
    assert_eq!(system.exec(&id, "echo run >> /tmp/runs; wc -l < /tmp/runs").await.1, "2\n");

    // A private sandbox's create, retried: its access token again, and kept nowhere in the
    // clear (not in the database, its log or any other file of the server's).
    let private = serde_json::json!({"template": "base", "projectId": system.project, "publicUrls": false});
    let create = || {
        let req = system.request(Method::POST, "/v1/sandboxes").header("idempotency-key", "private-1").json(&private);
        async move {
            let r = req.send().await.unwrap();
            let replayed = r.headers().get("idempotency-replayed").is_some();
            (r.status().as_u16(), replayed, r.json::<serde_json::Value>().await.unwrap())
        }
    };
    let first = create().await;
    assert_eq!((first.0, first.1), (201, false), "{}", first.2);
    let token = first.2["accessToken"].as_str().expect("a private sandbox's token").to_string();
    let again = create().await;
    assert_eq!((again.0, again.1, &again.2), (201, true, &first.2), "the retry gets the token it lost");
    assert_eq!(files_holding(system.data_dir(), token.as_bytes()), Vec::<std::path::PathBuf>::new());
}

/// The files under `dir` (symlinks not followed; disks past 256 MiB skipped) that hold
/// `needle`.
fn files_holding(dir: &std::path::Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut found = vec![];
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let (path, kind) = (entry.path(), entry.file_type().unwrap());
        if kind.is_dir() {
            found.extend(files_holding(&path, needle));
        } else if kind.is_file() && entry.metadata().is_ok_and(|m| m.len() <= 256 << 20) {
            let bytes = std::fs::read(&path).unwrap_or_default();
            if bytes.windows(needle.len()).any(|w| w == needle) {
                found.push(path);
            }
        }
    }
    found
}

/// Open descriptors of process `pid`.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_cannot_exhaust_the_servers_descriptors_through_its_api_endpoint() {
    let system = System::start(&[]).await;
    let id = system.create_sandbox("base", serde_json::json!({})).await;
    let hold = "import socket, time\n\
                held = []\n\
                for _ in range(300):\n\
                \x20   c = socket.socket()\n\
                \x20   c.settimeout(2)\n\
                \x20   try:\n\
                \x20       c.connect(('127.0.0.1', 49171))\n\
                \x20   except OSError:\n\
                \x20       break\n\
                \x20   held.append(c)\n\
                print(len(held), flush=True)\n\
                time.sleep(20)\n";
    system.write_file(&id, "/tmp/hold.py", hold).await;
    let server = system.pid().unwrap();
    let before = open_fds(server);
    system.exec(&id, "nohup python3 /tmp/hold.py >/tmp/hold.out 2>&1 &").await;
    // Wait until the guest holds its connections.
    let held = control::eventually(Duration::from_secs(30), || async {
        !system.exec(&id, "cat /tmp/hold.out").await.1.trim().is_empty()
    })
    .await;
    assert!(held, "the guest opened its connections");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let grown = open_fds(server).saturating_sub(before);
    let opened = system.exec(&id, "cat /tmp/hold.out").await.1;
    // Each carried connection costs the server two descriptors (guest side and API side).
    assert!(
        grown <= 2 * 64 + 32,
        "the guest opened {} connections and the server holds {grown} more descriptors",
        opened.trim()
    );
    let (status, _) = system.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(status, 200, "the API still answers");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fork_whose_client_vanishes_leaves_only_recorded_and_billed_copies() {
    let system = System::start(&[]).await;
    let source = system.create_sandbox("base", serde_json::json!({})).await;
    let body = serde_json::json!({"count": 2}).to_string();
    let raw = format!(
        "POST /v1/sandboxes/{source}/fork HTTP/1.1\r\nHost: lizard\r\nX-API-Key: {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        system.key,
        body.len()
    );
    control::send_and_vanish(&system, &raw, Duration::from_millis(100)).await;
    let forked =
        control::eventually(Duration::from_secs(120), || async { control::listed(&system).await.len() == 3 }).await;
    let vmms = leftovers::vmm_pids(system.data_dir()).len();
    assert!(
        forked,
        "copies run unrecorded after their client went away: {vmms} VMMs, {:?} listed",
        control::listed(&system).await
    );
    // Settled: every VMM is a listed, billed sandbox.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let listed = control::listed(&system).await;
    assert_eq!(leftovers::vmm_pids(system.data_dir()).len(), listed.len());
    assert_eq!(control::billed(&system).await, listed);
}

/// The server's peak resident memory so far (kB).
fn peak_rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM in /proc/<pid>/status");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_cannot_exhaust_the_servers_memory_through_calls_that_collect_its_output() {
    // A sandbox's share is a quarter: 64 MiB.
    let system = System::start(&["--guest-buffer-mib", "256"]).await;
    let id = system.create_sandbox("base", serde_json::json!({})).await;
    // A fake code service in a plain base sandbox: every execution answers one 60 MiB line
    // (the same bytes for every answer: six copies would not fit the guest's 512 MiB).
    let fake = "import socket, threading\n\
                line = b'{\"type\":\"stdout\",\"text\":\"' + b'x' * (60 << 20) + b'\"}\\n'\n\
                def answer(c):\n\
                \x20   try:\n\
                \x20       c.recv(65536)\n\
                \x20       c.sendall(b'HTTP/1.1 200 OK\\r\\nContent-Type: application/x-ndjson\\r\\nConnection: close\\r\\n\\r\\n')\n\
                \x20       c.sendall(line)\n\
                \x20   except OSError:\n\
                \x20       pass\n\
                \x20   c.close()\n\
                s = socket.socket()\n\
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
                s.bind(('127.0.0.1', 49999))\n\
                s.listen(16)\n\
                print('listening', flush=True)\n\
                while True:\n\
                \x20   threading.Thread(target=answer, args=(s.accept()[0],)).start()\n";
    system.write_file(&id, "/tmp/fake.py", fake).await;
    system.exec(&id, "nohup python3 /tmp/fake.py >/tmp/fake.out 2>&1 &").await;
    let listening = control::eventually(Duration::from_secs(30), || async {
        system.exec(&id, "cat /tmp/fake.out").await.1.contains("listening")
    })
    .await;
    assert!(listening, "the fake code service listens");
    let server = system.pid().unwrap();
    let before = peak_rss_kb(server);

    // Six code calls at once: each ends with an error event, none holds its line.
    let code = format!("/v1/sandboxes/{id}/code");
    let calls = (0..6).map(|_| async {
        let resp = system.request(Method::POST, &code).json(&serde_json::json!({"code": "1"})).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.text().await.unwrap()
    });
    for answer in futures_util::future::join_all(calls).await {
        let events: Vec<serde_json::Value> = answer.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let error =
            events.iter().find(|e| e["type"] == "error").unwrap_or_else(|| panic!("no error event: {answer:.300}"));
        let why = error["value"].as_str().unwrap();
        assert!(why.contains("passed 4 MiB") || why.contains("hold"), "{why}");
        assert_eq!(events.last().unwrap()["type"], "end");
    }
    // Six non-streamed execs of 15 MiB each in the same sandbox, each answer 30 MiB with
    // its JSON: its 64 MiB share lets two collect at a time; the others are told to stream.
    let exec = format!("/v1/sandboxes/{id}/exec");
    let fifteen = serde_json::json!({"cmd": "head -c 15728640 /dev/zero | tr '\\0' x"});
    let calls = (0..6).map(|_| system.call(Method::POST, &exec, Some(fifteen.clone())));
    for (status, answer) in futures_util::future::join_all(calls).await {
        match status {
            200 => assert_eq!(answer["stdout"].as_str().unwrap().len(), 15 << 20),
            _ => {
                assert_eq!((status, answer["code"].as_str()), (503, Some("UNAVAILABLE")), "{answer:.300}");
                assert!(answer["message"].as_str().unwrap().contains("stream=true"), "{answer}");
            }
        }
    }
    // 15 MiB of NUL bytes is 90 MiB of JSON: more than the share, so never collected.
    let nul = serde_json::json!({"cmd": "head -c 15728640 /dev/zero"});
    let (status, answer) = system.call(Method::POST, &exec, Some(nul)).await;
    assert_eq!((status, answer["code"].as_str()), (422, Some("OUTPUT_TOO_LARGE")), "{answer:.300}");
    let grown_mb = peak_rss_kb(server).saturating_sub(before) / 1024;
    eprintln!("the server's peak memory grew by {grown_mb} MB");
    // Unbounded, six 60 MiB lines took the server from 73 MB to 909 MB.
    assert!(grown_mb < 200, "the server's peak memory grew by {grown_mb} MB");
    // Everything was given back: one more full-size exec collects.
    let (status, answer) = system.call(Method::POST, &exec, Some(fifteen)).await;
    assert_eq!(status, 200, "{answer:.300}");
}

/// The stdout of one code execution (its NDJSON events), and whether it ended with `end`.
async fn run_code_stdout(system: &System, id: &str, body: serde_json::Value) -> String {
    let resp = system.request(Method::POST, &format!("/v1/sandboxes/{id}/code")).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let answer = resp.text().await.unwrap();
    let events: Vec<serde_json::Value> = answer.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(events.last().unwrap()["type"], "end", "{answer}");
    events.iter().filter(|e| e["type"] == "stdout").map(|e| e["text"].as_str().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_code_cell_cannot_end_itself_early_and_leak_into_the_next() {
    let system = System::start(&[]).await;
    let id = system.create_sandbox("interpreter", serde_json::json!({})).await;
    // The cell writes what used to be the end marker to the context's control pipe, which
    // it shares with the runner (a sourced bash cell runs in the context's own shell).
    let forged = "false; echo 0 >&$LIZARD_EVENTS_FD; sleep 2; echo after";
    let first = run_code_stdout(&system, &id, serde_json::json!({"code": forged, "language": "bash"})).await;
    let second = run_code_stdout(&system, &id, serde_json::json!({"code": "echo next", "language": "bash"})).await;
    // Before: the first ended at once with nothing, "after" came out of the second, whose
    // own output then leaked into the third.
    assert_eq!((first.as_str(), second.as_str()), ("after\n", "next\n"));
    let third = run_code_stdout(&system, &id, serde_json::json!({"code": "echo third", "language": "bash"})).await;
    assert_eq!(third, "third\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_holding_the_nodes_api_connections_leaves_other_sandboxes_theirs() {
    // A pool of 16 shared connections: one sandbox can take all of it.
    let system = System::start(&["--guest-api-connection-pool", "16"]).await;
    let greedy = system.create_sandbox("base", serde_json::json!({})).await;
    let other = system.create_sandbox("base", serde_json::json!({})).await;
    let hold = "import socket, time\n\
                held = []\n\
                for _ in range(100):\n\
                \x20   c = socket.socket()\n\
                \x20   c.connect(('127.0.0.1', 49171))\n\
                \x20   held.append(c)\n\
                print(len(held), flush=True)\n\
                time.sleep(60)\n";
    system.write_file(&greedy, "/tmp/hold.py", hold).await;
    system.exec(&greedy, "nohup python3 /tmp/hold.py >/tmp/hold.out 2>&1 &").await;
    let holding = control::eventually(Duration::from_secs(30), || async {
        system.exec(&greedy, "cat /tmp/hold.out").await.1.trim() == "100"
    })
    .await;
    assert!(holding, "the greedy guest opened its connections");
    // Its 64 are taken (8 of its own, 16 of the pool, the rest queued in its guest):
    // another sandbox still reaches the API.
    let health = "import urllib.request\n\
                  for _ in range(3):\n\
                  \x20   print(urllib.request.urlopen('http://127.0.0.1:49171/health', timeout=20).status)\n";
    system.write_file(&other, "/tmp/health.py", health).await;
    let (code, out, err) = system.exec(&other, "python3 /tmp/health.py").await;
    assert_eq!((code, out.as_str()), (0, "200\n200\n200\n"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_server_leaves_nothing_on_the_host() {
    let mut system = System::start(&[]).await;
    let table = format!("lizard_{}", system.net_prefix.replace('-', "_"));
    let id = system.create_sandbox("base", serde_json::json!({})).await;
    assert_eq!(system.exec(&id, "echo up").await.1, "up\n");
    assert_eq!(leftovers::nft_tables(&table).len(), 1, "the host's rules while it runs");
    system.stop();
    assert!(leftovers::vmm_pids(system.data_dir()).is_empty(), "a VMM outlived the server");
    assert!(leftovers::netns(&system.net_prefix).is_empty(), "namespaces left");
    assert!(leftovers::links(&system.net_prefix).is_empty(), "links left");
    // Before: the table stayed after every stop.
    assert_eq!(leftovers::nft_tables(&table), Vec::<String>::new(), "the host's firewall table left");
}
