//! The cluster's part of the store with replicas sharing it: one lease holder at a time,
//! one cluster key, join tokens, and a lost node's sandboxes ended and billed up to its
//! last heartbeat.

use crate::cluster::*;
use crate::harness::{TestDb, TestStore};
use crate::store_tests;
use crate::{NewSandbox, SandboxState, StoreError};
use lizard_api::cluster::{HeldSandbox, NodeCapacity, NodeUsage};

fn report(held: &[&str]) -> NodeReport {
    NodeReport {
        capacity: NodeCapacity { vcpus: 8, memory_mib: 16_384, disk_gib: 100 },
        usage: NodeUsage { vcpus: 1, memory_mib: 512, sandboxes: u32::try_from(held.len()).unwrap() },
        templates: vec!["tpl_a".into()],
        sandboxes: held
            .iter()
            .map(|id| HeldSandbox { sandbox_id: (*id).into(), state: SandboxState::Running })
            .collect(),
    }
}

fn sandbox_on(id: &str, node: &str, at: i64) -> NewSandbox {
    crate::fixture::running_sandbox(id, "prj_a", node, at)
}

/// Both replicas try for the lease at once, round after round: never both hold it; the
/// holder keeps it by renewing; the other takes it over once it lapses, or at once after
/// a release.
async fn one_lease_holder_at_a_time(db: TestDb) {
    let (a, b) = (db.open().await, db.open().await);
    const TTL: i64 = 5_000;
    let mut now = 1_000;
    let mut first_holder = None;
    for _ in 0..40 {
        let (x, y) =
            tokio::join!(a.acquire_lease("metering", "a", now, TTL), b.acquire_lease("metering", "b", now, TTL));
        let (x, y) = (x.unwrap(), y.unwrap());
        assert!(x ^ y, "exactly one holder at {now}: a {x}, b {y}");
        let holder = if x { "a" } else { "b" };
        assert_eq!(*first_holder.get_or_insert(holder), holder, "the holder renews and keeps it");
        now += 1_000;
    }
    let (holder, other, holder_name, other_name) =
        if first_holder == Some("a") { (&a, &b, "a", "b") } else { (&b, &a, "b", "a") };
    // The holder stops renewing (its replica died): the other takes over after the ttl.
    assert!(!other.acquire_lease("metering", other_name, now + TTL - 1_000, TTL).await.unwrap());
    assert!(other.acquire_lease("metering", other_name, now + TTL, TTL).await.unwrap());
    assert!(!holder.acquire_lease("metering", holder_name, now + TTL + 1, TTL).await.unwrap());
    // A release hands over at once; releasing what one does not hold changes nothing.
    holder.release_lease("metering", holder_name).await.unwrap();
    assert!(!holder.acquire_lease("metering", holder_name, now + TTL + 2, TTL).await.unwrap());
    other.release_lease("metering", other_name).await.unwrap();
    assert!(holder.acquire_lease("metering", holder_name, now + TTL + 3, TTL).await.unwrap());
    assert!(holder.acquire_lease("reaper", holder_name, 0, TTL).await.unwrap(), "leases are by name");
}

/// Concurrent first starts each propose a key: all get the same one.
async fn replicas_agree_on_one_cluster_key(db: TestDb) {
    let (a, b) = (db.open().await, db.open().await);
    let (x, y) = tokio::join!(a.cluster_key(&[1; 32]), b.cluster_key(&[2; 32]));
    let (x, y) = (x.unwrap(), y.unwrap());
    assert_eq!(x, y);
    assert!(x == vec![1; 32] || x == vec![2; 32]);
    assert_eq!(a.cluster_key(&[3; 32]).await.unwrap(), x, "kept for good");
}

async fn join_tokens_are_hashed_expire_and_revoke(db: TestDb) {
    let s = db.open().await;
    let token = |id: &str, hash: u8, expires_at| NodeTokenRecord {
        id: id.into(),
        hash: vec![hash; 32],
        created_at: 10,
        expires_at,
        revoked_at: None,
        uses_left: None,
    };
    s.insert_node_token(&token("ntk_1", 1, None)).await.unwrap();
    s.insert_node_token(&token("ntk_2", 2, Some(100))).await.unwrap();
    assert!(matches!(s.insert_node_token(&token("ntk_3", 1, None)).await, Err(StoreError::Conflict(_))));
    assert_eq!(s.node_token_by_hash(&[2; 32]).await.unwrap(), Some(token("ntk_2", 2, Some(100))));
    assert_eq!(s.node_token_by_hash(&[9; 32]).await.unwrap(), None);
    let ids = |v: Vec<NodeTokenRecord>| v.into_iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(ids(s.list_node_tokens(50).await.unwrap()), ["ntk_1", "ntk_2"]);
    assert_eq!(ids(s.list_node_tokens(100).await.unwrap()), ["ntk_1"], "expired at 100");
    s.revoke_node_token("ntk_1", 60).await.unwrap();
    assert!(matches!(s.revoke_node_token("ntk_1", 61).await, Err(StoreError::NotFound(_))));
    assert!(!s.node_token_by_hash(&[1; 32]).await.unwrap().unwrap().is_usable(62));
    assert!(s.list_node_tokens(50).await.unwrap().iter().all(|t| t.id != "ntk_1"));
    assert_eq!(s.use_node_token(&[1; 32], 62).await.unwrap(), None, "revoked");
    assert_eq!(s.use_node_token(&[2; 32], 100).await.unwrap(), None, "expired");
    // A token for two joins: two uses, then none; one before uses (`None`) joins on.
    s.insert_node_token(&NodeTokenRecord { uses_left: Some(2), ..token("ntk_4", 4, None) }).await.unwrap();
    assert_eq!(s.use_node_token(&[4; 32], 70).await.unwrap().unwrap().uses_left, Some(1));
    assert_eq!(s.use_node_token(&[4; 32], 70).await.unwrap().unwrap().uses_left, Some(0));
    assert_eq!(s.use_node_token(&[4; 32], 70).await.unwrap(), None, "used up");
    assert!(ids(s.list_node_tokens(70).await.unwrap()).iter().all(|id| id != "ntk_4"), "a spent token is not listed");
    assert_eq!(s.use_node_token(&[2; 32], 90).await.unwrap().unwrap().uses_left, None);
    assert_eq!(s.use_node_token(&[2; 32], 91).await.unwrap().unwrap().uses_left, None);
}

/// A node stops heartbeating: the expiry (on one replica, while the other ticks) marks
/// it down, ends its running sandboxes at its last heartbeat (paused ones stay), and
/// billing stops exactly there; a
/// heartbeat that lands before the expiry keeps a node up; one after brings it back.
async fn a_lost_node_ends_its_sandboxes_at_its_last_heartbeat(db: TestDb) {
    let a = db.seeded("acc_1", &[("ws_a", "prj_a")]).await;
    let b: TestStore = db.open().await;
    a.grant_signup_credits(1_000_000_000, 0).await.unwrap();
    for (id, at) in [("node_b", 1_000), ("node_c", 1_000)] {
        let n = NewNode {
            id: id.into(),
            region: "eu-1".into(),
            address: format!("http://{id}:7180"),
            report: report(&[]),
            at,
        };
        a.insert_node(&n).await.unwrap();
    }
    a.insert_sandbox(&sandbox_on("sbx_b", "node_b", 1_000)).await.unwrap();
    a.insert_sandbox(&sandbox_on("sbx_c", "node_c", 1_000)).await.unwrap();
    // A paused one on node_b: its saved state is on that node's disk, so it outlives the
    // node's absence (unavailable meanwhile), unlike a running one.
    a.insert_sandbox(&sandbox_on("sbx_p", "node_b", 1_000)).await.unwrap();
    a.set_sandbox_state("sbx_p", SandboxState::Paused).await.unwrap();
    let beat = b.record_heartbeat("node_b", &report(&["sbx_b", "sbx_p"]), 4_000, 60_000).await.unwrap();
    assert_eq!((beat.state, beat.stop), (NodeState::Up, vec![]));
    b.record_heartbeat("node_c", &report(&["sbx_c"]), 9_000, 60_000).await.unwrap();
    // Ticks bill a remote node's sandbox up to its last heartbeat at most.
    a.bill_meters(8_000).await.unwrap();
    // Lease 3 s at 8 000: node_b (heard at 4 000) is lost; node_c is not.
    let (lost, _) =
        tokio::join!(a.expire_nodes(8_000, 3_000, "lost: its node stopped answering"), b.bill_meters(8_000));
    let lost = lost.unwrap();
    assert_eq!(lost.len(), 1);
    assert_eq!((lost[0].node_id.as_str(), lost[0].last_heartbeat), ("node_b", 4_000));
    assert_eq!(lost[0].sandboxes.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["sbx_b"]);
    assert!(a.expire_nodes(8_000, 3_000, "again").await.unwrap().is_empty(), "once");
    let sbx = b.get_sandbox("sbx_b").await.unwrap().unwrap();
    assert_eq!((sbx.ended_at, sbx.end_reason.as_deref()), (Some(4_000), Some("lost: its node stopped answering")));
    assert!(b.get_sandbox("sbx_c").await.unwrap().unwrap().is_live());
    let paused = b.get_sandbox("sbx_p").await.unwrap().unwrap();
    assert!(paused.is_live() && paused.state == SandboxState::Paused, "a paused sandbox is kept: {paused:?}");
    assert_eq!(a.get_node("node_b").await.unwrap().unwrap().state, NodeState::Down);
    a.bill_meters(20_000).await.unwrap();
    let ledger = a.ledger_page("acc_1", None, 1_000, true).await.unwrap();
    let billed = |id: &str| -> i64 {
        ledger.iter().filter(|e| e.sandbox_id.as_deref() == Some(id)).map(|e| e.quantity_ms.unwrap()).sum()
    };
    assert_eq!(billed("sbx_b"), 3_000, "billed up to its node's last heartbeat, not to the expiry");
    assert_eq!(billed("sbx_c"), 8_000, "a live node's sandbox up to its last heartbeat (9 000)");
    assert_eq!(a.balance("acc_1").await.unwrap().balance_nanos, a.ledger_sum("acc_1").await.unwrap());
    // The node comes back: up again, and told to stop what the store ended.
    let back = b.record_heartbeat("node_b", &report(&["sbx_b", "sbx_p"]), 30_000, 60_000).await.unwrap();
    assert_eq!((back.state, back.stop), (NodeState::Up, vec!["sbx_b".to_string()]));
    // A sandbox no record names is stopped only after the grace period.
    let unknown = b.record_heartbeat("node_b", &report(&["sbx_x", "sbx_p"]), 31_000, 60_000).await.unwrap();
    assert!(unknown.stop.is_empty(), "maybe a create in flight");
    let later = b.record_heartbeat("node_b", &report(&["sbx_x", "sbx_p"]), 91_000, 60_000).await.unwrap();
    assert_eq!(later.stop, ["sbx_x"]);
    assert!(later.ended.is_empty() && b.get_sandbox("sbx_p").await.unwrap().unwrap().is_live(), "still paused there");
    // A live record its node no longer reports (the node restarted and lost it) ends
    // once past the grace period.
    assert!(b.record_heartbeat("node_c", &report(&[]), 30_000, 60_000).await.unwrap().ended.is_empty());
    let gone = b.record_heartbeat("node_c", &report(&[]), 100_000, 60_000).await.unwrap();
    assert_eq!(gone.ended, ["sbx_c"]);
    assert!(!a.get_sandbox("sbx_c").await.unwrap().unwrap().is_live());
    // Drain and undrain; a down node stays down, and cannot be undrained.
    assert_eq!(a.set_node_draining("node_c", true).await.unwrap().state, NodeState::Draining);
    assert_eq!(a.set_node_draining("node_c", false).await.unwrap().state, NodeState::Up);
    assert!(matches!(a.set_node_draining("node_x", true).await, Err(StoreError::NotFound(_))));
    a.expire_nodes(200_000, 3_000, "lost").await.unwrap();
    assert_eq!(a.set_node_draining("node_c", true).await.unwrap().state, NodeState::Down, "a drain leaves it down");
    assert!(matches!(a.set_node_draining("node_c", false).await, Err(StoreError::Conflict(_))));
    let nodes = b.list_nodes().await.unwrap();
    assert_eq!(nodes.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(), ["node_b", "node_c"]);
    assert_eq!(nodes[0].report.capacity, report(&[]).capacity);
    assert_eq!(nodes[0].report.templates, ["tpl_a"]);
}

/// Running sandboxes recorded on a node after its last heartbeat are counted for it until
/// its next heartbeat; earlier, paused and ended ones are not.
async fn sandboxes_placed_since_a_heartbeat_are_counted(db: TestDb) {
    let s = db.seeded("acc_1", &[("ws_a", "prj_a")]).await;
    for id in ["node_b", "node_c"] {
        let n = NewNode {
            id: id.into(),
            region: "eu-1".into(),
            address: format!("http://{id}:7180"),
            report: report(&[]),
            at: 1_000,
        };
        s.insert_node(&n).await.unwrap();
    }
    s.record_heartbeat("node_b", &report(&[]), 2_000, 60_000).await.unwrap();
    s.record_heartbeat("node_c", &report(&[]), 2_000, 60_000).await.unwrap();
    s.insert_sandbox(&sandbox_on("sbx_old", "node_b", 1_500)).await.unwrap();
    for (id, node) in [("sbx_1", "node_b"), ("sbx_2", "node_b"), ("sbx_3", "node_c"), ("sbx_p", "node_c")] {
        s.insert_sandbox(&sandbox_on(id, node, 2_500)).await.unwrap();
    }
    s.set_sandbox_state("sbx_p", SandboxState::Paused).await.unwrap();
    s.insert_sandbox(&sandbox_on("sbx_x", "node_c", 2_600)).await.unwrap();
    s.end_sandbox("sbx_x", 2_700, "killed").await.unwrap();
    let counts = s.placed_since_heartbeat().await.unwrap();
    assert_eq!(counts, [("node_b".to_string(), 2), ("node_c".to_string(), 1)].into());
    s.record_heartbeat("node_b", &report(&["sbx_old", "sbx_1", "sbx_2"]), 3_000, 60_000).await.unwrap();
    assert_eq!(s.placed_since_heartbeat().await.unwrap(), [("node_c".to_string(), 1)].into(), "reported now");
}

/// A build that ended on a node is in its templates at once, once however often it is
/// added, until the node's own next report replaces the list.
async fn a_finished_build_is_held_by_its_node_before_the_next_heartbeat(db: TestDb) {
    let s = db.seeded("acc_1", &[("ws_a", "prj_a")]).await;
    let n = NewNode {
        id: "node_b".into(),
        region: "eu-1".into(),
        address: "http://node_b:7180".into(),
        report: report(&[]),
        at: 1_000,
    };
    s.insert_node(&n).await.unwrap();
    s.add_node_template("node_b", "build_1").await.unwrap();
    s.add_node_template("node_b", "build_1").await.unwrap();
    s.add_node_template("node_b", "build's \"2\"").await.unwrap();
    let held = s.get_node("node_b").await.unwrap().unwrap().report.templates;
    assert_eq!(held, ["tpl_a", "build_1", "build's \"2\""]);
    s.add_node_template("node_x", "build_1").await.unwrap();
    assert!(s.get_node("node_x").await.unwrap().is_none(), "an unknown node is not made");
    s.record_heartbeat("node_b", &report(&[]), 2_000, 60_000).await.unwrap();
    let held = s.get_node("node_b").await.unwrap().unwrap().report.templates;
    assert_eq!(held, ["tpl_a"], "the node's own report is the truth");
}

/// A node is removed only with nothing recorded on it; then it is gone for every call.
async fn a_node_is_removed_only_once_nothing_lives_on_it(db: TestDb) {
    let s = db.seeded("acc_1", &[("ws_a", "prj_a")]).await;
    let n = NewNode {
        id: "node_r".into(),
        region: "eu-1".into(),
        address: "http://r:7180".into(),
        report: report(&[]),
        at: 1,
    };
    s.insert_node(&n).await.unwrap();
    s.insert_sandbox(&sandbox_on("sbx_r", "node_r", 1)).await.unwrap();
    let e = s.remove_node("node_r").await.unwrap_err();
    assert!(matches!(&e, StoreError::Conflict(m) if m.contains("1 sandbox(es)")), "{e:?}");
    assert!(s.end_sandbox("sbx_r", 5, "killed").await.unwrap());
    s.remove_node("node_r").await.unwrap();
    assert_eq!(s.get_node("node_r").await.unwrap(), None);
    assert!(matches!(s.remove_node("node_r").await, Err(StoreError::NotFound(_))));
    assert!(matches!(s.record_heartbeat("node_r", &report(&[]), 6, 60_000).await, Err(StoreError::NotFound(_))));
}

store_tests!(
    a_node_is_removed_only_once_nothing_lives_on_it,
    a_finished_build_is_held_by_its_node_before_the_next_heartbeat,
    sandboxes_placed_since_a_heartbeat_are_counted,
    one_lease_holder_at_a_time,
    replicas_agree_on_one_cluster_key,
    join_tokens_are_hashed_expire_and_revoke,
    a_lost_node_ends_its_sandboxes_at_its_last_heartbeat
);
