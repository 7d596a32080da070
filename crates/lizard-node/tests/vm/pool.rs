//! Machines made ahead of demand: pre-spawned VMMs and warm pools. A claimed machine is
//! a sandbox like any other — its own name, boot id, RNG, clock, disk and network policy
//! — pool machines are never listed, shelves refill after a burst, and nothing of them is
//! left after shutdown.

// Helpers of these tests unwrap as the tests do (clippy.toml's allow-unwrap-in-tests
// covers only the #[test] functions themselves).
#![allow(clippy::unwrap_used)]

use crate::common;

use common::sh;
use lizard_api::CreateSandboxRequest;
use lizard_node::{Node, Sandbox};
use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime};

fn base() -> CreateSandboxRequest {
    CreateSandboxRequest { template: "base".into(), ..Default::default() }
}

async fn out(sbx: &Sandbox, cmd: &str) -> String {
    let r = sbx.exec_collect(sh(cmd)).await.unwrap();
    assert_eq!(r.exit_code, 0, "{cmd}: {r:?}");
    r.stdout.trim().to_string()
}

/// Wait (at most `limit`) until `base` has `n` machines ready.
async fn wait_ready(node: &Node, n: usize, limit: Duration) {
    let start = Instant::now();
    while node.pool_ready("base") < n {
        assert!(start.elapsed() < limit, "the pool has {} of {n} machines after {limit:?}", node.pool_ready("base"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every claimed sandbox is its own machine, and the shelf is full again afterwards.
async fn claims_are_distinct(node: &Node, sandboxes: &[std::sync::Arc<Sandbox>]) {
    let mut seen = HashSet::new();
    for s in sandboxes {
        assert!(s.from_snapshot());
        assert_eq!(out(s, "hostname").await, s.id);
        let guest: i64 = out(s, "date +%s").await.parse().unwrap();
        let host = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() as i64;
        assert!((guest - host).abs() <= 5, "guest clock {guest}, host {host}");
        for probe in ["cat /proc/sys/kernel/random/boot_id", "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'"] {
            let v = out(s, probe).await;
            assert!(!v.is_empty());
            assert!(seen.insert(v.clone()), "two claimed machines share {probe}: {v}");
        }
    }
    // Disks are their own.
    out(&sandboxes[0], "echo mine > /root/f && sync").await;
    for s in &sandboxes[1..] {
        assert_ne!(s.exec_collect(sh("cat /root/f")).await.unwrap().exit_code, 0, "a claim sees another's file");
    }
    let listed: HashSet<String> = node.list().into_iter().map(|i| i.sandbox_id).collect();
    let ours: HashSet<String> = sandboxes.iter().map(|s| s.id.clone()).collect();
    assert!(ours.is_subset(&listed));
    assert_eq!(listed.len(), node.list().len());
}

#[tokio::test(flavor = "multi_thread")]
async fn warm_pool_claims_are_unique_and_the_pool_refills_after_a_burst() {
    let t = common::node_with(|c| {
        c.warm_pool.insert("base".into(), 3);
    })
    .await;
    wait_ready(&t.node, 3, Duration::from_secs(180)).await;
    assert!(t.node.list().is_empty(), "pool machines are listed as sandboxes");
    // A VMM per machine, each under the node's directory.
    assert_eq!(common::vmm_processes(t.dir.path()).len(), 3);

    // A burst bigger than the pool: three claims, two ordinary restores; all succeed.
    let started = Instant::now();
    let burst: Vec<_> = (0..5).map(|_| t.node.create(base())).collect();
    let sandboxes: Vec<_> = futures_util::future::join_all(burst).await.into_iter().map(Result::unwrap).collect();
    eprintln!("burst of 5 over a warm pool of 3: {:?}", started.elapsed());
    claims_are_distinct(&t.node, &sandboxes).await;

    // Refilled once the burst is over.
    wait_ready(&t.node, 3, Duration::from_secs(120)).await;
    assert_eq!(common::vmm_processes(t.dir.path()).len(), 3 + sandboxes.len());
    t.finish().await;
}

/// Pool machines count toward what the node promises: a shelf fills only as far as the
/// node's CPUs allow, a create that does not fit makes one give way (a sandbox never
/// does), a create of the pool's shape claims one without counting it twice, and with
/// nothing left to give way the next create is refused.
#[tokio::test(flavor = "multi_thread")]
async fn pool_machines_count_toward_admission_and_give_way_to_creates() {
    // Two vCPUs in all, and a warm pool that would hold three 1-vCPU machines.
    let cpus = std::thread::available_parallelism().unwrap().get();
    let t = common::node_with(|c| {
        c.warm_pool.insert("base".into(), 3);
        c.confine.cpu_overcommit = 2.0 / cpus as f64;
    })
    .await;
    wait_ready(&t.node, 2, Duration::from_secs(180)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(t.node.pool_ready("base"), 2, "a pool machine beyond the node's CPUs");
    assert_eq!(common::vmm_processes(t.dir.path()).len(), 2);
    // Placement sees no sandbox yet: pool machines give way to any create.
    assert_eq!(t.node.load().1, (0, 0));

    // Another shape cannot claim a machine of the pool: one gives way.
    let other_shape = CreateSandboxRequest { memory_mib: Some(1024), ..base() };
    let a = t.node.create(other_shape.clone()).await.unwrap();
    assert_eq!(out(&a, "echo hi").await, "hi");
    assert_eq!(t.node.pool_ready("base"), 1);
    // The pool's shape claims the last one (it is not counted twice).
    let pool_vmm = common::vmm_processes(t.dir.path()).into_iter().find(|p| *p != pid_of(&a)).unwrap();
    let b = t.node.create(base()).await.unwrap();
    assert_eq!(pid_of(&b), pool_vmm, "the create restored beside the pool instead of claiming it");
    assert_eq!(t.node.pool_ready("base"), 0);
    // Nothing left to give way: refused, and the shelf is not refilled past the node.
    let refused = t.node.create(other_shape).await.unwrap_err();
    assert!(refused.to_string().contains("promised"), "{refused}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(common::vmm_processes(t.dir.path()).len(), 2);
    assert_eq!(t.node.list().len(), 2);
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn prespawned_vmms_serve_the_next_creates() {
    let t = common::node_with(|c| c.prespawn = 2).await;
    let first = t.node.create(base()).await.unwrap();
    // The first create of the template registers its shelf; two VMMs wait from then on.
    wait_ready(&t.node, 2, Duration::from_secs(60)).await;
    let waiting: HashSet<u32> =
        common::vmm_processes(t.dir.path()).into_iter().filter(|p| *p != pid_of(&first)).collect();
    assert_eq!(waiting.len(), 2);
    for pid in &waiting {
        let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
        let pss = rollup.lines().find(|l| l.starts_with("Pss:")).unwrap_or_default().to_string();
        eprintln!("a waiting VMM: {pss}");
    }

    let second = t.node.create(base()).await.unwrap();
    assert!(waiting.contains(&pid_of(&second)), "the create did not take a waiting VMM");
    assert_eq!(out(&second, "echo hi").await, "hi");
    claims_are_distinct(&t.node, &[first.clone(), second.clone()]).await;

    // A kill of a claimed sandbox cleans up like any other.
    t.node.kill(&second.id).await.unwrap();
    assert!(!t.dir.path().join("sandboxes").join(&second.id).exists());
    t.finish().await;
}

/// A pool machine whose VMM died while it waited fails its claim; the create goes the
/// ordinary way and nothing of the dead machine is left.
#[tokio::test(flavor = "multi_thread")]
async fn a_dead_pool_machine_falls_back_to_an_ordinary_restore() {
    let t = common::node_with(|c| c.prespawn = 1).await;
    let first = t.node.create(base()).await.unwrap();
    wait_ready(&t.node, 1, Duration::from_secs(60)).await;
    let waiting: Vec<u32> = common::vmm_processes(t.dir.path()).into_iter().filter(|p| *p != pid_of(&first)).collect();
    assert_eq!(waiting.len(), 1);
    let dead_dir = std::fs::read_dir(t.dir.path().join("sandboxes"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|d| !d.ends_with(&first.id))
        .expect("the pool machine's directory");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(waiting[0]).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();

    let second = t.node.create(base()).await.unwrap();
    assert_ne!(pid_of(&second), waiting[0]);
    assert_eq!(out(&second, "echo hi").await, "hi");
    assert!(!dead_dir.exists(), "the dead pool machine's directory is left: {}", dead_dir.display());
    t.node.kill(&second.id).await.unwrap();
    t.node.kill(&first.id).await.unwrap();
    t.finish().await;
}

/// A claimed machine's network gets the create's policy (pool machines wait with a
/// closed one).
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_gets_the_creates_network_policy() {
    let t = common::node_with(|c| c.prespawn = 1).await;
    if t.node.config().network.is_none() {
        panic!("the VM tests run as root: networking is on");
    }
    let _warm_up = t.node.create(base()).await.unwrap();
    wait_ready(&t.node, 1, Duration::from_secs(60)).await;
    let req = CreateSandboxRequest {
        allow_internet_access: Some(false),
        allow_out: vec!["192.0.2.0/24".into(), "registry.example".into()],
        deny_out: vec!["192.0.2.9".into()],
        ..base()
    };
    let sbx = t.node.create(req).await.unwrap();
    assert_eq!(t.node.pool_ready("base"), 0, "the create did not claim the pool's machine");
    let (netns, _) = sbx.network().unwrap();
    let rules = std::process::Command::new("ip")
        .args(["netns", "exec", &netns, "nft", "list", "table", "inet", "lizard"])
        .output()
        .unwrap();
    let rules = String::from_utf8_lossy(&rules.stdout);
    // The closed table gained the create's policy: its lists (deny before allow), the
    // redirect of web traffic to the egress proxy for the named domain, no internet.
    let at = |s: &str| rules.find(s).unwrap_or_else(|| panic!("{s:?} is not in the claimed network's rules:\n{rules}"));
    assert!(rules.contains("192.0.2.0/24") && rules.contains("192.0.2.9"), "{rules}");
    assert!(at("@platform_deny drop") < at("@user_deny drop") && at("@user_deny drop") < at("@user_allow accept"));
    at("dnat ip to 10.0.2.1:15443");
    assert!(!rules.contains("\t\taccept\n\t}"), "internet is off, yet the forward chain ends in accept:\n{rules}");
    assert_eq!(rules.matches("table inet lizard").count(), 1, "{rules}");
    t.finish().await;
}

fn pid_of(s: &Sandbox) -> u32 {
    s.live().unwrap().vm().pid()
}
