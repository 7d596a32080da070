//! Sandboxes restored from a template snapshot: each one its own machine (RNG, boot id,
//! hostname, clock, disk, secret), and much faster to start than a cold boot; snapshots
//! nothing needs are collected.

// Helpers of these tests unwrap as the tests do (clippy.toml's allow-unwrap-in-tests
// covers only the #[test] functions themselves).
#![allow(clippy::unwrap_used)]

use crate::common;

use common::sh;
use lizard_agent_client::{AgentClient, ClientError};
use lizard_agent_proto::handshake::{HandshakeError, Secret};
use lizard_api::CreateSandboxRequest;
use lizard_node::snapshot::TemplateSnapshot;
use lizard_node::Sandbox;
use lizard_vmm::{Backend, MemoryMapping};
use std::time::{Duration, Instant, SystemTime};

fn base() -> CreateSandboxRequest {
    CreateSandboxRequest { template: "base".into(), ..Default::default() }
}

async fn out(sbx: &Sandbox, cmd: &str) -> String {
    let r = sbx.exec_collect(sh(cmd)).await.unwrap();
    assert_eq!(r.exit_code, 0, "{cmd}: {r:?}");
    r.stdout.trim().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn clones_of_one_snapshot_are_distinct_machines() {
    let t = common::node().await;
    t.node.prepare("base").await.unwrap();

    let t0 = Instant::now();
    let a = t.node.create(base()).await.unwrap();
    let first = t0.elapsed();
    let t1 = Instant::now();
    let b = t.node.create(base()).await.unwrap();
    let second = t1.elapsed();
    eprintln!("create: first (cold boot + snapshot + restore) {first:?}, second (restore) {second:?}");
    assert!(a.from_snapshot() && b.from_snapshot(), "a create fell back to a cold boot");

    // Both answer, each under its own name.
    assert_eq!(out(&a, "hostname").await, a.id);
    assert_eq!(out(&b, "hostname").await, b.id);

    // Their kernel RNGs have diverged from the template's and from each other.
    let rand = "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'";
    let (ra, rb) = (out(&a, rand).await, out(&b, rand).await);
    assert_eq!(ra.len(), 64);
    assert_ne!(ra, rb, "two clones produced the same random bytes");

    // Each made its own boot id on first read.
    let boot_id = "cat /proc/sys/kernel/random/boot_id";
    let (ba, bb) = (out(&a, boot_id).await, out(&b, boot_id).await);
    assert_eq!(ba.len(), 36);
    assert_ne!(ba, bb, "two clones share a boot id");

    // Wall clocks are the host's, not the snapshot's.
    for s in [&a, &b] {
        let guest: i64 = out(s, "date +%s").await.parse().unwrap();
        let host = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() as i64;
        assert!((guest - host).abs() <= 5, "guest clock {guest}, host {host}");
    }

    // Disks are separate.
    out(&a, "echo only-in-a > /root/mine && sync").await;
    let r = b.exec_collect(sh("cat /root/mine")).await.unwrap();
    assert_ne!(r.exit_code, 0, "b sees a's file: {r:?}");
    assert_eq!(out(&a, "cat /root/mine").await, "only-in-a");

    // A third create, once more timed: restores must beat a cold boot by far.
    let t2 = Instant::now();
    let c = t.node.create(base()).await.unwrap();
    let r = c.exec_collect(sh("true")).await.unwrap();
    let third = t2.elapsed();
    assert_eq!(r.exit_code, 0);
    eprintln!("create + first exec (restore): {third:?}");
    assert!(c.from_snapshot());
    assert!(second < Duration::from_millis(1500), "restore took {second:?}");

    t.finish().await;
}

/// The template-time secret opens a fresh clone, and no longer once it has been given
/// its identity; the new secret does.
#[tokio::test(flavor = "multi_thread")]
async fn the_template_secret_is_refused_after_identity() {
    let t = common::node().await;
    let sbx = t.node.create(base()).await.unwrap();
    assert!(sbx.from_snapshot());
    // A clone of our own, beside the node's, with the node's VM layout.
    let clone = ManualClone::restore(&t, &sbx, "manualclone").await;
    let snap = clone.snap.clone();
    let connect = |secret: Secret| {
        let sock = clone.config.agent_socket();
        async move {
            let stream = tokio::net::UnixStream::connect(&sock).await.unwrap();
            tokio::time::timeout(Duration::from_secs(10), AgentClient::connect(stream, &secret))
                .await
                .expect("handshake timed out")
        }
    };
    let old = connect(snap.secret.clone()).await.expect("the template secret opens a fresh clone");
    let new = Secret::generate();
    let identity = lizard_agent_proto::types::Identity {
        sandbox_id: "manualclone".into(),
        hostname: "manualclone".into(),
        secret: new.to_hex(),
        entropy: hex::encode([9u8; 64]),
        unix_time_ms: u64::try_from(SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_millis())
            .unwrap(),
    };
    old.identity(&identity).await.unwrap();
    // The session that sent it goes on.
    let r = old
        .exec_collect(lizard_agent_proto::types::ExecRequest { cmd: Some("hostname".into()), ..Default::default() })
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout).trim(), "manualclone");
    old.close().await;
    tokio::time::sleep(Duration::from_millis(50)).await;

    match connect(snap.secret.clone()).await {
        Err(ClientError::Handshake(HandshakeError::Denied)) => {}
        Err(e) => panic!("expected Denied, got {e}"),
        Ok(_) => panic!("the template secret still opens the clone"),
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let again = connect(new).await.expect("the new secret opens the clone");
    assert!(again.health().await.is_ok());
    drop(again);

    clone.remove().await;
    t.finish().await;
}

/// `snapshots: false` cold-boots, and still works.
#[tokio::test(flavor = "multi_thread")]
async fn snapshots_can_be_switched_off() {
    let t = common::node_with(|c| c.snapshots = false).await;
    let t0 = Instant::now();
    let s = t.node.create(base()).await.unwrap();
    let r = s.exec_collect(sh("true")).await.unwrap();
    eprintln!("create + first exec (cold boot): {:?}", t0.elapsed());
    assert_eq!(r.exit_code, 0);
    assert!(!s.from_snapshot());
    assert!(!t.dir.path().join("snapshots").exists());
    t.finish().await;
}

/// A restored clone of the node's `base` snapshot, beside the node's own sandbox `sbx`
/// (same VM layout, a run directory, disk and, with networking, a namespace of its own).
struct ManualClone {
    vm: Box<dyn lizard_vmm::Vm>,
    config: lizard_vmm::VmConfig,
    snap: TemplateSnapshot,
    netns: Option<String>,
}

impl ManualClone {
    async fn restore(t: &common::TestNode, sbx: &Sandbox, name: &str) -> ManualClone {
        let snaps = t.dir.path().join("snapshots");
        let dir = std::fs::read_dir(&snaps)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.is_dir() && !p.file_name().unwrap().to_string_lossy().starts_with('.'))
            .expect("a snapshot directory");
        let snap = TemplateSnapshot::load(&dir).expect("a complete snapshot");
        let run_dir = t.dir.path().join(name);
        std::fs::create_dir_all(&run_dir).unwrap();
        let mut config = sbx.live().unwrap().vm().config().clone();
        config.id = name.into();
        config.root_disk = run_dir.join("root.qcow2");
        config.secret_file = Some(run_dir.join("secret"));
        config.run_dir = run_dir.clone();
        // The same devices as the node's VMs: an empty volume slot and a staging disk.
        config.extra_disks = vec![run_dir.join("no-volume.img"), run_dir.join("staging.img")];
        std::fs::write(&config.extra_disks[0], b"").unwrap();
        lizard_agent_client::StagingFile::create(&config.extra_disks[1]).unwrap();
        std::fs::write(run_dir.join("secret"), snap.secret.to_hex()).unwrap();
        let mut netns = None;
        if let Some(net) = &mut config.net {
            let ns = format!("lizard-{name}-{}", rand::random::<u32>());
            let ip = |args: &str| {
                assert!(std::process::Command::new("ip").args(args.split_whitespace()).status().unwrap().success())
            };
            ip(&format!("netns add {ns}"));
            ip(&format!("-n {ns} tuntap add dev {} mode tap", net.tap));
            net.netns = std::path::Path::new("/run/netns").join(&ns);
            netns = Some(ns);
        }
        let st = std::process::Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
            .arg(snap.disk())
            .arg(&config.root_disk)
            .status()
            .unwrap();
        assert!(st.success());
        let backend = lizard_vmm::qemu::QemuBackend::default();
        let vm = backend.restore(&config, &snap.vm_snapshot(), MemoryMapping::CopyOnWrite).await.unwrap();
        ManualClone { vm, config, snap, netns }
    }

    async fn stream(&self) -> tokio::net::UnixStream {
        tokio::net::UnixStream::connect(self.config.agent_socket()).await.unwrap()
    }

    async fn remove(self) {
        self.vm.kill().await.unwrap();
        std::fs::remove_dir_all(&self.config.run_dir).unwrap();
        if let Some(ns) = self.netns {
            let _ = std::process::Command::new("ip").args(["netns", "del", &ns]).status();
        }
    }
}

fn identity_for(name: &str, secret: &Secret) -> lizard_agent_proto::types::Identity {
    lizard_agent_proto::types::Identity {
        sandbox_id: name.into(),
        hostname: name.into(),
        secret: secret.to_hex(),
        entropy: hex::encode(rand::random::<[u8; 32]>()) + &hex::encode(rand::random::<[u8; 32]>()),
        unix_time_ms: u64::try_from(SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_millis())
            .unwrap(),
    }
}

/// The identity rides in the handshake: a wrong proof changes nothing (the template
/// secret still opens the clone afterwards), a right one switches the clone in one round
/// trip, which the restored agent answers promptly (it is woken by the host's connect,
/// not by a timer); an idle agent waiting for its host then burns no measurable CPU.
#[tokio::test(flavor = "multi_thread")]
async fn identity_in_the_handshake_and_an_idle_agent() {
    let t = common::node().await;
    let sbx = t.node.create(base()).await.unwrap();
    assert!(sbx.from_snapshot());
    let clone = ManualClone::restore(&t, &sbx, "hsclone").await;
    let new = Secret::generate();
    let identity = identity_for("hsclone", &new);
    let limit = Duration::from_secs(10);

    // A wrong proof: refused, and the clone keeps its template secret.
    let r = tokio::time::timeout(
        limit,
        AgentClient::connect_with_identity(clone.stream().await, &Secret::generate(), &identity),
    )
    .await
    .expect("handshake timed out");
    assert!(matches!(r, Err(ClientError::Handshake(HandshakeError::Denied))), "{:?}", r.err());
    tokio::time::sleep(Duration::from_millis(50)).await;

    let t0 = Instant::now();
    let agent = tokio::time::timeout(
        limit,
        AgentClient::connect_with_identity(clone.stream().await, &clone.snap.secret, &identity),
    )
    .await
    .expect("handshake timed out")
    .expect("the template secret still opens the clone after a wrong proof");
    let answered = t0.elapsed();
    eprintln!("restored agent: connect → handshake with identity done in {answered:?}");
    assert!(answered < Duration::from_secs(2), "the restored agent took {answered:?} to answer");
    let exec = |cmd: &str| lizard_agent_proto::types::ExecRequest { cmd: Some(cmd.into()), ..Default::default() };
    let r = agent.exec_collect(exec("hostname")).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout).trim(), "hsclone");

    // Idle CPU of the agent (PID 1) while it waits for a host: sampled by a detached
    // shell in the guest, 5 s with no session open.
    let sample = "(sleep 1; a=$(cut -d' ' -f14,15 /proc/1/stat); sleep 5; \
                  b=$(cut -d' ' -f14,15 /proc/1/stat); echo $a $b > /run/idle-ticks) \
                  </dev/null >/dev/null 2>&1 &";
    assert_eq!(agent.exec_collect(exec(sample)).await.unwrap().status.exit_code, 0);
    agent.close().await;
    tokio::time::sleep(Duration::from_millis(7500)).await;

    // The template secret is refused now; the new one opens the clone.
    match AgentClient::connect(clone.stream().await, &clone.snap.secret).await {
        Err(ClientError::Handshake(HandshakeError::Denied)) => {}
        Err(e) => panic!("expected Denied, got {e}"),
        Ok(_) => panic!("the template secret still opens the clone"),
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let again = tokio::time::timeout(limit, AgentClient::connect(clone.stream().await, &new))
        .await
        .expect("handshake timed out")
        .expect("the new secret opens the clone");
    let r = again.exec_collect(exec("cat /run/idle-ticks")).await.unwrap();
    let ticks: Vec<u64> = String::from_utf8_lossy(&r.stdout).split_whitespace().map(|n| n.parse().unwrap()).collect();
    assert_eq!(ticks.len(), 4, "{r:?}");
    let used = (ticks[2] + ticks[3]) - (ticks[0] + ticks[1]);
    eprintln!("idle agent: {used} ticks (1/100 s) of CPU in 5 s");
    assert!(used <= 2, "an idle agent used {used} ticks in 5 s");
    drop(again);
    clone.remove().await;
    t.finish().await;
}
/// A guest process that fills `mib` MiB with random bytes and keeps them; it writes their
/// SHA-256 to /tmp/h1 at once and to /tmp/h2 on SIGUSR1. Returns the first hash.
async fn start_pattern(sbx: &Sandbox, mib: u32) -> String {
    let script = "const c=require('crypto'),fs=require('fs');\
        const b=Buffer.allocUnsafe(Number(process.argv[2])*1048576);c.randomFillSync(b);\
        const h=()=>c.createHash('sha256').update(b).digest('hex');\
        process.on('SIGUSR1',()=>fs.writeFileSync('/tmp/h2.tmp',h())||fs.renameSync('/tmp/h2.tmp','/tmp/h2'));\
        fs.writeFileSync('/tmp/h1.tmp',h());fs.renameSync('/tmp/h1.tmp','/tmp/h1');setInterval(()=>{},1000);";
    out(sbx, &format!("cat > /tmp/pattern.js <<'EOF'\n{script}\nEOF")).await;
    out(sbx, &format!("nohup node /tmp/pattern.js {mib} >/tmp/pattern.log 2>&1 & echo $! > /tmp/pattern.pid")).await;
    wait_for_file(sbx, "/tmp/h1").await
}

async fn wait_for_file(sbx: &Sandbox, path: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let h = out(sbx, &format!("cat {path} 2>/dev/null || true")).await;
        if h.len() == 64 {
            return h;
        }
        assert!(Instant::now() < deadline, "no {path}: {}", out(sbx, "cat /tmp/pattern.log").await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The pattern process's memory hashed now (it must still be the same process).
async fn pattern_hash(sbx: &Sandbox) -> String {
    out(sbx, "rm -f /tmp/h2 && kill -USR1 $(cat /tmp/pattern.pid)").await;
    wait_for_file(sbx, "/tmp/h2").await
}

fn run_dir(t: &common::TestNode, sbx: &Sandbox) -> std::path::PathBuf {
    t.dir.path().join("sandboxes").join(&sbx.id)
}

fn mib(path: &std::path::Path) -> f64 {
    std::fs::metadata(path).unwrap().len() as f64 / 1048576.0
}

/// A template clone pauses to the pages it dirtied (a delta over the template's memory,
/// linked into its directory), which rebuild its memory byte for byte; a process's
/// memory survives pause and resume, twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_paused_clone_keeps_only_the_pages_it_dirtied() {
    let t = common::node().await;
    let sbx = t.node.create(base()).await.unwrap();
    assert!(sbx.from_snapshot());
    const DIRTIED_MIB: u32 = 128;
    let h1 = start_pattern(&sbx, DIRTIED_MIB).await;

    // The delta over the base is the stopped VM's memory, byte for byte.
    {
        let live = sbx.live().unwrap();
        let vm = live.vm();
        vm.pause().await.unwrap();
        let base = vm.memory_base().expect("a clone's memory is copy-on-write").to_path_buf();
        assert_eq!(base, run_dir(&t, &sbx).join("base-memory"), "the clone maps the template's memory by a link");
        let len = u64::from(vm.config().memory_mib) << 20;
        let tmp = tempfile::tempdir().unwrap();
        let (delta, devices) = (tmp.path().join("delta"), tmp.path().join("devices"));
        let stats = vm.save_delta(&delta, &devices).await.unwrap();
        assert!(devices.is_file());
        let mapping = lizard_vmm::delta::layout(vm.pid(), &base, len).unwrap().mapping;
        let mut ram = vec![0u8; usize::try_from(len).unwrap()];
        use std::os::unix::fs::FileExt;
        let mem = std::fs::File::open(format!("/proc/{}/mem", vm.pid())).unwrap();
        mem.read_exact_at(&mut ram, mapping.start).unwrap();
        let mut rebuilt = std::fs::read(&base).unwrap();
        let differing = |a: &[u8], b: &[u8]| a.chunks(4096).zip(b.chunks(4096)).filter(|(x, y)| x != y).count();
        let before = differing(&rebuilt, &ram);
        assert!(before >= (DIRTIED_MIB as usize) * 256, "the base alone differs in only {before} pages");
        for (pages, data) in lizard_vmm::delta::load(&delta, len).unwrap().batches() {
            for (p, page) in pages.iter().zip(data.chunks(4096)) {
                let at = usize::try_from(*p).unwrap() * 4096;
                rebuilt[at..at + 4096].copy_from_slice(page);
            }
        }
        assert_eq!(differing(&rebuilt, &ram), 0, "base + delta is not the VM's memory");
        eprintln!("delta: {} pages, {} bytes; {before} pages differ from the base", stats.pages, stats.bytes);
        vm.resume().await.unwrap();
    }

    for round in 0..2 {
        let t0 = Instant::now();
        t.node.pause(&sbx.id).await.unwrap();
        let paused = t0.elapsed();
        let dir = run_dir(&t, &sbx);
        let delta = mib(&dir.join("memory.delta"));
        eprintln!("round {round}: pause {paused:?}, delta {delta:.1} MiB");
        assert!(
            delta >= f64::from(DIRTIED_MIB) && delta < f64::from(DIRTIED_MIB) + 160.0,
            "a delta of {delta:.1} MiB after dirtying {DIRTIED_MIB} MiB"
        );
        for gone in ["state", "memory"] {
            assert!(!dir.join(gone).exists(), "a paused clone has a {gone} file");
        }
        let t0 = Instant::now();
        t.node.resume(&sbx.id).await.unwrap();
        eprintln!("round {round}: resume {:?}", t0.elapsed());
        // The confined VMM maps the delta's pages rather than having them copied in; the
        // hash below only reads them, so the next round's save must take pages that are
        // still the delta file's.
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", sbx.live().unwrap().vm().pid())).unwrap();
        let mapped = maps.lines().filter(|l| l.contains("/memory.delta")).count();
        assert!(mapped > 0, "round {round}: the resumed VMM maps nothing of its delta");
        assert_eq!(pattern_hash(&sbx).await, h1, "round {round}: the process's memory changed");
        assert!(!dir.join("memory.delta").exists(), "the delta outlived the resume");
    }
    t.finish().await;
}

/// A damaged or missing delta fails the resume with a stable error, and the sandbox stays
/// paused with its files; put right, it resumes.
#[tokio::test(flavor = "multi_thread")]
async fn a_damaged_or_missing_delta_fails_the_resume_and_keeps_the_sandbox() {
    let t = common::node().await;
    let sbx = t.node.create(base()).await.unwrap();
    let h1 = start_pattern(&sbx, 16).await;
    t.node.pause(&sbx.id).await.unwrap();
    let dir = run_dir(&t, &sbx);
    let delta = dir.join("memory.delta");
    let good = std::fs::read(&delta).unwrap();

    let mut damaged = good.clone();
    let n = damaged.len();
    damaged[n - 100] ^= 0x40;
    std::fs::write(&delta, &damaged).unwrap();
    let check_refused = |what: &str, e: lizard_node::NodeError| {
        let api = e.to_api();
        assert_eq!(api.code, lizard_api::ErrorCode::BootFailed, "{what}: {e}");
        assert!(api.message.contains("saved memory is damaged or missing"), "{what}: {}", api.message);
        assert!(!api.message.contains(dir.to_str().unwrap()), "{what}: a host path in {}", api.message);
        assert_eq!(sbx.info().state, lizard_api::SandboxState::Paused, "{what}");
        assert_eq!(common::vmm_processes(t.dir.path()), Vec::<u32>::new(), "{what}: a VMM runs on");
        for f in ["sandbox.json", "devices", "base-memory", "root.qcow2"] {
            assert!(dir.join(f).is_file(), "{what}: {f} is gone");
        }
    };
    check_refused("damaged", t.node.resume(&sbx.id).await.unwrap_err());
    std::fs::remove_file(&delta).unwrap();
    check_refused("missing", t.node.resume(&sbx.id).await.unwrap_err());
    std::fs::write(&delta, &damaged[..n / 2]).unwrap();
    check_refused("truncated", t.node.resume(&sbx.id).await.unwrap_err());

    std::fs::write(&delta, &good).unwrap();
    t.node.resume(&sbx.id).await.unwrap();
    assert_eq!(pattern_hash(&sbx).await, h1);
    t.finish().await;
}

/// Five copies of a running clone: each has the source's memory (a process's pattern),
/// its own identity and RNG, and its own writes; a copy pauses and resumes.
#[tokio::test(flavor = "multi_thread")]
async fn a_clone_forks_into_five_distinct_copies() {
    let t = common::node().await;
    let src = t.node.create(base()).await.unwrap();
    let h1 = start_pattern(&src, 32).await;
    let t0 = Instant::now();
    let copies = t.node.fork(&src.id, 5).await.unwrap();
    eprintln!("fork ×5 of a clone: {:?}", t0.elapsed());
    assert_eq!(copies.len(), 5);
    let rand = "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'";
    let boot_id = "cat /proc/sys/kernel/random/boot_id";
    let mut randoms = vec![out(&src, rand).await];
    for (i, c) in copies.iter().enumerate() {
        assert_eq!(out(c, "hostname").await, c.id);
        assert_eq!(pattern_hash(c).await, h1, "copy {i} lost the source's memory");
        randoms.push(out(c, rand).await);
        out(c, &format!("echo copy{i} > /root/who")).await;
        assert_ne!(out(c, boot_id).await, "", "copy {i}");
    }
    randoms.sort();
    randoms.dedup();
    assert_eq!(randoms.len(), 6, "copies share RNG output");
    for (i, c) in copies.iter().enumerate() {
        assert_eq!(out(c, "cat /root/who").await, format!("copy{i}"));
    }
    assert_ne!(src.exec_collect(sh("cat /root/who")).await.unwrap().exit_code, 0, "the source sees a copy's file");
    assert_eq!(pattern_hash(&src).await, h1);

    // The source goes first; a copy still pauses and resumes over its own link.
    t.node.kill(&src.id).await.unwrap();
    t.node.pause(&copies[0].id).await.unwrap();
    t.node.resume(&copies[0].id).await.unwrap();
    assert_eq!(pattern_hash(&copies[0]).await, h1);
    t.finish().await;
}

/// A clone paused by a node from before memory deltas (one full save, `state`) is taken
/// back after a restart and resumes; from then on its memory is a file of its own.
#[tokio::test(flavor = "multi_thread")]
async fn a_clone_paused_to_a_full_save_still_resumes() {
    let t = common::node().await;
    let sbx = t.node.create(base()).await.unwrap();
    let h1 = start_pattern(&sbx, 16).await;
    out(&sbx, "sync").await;
    let dir = t.dir.path().join("sandboxes").join(&sbx.id);
    // The full save an older node made of a paused clone (from the clone's own VMM, as it
    // did); the guest then idles until the node pauses it, which leaves a delta that is
    // removed below: only the full save stays.
    {
        let live = sbx.live().unwrap();
        live.vm().pause().await.unwrap();
        live.vm().save_all(&dir.join("state")).await.unwrap();
        live.vm().resume().await.unwrap();
    }
    t.node.pause(&sbx.id).await.unwrap();
    let id = sbx.id.clone();
    drop(sbx);
    t.node.shutdown().await;
    for f in ["memory.delta", "devices"] {
        std::fs::remove_file(dir.join(f)).unwrap();
    }

    let node = lizard_node::Node::start(t.node.config().clone()).await.unwrap();
    let back = node.get(&id).expect("the paused sandbox is back");
    node.resume(&id).await.unwrap();
    assert_eq!(pattern_hash(&back).await, h1);
    assert!(dir.join("memory").is_file(), "a full save loads into a memory file of the sandbox's own");
    assert!(!dir.join("state").exists());
    // Its later pauses save device state beside that file.
    node.pause(&id).await.unwrap();
    assert!(dir.join("vmstate").is_file() && !dir.join("memory.delta").exists());
    node.resume(&id).await.unwrap();
    assert_eq!(pattern_hash(&back).await, h1);
    node.kill(&id).await.unwrap();
    node.shutdown().await;
    common::assert_no_leftovers(t.dir.path());
}

/// The snapshot keys on the node's disk.
fn snapshot_keys(t: &common::TestNode) -> Vec<String> {
    let dir = t.dir.path().join("snapshots");
    let mut keys: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| TemplateSnapshot::load(&e.path()).map(|s| s.key()))
        .collect();
    keys.sort();
    keys
}

/// A size-specific snapshot no disk needs is collected; one a paused clone's disk backs
/// onto, or a fork's copy's (through the layer between), stays until they are gone, and
/// so does the latest of the template in the default shape. The sandboxes resume and
/// run as before.
#[tokio::test(flavor = "multi_thread")]
async fn unused_size_specific_snapshots_are_collected_and_needed_ones_kept() {
    let t = common::node_with(|c| c.snapshot_idle = Duration::ZERO).await;
    let sized = |memory_mib| CreateSandboxRequest { memory_mib: Some(memory_mib), ..base() };
    let unused = t.node.create(sized(256)).await.unwrap();
    let unused_key = snapshot_keys(&t);
    t.node.kill(&unused.id).await.unwrap();
    let paused = t.node.create(sized(768)).await.unwrap();
    out(&paused, "echo kept > /root/note").await;
    t.node.pause(&paused.id).await.unwrap();
    let forked = t.node.create(sized(1024)).await.unwrap();
    let copy = t.node.fork(&forked.id, 1).await.unwrap().remove(0);
    t.node.kill(&forked.id).await.unwrap();
    let default = t.node.create(base()).await.unwrap();
    let all = snapshot_keys(&t);
    assert_eq!(all.len(), 4, "{all:?}");

    let collected = t.node.collect_snapshots().await;
    assert_eq!(collected, unused_key, "collected the wrong snapshots");
    assert_eq!(snapshot_keys(&t).len(), 3);
    assert!(!t.dir.path().join("snapshots").join(format!("{}.lock", unused_key[0])).exists());
    t.node.resume(&paused.id).await.unwrap();
    assert_eq!(out(&paused, "cat /root/note").await, "kept");
    assert_eq!(out(&copy, "echo copy").await, "copy");
    // A create of the collected size makes its snapshot anew.
    let again = t.node.create(sized(256)).await.unwrap();
    assert!(again.from_snapshot());
    assert_eq!(out(&again, "echo again").await, "again");

    for s in [&paused, &copy, &again] {
        t.node.kill(&s.id).await.unwrap();
    }
    // The default shape's stays, and so does the template's latest (256 MiB, made last).
    assert_eq!(t.node.collect_snapshots().await.len(), 2, "the unneeded snapshots stayed");
    assert_eq!(snapshot_keys(&t).len(), 2);
    let next = t.node.create(base()).await.unwrap();
    assert_eq!(out(&next, "echo next").await, "next");
    drop((default, next));
    t.finish().await;
}
