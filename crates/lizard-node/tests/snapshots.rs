//! Sandboxes restored from a template snapshot: each one its own machine (RNG, boot id,
//! hostname, clock, disk, secret), and much faster to start than a cold boot.

// Helpers of these tests unwrap as the tests do (clippy.toml's allow-unwrap-in-tests
// covers only the #[test] functions themselves).
#![allow(clippy::unwrap_used)]

mod common;

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
