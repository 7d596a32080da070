//! Property test of scoped keys through the real router.
//!
//! Random sequences of create-workspace, create-project, rename, mint-key (random subsets
//! of existing, deleted and made-up ids, from a random parent key), revoke, and deletes,
//! each issued by a random key. A model predicts every answer from the reference's
//! rules; after each step every live key is checked to see exactly what its scope reaches
//! (lists and lookups of every id ever created), to list only keys within its scope, and
//! revoked keys to be refused. Every minted key's scope is checked to be a subset of its
//! parent's.
//!
//! The model states the rules itself (below), independently of `lizard_server::scope`,
//! so a bug there cannot hide behind the same bug in the oracle.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use crate::common;

use lizard_store::scope::Scope;
use proptest::prelude::*;
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};

// --- the reference's rules, written out for the oracle -----------------------------

/// A key sees a workspace: unscoped, or the workspace is listed.
fn sees_workspace(scope: Option<&Scope>, ws: &str) -> bool {
    match scope {
        None => true,
        Some(s) => s.workspaces.contains(ws),
    }
}

/// A key reaches a project: unscoped, its workspace is listed, or it is listed.
fn sees_project(scope: Option<&Scope>, ws: &str, prj: &str) -> bool {
    match scope {
        None => true,
        Some(s) => s.workspaces.contains(ws) || s.projects.contains(prj),
    }
}

#[derive(Debug, Clone)]
enum Op {
    CreateWorkspace { by: usize },
    CreateProject { by: usize, ws: usize },
    RenameProject { by: usize, prj: usize },
    MintKey { by: usize, ws: Option<Vec<usize>>, prj: Option<Vec<usize>> },
    Revoke { by: usize, target: usize },
    DeleteProject { by: usize, prj: usize },
    DeleteWorkspace { by: usize, ws: usize, force: bool },
}

fn picks() -> impl Strategy<Value = Option<Vec<usize>>> {
    prop::option::weighted(0.7, prop::collection::vec(0usize..64, 0..3))
}

fn op() -> impl Strategy<Value = Op> {
    let k = 0usize..64;
    prop_oneof![
        2 => k.clone().prop_map(|by| Op::CreateWorkspace { by }),
        3 => (k.clone(), 0usize..64).prop_map(|(by, ws)| Op::CreateProject { by, ws }),
        1 => (k.clone(), 0usize..64).prop_map(|(by, prj)| Op::RenameProject { by, prj }),
        5 => (k.clone(), picks(), picks()).prop_map(|(by, ws, prj)| Op::MintKey { by, ws, prj }),
        1 => (k.clone(), 0usize..64).prop_map(|(by, target)| Op::Revoke { by, target }),
        1 => (k.clone(), 0usize..64).prop_map(|(by, prj)| Op::DeleteProject { by, prj }),
        1 => (k, 0usize..64, any::<bool>()).prop_map(|(by, ws, force)| Op::DeleteWorkspace { by, ws, force }),
    ]
}

struct Ws {
    id: String,
    alive: bool,
}

struct Prj {
    id: String,
    ws: String,
    alive: bool,
}

struct Key {
    id: String,
    key: String,
    scope: Option<Scope>,
    revoked: bool,
}

/// What the server should hold.
#[derive(Default)]
struct Model {
    ws: Vec<Ws>,
    prj: Vec<Prj>,
    keys: Vec<Key>,
    counter: usize,
}

impl Model {
    /// An id picked by index among every id ever created, plus one made-up id.
    fn ws_id(&self, i: usize) -> String {
        match i % (self.ws.len() + 1) {
            j if j == self.ws.len() => "ws_madeup000000000".into(),
            j => self.ws[j].id.clone(),
        }
    }
    fn prj_id(&self, i: usize) -> String {
        match i % (self.prj.len() + 1) {
            j if j == self.prj.len() => "prj_madeup00000000".into(),
            j => self.prj[j].id.clone(),
        }
    }
    fn ws_alive(&self, id: &str) -> bool {
        self.ws.iter().any(|w| w.id == id && w.alive)
    }
    fn prj(&self, id: &str) -> Option<&Prj> {
        self.prj.iter().find(|p| p.id == id && p.alive)
    }
    /// project → workspace of live projects (what the server can resolve).
    fn ws_of(&self) -> HashMap<String, String> {
        self.prj.iter().filter(|p| p.alive).map(|p| (p.id.clone(), p.ws.clone())).collect()
    }
    /// `child` is an exact subset of `parent`: an unscoped child needs an unscoped
    /// parent; every listed workspace is the parent's; every listed project is one the
    /// parent reaches (a project that no longer exists only if the parent lists it).
    fn within(&self, parent: Option<&Scope>, child: Option<&Scope>) -> bool {
        let Some(parent) = parent else { return true };
        let Some(child) = child else { return false };
        let m = self.ws_of();
        child.workspaces.iter().all(|w| parent.workspaces.contains(w))
            && child.projects.iter().all(|p| match m.get(p) {
                Some(ws) => sees_project(Some(parent), ws, p),
                None => parent.projects.contains(p),
            })
    }
    fn next_name(&mut self, p: &str) -> String {
        self.counter += 1;
        format!("{p}{}", self.counter)
    }
}

fn strs(v: &Value) -> BTreeSet<String> {
    v.as_array().unwrap().iter().map(|x| x.as_str().unwrap().to_string()).collect()
}

fn ids_of(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|x| x["id"].as_str().unwrap().to_string())
        .collect()
}

async fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let api = common::in_process().await;
    let mut m = Model::default();
    let owner_id = api.call("GET", "/v1/whoami", &api.owner_key, None).await.1["keyId"].as_str().unwrap().to_string();
    m.keys.push(Key { id: owner_id, key: api.owner_key.clone(), scope: None, revoked: false });

    for (step, op) in ops.into_iter().enumerate() {
        let by = match &op {
            Op::CreateWorkspace { by }
            | Op::CreateProject { by, .. }
            | Op::RenameProject { by, .. }
            | Op::MintKey { by, .. }
            | Op::Revoke { by, .. }
            | Op::DeleteProject { by, .. }
            | Op::DeleteWorkspace { by, .. } => *by % m.keys.len(),
        };
        let key = m.keys[by].key.clone();
        let scope = m.keys[by].scope.clone();
        let revoked = m.keys[by].revoked;
        let ctx = format!("step {step}: {op:?} by key #{by} ({scope:?}, revoked={revoked})");
        match op {
            Op::CreateWorkspace { .. } => {
                let name = m.next_name("w");
                let (s, v) = api.call("POST", "/v1/workspaces", &key, Some(json!({ "name": name }))).await;
                let want = if revoked {
                    401
                } else if scope.is_some() {
                    403
                } else {
                    201
                };
                prop_assert_eq!(s, want, "{} → {}", ctx, v);
                if s == 201 {
                    m.ws.push(Ws { id: v["id"].as_str().unwrap().into(), alive: true });
                }
            }
            Op::CreateProject { ws, .. } => {
                let w = m.ws_id(ws);
                let name = m.next_name("p");
                let body = json!({ "workspaceId": w, "name": name });
                let (s, v) = api.call("POST", "/v1/projects", &key, Some(body)).await;
                let want = if revoked {
                    401
                } else if !m.ws_alive(&w) || !sees_workspace(scope.as_ref(), &w) {
                    404
                } else {
                    201
                };
                prop_assert_eq!(s, want, "{} → {}", ctx, v);
                if s == 201 {
                    m.prj.push(Prj { id: v["id"].as_str().unwrap().into(), ws: w, alive: true });
                }
            }
            Op::RenameProject { prj, .. } => {
                let p = m.prj_id(prj);
                let name = m.next_name("r");
                let (s, v) = api.call("PATCH", &format!("/v1/projects/{p}"), &key, Some(json!({ "name": name }))).await;
                let want = match m.prj(&p) {
                    _ if revoked => 401,
                    Some(x) if sees_project(scope.as_ref(), &x.ws, &x.id) => 200,
                    _ => 404,
                };
                prop_assert_eq!(s, want, "{} → {}", ctx, v);
            }
            Op::MintKey { ws, prj, .. } => {
                let ws: Option<BTreeSet<String>> = ws.map(|v| v.into_iter().map(|i| m.ws_id(i)).collect());
                let prj: Option<BTreeSet<String>> = prj.map(|v| v.into_iter().map(|i| m.prj_id(i)).collect());
                let child = match (&ws, &prj) {
                    (None, None) => None,
                    (w, p) => Some(Scope {
                        workspaces: w.clone().unwrap_or_default(),
                        projects: p.clone().unwrap_or_default(),
                    }),
                };
                let mut body = json!({ "name": m.next_name("k") });
                if let Some(w) = &ws {
                    body["workspaces"] = json!(w);
                }
                if let Some(p) = &prj {
                    body["projects"] = json!(p);
                }
                let (s, v) = api.call("POST", "/v1/api-keys", &key, Some(body)).await;
                let exists = child.as_ref().is_none_or(|c| {
                    c.workspaces.iter().all(|w| m.ws_alive(w)) && c.projects.iter().all(|p| m.prj(p).is_some())
                });
                let want = if revoked {
                    401
                } else if child.as_ref().is_some_and(Scope::is_empty) {
                    422
                } else if !m.within(scope.as_ref(), child.as_ref()) {
                    403
                } else if !exists {
                    404
                } else {
                    201
                };
                prop_assert_eq!(s, want, "{} child {:?} → {}", ctx, child, v);
                if s == 201 {
                    // The minted scope is exactly what was asked, and within the parent's.
                    let got = match (&v["workspaces"], &v["projects"]) {
                        (Value::Null, Value::Null) => None,
                        (w, p) => Some(Scope { workspaces: strs(w), projects: strs(p) }),
                    };
                    prop_assert_eq!(&got, &child, "{}", ctx);
                    prop_assert!(m.within(scope.as_ref(), got.as_ref()), "{}: minted scope not within parent", ctx);
                    m.keys.push(Key {
                        id: v["id"].as_str().unwrap().into(),
                        key: v["key"].as_str().unwrap().into(),
                        scope: got,
                        revoked: false,
                    });
                }
            }
            Op::Revoke { target, .. } => {
                let t = target % m.keys.len();
                let tid = m.keys[t].id.clone();
                let (s, v) = api.call("DELETE", &format!("/v1/api-keys/{tid}"), &key, None).await;
                let last_unscoped =
                    m.keys[t].scope.is_none() && m.keys.iter().filter(|k| !k.revoked && k.scope.is_none()).count() == 1;
                let want = if revoked {
                    401
                } else if m.keys[t].revoked || !m.within(scope.as_ref(), m.keys[t].scope.as_ref()) {
                    404
                } else if last_unscoped {
                    409
                } else {
                    204
                };
                prop_assert_eq!(s, want, "{} target #{} → {}", ctx, t, v);
                if s == 204 {
                    m.keys[t].revoked = true;
                }
            }
            Op::DeleteProject { prj, .. } => {
                let p = m.prj_id(prj);
                let (s, v) = api.call("DELETE", &format!("/v1/projects/{p}"), &key, None).await;
                let want = match m.prj(&p) {
                    _ if revoked => 401,
                    Some(x) if sees_project(scope.as_ref(), &x.ws, &x.id) => 204,
                    _ => 404,
                };
                prop_assert_eq!(s, want, "{} → {}", ctx, v);
                if s == 204 {
                    m.prj.iter_mut().filter(|x| x.id == p).for_each(|x| x.alive = false);
                }
            }
            Op::DeleteWorkspace { ws, force, .. } => {
                let w = m.ws_id(ws);
                let (s, v) = api.call("DELETE", &format!("/v1/workspaces/{w}?force={force}"), &key, None).await;
                let has_projects = m.prj.iter().any(|p| p.alive && p.ws == w);
                let want = if revoked {
                    401
                } else if !m.ws_alive(&w) || !sees_workspace(scope.as_ref(), &w) {
                    404
                } else if has_projects && !force {
                    409
                } else {
                    204
                };
                prop_assert_eq!(s, want, "{} → {}", ctx, v);
                if s == 204 {
                    m.ws.iter_mut().filter(|x| x.id == w).for_each(|x| x.alive = false);
                    m.prj.iter_mut().filter(|x| x.ws == w).for_each(|x| x.alive = false);
                }
            }
        }
        check(&api, &m, step).await?;
    }
    Ok(())
}

/// After each step: every live key sees exactly its scope; revoked keys see nothing.
async fn check(api: &common::InProcess, m: &Model, step: usize) -> Result<(), TestCaseError> {
    for (i, k) in m.keys.iter().enumerate() {
        let ctx = format!("after step {step}, key #{i} {:?}", k.scope);
        if k.revoked {
            prop_assert_eq!(api.call("GET", "/v1/whoami", &k.key, None).await.0, 401, "{}", ctx);
            prop_assert_eq!(api.call("GET", "/v1/projects", &k.key, None).await.0, 401, "{}", ctx);
            continue;
        }
        let s = k.scope.as_ref();
        let want_ws: BTreeSet<String> =
            m.ws.iter().filter(|w| w.alive && sees_workspace(s, &w.id)).map(|w| w.id.clone()).collect();
        let want_prj: BTreeSet<String> =
            m.prj.iter().filter(|p| p.alive && sees_project(s, &p.ws, &p.id)).map(|p| p.id.clone()).collect();
        let (st, v) = api.call("GET", "/v1/workspaces", &k.key, None).await;
        prop_assert_eq!(st, 200);
        prop_assert_eq!(ids_of(&v), want_ws.clone(), "{} workspaces", ctx);
        let (st, v) = api.call("GET", "/v1/projects", &k.key, None).await;
        prop_assert_eq!(st, 200);
        prop_assert_eq!(ids_of(&v), want_prj.clone(), "{} projects", ctx);
        for w in &m.ws {
            let (st, _) = api.call("GET", &format!("/v1/workspaces/{}", w.id), &k.key, None).await;
            prop_assert_eq!(st, if want_ws.contains(&w.id) { 200 } else { 404 }, "{} GET {}", ctx, w.id);
            let (st, v) = api.call("GET", &format!("/v1/projects?workspaceId={}", w.id), &k.key, None).await;
            if st == 200 {
                prop_assert!(ids_of(&v).is_subset(&want_prj), "{} projects of {}", ctx, w.id);
            } else {
                prop_assert_eq!(st, 404, "{}", ctx);
            }
        }
        for p in &m.prj {
            let (st, _) = api.call("GET", &format!("/v1/projects/{}", p.id), &k.key, None).await;
            prop_assert_eq!(st, if want_prj.contains(&p.id) { 200 } else { 404 }, "{} GET {}", ctx, p.id);
        }
        // Keys it lists: exactly the live keys within its scope.
        let (st, v) = api.call("GET", "/v1/api-keys", &k.key, None).await;
        prop_assert_eq!(st, 200);
        let want_keys: BTreeSet<String> =
            m.keys.iter().filter(|t| !t.revoked && m.within(s, t.scope.as_ref())).map(|t| t.id.clone()).collect();
        prop_assert_eq!(ids_of(&v), want_keys, "{} api keys", ctx);
        // whoami reports its own scope and, when scoped, nothing of the account.
        let (_, me) = api.call("GET", "/v1/whoami", &k.key, None).await;
        match s {
            None => prop_assert!(me["email"].is_string(), "{}", ctx),
            Some(sc) => {
                prop_assert!(me.get("email").is_none() && me.get("plan").is_none(), "{}", ctx);
                prop_assert_eq!(strs(&me["workspaces"]), sc.workspaces.clone());
                prop_assert_eq!(strs(&me["projects"]), sc.projects.clone());
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("LIZARD_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64),
        max_shrink_iters: 200,
        ..ProptestConfig::default()
    })]

    #[test]
    fn no_key_reaches_outside_its_scope(ops in prop::collection::vec(op(), 1..32)) {
        // Start from a populated world (two workspaces, three projects, a workspace key
        // and a project key) so that short random sequences already exercise scoped
        // parents; the prelude's answers are checked like any other step.
        let mut all = vec![
            Op::CreateWorkspace { by: 0 },
            Op::CreateWorkspace { by: 0 },
            Op::CreateProject { by: 0, ws: 0 },
            Op::CreateProject { by: 0, ws: 1 },
            Op::CreateProject { by: 0, ws: 1 },
            Op::MintKey { by: 0, ws: Some(vec![0]), prj: None },
            Op::MintKey { by: 0, ws: None, prj: Some(vec![1]) },
        ];
        all.extend(ops);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(run(all))?;
    }
}
