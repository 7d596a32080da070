//! The E2B face is one more client, never a side door: another account's key reaches no
//! sandbox through E2B's control routes, and one sandbox's envd token (or none) opens no
//! other sandbox's envd or ports. Errors carry no host detail, and the victim is untouched.

// Helpers unwrap as the tests do (clippy.toml's allow-unwrap-in-tests covers only the
// #[test] functions themselves).
#![allow(clippy::unwrap_used)]

use crate::tenancy::{another_account, credit};
use lizard_attacks::system::System;
use reqwest::Method;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An E2B create with `key` of a sandbox with private URLs: its id, envd token and
/// traffic token.
async fn e2b_create(system: &System, key: &str, metadata: Value) -> (String, String, String) {
    let body = json!({"templateID": "base", "metadata": metadata, "network": {"allowPublicTraffic": false}});
    let (status, created) = system.call_as(key, Method::POST, "/v2/sandboxes", Some(body)).await;
    assert_eq!(status, 201, "{created}");
    let field = |name: &str| created[name].as_str().unwrap().to_owned();
    (field("sandboxID"), field("envdAccessToken"), field("trafficAccessToken"))
}

/// An envd (or guest port) request for `id` through the sandbox URL.
async fn envd(system: &System, id: &str, port: u16, path: &str, token: Option<&str>) -> (u16, String) {
    let mut req = system
        .http
        .post(format!("http://{}{path}", system.proxy))
        .header("E2b-Sandbox-Id", id)
        .header("E2b-Sandbox-Port", port.to_string())
        .json(&json!({}));
    if let Some(token) = token {
        req = req.header("X-Access-Token", token);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn e2bs_routes_and_tokens_reach_no_other_tenants_sandbox() {
    let system = System::start(&[]).await;
    let (victim, victim_token, victim_traffic) =
        e2b_create(&system, &system.key, json!({"lizardProject": system.project})).await;
    let intruder = another_account(&system).await;
    credit(&system, "acc_intruder").await;
    let (status, _) = system.call_as(&intruder, Method::POST, "/v1/workspaces", Some(json!({"name": "w"}))).await;
    assert_eq!(status, 201);
    let (_, workspaces) = system.call_as(&intruder, Method::GET, "/v1/workspaces", None).await;
    let body = json!({"workspaceId": workspaces[0]["id"], "name": "p"});
    let (status, _) = system.call_as(&intruder, Method::POST, "/v1/projects", Some(body)).await;
    assert_eq!(status, 201);
    let (own, own_token, own_traffic) = e2b_create(&system, &intruder, json!({})).await;

    // The control plane: every route with the victim's id is E2B's 404.
    let routes = [
        (Method::GET, format!("/sandboxes/{victim}"), None),
        (Method::DELETE, format!("/sandboxes/{victim}"), None),
        (Method::POST, format!("/sandboxes/{victim}/timeout"), Some(json!({"timeout": 1}))),
        (Method::PUT, format!("/sandboxes/{victim}/network"), Some(json!({"denyOut": ["0.0.0.0/0"]}))),
        (Method::POST, format!("/sandboxes/{victim}/pause"), None),
        (Method::POST, format!("/sandboxes/{victim}/resume"), Some(json!({}))),
        (Method::POST, format!("/sandboxes/{victim}/fork"), Some(json!({"count": 1}))),
        (Method::POST, format!("/sandboxes/{victim}/connect"), Some(json!({}))),
        (Method::POST, format!("/v2/sandboxes/{victim}/connect"), Some(json!({}))),
    ];
    for (method, path, body) in routes {
        let (status, answer) = system.call_as(&intruder, method.clone(), &path, body).await;
        assert_eq!((status, answer["code"].as_u64()), (404, Some(404)), "{method} {path}: {answer}");
        assert!(!answer.to_string().contains("/var"), "{answer}");
    }
    // The victim's snapshot: the intruder neither takes one, sees, deletes nor starts
    // from it, by its id or by its name.
    let body = json!({"name": "victim-snap"});
    let (status, snap) = system.call(Method::POST, &format!("/sandboxes/{victim}/snapshots"), Some(body)).await;
    assert_eq!(status, 201, "{snap}");
    let snap = snap["snapshotID"].as_str().unwrap().to_owned();
    let routes = [
        (Method::POST, format!("/sandboxes/{victim}/snapshots"), Some(json!({}))),
        (Method::DELETE, format!("/templates/{snap}"), None),
        (Method::POST, "/v2/sandboxes".to_owned(), Some(json!({"templateID": snap}))),
    ];
    for (method, path, body) in routes {
        let (status, answer) = system.call_as(&intruder, method.clone(), &path, body).await;
        assert_eq!((status, answer["code"].as_u64()), (404, Some(404)), "{method} {path}: {answer}");
    }
    let body = json!({"templateID": "victim-snap"});
    let (status, answer) = system.call_as(&intruder, Method::POST, "/v2/sandboxes", Some(body)).await;
    assert!(matches!(status, 404 | 422), "a create by the victim's snapshot's name: {status} {answer}");
    let (status, listed) = system.call_as(&intruder, Method::GET, "/snapshots", None).await;
    assert_eq!((status, listed), (200, json!([])));
    let (status, listed) = system.call(Method::GET, "/snapshots", None).await;
    assert_eq!((status, listed[0]["snapshotID"].as_str()), (200, Some(snap.as_str())));

    let (status, listed) = system.call_as(&intruder, Method::GET, "/v2/sandboxes", None).await;
    assert_eq!(status, 200);
    let ids: Vec<&str> = listed.as_array().unwrap().iter().filter_map(|s| s["sandboxID"].as_str()).collect();
    assert_eq!(ids, [own.as_str()], "the list shows another account's sandbox");

    // envd and the guest's ports: the intruder's own token, a made-up one and none are
    // refused for the victim; the platform's code service port too.
    for (port, path) in [(49983, "/process.Process/List"), (49983, "/files"), (8000, "/"), (49999, "/execute")] {
        for token in [Some(own_token.as_str()), Some(own_traffic.as_str()), Some("0".repeat(64).as_str()), None] {
            let (status, answer) = envd(&system, &victim, port, path, token).await;
            assert_eq!(status, 401, "port {port} {path} with {token:?}: {answer}");
            assert!(!answer.contains("/var") && !answer.contains(&victim_token), "{answer}");
        }
    }
    // By host, E2B's order and Lizard's: the intruder's traffic token opens no port of
    // the victim's, nor does the victim's envd token sent as a traffic token.
    let (_, detail) = system.call(Method::GET, &format!("/sandboxes/{victim}"), None).await;
    let domain = detail["domain"].as_str().unwrap().to_owned();
    for host in [format!("8000-{victim}.{domain}"), format!("{victim}-8000.{domain}")] {
        for token in [own_traffic.as_str(), victim_token.as_str()] {
            let resp = system
                .http
                .get(format!("http://{}/", system.proxy))
                .header("Host", &host)
                .header("E2B-Traffic-Access-Token", token)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status().as_u16(), 403, "{host} with a foreign traffic token");
        }
    }
    // The victim's own traffic token reaches its port (closed here: the guest's answer).
    let resp = system
        .http
        .get(format!("http://{}/", system.proxy))
        .header("Host", format!("8000-{victim}.{domain}"))
        .header("E2B-Traffic-Access-Token", &victim_traffic)
        .send()
        .await
        .unwrap();
    assert_ne!(resp.status().as_u16(), 403, "the victim's own traffic token was refused");
    // A header naming no sandbox reaches none.
    let (status, answer) = envd(&system, "sbx_none", 49983, "/process.Process/List", Some(&victim_token)).await;
    assert_eq!(status, 502, "{answer}");

    // The victim runs on, and its own token still works.
    let (status, answer) = envd(&system, &victim, 49983, "/process.Process/List", Some(&victim_token)).await;
    assert_eq!(status, 200, "{answer}");
    let (status, info) = system.call(Method::GET, &format!("/sandboxes/{victim}"), None).await;
    assert_eq!((status, info["state"].as_str()), (200, Some("running")), "{info}");
}

/// A guest's own `/files` route, behind its sandbox's host, stays the guest's even with a
/// `signature` in the query: only a host that names no sandbox is E2B's signed URL.
#[tokio::test(flavor = "multi_thread")]
async fn a_guests_own_files_route_is_never_taken_for_a_signed_url() {
    let system = System::start(&[]).await;
    let body = json!({"template": "base", "projectId": system.project});
    let (status, info) = system.call(Method::POST, "/v1/sandboxes", Some(body)).await;
    assert_eq!(status, 201, "{info}");
    let id = info["sandboxId"].as_str().unwrap();
    let serve = "mkdir -p /srv && echo guest > /srv/files && cd /srv && (nohup python3 -m http.server 8000 >/dev/null 2>&1 &) \
                 && for i in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:8000/files && exit 0; sleep 0.1; done; exit 1";
    let (code, _, err) = system.exec(id, serve).await;
    assert_eq!(code, 0, "{err}");
    let host = format!("{id}-8000.{}", info["domain"].as_str().unwrap());
    let mut conn = tokio::net::TcpStream::connect(system.proxy).await.unwrap();
    let request =
        format!("GET /files?path=/etc/passwd&signature=v1_x HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(std::time::Duration::from_secs(20), conn.read_to_string(&mut answer)).await.unwrap().unwrap();
    let status = answer.split_whitespace().nth(1);
    assert!(status == Some("200") && answer.ends_with("guest\n"), "{answer}");
}
