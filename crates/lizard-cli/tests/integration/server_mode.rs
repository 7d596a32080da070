//! The `lizard` binary in server mode (LIZARD_API_URL/LIZARD_API_KEY), against:
//! - the real control plane (`lizard_server::open` + `axum::serve` on 127.0.0.1:0, the
//!   tenancy routes; no VMs), and
//! - a recording stand-in for the sandbox routes, to check what each command sends.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

use crate::common;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use common::stderr;
use lizard_agent_proto::frame::{Frame, FrameKind};
use serde_json::{json, Value};
use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

/// A server on a runtime of its own, alive as long as this is.
struct Served {
    url: String,
    _rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

fn serve(router: axum::Router, dir: tempfile::TempDir) -> Served {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    rt.spawn(async move { axum::serve(listener, router).await.unwrap() });
    Served { url, _rt: rt, _dir: dir }
}

/// The real control plane with every route (volumes included) over a real node that
/// boots nothing here; returns it and the owner's unscoped key.
fn full_server() -> (Served, String) {
    let dir = tempfile::Builder::new().prefix("lizard-cli-full-").tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let (router, key) = rt.block_on(async {
        let server = lizard_server::open(lizard_server::ServerConfig::new(dir.path())).await.unwrap();
        let key = server.initial_key().expect("first start").to_string();
        let node = lizard_node::Node::start(lizard_node::NodeConfig::new(dir.path().join("node"))).await.unwrap();
        let state = server.app_state(lizard_node_client::Nodes::local(node));
        (lizard_server::build_router(state, lizard_server::api::all_routes()), key)
    });
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    rt.spawn(async move { axum::serve(listener, router).await.unwrap() });
    (Served { url, _rt: rt, _dir: dir }, key)
}

/// The real control plane; returns it and the owner's unscoped key.
fn control_plane() -> (Served, String) {
    let dir = tempfile::Builder::new().prefix("lizard-cli-server-").tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let server = rt.block_on(lizard_server::open(lizard_server::ServerConfig::new(dir.path()))).unwrap();
    let key = server.initial_key().expect("first start").to_string();
    let router = server.router();
    drop(rt);
    (serve(router, dir), key)
}

/// `lizard` with only the LIZARD_* variables given here.
fn lizard(url: &str, key: Option<&str>, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut cmd = common::lizard_command();
    cmd.env("LIZARD_API_URL", url);
    if let Some(k) = key {
        cmd.env("LIZARD_API_KEY", k);
    }
    let mut child = cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(b) = stdin {
        input.write_all(b).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

struct As<'a> {
    url: &'a str,
    key: &'a str,
}

impl As<'_> {
    fn run(&self, args: &[&str]) -> Output {
        lizard(self.url, Some(self.key), args, None)
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(o.status.success(), "lizard {args:?} failed ({:?}): {}", o.status.code(), stderr(&o));
        stdout(&o)
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.ok(&[args, &["--json"]].concat());
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("lizard {args:?} --json: {e}: {out}"))
    }

    /// Fails with exit status 1 and `error: CODE: …` on stderr.
    fn fails(&self, args: &[&str], code: &str) -> String {
        let o = self.run(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "lizard {args:?}: {err}");
        assert!(err.starts_with(&format!("error: {code}: ")), "lizard {args:?}: expected {code}: {err}");
        err
    }
}

#[test]
fn volume_commands_against_the_real_server() {
    let (server, owner_key) = full_server();
    let owner = As { url: &server.url, key: &owner_key };
    let ws = owner.ok(&["workspace", "create", "w"]).trim().to_string();
    owner.ok(&["project", "create", "--workspace", &ws, "p"]);
    let volumes_dir = server._dir.path().join("node/volumes");

    let id = owner.ok(&["volume", "create", "data", "--project", "p", "--size-gb", "1"]).trim().to_string();
    assert!(id.starts_with("vol_"), "{id}");
    assert_eq!(std::fs::metadata(volumes_dir.join(format!("{id}.img"))).unwrap().len(), 1 << 30);
    owner.fails(&["volume", "create", "data", "--project", "p"], "CONFLICT");
    let list = owner.ok(&["volume", "list"]);
    assert!(list.starts_with("ID") && list.contains(&id) && list.contains("data"), "{list}");
    assert_eq!(owner.json(&["volume", "list", "--project", "p"])[0]["id"], json!(id));
    let got = owner.ok(&["volume", "get", "data", "--project", "p"]);
    assert!(got.contains(&id) && got.contains("size_gb") && got.contains("local"), "{got}");
    assert_eq!(owner.json(&["volume", "get", &id])["name"], "data");
    owner.fails(&["volume", "get", "nope", "--project", "p"], "NOT_FOUND");
    let o = Command::new(env!("CARGO_BIN_EXE_lizard"))
        .env("LIZARD_API_URL", &server.url)
        .env("LIZARD_API_KEY", &owner_key)
        .env("LIZARD_PROJECT", "p")
        .args(["volume", "delete", "data"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!volumes_dir.join(format!("{id}.img")).exists());
    assert_eq!(owner.json(&["volume", "list"]), json!([]));
    owner.fails(&["volume", "delete", &id], "NOT_FOUND");
}

#[test]
fn tenancy_against_the_real_server() {
    let (server, owner_key) = control_plane();
    let owner = As { url: &server.url, key: &owner_key };

    // whoami: the unscoped owner key sees the account's email.
    let me = owner.ok(&["whoami"]);
    assert!(me.contains("owner@lizard.localhost") && me.contains("unscoped"), "{me}");
    let me = owner.json(&["whoami"]);
    assert_eq!((me["scoped"].as_bool(), me["email"].as_str()), (Some(false), Some("owner@lizard.localhost")));

    // Workspaces: create prints the id; list, find by id, slug and name.
    let ws = owner.ok(&["workspace", "create", "User 42"]).trim().to_string();
    assert!(ws.starts_with("ws_"), "{ws}");
    let other = owner.ok(&["workspace", "create", "other"]).trim().to_string();
    let list = owner.ok(&["workspace", "list"]);
    assert!(
        list.starts_with("ID") && list.contains(&ws) && list.contains("user-42") && list.contains(&other),
        "{list}"
    );
    assert_eq!(owner.json(&["workspace", "list"]).as_array().unwrap().len(), 2);
    for k in [ws.as_str(), "user-42", "User 42"] {
        let found = owner.ok(&["workspace", "find", k]);
        assert!(found.contains(&ws) && found.contains("User 42"), "{k}: {found}");
    }
    owner.fails(&["workspace", "find", "nope"], "NOT_FOUND");
    owner.fails(&["workspace", "create", "user 42"], "CONFLICT");

    // Projects: create, list (all and by workspace), get by name, rename, delete.
    let prj = owner.ok(&["project", "create", "--workspace", &ws, "My Project"]).trim().to_string();
    assert!(prj.starts_with("prj_"), "{prj}");
    let prj2 = owner.ok(&["project", "create", "--workspace", &other, "elsewhere"]).trim().to_string();
    let all = owner.ok(&["project", "list"]);
    assert!(all.contains(&prj) && all.contains(&prj2), "{all}");
    let in_ws = owner.json(&["project", "list", "--workspace", &ws]);
    assert_eq!(in_ws.as_array().unwrap().iter().map(|p| p["id"].as_str().unwrap()).collect::<Vec<_>>(), [&prj]);
    assert!(owner.ok(&["project", "get", "My Project"]).contains(&prj));
    let renamed = owner.ok(&["project", "rename", &prj, "Renamed Project"]);
    assert!(renamed.contains("Renamed Project") && renamed.contains("my-project"), "slug kept: {renamed}");
    assert_eq!(owner.json(&["project", "get", "my-project"])["name"], "Renamed Project");
    let tmp = owner.ok(&["project", "create", "--workspace", &ws, "tmp"]).trim().to_string();
    owner.ok(&["project", "delete", &tmp]);
    owner.fails(&["project", "get", &tmp], "NOT_FOUND");

    // A key scoped to one workspace: its secret is printed once, clearly labelled.
    let o = owner.run(&["key", "create", "user-42", "--workspace", &ws]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let scoped_key = out.trim().strip_prefix("LIZARD_API_KEY=").unwrap_or_else(|| panic!("{out}")).to_string();
    assert!(scoped_key.starts_with("lz_"), "{out}");
    assert!(stderr(&o).contains("only time") && stderr(&o).contains(&ws), "{}", stderr(&o));
    for args in [&["key", "list"][..], &["key", "list", "--json"]] {
        let keys = owner.ok(args);
        assert!(keys.contains("user-42") && keys.contains(&scoped_key[..11]), "{keys}");
        assert!(!keys.contains(&scoped_key), "`key list` shows a secret: {keys}");
    }

    // The scoped key: no email, sees only its workspace, mints nothing broader.
    let user = As { url: &server.url, key: &scoped_key };
    let me = user.ok(&["whoami"]);
    assert!(!me.contains('@') && me.contains(&ws), "{me}");
    let me = user.json(&["whoami"]);
    assert!(me.get("email").is_none() && me["scoped"] == true, "{me}");
    assert!(user.ok(&["workspace", "list"]).contains(&ws));
    assert!(!user.ok(&["workspace", "list"]).contains(&other));
    user.fails(&["workspace", "find", &other], "NOT_FOUND");
    user.fails(&["workspace", "find", "other"], "NOT_FOUND");
    user.fails(&["project", "get", &prj2], "NOT_FOUND");
    user.fails(&["key", "create", "broader"], "FORBIDDEN");
    user.fails(&["key", "create", "sideways", "--workspace", &other], "FORBIDDEN");
    user.fails(&["workspace", "create", "mine"], "FORBIDDEN");
    let narrower = user.json(&["key", "create", "narrower", "--project", &prj]);
    assert_eq!(narrower["projects"], json!([prj]));
    assert!(narrower["key"].as_str().unwrap().starts_with("lz_"));
    assert!(user.ok(&["region", "list"]).contains("sandbox.local.lizard.localhost"));

    // Revoked keys stop working at once.
    let narrower_id = narrower["id"].as_str().unwrap();
    owner.ok(&["key", "delete", narrower_id]);
    As { url: &server.url, key: narrower["key"].as_str().unwrap() }.fails(&["whoami"], "UNAUTHENTICATED");

    // Deleting a workspace: refused while it holds a project; --force deletes it all.
    owner.fails(&["workspace", "delete", &ws], "CONFLICT");
    owner.ok(&["workspace", "delete", &ws, "--force"]);
    owner.fails(&["workspace", "find", &ws], "NOT_FOUND");
    owner.fails(&["project", "get", &prj], "NOT_FOUND");
    owner.ok(&["project", "delete", &prj2]);
    owner.ok(&["workspace", "delete", &other]);
    assert_eq!(owner.json(&["workspace", "list"]), json!([]));

    // Wrong or missing credentials, and server-only commands without a server.
    As { url: &server.url, key: "lz_nope" }.fails(&["whoami"], "UNAUTHENTICATED");
    let o = lizard(&server.url, None, &["whoami"], None);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no API key") && stderr(&o).contains("LIZARD_API_KEY"), "{}", stderr(&o));
    let o = lizard("", Some(&owner_key), &["workspace", "list"], None);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("LIZARD_API_URL"), "{}", stderr(&o));
    let o = lizard("https://127.0.0.1:1", Some(&owner_key), &["whoami"], None);
    assert!(stderr(&o).contains("TLS termination belongs in front"), "{}", stderr(&o));
    // The --api-url / --api-key flags work without the environment.
    let o = lizard("", None, &["whoami", "--api-url", &server.url, "--api-key", &owner_key], None);
    assert!(o.status.success() && stdout(&o).contains("owner@"), "{}", stderr(&o));
}

/// One request as the stand-in saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    uri: String,
    key: Option<String>,
    body: Bytes,
}

impl Seen {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

fn sandbox_json(end_at: &str) -> Value {
    json!({
        "sandboxId": "sbx_1", "template": "base", "state": "running", "vcpus": 1, "memoryMib": 512,
        "startedAt": "2026-01-01T00:00:00Z", "projectId": "prj_1", "endAt": end_at,
        "domain": "sandbox.local.lizard.localhost", "metadata": {"owner": "me"}
    })
}

async fn stand_in(seen: Arc<Mutex<Vec<Seen>>>, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let key = headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(String::from);
    seen.lock().unwrap().push(Seen { method: method.clone(), uri: uri.to_string(), key: key.clone(), body });
    if key.as_deref() != Some("lz_test") {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"code": "UNAUTHENTICATED", "message": "invalid or revoked API key"})),
        )
            .into_response();
    }
    match (method.as_str(), uri.path()) {
        ("POST", "/v1/sandboxes") => (StatusCode::CREATED, Json(sandbox_json("2026-01-01T00:05:00Z"))).into_response(),
        ("GET", "/v1/sandboxes") => Json(json!([sandbox_json("2026-01-01T00:05:00Z")])).into_response(),
        ("GET", "/v1/sandboxes/sbx_1") => Json(sandbox_json("2026-01-01T00:05:00Z")).into_response(),
        ("POST", "/v1/sandboxes/sbx_1/timeout") => Json(sandbox_json("2026-01-01T01:00:00Z")).into_response(),
        ("DELETE", "/v1/sandboxes/sbx_1") => StatusCode::NO_CONTENT.into_response(),
        ("POST", "/v1/sandboxes/sbx_1/exec") => {
            let exit = json!({"exitCode": 7, "timedOut": false, "durationMs": 3});
            let mut body = Vec::new();
            body.extend_from_slice(&Frame::new(FrameKind::Stdout, &b"hi\n"[..]).to_bytes());
            body.extend_from_slice(&Frame::new(FrameKind::Stderr, &b"oops\n"[..]).to_bytes());
            body.extend_from_slice(&Frame::json(FrameKind::Exit, &exit).to_bytes());
            body.into_response()
        }
        ("PUT", "/v1/sandboxes/sbx_1/files") => Json(json!({"path": "/app/a.txt", "bytesWritten": 5})).into_response(),
        ("GET", "/v1/sandboxes/sbx_1/files") => b"hello".to_vec().into_response(),
        ("GET", "/v1/sandboxes/sbx_1/files/list") => Json(json!([
            {"name": "a.txt", "path": "/app/a.txt", "type": "file", "size": 5, "mode": 420, "mtimeMs": 0}
        ]))
        .into_response(),
        ("POST", "/v1/sandboxes/sbx_1/files/mkdir") | ("DELETE", "/v1/sandboxes/sbx_1/files") => {
            StatusCode::NO_CONTENT.into_response()
        }
        ("GET", "/v1/sandboxes/sbx_1/files/info") | ("POST", "/v1/sandboxes/sbx_1/files/rename") => Json(json!({
            "name": "b.txt", "path": "/app/b.txt", "type": "symlink", "size": 5, "mode": 511, "uid": 0, "gid": 0,
            "owner": "root", "group": "root", "mtimeMs": 0, "symlinkTarget": "a.txt"
        }))
        .into_response(),
        ("GET", "/v1/sandboxes/sbx_1/files/archive") => b"tar bytes".to_vec().into_response(),
        ("PUT", "/v1/sandboxes/sbx_1/files/archive") => {
            Json(json!({"path": "/app", "entries": 2, "bytesWritten": 9})).into_response()
        }
        ("GET", "/v1/sandboxes/sbx_1/files/watch") => {
            b"{\"type\":\"create\",\"path\":\"/app/x\",\"isDir\":false}\n\n{\"type\":\"overflow\",\"path\":\"\",\"isDir\":false}\n"
                .to_vec()
                .into_response()
        }
        ("GET", "/v1/volumes") => Json(json!([
            {"id": "vol_1", "name": "agent-scratch", "sizeGb": 10, "region": "local", "projectId": "prj_1", "createdAt": "2026-01-01T00:00:00Z"}
        ]))
        .into_response(),
        _ => (StatusCode::NOT_FOUND, Json(json!({"code": "NOT_FOUND", "message": format!("no route for {method} {}", uri.path())})))
            .into_response(),
    }
}

#[test]
fn sandbox_commands_send_the_node_routes_to_the_server() {
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let s = seen.clone();
    let router =
        axum::Router::new().fallback(move |m: Method, u: Uri, h: HeaderMap, b: Bytes| stand_in(s.clone(), m, u, h, b));
    let server = serve(router, tempfile::tempdir().unwrap());
    let last = || seen.lock().unwrap().last().cloned().unwrap();
    let cli = As { url: &server.url, key: "lz_test" };

    // create: the project from --project, else LIZARD_PROJECT; missing → a clear error.
    let id = cli.ok(&["sandbox", "create", "base", "--project", "my-project", "--timeout-ms", "60000", "--env", "A=1"]);
    assert_eq!(id.trim(), "sbx_1");
    let req = last();
    assert_eq!((req.method.as_str(), req.uri.as_str(), req.key.as_deref()), ("POST", "/v1/sandboxes", Some("lz_test")));
    assert_eq!(req.json(), json!({"template": "base", "project": "my-project", "timeoutMs": 60000, "env": {"A": "1"}}));
    let o = Command::new(env!("CARGO_BIN_EXE_lizard"))
        .env("LIZARD_API_URL", &server.url)
        .env("LIZARD_API_KEY", "lz_test")
        .env("LIZARD_PROJECT", "from-env")
        .args(["sandbox", "create", "base", "--metadata", "k=v"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(last().json(), json!({"template": "base", "project": "from-env", "metadata": {"k": "v"}}));
    let n = seen.lock().unwrap().len();
    let o = cli.run(&["sandbox", "create", "base"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("LIZARD_PROJECT"), "{}", stderr(&o));
    assert_eq!(seen.lock().unwrap().len(), n, "nothing sent without a project");
    assert_eq!(cli.json(&["sandbox", "create", "base", "--project", "p"])["projectId"], "prj_1");

    // list / get: human tables show the project and the end; --json is the server's answer.
    let list = cli.ok(&["sandbox", "list"]);
    assert!(
        list.contains("PROJECT") && list.contains("ENDS") && list.contains("sbx_1") && list.contains("prj_1"),
        "{list}"
    );
    assert_eq!(cli.json(&["sandbox", "list"]), json!([sandbox_json("2026-01-01T00:05:00Z")]));
    let got = cli.ok(&["sandbox", "get", "sbx_1"]);
    assert!(got.contains("prj_1") && got.contains("owner=me") && got.contains("2026-01-01T00:05:00Z"), "{got}");

    // set-timeout.
    let o = cli.run(&["sandbox", "set-timeout", "sbx_1", "3600000"]);
    assert!(o.status.success() && stderr(&o).contains("2026-01-01T01:00:00Z"), "{}", stderr(&o));
    let req = last();
    assert_eq!((req.method.as_str(), req.uri.as_str()), ("POST", "/v1/sandboxes/sbx_1/timeout"));
    assert_eq!(req.json(), json!({"timeoutMs": 3600000}));

    // exec streams and exits with the command's status.
    let o = cli.run(&["sandbox", "exec", "sbx_1", "--", "echo", "hi"]);
    assert_eq!((o.status.code(), stdout(&o).as_str()), (Some(7), "hi\n"));
    assert!(stderr(&o).contains("oops"));
    let req = last();
    assert_eq!(req.uri, "/v1/sandboxes/sbx_1/exec?stream=true");
    assert_eq!(req.json(), json!({"argv": ["echo", "hi"]}));
    // A Lizard error is 125, a missing key too.
    let o = cli.run(&["sandbox", "exec", "nope", "--", "true"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(stderr(&o).contains("NOT_FOUND"), "{}", stderr(&o));
    let o = lizard(&server.url, None, &["sandbox", "exec", "sbx_1", "--", "true"], None);
    assert_eq!(o.status.code(), Some(125));

    // Files.
    let o = lizard(&server.url, Some("lz_test"), &["sandbox", "fs", "write", "sbx_1", "/app/a b.txt"], Some(b"hello"));
    assert!(o.status.success(), "{}", stderr(&o));
    let req = last();
    assert_eq!((req.method.as_str(), req.uri.as_str()), ("PUT", "/v1/sandboxes/sbx_1/files?path=%2Fapp%2Fa%20b.txt"));
    assert_eq!(&req.body[..], b"hello");
    assert_eq!(cli.ok(&["sandbox", "fs", "read", "sbx_1", "/app/a.txt"]), "hello");
    assert!(cli.ok(&["sandbox", "fs", "ls", "sbx_1", "/app"]).contains("a.txt"));
    assert_eq!(last().uri, "/v1/sandboxes/sbx_1/files/list?path=%2Fapp");
    cli.ok(&["sandbox", "fs", "mkdir", "sbx_1", "/app/d"]);
    assert_eq!(
        (last().method.as_str(), last().uri.as_str()),
        ("POST", "/v1/sandboxes/sbx_1/files/mkdir?path=%2Fapp%2Fd")
    );
    cli.ok(&["sandbox", "fs", "rm", "sbx_1", "/app/d"]);
    assert_eq!((last().method.as_str(), last().uri.as_str()), ("DELETE", "/v1/sandboxes/sbx_1/files?path=%2Fapp%2Fd"));
    assert!(cli.ok(&["sandbox", "fs", "stat", "sbx_1", "/app/b.txt"]).contains("root:root /app/b.txt -> a.txt"));
    assert_eq!(last().uri, "/v1/sandboxes/sbx_1/files/info?path=%2Fapp%2Fb.txt");
    cli.ok(&["sandbox", "fs", "mv", "sbx_1", "/app/a.txt", "/app/b.txt"]);
    assert_eq!(
        (last().method.as_str(), last().uri.as_str()),
        ("POST", "/v1/sandboxes/sbx_1/files/rename?path=%2Fapp%2Fa.txt&to=%2Fapp%2Fb.txt")
    );
    assert_eq!(cli.ok(&["sandbox", "fs", "download", "sbx_1", "/app"]), "tar bytes");
    assert_eq!(last().uri, "/v1/sandboxes/sbx_1/files/archive?path=%2Fapp");
    let o = lizard(&server.url, Some("lz_test"), &["sandbox", "fs", "upload", "sbx_1", "/app"], Some(b"a tar"));
    assert!(o.status.success() && stderr(&o).contains("unpacked 2 entries"), "{}", stderr(&o));
    assert_eq!((last().method.as_str(), &last().body[..]), ("PUT", &b"a tar"[..]));
    // A watch prints each event as a line; its end is an error (the sandbox paused or left).
    let o = cli.run(&["sandbox", "fs", "watch", "sbx_1", "/app", "-r"]);
    assert_eq!(last().uri, "/v1/sandboxes/sbx_1/files/watch?path=%2Fapp&recursive=true");
    let lines: Vec<String> = String::from_utf8_lossy(&o.stdout).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].contains("\"create\"") && lines[1].contains("\"overflow\""));
    assert!(!o.status.success() && stderr(&o).contains("ended"), "{}", stderr(&o));

    // kill.
    cli.ok(&["sandbox", "kill", "sbx_1"]);
    assert_eq!((last().method.as_str(), last().uri.as_str()), ("DELETE", "/v1/sandboxes/sbx_1"));
    cli.fails(&["sandbox", "get", "gone"], "NOT_FOUND");

    // Volumes, once served, are listed.
    let vols = cli.ok(&["volume", "list"]);
    assert!(vols.contains("agent-scratch") && vols.contains("vol_1"), "{vols}");

    // Every request carried the key.
    assert!(seen.lock().unwrap().iter().all(|r| r.key.as_deref() == Some("lz_test")));
}

#[test]
fn local_mode_refuses_server_only_flags() {
    // Without LIZARD_API_URL these fail before any node is started.
    let dir = tempfile::tempdir().unwrap();
    for args in [&["sandbox", "create", "base", "--timeout-ms", "5"][..], &["sandbox", "set-timeout", "x", "5"]] {
        let mut cmd = common::lizard_command();
        let o = cmd.arg("--data-dir").arg(dir.path()).args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert!(stderr(&o).contains("server mode"), "{args:?}: {}", stderr(&o));
    }
}

/// `lizard server`: prints the owner key on the first start only, serves the API, and
/// exits 0 on SIGTERM. No sandbox is created, so no VM is needed.
#[test]
fn lizard_server_runs_until_sigterm() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::Builder::new().prefix("lizard-cli-serve-").tempdir().unwrap();
    for start in 0..2 {
        // Free ports for both listeners: a server left on the defaults (7171/7172, e.g. by
        // scripts/install.sh) must not decide whether this passes.
        let [port, proxy_port] = free_ports();
        let url = format!("http://127.0.0.1:{port}");
        let mut cmd = common::lizard_command();
        let mut child = cmd
            .arg("--data-dir")
            .arg(dir.path())
            .args(["server", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--proxy-listen", &format!("127.0.0.1:{proxy_port}")])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let key = if start == 0 {
            let line = lines.next().expect("a first line").unwrap();
            let key = line.strip_prefix("LIZARD_API_KEY=").unwrap_or_else(|| panic!("{line}")).to_string();
            std::fs::write(dir.path().join("key"), &key).unwrap();
            key
        } else {
            std::fs::read_to_string(dir.path().join("key")).unwrap()
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let me = loop {
            let o = lizard(&url, Some(&key), &["whoami", "--json"], None);
            if o.status.success() {
                break serde_json::from_slice::<Value>(&o.stdout).unwrap();
            }
            assert!(std::time::Instant::now() < deadline, "the server did not answer: {}", stderr(&o));
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        assert_eq!(me["keyName"], "owner");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM)
            .unwrap();
        assert!(child.wait().unwrap().success(), "exit status after SIGTERM");
        let rest: Vec<String> = lines.map_while(|l| l.ok()).collect();
        assert!(
            rest.iter().all(|l| !l.contains("LIZARD_API_KEY")),
            "the key is shown on the first start only: {rest:?}"
        );
    }
    assert!(dir.path().join("lizard.db").exists());
}

/// `N` distinct free loopback ports (held open together while chosen, so they differ).
fn free_ports<const N: usize>() -> [u16; N] {
    let held: [std::net::TcpListener; N] = std::array::from_fn(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    held.map(|l| l.local_addr().unwrap().port())
}

/// `lizard tls init` mints a CA and a wildcard certificate that `lizard server
/// --proxy-tls-listen` serves by default: curl, trusting only that CA, reaches the
/// sandbox-URL listener over HTTPS. A second init keeps the CA and re-mints the
/// certificate under it. The keys are readable by their owner only.
#[test]
fn tls_init_makes_a_certificate_the_servers_tls_listener_serves() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new().prefix("lizard-cli-tls-").tempdir().unwrap();
    let tls = dir.path().join("tls");
    let init = || {
        let o = common::lizard_command().arg("--data-dir").arg(dir.path()).args(["tls", "init"]).output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8(o.stdout).unwrap()
    };
    let said = init();
    assert!(said.contains("*.sandbox.local.lizard.localhost") && said.contains("SSL_CERT_FILE="), "{said}");
    for key in ["key.pem", "ca-key.pem"] {
        let mode = std::fs::metadata(tls.join(key)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{key}");
    }
    let bundle = std::fs::read_to_string(tls.join("bundle.pem")).unwrap();
    assert!(bundle.ends_with(&std::fs::read_to_string(tls.join("ca.pem")).unwrap()));

    let [port, proxy_port, tls_port] = free_ports();
    let mut child = common::lizard_command()
        .arg("--data-dir")
        .arg(dir.path())
        .args(["server", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--proxy-listen", &format!("127.0.0.1:{proxy_port}")])
        .args(["--proxy-tls-listen", &format!("127.0.0.1:{tls_port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let host = "sbxnosuch-8000.sandbox.local.lizard.localhost";
    let curl = |ca: &std::path::Path| {
        Command::new("curl")
            .args(["-sS", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
            .arg(ca)
            .args(["--resolve", &format!("{host}:{tls_port}:127.0.0.1")])
            .arg(format!("https://{host}:{tls_port}/"))
            .output()
            .unwrap()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let answered = loop {
        let o = curl(&tls.join("ca.pem"));
        if o.status.success() {
            break String::from_utf8(o.stdout).unwrap();
        }
        assert!(std::time::Instant::now() < deadline, "no HTTPS answer: {}", stderr(&o));
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(answered, "404", "the listener's own answer for a host that names no sandbox");
    // A client that does not trust the CA refuses the certificate.
    let refused = curl(std::path::Path::new("/etc/ssl/certs/ca-certificates.crt"));
    assert!(!refused.status.success(), "verified without the local CA");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    assert!(child.wait().unwrap().success(), "exit status after SIGTERM");

    let (ca, cert) = (std::fs::read(tls.join("ca.pem")).unwrap(), std::fs::read(tls.join("cert.pem")).unwrap());
    init();
    assert_eq!(std::fs::read(tls.join("ca.pem")).unwrap(), ca, "the CA is kept");
    assert_ne!(std::fs::read(tls.join("cert.pem")).unwrap(), cert, "the certificate is new");
    let verified = Command::new("openssl")
        .args(["verify", "-CAfile"])
        .arg(tls.join("ca.pem"))
        .arg(tls.join("cert.pem"))
        .output()
        .unwrap();
    assert!(verified.status.success(), "{}", String::from_utf8_lossy(&verified.stdout));
}
