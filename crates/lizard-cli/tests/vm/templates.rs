//! Templates as code end to end: a real `lizard server` (with its sandbox-URL proxy), the
//! `lizard push` / `lizard template …` commands, real build VMs.
//!
//! One successful push is shared by most assertions (builds are minutes under TCG): its
//! sandbox answers through the sandbox URL right after create; a second push with the
//! last step changed shows the earlier steps cached; every bad input gets its code and
//! leaves no VMM process, layer or network namespace behind; a key of another workspace
//! can neither see nor use the template; a delete waits for its sandbox.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

use crate::common;

use common::server::{assert_left_nothing, footprint, Server, Tenants};
use common::stderr;
use lizard_api::routes;
use lizard_api::templates::{ContextEntry, ContextEntryKind, PushTemplateRequest, RecipeFormat};
use lizard_cli::client::{json_body, Call};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const FILES: &[(&str, &str, u32)] = &[
    ("tools/hello.sh", "#!/bin/sh\necho \"hello-$GREETING\"\n", 0o755),
    ("srv/index.html", "<h1>served from the snapshot</h1>\n", 0o644),
];

fn recipe(name: &str, from: &str, last_run: &str) -> String {
    format!(
        r#"
name = "{name}"
from = "{from}"
[build]
vcpus = 1
memory_mib = 1024
[[steps]]
apt = ["jq", "passwd"]
[[steps]]
run = "useradd --create-home builder && mkdir -p /srv && chown builder /srv"
[[steps]]
copy = {{ src = "tools", dest = "/opt/tools/" }}
[[steps]]
copy = {{ src = "srv/index.html", dest = "/srv/", owner = "builder" }}
[[steps]]
env = {{ GREETING = "world" }}
[[steps]]
workdir = "/srv"
[[steps]]
user = "builder"
[[steps]]
run = "{last_run}"
[env]
MODE = "test"
[start]
cmd = "python3 -m http.server 8080 --bind 127.0.0.1 --directory /srv"
ready = {{ port = 8080 }}
"#
    )
}

/// A directory to push: the files above and `lizard.template.toml`.
fn pushed_dir(parent: &Path, dir: &str, recipe_text: &str) -> PathBuf {
    let root = parent.join(dir);
    for (path, content, mode) in FILES {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, content).unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(*mode)).unwrap();
    }
    std::fs::write(root.join(lizard_recipe::RECIPE_FILE), recipe_text).unwrap();
    root
}

/// GET /index.html through the sandbox-URL proxy.
fn get_through_proxy(server: &Server, sandbox: &str, domain: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", server.proxy_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET /index.html HTTP/1.1\r\nHost: {sandbox}-8080.{domain}\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
}

/// Push through the API directly (the CLI checks some of these itself before sending).
fn push_api(server: &Server, key: &str, req: &PushTemplateRequest) -> lizard_api::ApiError {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let api = server.api(key);
    let err = rt
        .block_on(api.json::<serde_json::Value>(&Call::new(&routes::PUSH_TEMPLATE, &[]), json_body(req)))
        .expect_err("the push is refused");
    err.downcast_ref::<lizard_api::ApiError>().cloned().unwrap_or_else(|| panic!("not an API error: {err:#}"))
}

fn file_entry(path: &str, content: &[u8]) -> ContextEntry {
    ContextEntry {
        path: path.into(),
        mode: 0o644,
        kind: ContextEntryKind::File,
        sha256: Some(hex::encode(<sha2::Sha256 as sha2::Digest>::digest(content))),
        size: Some(content.len() as u64),
        target: None,
    }
}

fn dir_entry(path: &str) -> ContextEntry {
    ContextEntry { path: path.into(), mode: 0o755, kind: ContextEntryKind::Dir, sha256: None, size: None, target: None }
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn pushed_templates_end_to_end() {
    let (data, server, Tenants { wa, key_a, key_b, .. }) = Server::with_tenants("lizard-templates-");
    let work = tempfile::tempdir().unwrap();
    let clean = footprint(data.path());

    // --- a push with every step kind and a start command ---------------------------------
    let dir = pushed_dir(work.path(), "web", &recipe("web", "base", "echo first > /srv/marker"));
    let started = Instant::now();
    let o = server.lizard(&key_a, &["push", dir.to_str().unwrap()]);
    let cold = started.elapsed();
    assert!(o.status.success(), "push: {}", stderr(&o));
    let progress = stderr(&o);
    assert!(progress.contains("[1/8] apt jq") && progress.contains("is ready"), "{progress}");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "web");
    eprintln!("cold push: {:.1}s", cold.as_secs_f64());
    let info = json(&server.ok(&key_a, &["--json", "template", "get", "web"]));
    assert_eq!((info["ready"].as_bool(), info["workspaceId"].as_str()), (Some(true), Some(wa.as_str())), "{info}");
    let listed = json(&server.ok(&key_a, &["--json", "template", "list"]));
    let names: Vec<&str> = listed.as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(names.contains(&"base") && names.contains(&"web"), "{names:?}");

    // A sandbox of it answers through its URL at once: the server started in the snapshot.
    let created = json(&server.ok(&key_a, &["--json", "sandbox", "create", "web", "--project", "pa"]));
    let (sandbox, domain) = (created["sandboxId"].as_str().unwrap(), created["domain"].as_str().unwrap());
    assert_eq!(created["template"], "web", "clients see the name, not the node's ref");
    let page = get_through_proxy(&server, sandbox, domain);
    assert!(
        page.starts_with("HTTP/1.") && page.contains(" 200 ") && page.contains("served from the snapshot"),
        "{page}"
    );
    let exec = |cmd: &str| server.ok(&key_a, &["sandbox", "exec", sandbox, "--shell", cmd]);
    assert_eq!(exec("/opt/tools/hello.sh").trim(), "hello-world");
    assert_eq!(exec("echo $MODE $(pwd) $(whoami) $(cat /srv/marker)").trim(), "test /srv builder first");
    assert!(exec("jq --version").starts_with("jq-"));

    // --- the last step changed: only it runs again ----------------------------------------
    std::fs::write(dir.join(lizard_recipe::RECIPE_FILE), recipe("web", "base", "echo second > /srv/marker")).unwrap();
    let started = Instant::now();
    let build_id = server.ok(&key_a, &["push", dir.to_str().unwrap(), "--detach"]).trim().to_string();
    let o = server.lizard(&key_a, &["template", "logs", "web", "--build", &build_id, "--follow"]);
    assert!(o.status.success(), "{}", stderr(&o));
    eprintln!("push with one changed step: {:.1}s", started.elapsed().as_secs_f64());
    let build = json(&server.ok(&key_a, &["--json", "template", "logs", "web", "--build", &build_id]));
    let cached: Vec<bool> = build["steps"].as_array().unwrap().iter().map(|s| s["cached"].as_bool().unwrap()).collect();
    assert_eq!(cached, [true, true, true, true, true, true, true, false], "{build}");
    let info = json(&server.ok(&key_a, &["--json", "template", "get", "web"]));
    assert_eq!(info["buildId"].as_str(), Some(build_id.as_str()));
    // The running sandbox keeps the build it started from.
    assert_eq!(exec("cat /srv/marker").trim(), "first");

    // --- a Dockerfile builds the same template as its TOML twin ------------------------------
    let twin_toml = r#"
name = "twin-toml"
from = "web"
[[steps]]
copy = { src = "srv/index.html", dest = "/srv/" }
[[steps]]
run = "echo twin > /srv/twin"
"#;
    let toml_dir = pushed_dir(work.path(), "twin-toml", twin_toml);
    server.ok(&key_a, &["push", toml_dir.to_str().unwrap()]);
    let docker_dir = pushed_dir(work.path(), "twin-docker", "");
    std::fs::remove_file(docker_dir.join(lizard_recipe::RECIPE_FILE)).unwrap();
    std::fs::write(docker_dir.join("Dockerfile"), "FROM web\nCOPY srv/index.html /srv/\nRUN echo twin > /srv/twin\n")
        .unwrap();
    let twin = server.ok(&key_a, &["push", docker_dir.to_str().unwrap(), "--name", "twin-docker", "--detach"]);
    let o = server.lizard(&key_a, &["template", "logs", "twin-docker", "--build", twin.trim(), "--follow"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let build = json(&server.ok(&key_a, &["--json", "template", "logs", "twin-docker"]));
    let cached: Vec<bool> = build["steps"].as_array().unwrap().iter().map(|s| s["cached"].as_bool().unwrap()).collect();
    assert_eq!(cached, [true, true], "every layer is its TOML twin's: {build}");

    // --- another workspace's key cannot see or use it ---------------------------------------
    for args in [
        vec!["template", "get", "web"],
        vec!["template", "logs", "web", "--build", &build_id],
        vec!["template", "delete", "web"],
        vec!["template", "cancel", "web", "--build", &build_id],
        vec!["sandbox", "create", "web", "--project", "pb"],
        vec!["template", "get", "web", "--workspace", &wa],
    ] {
        let err = server.fails(&key_b, &args);
        assert!(err.contains("NOT_FOUND"), "{args:?}: {err}");
    }
    let seen = server.ok(&key_b, &["template", "list"]);
    assert!(!seen.lines().any(|l| l.starts_with("web ")), "{seen}");

    // --- bad input: a clear code, nothing left behind --------------------------------------
    let with_sandbox = footprint(data.path());
    let bad = |name: &str, text: &str| pushed_dir(work.path(), name, text);
    let unknown_base = bad("unknown", &recipe("unknown", "no-such-base", "true"));
    let err = server.fails(&key_a, &["push", unknown_base.to_str().unwrap()]);
    assert!(err.contains("NOT_FOUND") && err.contains("no-such-base"), "{err}");
    let builtin = bad("builtin", &recipe("base", "base", "true"));
    assert!(server.fails(&key_a, &["push", builtin.to_str().unwrap()]).contains("CONFLICT"));
    let symlink = bad("symlink", &recipe("symlink", "base", "true"));
    std::os::unix::fs::symlink("../../../etc/passwd", symlink.join("tools/passwd")).unwrap();
    let err = server.fails(&key_a, &["push", symlink.to_str().unwrap()]);
    assert!(err.contains("INVALID_ARGUMENT") && err.contains("outside the pushed directory"), "{err}");
    assert_left_nothing(data.path(), &with_sandbox, "refused pushes");

    let failing = bad("failing", &recipe("failing", "base", "echo about-to-fail; exit 3"));
    let o = server.lizard(&key_a, &["push", failing.to_str().unwrap()]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("STEP_FAILED: step 8") && err.contains("about-to-fail"), "{err}");
    let failed = json(&server.ok(&key_a, &["--json", "template", "get", "failing"]));
    assert_eq!(failed["ready"], false);
    let err = server.fails(&key_a, &["sandbox", "create", "failing", "--project", "pa"]);
    assert!(err.contains("NOT_FOUND"), "nothing half-built is usable: {err}");
    assert_left_nothing(data.path(), &with_sandbox, "a failed build");

    // A build past its time limit, and one cancelled midway: both leave nothing.
    let slow = |name: &str, timeout: &str| {
        format!("name = \"{name}\"\nfrom = \"base\"\n[build]\nvcpus = 1\nmemory_mib = 512\n{timeout}\n[[steps]]\nrun = \"sleep 600\"\n")
    };
    let timed = bad("timed", &slow("timed", "timeout_s = 15"));
    let err = server.fails(&key_a, &["push", timed.to_str().unwrap()]);
    assert!(err.contains("TIMED_OUT"), "{err}");
    assert_left_nothing(data.path(), &with_sandbox, "a build past its time limit");
    let cancelled = bad("cancelled", &slow("cancelled", ""));
    let build = server.ok(&key_a, &["push", cancelled.to_str().unwrap(), "--detach"]).trim().to_string();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        // Cancel once its step runs (in the build VM).
        let b = json(&server.ok(&key_a, &["--json", "template", "logs", "cancelled", "--build", &build]));
        if b["steps"].as_array().is_some_and(|s| !s.is_empty()) {
            break;
        }
        assert!(Instant::now() < deadline, "the build never started its step: {b}");
        std::thread::sleep(Duration::from_millis(500));
    }
    server.ok(&key_a, &["template", "cancel", "cancelled"]);
    let o = server.lizard(&key_a, &["template", "logs", "cancelled", "--build", &build, "--follow"]);
    assert!(!o.status.success() && stderr(&o).contains("CANCELLED"), "{}", stderr(&o));
    let b = json(&server.ok(&key_a, &["--json", "template", "logs", "cancelled", "--build", &build]));
    assert_eq!(b["status"], "cancelled", "{b}");
    assert_left_nothing(data.path(), &with_sandbox, "a cancelled build");

    // What the CLI would refuse itself, sent as it is.
    // The same contents as the first push's, which workspace A uploaded then.
    let uploaded = vec![
        dir_entry("srv"),
        file_entry("srv/index.html", FILES[1].1.as_bytes()),
        dir_entry("tools"),
        ContextEntry { mode: 0o755, ..file_entry("tools/hello.sh", FILES[0].1.as_bytes()) },
    ];
    let base_req = PushTemplateRequest {
        recipe: recipe("direct", "base", "true"),
        format: RecipeFormat::Toml,
        name: None,
        files: uploaded,
        workspace: None,
        project: None,
    };
    let cases = [
        ("copy ../", recipe("direct", "base", "true").replace("src = \"tools\"", "src = \"../etc\""), None),
        ("copy absolute", recipe("direct", "base", "true").replace("src = \"tools\"", "src = \"/etc\""), None),
        ("invalid name", recipe("Bad_Name", "base", "true"), None),
        (
            "missing blob",
            recipe("direct", "base", "true"),
            Some(vec![dir_entry("tools"), file_entry("tools/new.sh", b"never uploaded")]),
        ),
        (
            "over the size limit",
            recipe("direct", "base", "true"),
            Some(vec![dir_entry("tools"), ContextEntry { size: Some(1 << 40), ..file_entry("tools/big", b"x") }]),
        ),
    ];
    for (what, text, files) in cases {
        let req = PushTemplateRequest {
            recipe: text,
            files: files.unwrap_or_else(|| base_req.files.clone()),
            ..base_req.clone()
        };
        let e = push_api(&server, &key_a, &req);
        assert_eq!(e.code, lizard_api::ErrorCode::InvalidArgument, "{what}: {e:?}");
        assert!(!e.message.contains(data.path().to_str().unwrap()), "{what}: a host path in {e:?}");
    }
    assert_left_nothing(data.path(), &with_sandbox, "refused API pushes");

    // --- delete waits for the sandbox ---------------------------------------------------------
    let err = server.fails(&key_a, &["template", "delete", "web"]);
    assert!(err.contains("CONFLICT") && err.contains(sandbox), "{err}");
    server.ok(&key_a, &["sandbox", "kill", sandbox]);
    server.ok(&key_a, &["template", "delete", "web"]);
    server.ok(&key_a, &["template", "delete", "failing"]);
    server.ok(&key_a, &["template", "delete", "twin-toml"]);
    server.ok(&key_a, &["template", "delete", "twin-docker"]);
    server.ok(&key_a, &["template", "delete", "timed"]);
    server.ok(&key_a, &["template", "delete", "cancelled"]);
    assert!(server.fails(&key_a, &["template", "get", "web"]).contains("NOT_FOUND"));
    assert!(server.fails(&server.key, &["template", "delete", "base"]).contains("FORBIDDEN"));
    assert_left_nothing(data.path(), &clean, "the deleted templates");
}
