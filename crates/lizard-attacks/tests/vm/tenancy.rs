//! A tenant against another: keys scoped to one workspace, or to one project, and an
//! unscoped key of another account, aimed at every route of the API with the ids of
//! another workspace's, project's or account's sandbox, volume, workspace, project and key,
//! and at the operator's node and join-token routes and the nodes' own routes (a key is no
//! node credential: ending the victim's sandbox as its node would is refused). Nothing may
//! answer with success, and afterwards the victims are exactly as they were.

#![allow(clippy::unwrap_used)]

use lizard_api::routes::{Body, Method as RouteMethod, SERVER};
use lizard_attacks::system::System;
use reqwest::Method;
use serde_json::{json, Value};

/// The ids an attack aims at.
struct Victims {
    sandbox: String,
    volume: String,
    workspace: String,
    project: String,
    key: String,
    /// The node the victim's sandbox runs on, and an operator's join token.
    node: String,
    node_token: String,
}

async fn created(system: &System, path: &str, body: Value) -> Value {
    let (status, v) = system.call(Method::POST, path, Some(body)).await;
    assert_eq!(status, 201, "POST {path}: {v}");
    v
}

/// A request body the route accepts, so that what stops the attack is the key's scope
/// and not a malformed request.
fn body_for(request: Body) -> Option<Value> {
    match request {
        Body::Json("SetTimeoutRequest") => Some(json!({"timeoutMs": 1000})),
        Body::Json("SignUrlRequest") => Some(json!({"port": 22})),
        Body::Json("NetworkPolicy") => Some(json!({"allowInternetAccess": false})),
        Body::Json("ForkRequest") => Some(json!({"count": 1})),
        Body::Json("ExecRequest") | Body::Json("StartProcessRequest") => Some(json!({"cmd": "touch /root/pwned"})),
        Body::Json("SignalRequest") => Some(json!({"signal": "SIGKILL"})),
        Body::Json("PtySize") => Some(json!({"cols": 10, "rows": 10})),
        Body::Json("RunCodeRequest") => Some(json!({"code": "open('/root/pwned', 'w')"})),
        Body::Json("CreateCodeContextRequest") => Some(json!({})),
        Body::Json("UpdateProjectRequest") => Some(json!({"name": "pwned"})),
        Body::Json("UpdateWorkspaceRequest") => Some(json!({"volumeQuotaGb": 0})),
        Body::Json("NodeReport") => Some(json!({
            "capacity": {"vcpus": 64, "memoryMib": 65536, "diskGib": 100},
            "usage": {"vcpus": 0, "memoryMib": 0, "sandboxes": 0}
        })),
        _ => None,
    }
}

/// A list body the route accepts: the victim's sandbox reported ended.
fn list_body_for(request: Body, v: &Victims) -> Option<Value> {
    match request {
        Body::JsonList("SandboxEnded") => Some(json!([{"sandboxId": v.sandbox, "reason": "pwned"}])),
        Body::JsonList("SandboxHalt") => Some(json!([{"sandboxId": v.sandbox, "halted": true}])),
        _ => None,
    }
}

/// Every route that names one resource, with the victim's id in it; template and blob
/// routes name resources no victim has here (built-ins are shared by design), and so do
/// service routes (a service is a build and running instances; another workspace's key
/// against services — list, status, logs, down, a deploy to a taken name — is in
/// `lizard-cli`'s `services` test).
fn aimed_requests(v: &Victims) -> Vec<(RouteMethod, String, Body)> {
    let mut out = vec![];
    for route in SERVER {
        let params: Vec<&str> = route.params().collect();
        if params.is_empty() || route.path.starts_with("/v1/templates") || route.path.starts_with("/v1/services") {
            continue;
        }
        let args: Vec<&str> = params
            .iter()
            .map(|p| match (*p, route.path) {
                ("id", path) if path.starts_with("/v1/sandboxes") => v.sandbox.as_str(),
                ("id", path) if path.starts_with("/v1/workspaces") => v.workspace.as_str(),
                ("id", path) if path.starts_with("/v1/projects") => v.project.as_str(),
                ("id", path) if path.starts_with("/v1/api-keys") => v.key.as_str(),
                ("id", path) if path.starts_with("/v1/nodes") || path.starts_with("/v1/cluster/nodes") => {
                    v.node.as_str()
                }
                ("id", path) if path.starts_with("/v1/node-tokens") => v.node_token.as_str(),
                ("contextId", _) => "default",
                // The guest agent's own pid: a signal to it would show in the victim's health.
                ("pid", _) => "1",
                ("port", _) => "22",
                ("nameOrId", _) => v.volume.as_str(),
                (p, path) => panic!("{path}: no victim for parameter {p}: extend the attack"),
            })
            .collect();
        let mut uri = route.uri(&args);
        if route.path.contains("/files") {
            uri.push_str("?path=/root/victim.txt");
        }
        if route.path.ends_with("/files/rename") {
            uri.push_str("&to=/root/moved.txt");
        }
        out.push((route.method, uri, route.request));
    }
    out
}

async fn attack(system: &System, key: &str, victims: &Victims) {
    for (method, uri, request) in aimed_requests(victims) {
        let mut req = system.request_as(key, Method::from_bytes(method.as_str().as_bytes()).unwrap(), &uri);
        req = match (request, body_for(request).or_else(|| list_body_for(request, victims))) {
            (_, Some(body)) => req.json(&body),
            (Body::Bytes, _) => req.body("pwned"),
            _ => req,
        };
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let body = resp.text().await.unwrap();
        // A node's own routes take its credential, never an API key: 401.
        let node_route = uri.starts_with("/v1/cluster/");
        assert!(
            status == 403 || status == 404 || (node_route && status == 401),
            "{} {uri} with another tenant's id answered {status}: {body}",
            method.as_str()
        );
    }
    // Lists and creates that name the victim's workspace or project.
    for query in [format!("projectId={}", victims.project), format!("workspaceId={}", victims.workspace)] {
        let (status, list) = system.call_as(key, Method::GET, &format!("/v1/sandboxes?{query}"), None).await;
        assert!(status == 403 || status == 404 || list == json!([]), "sandboxes?{query}: {status} {list}");
    }
    let (status, _) = system
        .call_as(key, Method::POST, "/v1/sandboxes", Some(json!({"template": "base", "projectId": victims.project})))
        .await;
    assert!(status == 403 || status == 404, "a create in the victim's project answered {status}");
    let (status, _) = system
        .call_as(key, Method::POST, "/v1/volumes", Some(json!({"name": "intruder", "project": victims.project})))
        .await;
    assert!(status == 403 || status == 404, "a volume in the victim's project answered {status}");
}

/// The victims are as they were: running, their file and volume intact, nothing written.
async fn assert_untouched(system: &System, v: &Victims) {
    let (status, info) = system.call(Method::GET, &format!("/v1/sandboxes/{}", v.sandbox), None).await;
    assert_eq!((status, info["state"].as_str()), (200, Some("running")), "{info}");
    let (code, out, _) = system.exec(&v.sandbox, "cat /root/victim.txt; test -e /root/pwned && echo PWNED; true").await;
    assert_eq!((code, out.as_str()), (0, "victim\n"));
    for path in [
        format!("/v1/volumes/{}", v.volume),
        format!("/v1/workspaces/{}", v.workspace),
        format!("/v1/projects/{}", v.project),
    ] {
        let (status, body) = system.call(Method::GET, &path, None).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    let (_, project) = system.call(Method::GET, &format!("/v1/projects/{}", v.project), None).await;
    assert_ne!(project["name"], "pwned");
    let (_, keys) = system.call(Method::GET, "/v1/api-keys", None).await;
    assert!(keys.as_array().unwrap().iter().any(|k| k["id"] == v.key.as_str()), "{keys}");
    let (_, node) = system.call(Method::GET, &format!("/v1/nodes/{}", v.node), None).await;
    assert_eq!(node["state"], "up", "{node}");
    let (_, tokens) = system.call(Method::GET, "/v1/node-tokens", None).await;
    assert!(tokens.as_array().unwrap().iter().any(|t| t["id"] == v.node_token.as_str()), "{tokens}");
}

async fn victims_in(system: &System, workspace: &str, project: &str) -> Victims {
    let sandbox = {
        let (status, info) =
            system.call(Method::POST, "/v1/sandboxes", Some(json!({"template": "base", "projectId": project}))).await;
        assert_eq!(status, 201, "{info}");
        info["sandboxId"].as_str().unwrap().to_string()
    };
    system.exec(&sandbox, "echo victim > /root/victim.txt").await;
    let volume = created(
        system,
        "/v1/volumes",
        json!({"name": format!("vol-{}", &project[project.len() - 6..]), "project": project}),
    )
    .await;
    let key = created(system, "/v1/api-keys", json!({"name": "victim", "projects": [project]})).await;
    Victims {
        sandbox,
        volume: volume["id"].as_str().unwrap().to_string(),
        workspace: workspace.to_string(),
        project: project.to_string(),
        key: key["id"].as_str().unwrap().to_string(),
        node: {
            let (status, nodes) = system.call(Method::GET, "/v1/nodes", None).await;
            assert_eq!(status, 200, "{nodes}");
            nodes[0]["id"].as_str().unwrap().to_string()
        },
        node_token: created(system, "/v1/node-tokens", json!({})).await["id"].as_str().unwrap().to_string(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn scoped_keys_reach_nothing_of_another_workspace_or_project() {
    let system = System::start(&[]).await;
    let (_, own) = system.call(Method::GET, &format!("/v1/projects/{}", system.project), None).await;
    let own_workspace = own["workspaceId"].as_str().unwrap().to_string();
    // Another project in the attacker's own workspace, and another workspace.
    let sibling = created(&system, "/v1/projects", json!({"workspaceId": own_workspace, "name": "sibling"})).await;
    let other_ws = created(&system, "/v1/workspaces", json!({"name": "victim"})).await;
    let other_ws = other_ws["id"].as_str().unwrap().to_string();
    let other_project = created(&system, "/v1/projects", json!({"workspaceId": other_ws, "name": "victim"})).await;

    let across_workspaces = victims_in(&system, &other_ws, other_project["id"].as_str().unwrap()).await;
    let across_projects = victims_in(&system, &own_workspace, sibling["id"].as_str().unwrap()).await;

    let workspace_key = created(&system, "/v1/api-keys", json!({"name": "ws", "workspaces": [own_workspace]})).await;
    let project_key = created(&system, "/v1/api-keys", json!({"name": "p", "projects": [system.project]})).await;
    let workspace_key = workspace_key["key"].as_str().unwrap();
    let project_key = project_key["key"].as_str().unwrap();

    // The keys work where they are meant to: the attack is stopped by scope, not by a dead key.
    for key in [workspace_key, project_key] {
        let (status, list) =
            system.call_as(key, Method::GET, &format!("/v1/sandboxes?projectId={}", system.project), None).await;
        assert_eq!(status, 200, "{list}");
    }

    attack(&system, workspace_key, &across_workspaces).await;
    attack(&system, project_key, &across_workspaces).await;
    attack(&system, project_key, &across_projects).await;
    assert_untouched(&system, &across_workspaces).await;
    assert_untouched(&system, &across_projects).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn path_tricks_in_names_and_file_paths_stay_inside_their_sandbox() {
    let system = System::start(&[]).await;
    let id = system.create_sandbox("base", json!({})).await;
    // Names that would be paths on the host are refused with a stable code.
    for name in ["../../etc", "a/b", "..", ".", "vol\u{0}x", "%2e%2e"] {
        let (status, body) =
            system.call(Method::POST, "/v1/volumes", Some(json!({"name": name, "project": system.project}))).await;
        assert_eq!((status, body["code"].as_str()), (422, Some("INVALID_ARGUMENT")), "volume {name:?}: {body}");
    }
    for id in ["..", "..%2F..%2Fetc", "%2e%2e", "x%00y"] {
        let (status, body) = system.call(Method::GET, &format!("/v1/sandboxes/{id}"), None).await;
        assert!(status == 404 || status == 422, "sandbox id {id:?}: {status} {body}");
    }
    // A file path that climbs out of / is the guest's own root: its hostname, not the host's.
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    let (_, guest, _) = system.exec(&id, "cat /etc/hostname").await;
    for path in ["/../../../../etc/hostname", "/proc/1/root/etc/hostname", "//etc/./hostname"] {
        let resp = system
            .request(Method::GET, &format!("/v1/sandboxes/{id}/files"))
            .query(&[("path", path)])
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        let text = resp.text().await.unwrap();
        assert_eq!(text, guest, "{path}");
        assert!(host.is_empty() || text != host || host == guest, "{path} read the host's file");
    }
}

/// A second account in the server's store with an unscoped key of its own (the plaintext).
/// No route makes accounts (one server, one owner account); a multi-account operator's
/// tooling would write them, as this does.
pub(crate) async fn another_account(system: &System) -> String {
    let db = system.data_dir().join("lizard.db");
    let url = format!("sqlite://{}", db.display());
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    let key = lizard_server::keys::generate();
    let now = i64::try_from(std::time::SystemTime::UNIX_EPOCH.elapsed().unwrap().as_millis()).unwrap();
    sqlx::query("INSERT INTO accounts (id, email, plan, created_at) VALUES ('acc_intruder', 'intruder@example.test', 'free', ?)")
        .bind(now)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO api_keys (id, account_id, name, prefix, hash, workspaces, projects, created_at) \
         VALUES ('key_intruder', 'acc_intruder', 'intruder', ?, ?, NULL, NULL, ?)",
    )
    .bind(&key.prefix)
    .bind(key.hash.to_vec())
    .bind(now)
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    key.plaintext
}

#[tokio::test(flavor = "multi_thread")]
async fn another_accounts_key_reaches_nothing_of_this_account() {
    let system = System::start(&[]).await;
    let (_, own) = system.call(Method::GET, &format!("/v1/projects/{}", system.project), None).await;
    let workspace = own["workspaceId"].as_str().unwrap().to_string();
    let victims = victims_in(&system, &workspace, &system.project).await;
    let intruder = another_account(&system).await;

    // The key works, and every list it can read is its own account's: empty.
    for path in ["/v1/sandboxes", "/v1/volumes", "/v1/workspaces", "/v1/projects", "/v1/billing/transactions"] {
        let (status, list) = system.call_as(&intruder, Method::GET, path, None).await;
        assert_eq!(status, 200, "{path}: {list}");
        let items = list.get("items").unwrap_or(&list);
        assert_eq!(items, &json!([]), "{path} shows another account's rows: {list}");
    }
    let (_, keys) = system.call_as(&intruder, Method::GET, "/v1/api-keys", None).await;
    let names: Vec<&str> = keys.as_array().unwrap().iter().map(|k| k["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["intruder"], "{keys}");
    let (_, live) = system.call_as(&intruder, Method::GET, "/v1/billing/live", None).await;
    assert_eq!(live["sandboxes"], json!([]), "{live}");
    // Nodes belong to the server's owner account only.
    let (status, nodes) = system.call_as(&intruder, Method::GET, "/v1/nodes", None).await;
    assert_eq!(status, 403, "{nodes}");

    attack(&system, &intruder, &victims).await;
    assert_untouched(&system, &victims).await;
}

/// Give an account made by [`another_account`] credits, as `lizard billing credit` does.
pub(crate) async fn credit(system: &System, account: &str) {
    let url = format!("sqlite://{}", system.data_dir().join("lizard.db").display());
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    sqlx::query(
        "INSERT INTO ledger (id, account_id, kind, amount_nanos, description, created_at) \
         VALUES ('txn_intruder', ?, 'credit', 10000000000, 'test credit', 1)",
    )
    .bind(account)
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
}

/// Every account's volumes reserve the one disk of their node: one account (or one
/// workspace's tenant) taking it all refused everyone else's volumes. Each account is
/// held to its quota, and each workspace to the quota its account set, which the
/// workspace's own key cannot raise.
#[tokio::test(flavor = "multi_thread")]
async fn no_account_or_workspace_takes_the_volume_disk_others_need() {
    let system = System::start(&["--volume-quota-gb", "2"]).await;
    let intruder = another_account(&system).await;
    credit(&system, "acc_intruder").await;
    let (status, ws) = system.call_as(&intruder, Method::POST, "/v1/workspaces", Some(json!({"name": "grab"}))).await;
    assert_eq!(status, 201, "{ws}");
    let body = json!({"workspaceId": ws["id"], "name": "grab"});
    let (status, project) = system.call_as(&intruder, Method::POST, "/v1/projects", Some(body)).await;
    assert_eq!(status, 201, "{project}");
    let volume = |name: &str, project: &Value, size: u32| json!({"name": name, "projectId": project, "sizeGb": size});
    let (status, v) =
        system.call_as(&intruder, Method::POST, "/v1/volumes", Some(volume("a", &project["id"], 1))).await;
    assert_eq!(status, 201, "{v}");
    let (status, e) =
        system.call_as(&intruder, Method::POST, "/v1/volumes", Some(volume("b", &project["id"], 2))).await;
    assert_eq!((status, e["code"].as_str()), (403, Some("QUOTA_EXCEEDED")), "{e}");

    // This account: a tenant's workspace, held to 1 GiB by the owner.
    let (_, team) = system.call(Method::POST, "/v1/workspaces", Some(json!({"name": "team"}))).await;
    let team_path = format!("/v1/workspaces/{}", team["id"].as_str().unwrap());
    let (_, team_project) =
        system.call(Method::POST, "/v1/projects", Some(json!({"workspaceId": team["id"], "name": "t"}))).await;
    let (status, _) = system.call(Method::PATCH, &team_path, Some(json!({"volumeQuotaGb": 1}))).await;
    assert_eq!(status, 200);
    let (_, key) =
        system.call(Method::POST, "/v1/api-keys", Some(json!({"name": "tenant", "workspaces": [team["id"]]}))).await;
    let tenant = key["key"].as_str().unwrap();
    let (status, e) = system.call_as(tenant, Method::PATCH, &team_path, Some(json!({"volumeQuotaGb": null}))).await;
    assert_eq!((status, e["code"].as_str()), (403, Some("ACCOUNT_SCOPE_REQUIRED")), "{e}");
    let (status, e) =
        system.call_as(tenant, Method::POST, "/v1/volumes", Some(volume("t", &team_project["id"], 2))).await;
    assert_eq!((status, e["code"].as_str()), (403, Some("QUOTA_EXCEEDED")), "{e}");
    assert!(e["message"].as_str().unwrap().contains("workspace's volume quota of 1 GiB"), "{e}");

    // What the others left is still there for the owner's own project.
    let own = json!({"name": "mine", "project": system.project, "sizeGb": 2});
    let (status, v) = system.call(Method::POST, "/v1/volumes", Some(own)).await;
    assert_eq!(status, 201, "{v}");
    let (_, volumes) = system.call(Method::GET, "/v1/volumes", None).await;
    assert_eq!(volumes.as_array().map(Vec::len), Some(1), "{volumes}");
}
