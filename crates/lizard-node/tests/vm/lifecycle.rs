//! Pause, resume and fork of real guests: running processes, files and ports survive a
//! pause (the VMM process gone in between, or kept stopped a while) and a node restart;
//! forks are independent.

// Helpers of these tests unwrap as the tests do (clippy.toml's allow-unwrap-in-tests
// covers only the #[test] functions themselves).
#![allow(clippy::unwrap_used)]

use crate::common;

use common::sh;
use lizard_api::{CreateSandboxRequest, ErrorCode, SandboxState};
use lizard_node::Sandbox;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A counter the guest bumps every 100 ms, in a file; and a Node.js HTTP server on 3000.
const COUNTER: &str = "nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/counter.tmp; mv /tmp/counter.tmp /tmp/counter; sleep 0.1; done' >/dev/null 2>&1 &";
const SERVER: &str = r#"node -e "require('http').createServer((q,s)=>s.end('still here '+process.pid)).listen(3000)" >/tmp/http.log 2>&1 &"#;

async fn base(t: &common::TestNode) -> std::sync::Arc<Sandbox> {
    t.node.create(CreateSandboxRequest { template: "base".into(), ..Default::default() }).await.unwrap()
}

async fn run(sbx: &Sandbox, cmd: &str) -> String {
    let r = sbx.exec_collect(sh(cmd)).await.unwrap();
    assert_eq!(r.exit_code, 0, "{cmd}: {r:?}");
    r.stdout
}

async fn counter(sbx: &Sandbox) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = run(sbx, "cat /tmp/counter 2>/dev/null || true").await;
        if let Ok(n) = out.trim().parse() {
            return n;
        }
        assert!(Instant::now() < deadline, "the counter never started");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// GET / on guest port 3000 through the agent, waiting for a server still starting.
async fn http_get(sbx: &Sandbox) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut conn = loop {
        match sbx.connect_port(3000).await {
            Ok(c) => break c,
            Err(e) if e.code() == ErrorCode::PortClosed && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("port 3000: {e}"),
        }
    };
    conn.write_all(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut v = vec![];
    tokio::time::timeout(Duration::from_secs(30), conn.read_to_end(&mut v)).await.expect("no EOF").unwrap();
    let resp = String::from_utf8(v).unwrap();
    resp.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or(resp)
}

/// After a resume the counter goes on from where it stood, not from zero and not by the
/// time it was paused.
async fn assert_counter_continues(sbx: &Sandbox, before: u64) {
    let after = assert_counter_runs_on(sbx, before).await;
    assert!(after < before + 30, "counter ran while paused: {before} → {after}");
}

/// The counter process is alive and at least at `before` (it was not started anew).
async fn assert_counter_runs_on(sbx: &Sandbox, before: u64) -> u64 {
    let after = counter(sbx).await;
    assert!(after >= before, "counter went back: {before} → {after}");
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(counter(sbx).await > after, "the counter loop no longer runs");
    after
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_and_resume_keep_processes_files_and_ports() {
    let t = common::node().await;
    let sbx = base(&t).await;
    run(&sbx, COUNTER).await;
    run(&sbx, SERVER).await;
    run(&sbx, "echo kept > /root/note.txt").await;
    let first = http_get(&sbx).await;
    assert!(first.starts_with("still here"), "{first}");

    // Twice: a template clone's first pause saves all of memory, later ones only devices.
    for round in 0..2 {
        let before = counter(&sbx).await;
        t.node.pause(&sbx.id).await.unwrap();
        assert_eq!(sbx.info().state, SandboxState::Paused);
        assert_eq!(common::vmm_processes(t.dir.path()), Vec::<u32>::new(), "a paused sandbox has no VMM");
        let e = sbx.exec_collect(sh("true")).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::Conflict, "{e}");
        assert!(e.to_string().contains("paused"), "{e}");
        t.node.pause(&sbx.id).await.expect("pausing a paused sandbox is a no-op");
        tokio::time::sleep(Duration::from_secs(2)).await;

        t.node.resume(&sbx.id).await.unwrap();
        assert_eq!(sbx.info().state, SandboxState::Running, "round {round}");
        assert_counter_continues(&sbx, before).await;
        assert_eq!(run(&sbx, "cat /root/note.txt").await, "kept\n");
        // The same server process answers (not a new one).
        assert_eq!(http_get(&sbx).await, first, "round {round}");
        t.node.resume(&sbx.id).await.expect("resuming a running sandbox is a no-op");
    }
    // The guest's clock was set forward on resume: within a few seconds of the host's.
    let guest: i64 = run(&sbx, "date +%s").await.trim().parse().unwrap();
    let host = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    assert!((guest - host).abs() <= 5, "guest clock {guest} vs host {host}");

    // A paused sandbox can be killed, and nothing of it stays.
    t.node.pause(&sbx.id).await.unwrap();
    t.node.kill(&sbx.id).await.unwrap();
    assert_eq!(t.node.resume(&sbx.id).await.unwrap_err().code(), ErrorCode::NotFound);
    t.finish().await;
}

/// CPU time (user + system, in clock ticks) of process `pid` so far.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// With `keep_paused_vm`, a pause saves the sandbox as ever but leaves its VMM stopped
/// for that long: a resume within it continues the same process (nothing restored, the
/// save discarded), one after it restores the save into a new VMM. A kept VMM uses no CPU,
/// gives way to a create that needs its vCPU (its sandbox stays paused and whole), and
/// goes with a kill of its sandbox.
#[tokio::test(flavor = "multi_thread")]
async fn a_paused_sandboxs_vmm_is_kept_a_while_and_a_resume_continues_it() {
    let cpus = std::thread::available_parallelism().unwrap().get();
    let t = common::node_with(|c| {
        c.keep_paused_vm = Duration::from_secs(6);
        // One vCPU in all: a second sandbox fits only once the kept VMM gives way.
        c.confine.cpu_overcommit = 1.0 / cpus as f64;
    })
    .await;
    let sbx = base(&t).await;
    run(&sbx, COUNTER).await;
    run(&sbx, "echo kept > /root/note.txt").await;
    let run_dir = t.dir.path().join("sandboxes").join(&sbx.id);
    let vmm = common::vmm_processes(t.dir.path());
    assert_eq!(vmm.len(), 1);

    // Kept: the same process, stopped, its save on disk all the same; the session's
    // streams end at the pause all the same (the VMM keeps its end of the channel open).
    let mut watch = sbx.watch("/tmp", false).await.unwrap();
    let before = counter(&sbx).await;
    t.node.pause(&sbx.id).await.unwrap();
    let ended = loop {
        match tokio::time::timeout(Duration::from_secs(10), futures_util::StreamExt::next(&mut watch)).await {
            Ok(Some(Ok(_))) => continue,
            Ok(end) => break end,
            Err(_) => panic!("a watch ran on across the pause"),
        }
    };
    assert!(ended.as_ref().is_none_or(|r| r.is_err()), "{ended:?}");
    assert_eq!(sbx.info().state, SandboxState::Paused);
    assert_eq!(common::vmm_processes(t.dir.path()), vmm, "the VMM was not kept");
    assert!(run_dir.join("memory.delta").is_file() && run_dir.join("devices").is_file(), "no save beside it");
    assert_eq!(sbx.exec_collect(sh("true")).await.unwrap_err().code(), ErrorCode::Conflict);
    let ticks = cpu_ticks(vmm[0]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let used = cpu_ticks(vmm[0]) - ticks;
    assert!(used <= 10, "a kept VMM used {used} ticks in 2 s");
    t.node.resume(&sbx.id).await.unwrap();
    assert_eq!(common::vmm_processes(t.dir.path()), vmm, "resumed into another VMM");
    assert!(!run_dir.join("memory.delta").exists(), "the save of a continued VM stays");
    assert_counter_continues(&sbx, before).await;
    assert_eq!(run(&sbx, "cat /root/note.txt").await, "kept\n");
    let guest: i64 = run(&sbx, "date +%s").await.trim().parse().unwrap();
    let host = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    assert!((guest - host).abs() <= 5, "guest clock {guest} vs host {host}");

    // Paused past the keep: the VMM ends, and the resume restores the save.
    let before = counter(&sbx).await;
    t.node.pause(&sbx.id).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !common::vmm_processes(t.dir.path()).is_empty() {
        assert!(Instant::now() < deadline, "the kept VMM outlived its time");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    t.node.resume(&sbx.id).await.unwrap();
    let restored = common::vmm_processes(t.dir.path());
    assert!(restored.len() == 1 && restored != vmm, "{restored:?}");
    assert_counter_continues(&sbx, before).await;

    // A create that needs the vCPU a kept VMM holds: the VMM gives way, the sandbox stays
    // paused and whole, and resumes (restored) once there is room.
    let before = counter(&sbx).await;
    t.node.pause(&sbx.id).await.unwrap();
    let other = base(&t).await;
    assert_eq!(run(&other, "echo hi").await, "hi\n");
    let deadline = Instant::now() + Duration::from_secs(30);
    while common::vmm_processes(t.dir.path()).len() != 1 {
        assert!(Instant::now() < deadline, "the kept VMM did not give way");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let refused = t.node.resume(&sbx.id).await.unwrap_err();
    assert!(refused.to_string().contains("promised"), "{refused}");
    assert_eq!(sbx.info().state, SandboxState::Paused);
    t.node.kill(&other.id).await.unwrap();
    t.node.resume(&sbx.id).await.unwrap();
    assert_counter_continues(&sbx, before).await;
    assert_eq!(run(&sbx, "cat /root/note.txt").await, "kept\n");

    // Killed while its VMM is kept: nothing of it stays.
    t.node.pause(&sbx.id).await.unwrap();
    assert_eq!(common::vmm_processes(t.dir.path()).len(), 1);
    t.node.kill(&sbx.id).await.unwrap();
    assert_eq!(common::vmm_processes(t.dir.path()), Vec::<u32>::new());
    // And one kept at shutdown ends with the node (its sandbox stays on disk, paused).
    let last = base(&t).await;
    t.node.pause(&last.id).await.unwrap();
    assert_eq!(common::vmm_processes(t.dir.path()).len(), 1);
    t.node.shutdown().await;
    assert_eq!(common::vmm_processes(t.dir.path()), Vec::<u32>::new(), "a kept VMM outlived the node");
}

async fn boot_id(sbx: &Sandbox) -> String {
    run(sbx, "cat /proc/sys/kernel/random/boot_id").await
}

#[tokio::test(flavor = "multi_thread")]
async fn forks_are_independent_copies_with_their_processes() {
    let t = common::node().await;
    let src = base(&t).await;
    run(&src, COUNTER).await;
    run(&src, "echo original > /root/a.txt").await;
    // Far enough from zero that a copy whose loop started over would show.
    let deadline = Instant::now() + Duration::from_secs(60);
    let before = loop {
        let n = counter(&src).await;
        if n > 5 {
            break n;
        }
        assert!(Instant::now() < deadline, "the counter is stuck at {n}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };

    assert_eq!(t.node.fork(&src.id, 0).await.unwrap_err().code(), ErrorCode::InvalidArgument);
    assert_eq!(t.node.fork("nope", 1).await.unwrap_err().code(), ErrorCode::NotFound);
    // Read before the fork: Linux fixes the boot id at its first read.
    let src_boot = boot_id(&src).await;
    let copies = t.node.fork(&src.id, 2).await.unwrap();
    assert_eq!(copies.len(), 2);
    assert_ne!(copies[0].id, copies[1].id);
    // Each copy boots anew as far as its programs can tell; the source and a resume keep theirs.
    let mut boots = vec![src_boot.clone(), boot_id(&copies[0]).await, boot_id(&copies[1]).await];
    assert_eq!(boot_id(&src).await, src_boot);
    assert!(boots.iter().all(|b| b.len() == 37), "{boots:?}");
    boots.sort();
    boots.dedup();
    assert_eq!(boots.len(), 3, "copies share a boot id: {boots:?}");
    let e = copies[0].exec_collect(sh("echo x > /proc/sys/kernel/random/boot_id")).await.unwrap();
    assert_ne!(e.exit_code, 0, "a copy's boot id is writable");

    let mut randoms = vec![run(&src, "head -c 16 /dev/urandom | od -An -tx1").await];
    for (i, copy) in copies.iter().enumerate() {
        assert_ne!(copy.id, src.id);
        // The counter process came along and runs on in the copy.
        assert_counter_runs_on(copy, before).await;
        assert_eq!(run(copy, "cat /root/a.txt").await, "original\n");
        assert_eq!(run(copy, "hostname").await.trim(), copy.id);
        run(copy, &format!("echo copy{i} > /root/a.txt")).await;
        randoms.push(run(copy, "head -c 16 /dev/urandom | od -An -tx1").await);
    }
    randoms.dedup();
    assert_eq!(randoms.len(), 3, "copies share RNG output: {randoms:?}");
    // Writes stay where they were made.
    assert_eq!(run(&src, "cat /root/a.txt").await, "original\n");
    assert_eq!(run(&copies[0], "cat /root/a.txt").await, "copy0\n");
    assert_eq!(run(&copies[1], "cat /root/a.txt").await, "copy1\n");
    run(&src, "echo changed > /root/a.txt").await;
    assert_eq!(run(&copies[0], "cat /root/a.txt").await, "copy0\n");
    // The source, now on a new overlay over the frozen layer, pauses and resumes.
    t.node.pause(&src.id).await.unwrap();
    if let Err(e) = t.node.resume(&src.id).await {
        let dir = t.dir.path().join("sandboxes").join(&src.id);
        panic!("{e}: {}", std::fs::read_to_string(dir.join("qemu.stderr")).unwrap_or_default());
    }
    assert_eq!(run(&src, "cat /root/a.txt").await, "changed\n");
    assert_eq!(boot_id(&src).await, src_boot, "a resume changed the boot id");

    // The source can go first: the copies' disks do not depend on its directory. A copy
    // pauses and resumes like any sandbox.
    t.node.kill(&src.id).await.unwrap();
    let copy_boot = boot_id(&copies[0]).await;
    t.node.pause(&copies[0].id).await.unwrap();
    t.node.resume(&copies[0].id).await.unwrap();
    assert_eq!(run(&copies[0], "cat /root/a.txt").await, "copy0\n");
    assert_eq!(boot_id(&copies[0]).await, copy_boot, "a copy's resume changed its boot id");
    // A paused sandbox cannot be forked.
    t.node.pause(&copies[1].id).await.unwrap();
    assert_eq!(t.node.fork(&copies[1].id, 1).await.unwrap_err().code(), ErrorCode::Conflict);
    for c in &copies {
        t.node.kill(&c.id).await.unwrap();
    }
    let layers: Vec<_> = std::fs::read_dir(t.dir.path().join("layers")).unwrap().flatten().map(|e| e.path()).collect();
    assert!(layers.is_empty(), "layers left behind: {layers:?}");
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_sandbox_survives_a_node_restart() {
    let t = common::node().await;
    // Its environment carries a key, which waits on the host as long as the pause lasts.
    const KEY: &str = "lz_sealedSecretValue123";
    let env = [("LIZARD_API_KEY".to_string(), KEY.to_string())].into();
    let sbx = t.node.create(CreateSandboxRequest { template: "base".into(), env, ..Default::default() }).await.unwrap();
    let running = base(&t).await;
    run(&sbx, COUNTER).await;
    run(&sbx, "echo kept > /root/note.txt").await;
    let before = counter(&sbx).await;
    t.node.pause(&sbx.id).await.unwrap();
    let id = sbx.id.clone();
    // Nothing in the paused sandbox's directory but guest memory holds the key in plain text.
    let dir = t.node.config().data_dir.join("sandboxes").join(&id);
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let guest_memory = ["memory", "base-memory", "memory.delta", "state"].contains(&name.as_str());
        if entry.file_type().unwrap().is_file() && !guest_memory {
            let bytes = std::fs::read(entry.path()).unwrap();
            assert!(!bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes()), "{name} holds the key in plain text");
        }
    }
    drop(sbx);

    // A new node process on the same directory: the paused one is back, the running one
    // (killed by the old node's shutdown) is not.
    t.node.shutdown().await;
    // As if the old process had died between the pause's record and its VMM's kill: a
    // process naming the sandbox holds the VMM's pid file. The new node kills it and still
    // takes the sandbox back paused.
    let stale = std::process::Command::new("python3")
        .args(["-c", "import time; time.sleep(600)", &format!("lizard-{id}")])
        .spawn()
        .unwrap();
    std::fs::write(dir.join("vmm.pid"), stale.id().to_string()).unwrap();
    let node = lizard_node::Node::start(t.node.config().clone()).await.unwrap();
    let back = node.get(&id).expect("the paused sandbox is back");
    assert_eq!(back.info().state, SandboxState::Paused);
    assert_eq!(node.list().len(), 1);
    assert_eq!(node.get(&running.id).unwrap_err().code(), ErrorCode::NotFound);
    let mut stale = stale;
    let waited = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            if let Some(status) = stale.try_wait().unwrap() {
                return status;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    });
    assert!(!waited.await.expect("the stale VMM was killed").success());

    node.resume(&id).await.unwrap();
    assert_counter_continues(&back, before).await;
    assert_eq!(run(&back, "cat /root/note.txt").await, "kept\n");
    assert_eq!(run(&back, "echo $LIZARD_API_KEY").await, format!("{KEY}\n"), "the sealed environment opened");
    node.kill(&id).await.unwrap();
    node.shutdown().await;
    common::assert_no_leftovers(t.dir.path());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_snapshot_starts_sandboxes_after_its_source_and_the_node_are_gone() {
    let t = common::node().await;
    let env = [("FROM".to_string(), "source".to_string()), ("KEPT".to_string(), "yes".to_string())].into();
    let src = t.node.create(CreateSandboxRequest { template: "base".into(), env, ..Default::default() }).await.unwrap();
    run(&src, COUNTER).await;
    run(&src, "echo original > /root/a.txt").await;
    let before = counter(&src).await;
    assert_eq!(t.node.snapshot_sandbox("nope").await.unwrap_err().code(), ErrorCode::NotFound);
    let snap = t.node.snapshot_sandbox(&src.id).await.unwrap();
    assert_eq!((snap.source.as_str(), snap.template.as_str()), (src.id.as_str(), "base"));
    assert_eq!(t.node.sandbox_snapshots(), vec![snap.clone()]);
    // The source runs on, on a disk of its own.
    assert_counter_runs_on(&src, before).await;
    run(&src, "echo changed > /root/a.txt").await;
    t.node.kill(&src.id).await.unwrap();
    drop(src);

    // A new node process on the same directory still has the snapshot.
    t.node.shutdown().await;
    let node = lizard_node::Node::start(t.node.config().clone()).await.unwrap();
    assert_eq!(node.sandbox_snapshots(), vec![snap.clone()]);
    let from = |snapshot: &str| CreateSandboxRequest { snapshot: Some(snapshot.into()), ..Default::default() };
    // What a snapshot's sandboxes cannot have is refused, and nothing is started.
    assert_eq!(node.create(from("nope")).await.unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(node.create(from("../sandboxes")).await.unwrap_err().code(), ErrorCode::NotFound);
    let bigger = CreateSandboxRequest { vcpus: Some(snap.vcpus + 1), ..from(&snap.id) };
    assert_eq!(node.create(bigger).await.unwrap_err().code(), ErrorCode::InvalidArgument);
    let volume = CreateSandboxRequest { volume: Some("v".into()), ..from(&snap.id) };
    assert_eq!(node.create(volume).await.unwrap_err().code(), ErrorCode::InvalidArgument);
    assert!(node.list().is_empty());

    let env = [("FROM".to_string(), "create".to_string())].into();
    let metadata = [("k".to_string(), "v".to_string())].into();
    let copies = [
        node.create(CreateSandboxRequest { env, metadata, ..from(&snap.id) }).await.unwrap(),
        node.create(from(&snap.id)).await.unwrap(),
    ];
    assert_ne!(copies[0].id, copies[1].id);
    assert_eq!(copies[0].metadata.get("k").map(String::as_str), Some("v"));
    for copy in &copies {
        assert_eq!(copy.template, "base");
        // The processes and files of the moment it was taken, under a name of its own.
        assert_counter_runs_on(copy, before).await;
        assert_eq!(run(copy, "cat /root/a.txt").await, "original\n");
        assert_eq!(run(copy, "hostname").await.trim(), copy.id);
        assert_eq!(run(copy, "echo $KEPT").await, "yes\n");
    }
    assert_eq!(run(&copies[0], "echo $FROM").await, "create\n");
    assert_eq!(run(&copies[1], "echo $FROM").await, "source\n");
    run(&copies[0], "echo copy > /root/a.txt").await;
    assert_eq!(run(&copies[1], "cat /root/a.txt").await, "original\n");

    // Deleted, it starts nothing more; its sandboxes run on, pause and resume.
    node.delete_sandbox_snapshot(&snap.id).await.unwrap();
    assert_eq!(node.delete_sandbox_snapshot(&snap.id).await.unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(node.create(from(&snap.id)).await.unwrap_err().code(), ErrorCode::NotFound);
    assert!(node.sandbox_snapshots().is_empty());
    node.pause(&copies[1].id).await.unwrap();
    node.resume(&copies[1].id).await.unwrap();
    assert_eq!(run(&copies[1], "cat /root/a.txt").await, "original\n");
    for copy in &copies {
        node.kill(&copy.id).await.unwrap();
    }
    let data = t.node.config().data_dir.clone();
    let layers: Vec<_> = std::fs::read_dir(data.join("layers")).unwrap().flatten().map(|e| e.path()).collect();
    assert!(layers.is_empty(), "layers left behind: {layers:?}");
    let kept: Vec<_> = std::fs::read_dir(data.join("sandbox-snapshots")).unwrap().flatten().map(|e| e.path()).collect();
    assert!(kept.is_empty(), "snapshot files left behind: {kept:?}");
    node.shutdown().await;
    common::assert_no_leftovers(t.dir.path());
}
