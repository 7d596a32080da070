//! Many machines end to end below HTTP, over fake remote nodes (a test connector hands
//! out in-process fakes by address): join, heartbeat, placement across nodes, routing by
//! the record, events, drains, a lost node, and who may manage nodes.

use super::{credentials, expiry, membership, operator};
use crate::auth::Principal;
use crate::nodes::{ClusterKey, NodeClient, NodeConnector, Nodes};
use crate::ops::sandboxes::{self, NewSandboxSpec};
use crate::ops::tests::FakeNode;
use crate::placement;
use crate::state::{AppState, ServerState};
use crate::store::fixture::seeded_store;
use crate::store::{OnTimeout, Store};
use crate::{Scope, ServerConfig};
use lizard_api::cluster::{JoinRequest, NodeCapacity, NodeReport, NodeState, NodeUsage, SandboxEnded};
use lizard_api::ErrorCode;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Hands out the fake node at each address, and keeps the credentials it was given.
struct TestConnector {
    nodes: HashMap<String, Arc<FakeNode>>,
    credentials: Mutex<Vec<(String, String)>>,
}

impl NodeConnector for TestConnector {
    fn connect(&self, node_id: &str, address: &str, credential: String) -> Arc<dyn NodeClient> {
        self.credentials.lock().unwrap().push((node_id.to_owned(), credential));
        self.nodes[address].clone()
    }
}

struct Cluster {
    state: AppState,
    key: ClusterKey,
    a: Arc<FakeNode>,
    b: Arc<FakeNode>,
    connector: Arc<TestConnector>,
}

async fn cluster() -> Cluster {
    let store: Arc<dyn Store> = Arc::new(seeded_store("acc", &[("ws", "prj")]).await);
    let (a, b) = (Arc::new(FakeNode::default()), Arc::new(FakeNode::default()));
    let connector = Arc::new(TestConnector {
        nodes: HashMap::from([("http://a:7180".to_string(), a.clone()), ("http://b:7180".to_string(), b.clone())]),
        credentials: Mutex::default(),
    });
    let key = credentials::load_key(store.as_ref()).await.unwrap();
    let nodes = Nodes::none().with_remote(key.clone(), Some(connector.clone() as Arc<dyn NodeConnector>));
    let state = AppState::new(ServerState::new(store, ServerConfig::new("/nonexistent")), nodes);
    Cluster { state, key, a, b, connector }
}

fn report(used_memory_mib: u64) -> NodeReport {
    NodeReport {
        capacity: NodeCapacity { vcpus: 16, memory_mib: 8192, disk_gib: 100 },
        usage: NodeUsage { vcpus: 0, memory_mib: used_memory_mib, sandboxes: 0 },
        templates: vec!["base".into()],
        sandboxes: vec![],
    }
}

async fn join(c: &Cluster, token: &str, address: &str, used_memory_mib: u64) -> String {
    let req = JoinRequest { region: "local".into(), address: address.into(), report: report(used_memory_mib) };
    let joined = membership::join(&c.state, Some(token), req).await.unwrap();
    assert_eq!((joined.heartbeat_ms, joined.lease_ms), (2_000, 10_000));
    assert_eq!(joined.credential, c.key.credential(&joined.node_id));
    joined.node_id
}

async fn spec(state: &AppState) -> NewSandboxSpec {
    let project = state.server.store.get_project("acc", "prj").await.unwrap().unwrap();
    NewSandboxSpec {
        account_id: "acc".into(),
        project,
        template: "base".into(),
        template_ref: None,
        vcpus: None,
        memory_mib: None,
        env: Default::default(),
        metadata: Default::default(),
        allow_internet_access: None,
        allow_out: vec![],
        deny_out: vec![],
        volume: None,
        timeout_ms: 60_000,
        timeout_at: crate::ids::now_ms() + 60_000,
        on_timeout: OnTimeout::Kill,
        access_hash: None,
    }
}

#[tokio::test]
async fn nodes_join_take_sandboxes_by_load_answer_by_record_and_are_lost_when_silent() {
    let c = cluster().await;
    let state = &c.state;
    let (record, plain) = credentials::mint(crate::ids::now_ms(), None);
    state.server.store.insert_node_token(&record).await.unwrap();
    let req = JoinRequest { region: "local".into(), address: "http://a:7180".into(), report: report(0) };
    let e = membership::join(state, None, req.clone()).await.unwrap_err();
    assert_eq!(e.0.code, ErrorCode::Unauthenticated);
    let e = membership::join(state, Some("lzn_wrong"), req.clone()).await.unwrap_err();
    assert_eq!(e.0.code, ErrorCode::Unauthenticated);
    let bad = JoinRequest { address: "a:7180".into(), ..req };
    assert_eq!(membership::join(state, Some(&plain), bad).await.unwrap_err().0.code, ErrorCode::InvalidArgument);
    // B is busier than A.
    let a = join(&c, &plain, "http://a:7180", 0).await;
    let b = join(&c, &plain, "http://b:7180/", 4096).await;

    // Heartbeats: only with that node's credential.
    let a_cred = c.key.credential(&a);
    let e = membership::heartbeat(state, &b, Some(&a_cred), report(4096)).await.unwrap_err();
    assert_eq!(e.0.code, ErrorCode::Unauthenticated, "one node's credential is not another's");
    assert_eq!(membership::heartbeat(state, &a, None, report(0)).await.unwrap_err().0.code, ErrorCode::Unauthenticated);
    let hb = membership::heartbeat(state, &a, Some(&a_cred), report(0)).await.unwrap();
    assert_eq!((hb.state, hb.stop.len()), (NodeState::Up, 0));

    // The least loaded node takes the create; the record names it; ops reach it there.
    let first = sandboxes::create(state, spec(state).await).await.unwrap();
    assert_eq!(first.record.node_id, a);
    assert!(c.a.calls().iter().any(|call| call.starts_with("create")));
    let again = sandboxes::live(state, first.record.clone()).await.unwrap();
    assert_eq!(again.info.sandbox_id, first.record.id);
    assert!(c.connector.credentials.lock().unwrap().iter().all(|(id, cred)| *cred == c.key.credential(id)));
    // A answers 503 (its own admission): the next node takes it.
    *c.a.full.lock().unwrap() = true;
    let second = sandboxes::create(state, spec(state).await).await.unwrap();
    assert_eq!(second.record.node_id, b);
    assert_eq!(c.b.calls(), [format!("create {}", second.record.id)]);
    *c.a.full.lock().unwrap() = false;

    // Events: a node ends only its own sandboxes.
    let ended = |id: &str| vec![SandboxEnded { sandbox_id: id.into(), reason: "its VM stopped unexpectedly".into() }];
    let b_cred = c.key.credential(&b);
    membership::events(state, &b, Some(&b_cred), ended(&first.record.id)).await.unwrap();
    assert!(state.server.store.get_sandbox(&first.record.id).await.unwrap().unwrap().is_live());
    membership::events(state, &a, Some(&a_cred), ended(&first.record.id)).await.unwrap();
    let gone = state.server.store.get_sandbox(&first.record.id).await.unwrap().unwrap();
    assert_eq!(gone.end_reason.as_deref(), Some("its VM stopped unexpectedly"));
    // A heartbeat that still reports it is told to stop it.
    let mut held = report(0);
    held.sandboxes.push(lizard_api::cluster::HeldSandbox {
        sandbox_id: first.record.id.clone(),
        state: lizard_api::SandboxState::Running,
    });
    let hb = membership::heartbeat(state, &a, Some(&a_cred), held).await.unwrap();
    assert_eq!(hb.stop, vec![first.record.id.clone()]);

    // Drained nodes take nothing: a clear 503 at once.
    operator::set_draining(state, &a, true).await.unwrap();
    operator::set_draining(state, &b, true).await.unwrap();
    let e = sandboxes::create(state, spec(state).await).await.err().unwrap();
    assert_eq!(e.0.code, ErrorCode::Unavailable);
    assert_eq!(e.0.message, "no node has room for 1 vCPUs and 512 MiB in region local");
    operator::set_draining(state, &a, false).await.unwrap();

    // B falls silent: down, its sandbox lost, its ops 503 — a lookup ends nothing more.
    let later = crate::ids::now_ms() + 60_000;
    membership::heartbeat(state, &a, Some(&a_cred), report(0)).await.unwrap();
    let lost = expiry::expire_once(state.server.store.as_ref(), later, 10_000).await.unwrap();
    let lost_ids: Vec<&str> = lost.iter().map(|l| l.node_id.as_str()).collect();
    assert!(lost_ids.contains(&b.as_str()));
    let e = placement::node(state, &b).await.err().unwrap();
    assert_eq!(e.0.code, ErrorCode::Unavailable);
    assert!(e.0.message.contains("is down"), "{}", e.0.message);
    let record = state.server.store.get_sandbox(&second.record.id).await.unwrap().unwrap();
    assert_eq!(record.end_reason.as_deref(), Some(expiry::LOST_REASON));
    let e = sandboxes::live(state, record).await.err().unwrap();
    assert_eq!(e.0.code, ErrorCode::NotFound);
    assert!(e.0.message.contains(expiry::LOST_REASON));
    // It comes back: up, and told to stop what was lost.
    let mut held = report(0);
    held.sandboxes.push(lizard_api::cluster::HeldSandbox {
        sandbox_id: second.record.id.clone(),
        state: lizard_api::SandboxState::Running,
    });
    let hb = membership::heartbeat(state, &b, Some(&b_cred), held).await.unwrap();
    assert_eq!((hb.state, hb.stop), (NodeState::Up, vec![second.record.id.clone()]));
}

#[tokio::test]
async fn only_an_unscoped_key_of_the_owner_manages_nodes() {
    let c = cluster().await;
    let principal = |account: &str, scope: Option<Scope>| Principal {
        account_id: account.into(),
        key_id: "key".into(),
        key_name: "k".into(),
        scope,
    };
    operator::require_operator(&c.state, &principal("acc", None)).await.unwrap();
    let scoped = principal("acc", Some(Scope::new(vec!["ws".to_string()], Vec::<String>::new())));
    assert_eq!(operator::require_operator(&c.state, &scoped).await.unwrap_err().0.code, ErrorCode::Forbidden);
    let other = principal("acc_other", None);
    assert_eq!(operator::require_operator(&c.state, &other).await.unwrap_err().0.code, ErrorCode::Forbidden);

    let token = operator::create_token(&c.state, lizard_api::cluster::CreateNodeTokenRequest { ttl_secs: Some(60) })
        .await
        .unwrap();
    assert!(token.token.as_deref().is_some_and(|t| t.starts_with("lzn_")) && token.expires_at.is_some());
    let listed = operator::list_tokens(&c.state).await.unwrap();
    assert_eq!((listed.len(), listed[0].token.as_deref()), (1, None), "the plaintext is shown once");
    let bad = lizard_api::cluster::CreateNodeTokenRequest { ttl_secs: Some(0) };
    assert_eq!(operator::create_token(&c.state, bad).await.unwrap_err().0.code, ErrorCode::InvalidArgument);
    operator::revoke_token(&c.state, &token.id).await.unwrap();
    assert_eq!(operator::revoke_token(&c.state, &token.id).await.unwrap_err().0.code, ErrorCode::NotFound);
    assert!(operator::list_tokens(&c.state).await.unwrap().is_empty());
    assert_eq!(operator::get(&c.state, "node_nope").await.unwrap_err().0.code, ErrorCode::NotFound);
    // A server without an in-process node lists none.
    assert!(operator::list(&c.state).await.unwrap().is_empty());
}
