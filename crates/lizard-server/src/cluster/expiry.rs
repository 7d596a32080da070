//! Nodes that stop answering: once a second (on the replica holding the lease), every
//! remote node whose last heartbeat is older than its lease is marked `down`; its live
//! sandboxes are recorded lost at that heartbeat (their meters close there) and its
//! volumes answer 503 until it is back. Nothing is deleted: a node that comes back
//! heartbeats, is `up` again, and is told to stop what the store ended.

use lizard_store::{LostNode, Store, StoreError};

/// The end reason of a sandbox whose node was lost.
pub const LOST_REASON: &str = "lost: its node stopped answering";

/// One pass at `now` with a lease of `lease_ms`.
pub async fn expire_once(store: &dyn Store, now: i64, lease_ms: u64) -> Result<Vec<LostNode>, StoreError> {
    let lease = i64::try_from(lease_ms).unwrap_or(i64::MAX);
    let lost = store.expire_nodes(now, lease, LOST_REASON).await?;
    for node in &lost {
        tracing::warn!(
            node = %node.node_id,
            sandboxes = node.sandboxes.len(),
            last_heartbeat = %lizard_api::ids::rfc3339(node.last_heartbeat),
            "a node stopped answering: marked down, its sandboxes recorded lost"
        );
    }
    Ok(lost)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lizard_api::cluster::{HeldSandbox, NodeReport, NodeState};
    use lizard_store::fixture::seeded_store;
    use lizard_store::sql::SqlStore;
    use lizard_store::{BillingStore, ClusterStore, NewNode, NewSandbox, SandboxState, Store};

    mod fixture {
        use super::*;

        pub async fn store_with_project() -> SqlStore {
            seeded_store("acc_1", &[("ws_a", "prj_a")]).await
        }

        /// A running sandbox recorded at `at` on the in-process node.
        pub fn sandbox(id: &str, at: i64) -> NewSandbox {
            lizard_store::fixture::running_sandbox(id, "prj_a", lizard_node_client::LOCAL_NODE_ID, at)
        }

        /// Milliseconds of `sandbox` the ledger has billed.
        pub async fn usage_ms(store: &SqlStore, sandbox: &str) -> i64 {
            let all = store.ledger_page("acc_1", None, 1000, true).await.unwrap();
            all.iter().filter(|e| e.sandbox_id.as_deref() == Some(sandbox)).filter_map(|e| e.quantity_ms).sum()
        }
    }

    fn report(held: &[&str]) -> NodeReport {
        NodeReport {
            sandboxes: held
                .iter()
                .map(|id| HeldSandbox { sandbox_id: id.to_string(), state: SandboxState::Running })
                .collect(),
            ..NodeReport::default()
        }
    }

    async fn join(store: &dyn Store, id: &str, at: i64) {
        let node =
            NewNode { id: id.into(), region: "eu".into(), address: format!("http://{id}"), report: report(&[]), at };
        store.insert_node(&node).await.unwrap();
    }

    #[tokio::test]
    async fn a_silent_node_goes_down_its_sandboxes_are_lost_at_its_last_heartbeat_and_it_comes_back() {
        let store = fixture::store_with_project().await;
        join(&store, "node_a", 0).await;
        join(&store, "node_b", 0).await;
        let mut on_a = fixture::sandbox("sbx_a", 1_000);
        on_a.node_id = "node_a".into();
        store.insert_sandbox(&on_a).await.unwrap();
        let mut on_b = fixture::sandbox("sbx_b", 1_000);
        on_b.node_id = "node_b".into();
        store.insert_sandbox(&on_b).await.unwrap();
        // A heard from at 5 s, B at 12 s; billing runs at 14 s.
        store.record_heartbeat("node_a", &report(&["sbx_a"]), 5_000, 60_000).await.unwrap();
        store.record_heartbeat("node_b", &report(&["sbx_b"]), 12_000, 60_000).await.unwrap();
        store.bill_meters(14_000).await.unwrap();

        assert!(expire_once(&store, 14_000, 10_000).await.unwrap().is_empty(), "within the lease");
        let lost = expire_once(&store, 15_001, 10_000).await.unwrap();
        assert_eq!(lost.len(), 1);
        assert_eq!((lost[0].node_id.as_str(), lost[0].last_heartbeat), ("node_a", 5_000));
        assert_eq!(lost[0].sandboxes.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["sbx_a"]);
        let a = store.get_sandbox("sbx_a").await.unwrap().unwrap();
        assert_eq!((a.ended_at, a.end_reason.as_deref()), (Some(5_000), Some(LOST_REASON)));
        assert!(store.get_sandbox("sbx_b").await.unwrap().unwrap().is_live(), "the other node's are untouched");
        assert_eq!(store.get_node("node_a").await.unwrap().unwrap().state, NodeState::Down);
        // Billed 1 s → 5 s (its last heartbeat), not to the 14 s tick.
        let billed: i64 = fixture::usage_ms(&store, "sbx_a").await;
        assert_eq!(billed, 4_000);
        assert_eq!(fixture::usage_ms(&store, "sbx_b").await, 11_000, "billed to its node's last heartbeat");
        assert!(expire_once(&store, 16_000, 10_000).await.unwrap().is_empty(), "down once");

        // It comes back: up again, told to stop what was recorded lost.
        let back = store.record_heartbeat("node_a", &report(&["sbx_a"]), 20_000, 60_000).await.unwrap();
        assert_eq!((back.state, back.stop), (NodeState::Up, vec!["sbx_a".to_string()]));
    }

    #[tokio::test]
    async fn heartbeats_stop_orphans_only_after_the_grace_period_and_drains_hold() {
        let store = fixture::store_with_project().await;
        join(&store, "node_a", 0).await;
        let mut live = fixture::sandbox("sbx_live", 0);
        live.node_id = "node_a".into();
        store.insert_sandbox(&live).await.unwrap();
        let held = report(&["sbx_live", "sbx_unknown"]);
        let first = store.record_heartbeat("node_a", &held, 1_000, 60_000).await.unwrap();
        assert!(first.stop.is_empty(), "an unrecorded sandbox may be a create in flight");
        assert!(store.record_heartbeat("node_a", &held, 60_999, 60_000).await.unwrap().stop.is_empty());
        let late = store.record_heartbeat("node_a", &held, 61_000, 60_000).await.unwrap();
        assert_eq!(late.stop, ["sbx_unknown"]);
        // Not reported any more: forgotten, a later sighting starts over.
        store.record_heartbeat("node_a", &report(&["sbx_live"]), 62_000, 60_000).await.unwrap();
        assert!(store.record_heartbeat("node_a", &held, 63_000, 60_000).await.unwrap().stop.is_empty());

        assert_eq!(store.set_node_draining("node_a", true).await.unwrap().state, NodeState::Draining);
        let hb = store.record_heartbeat("node_a", &held, 64_000, 60_000).await.unwrap();
        assert_eq!(hb.state, NodeState::Draining, "a heartbeat keeps a drain");
        assert_eq!(store.set_node_draining("node_a", false).await.unwrap().state, NodeState::Up);
        let lost = expire_once(&store, 100_000, 10_000).await.unwrap();
        assert_eq!(lost[0].sandboxes.len(), 1);
        assert_eq!(store.set_node_draining("node_a", true).await.unwrap().state, NodeState::Down, "stays down");
        assert!(matches!(store.set_node_draining("node_a", false).await, Err(StoreError::Conflict(_))));
        assert!(matches!(store.record_heartbeat("node_x", &held, 1, 1).await, Err(StoreError::NotFound(_))));
    }

    #[tokio::test]
    async fn a_node_that_no_longer_reports_a_sandbox_past_the_grace_period_has_lost_it() {
        let store = fixture::store_with_project().await;
        join(&store, "node_a", 0).await;
        for (id, at) in [("sbx_old", 1_000), ("sbx_new", 59_000), ("sbx_held", 1_000)] {
            let mut s = fixture::sandbox(id, at);
            s.node_id = "node_a".into();
            store.insert_sandbox(&s).await.unwrap();
        }
        // A partial report (fewer listed than its own count) ends nothing.
        let mut partial = report(&["sbx_held"]);
        partial.usage.sandboxes = 3;
        assert!(store.record_heartbeat("node_a", &partial, 70_000, 60_000).await.unwrap().ended.is_empty());
        // Too young to judge: a create whose report raced its record.
        let hb = store.record_heartbeat("node_a", &report(&["sbx_held"]), 70_000, 60_000).await.unwrap();
        assert_eq!(hb.ended, ["sbx_old"]);
        let old = store.get_sandbox("sbx_old").await.unwrap().unwrap();
        assert_eq!((old.ended_at, old.end_reason.as_deref()), (Some(70_000), Some(lizard_store::GONE_REASON)));
        assert!(store.get_sandbox("sbx_new").await.unwrap().unwrap().is_live());
        assert!(store.get_sandbox("sbx_held").await.unwrap().unwrap().is_live());
    }
}
