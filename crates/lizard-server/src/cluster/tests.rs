//! Many machines end to end below HTTP, over fake remote nodes (a test connector hands
//! out in-process fakes by address): join, heartbeat, placement across nodes, routing by
//! the record, events, drains, a lost node, and who may manage nodes.

use super::{credentials, expiry, membership, operator};
use crate::auth::Principal;
use crate::ops::sandboxes::{self, NewSandboxSpec};
use crate::ops::tests::FakeNode;
use crate::placement;
use crate::state::{AppState, ServerState};
use crate::{Scope, ServerConfig};
use lizard_api::cluster::{JoinRequest, NodeCapacity, NodeReport, NodeState, NodeUsage, SandboxEnded};
use lizard_api::ErrorCode;
use lizard_node_client::{ClusterKey, NodeClient, NodeConnector, Nodes};
use lizard_store::fixture::seeded_store;
use lizard_store::{MeterState, OnTimeout, Store};
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
        timeout_at: lizard_api::ids::now_ms() + 60_000,
        on_timeout: OnTimeout::Kill,
        access: None,
        snapshot: None,
    }
}

#[tokio::test]
async fn nodes_join_take_sandboxes_by_load_answer_by_record_and_are_lost_when_silent() {
    let c = cluster().await;
    let state = &c.state;
    let (record, plain) = credentials::mint(lizard_api::ids::now_ms(), None, 2);
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
    // Its two joins are spent (the refused one above spent none): a third is refused.
    let third = JoinRequest { region: "local".into(), address: "http://c:7180".into(), report: report(0) };
    let e = membership::join(state, Some(&plain), third).await.unwrap_err();
    assert_eq!(e.0.code, ErrorCode::Unauthenticated);
    assert!(e.0.message.contains("used up"), "{}", e.0.message);

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

    // Halts: a node moves only its own sandboxes' meters (paused while halted).
    let halt = |id: &str, halted| vec![lizard_api::cluster::SandboxHalt { sandbox_id: id.into(), halted }];
    let b_cred = c.key.credential(&b);
    let meter_of = |id: String| async move {
        let meters = state.server.store.open_meters(None).await.unwrap();
        meters.into_iter().find(|m| m.sandbox_id == id).map(|m| m.state)
    };
    let e = membership::halts(state, &a, Some(&b_cred), halt(&first.record.id, true)).await.unwrap_err();
    assert_eq!(e.0.code, ErrorCode::Unauthenticated);
    membership::halts(state, &b, Some(&b_cred), halt(&first.record.id, true)).await.unwrap();
    assert_eq!(meter_of(first.record.id.clone()).await, Some(MeterState::Running), "B halted A's sandbox");
    membership::halts(state, &a, Some(&a_cred), halt(&first.record.id, true)).await.unwrap();
    assert_eq!(meter_of(first.record.id.clone()).await, Some(MeterState::Paused));
    membership::halts(state, &a, Some(&a_cred), halt(&first.record.id, false)).await.unwrap();
    assert_eq!(meter_of(first.record.id.clone()).await, Some(MeterState::Running));

    // Events: a node ends only its own sandboxes.
    let ended = |id: &str| vec![SandboxEnded { sandbox_id: id.into(), reason: "its VM stopped unexpectedly".into() }];
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
    let later = lizard_api::ids::now_ms() + 60_000;
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

    let token = operator::create_token(&c.state, Default::default()).await.unwrap();
    assert!(token.token.as_deref().is_some_and(|t| t.starts_with("lzn_")));
    assert!(token.expires_at.is_some() && token.uses_left == Some(1), "an hour and one join by default: {token:?}");
    let listed = operator::list_tokens(&c.state).await.unwrap();
    assert_eq!((listed.len(), listed[0].token.as_deref()), (1, None), "the plaintext is shown once");
    for bad in [
        lizard_api::cluster::CreateNodeTokenRequest { ttl_secs: Some(0), uses: None },
        lizard_api::cluster::CreateNodeTokenRequest { ttl_secs: None, uses: Some(0) },
    ] {
        assert_eq!(operator::create_token(&c.state, bad).await.unwrap_err().0.code, ErrorCode::InvalidArgument);
    }
    operator::revoke_token(&c.state, &token.id).await.unwrap();
    assert_eq!(operator::revoke_token(&c.state, &token.id).await.unwrap_err().0.code, ErrorCode::NotFound);
    assert!(operator::list_tokens(&c.state).await.unwrap().is_empty());
    assert_eq!(operator::get(&c.state, "node_nope").await.unwrap_err().0.code, ErrorCode::NotFound);
    // A server without an in-process node lists none.
    assert!(operator::list(&c.state).await.unwrap().is_empty());
}

/// The routes, through the router: a join token minted by the operator, a join and a
/// heartbeat with bearer tokens, the node list; other keys are refused.
#[tokio::test]
async fn the_cluster_routes_through_the_router() {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use serde_json::{json, Value};
    use tower::ServiceExt;

    let store: Arc<dyn Store> = Arc::new(crate::SqlStore::memory().await.unwrap());
    let server = crate::open_with_store(ServerConfig::new("/nonexistent"), store.clone()).await.unwrap();
    let owner = server.initial_key().unwrap().to_string();
    let key = credentials::load_key(store.as_ref()).await.unwrap();
    let connector = Arc::new(TestConnector { nodes: HashMap::new(), credentials: Mutex::default() });
    let state = server.app_state(Nodes::none().with_remote(key.clone(), Some(connector as Arc<dyn NodeConnector>)));
    let app = crate::build_router(state, crate::api::all_routes());
    let call = |method: &str, uri: &str, auth: Option<(&str, String)>, body: Option<Value>| {
        let mut req = Request::builder().method(method).uri(uri);
        if let Some((header, value)) = auth {
            req = req.header(header, value);
        }
        let body = body.map_or_else(Body::empty, |v| Body::from(v.to_string()));
        let req = req.header("content-type", "application/json").body(body).unwrap();
        let app = app.clone();
        async move {
            let resp = app.oneshot(req).await.unwrap();
            let status = resp.status();
            let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
            (status, serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null))
        }
    };
    let api_key = |k: &str| Some(("x-api-key", k.to_string()));
    let bearer = |t: &str| Some(("authorization", format!("Bearer {t}")));

    // A scoped key of the owner is refused.
    let (s, ws) = call("POST", "/v1/workspaces", api_key(&owner), Some(json!({"name": "w"}))).await;
    assert_eq!(s, StatusCode::CREATED, "{ws}");
    let body = json!({"name": "scoped", "workspaces": [ws["id"]]});
    let (_, scoped) = call("POST", "/v1/api-keys", api_key(&owner), Some(body)).await;
    let scoped = scoped["key"].as_str().unwrap().to_string();
    let (s, e) = call("GET", "/v1/nodes", api_key(&scoped), None).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::FORBIDDEN, Some("FORBIDDEN")));
    assert_eq!(call("GET", "/v1/nodes", None, None).await.0, StatusCode::UNAUTHORIZED);

    let (s, token) = call("POST", "/v1/node-tokens", api_key(&owner), Some(json!({"uses": 2}))).await;
    assert_eq!((s, token["usesLeft"].as_u64()), (StatusCode::CREATED, Some(2)), "{token}");
    let token = token["token"].as_str().unwrap().to_string();
    let join = json!({"region": "local", "address": "http://10.0.0.5:7180", "report": report(0)});
    assert_eq!(call("POST", "/v1/cluster/join", None, Some(join.clone())).await.0, StatusCode::UNAUTHORIZED);
    let (s, joined) = call("POST", "/v1/cluster/join", bearer(&token), Some(join)).await;
    assert_eq!(s, StatusCode::OK, "{joined}");
    let id = joined["nodeId"].as_str().unwrap().to_string();
    let credential = joined["credential"].as_str().unwrap().to_string();
    assert_eq!(credential, key.credential(&id));

    let hb = format!("/v1/cluster/nodes/{id}/heartbeat");
    let report_json = serde_json::to_value(report(1024)).unwrap();
    assert_eq!(call("POST", &hb, bearer(&token), Some(report_json.clone())).await.0, StatusCode::UNAUTHORIZED);
    let (s, answer) = call("POST", &hb, bearer(&credential), Some(report_json)).await;
    assert_eq!((s, answer["state"].as_str()), (StatusCode::OK, Some("up")), "{answer}");
    let events = format!("/v1/cluster/nodes/{id}/events");
    let (s, _) = call("POST", &events, bearer(&credential), Some(json!([]))).await;
    assert_eq!(s, StatusCode::NO_CONTENT);

    let (s, nodes) = call("GET", "/v1/nodes", api_key(&owner), None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(nodes.as_array().unwrap().len(), 1, "{nodes}");
    assert_eq!(nodes[0]["usage"]["memoryMib"], 1024);
    assert_eq!(nodes[0]["address"], "http://10.0.0.5:7180");
    let (s, drained) = call("POST", &format!("/v1/nodes/{id}/drain"), api_key(&owner), None).await;
    assert_eq!((s, drained["state"].as_str()), (StatusCode::OK, Some("draining")));
    let (s, tokens) = call("GET", "/v1/node-tokens", api_key(&owner), None).await;
    assert_eq!((s, tokens[0].get("token"), tokens[0]["usesLeft"].as_u64()), (StatusCode::OK, None, Some(1)));
    let revoke = format!("/v1/node-tokens/{}", tokens[0]["id"].as_str().unwrap());
    assert_eq!(call("DELETE", &revoke, api_key(&owner), None).await.0, StatusCode::NO_CONTENT);

    // Removed (nothing lives on it): its credential is refused from then on.
    let node = format!("/v1/nodes/{id}");
    assert_eq!(call("DELETE", &node, api_key(&scoped), None).await.0, StatusCode::FORBIDDEN);
    assert_eq!(call("DELETE", &node, api_key(&owner), None).await.0, StatusCode::NO_CONTENT);
    let (s, e) = call("POST", &hb, bearer(&credential), Some(serde_json::to_value(report(0)).unwrap())).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{e}");
    assert!(e["message"].as_str().unwrap().contains("was removed"), "{e}");
    assert_eq!(call("POST", &events, bearer(&credential), Some(json!([]))).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(call("GET", &node, api_key(&owner), None).await.0, StatusCode::NOT_FOUND);
    assert_eq!(call("DELETE", &node, api_key(&owner), None).await.0, StatusCode::NOT_FOUND);
}
