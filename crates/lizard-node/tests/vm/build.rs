//! Template builds in real microVMs: every step kind (pip aside: `base` has no pip), the
//! start command running in the template snapshot, the layer cache, templates built on
//! built ones, delete and its refusals, a node restart, and every way a build can fail —
//! each proven to leave nothing behind (VMM processes, layers, sandbox directories,
//! network namespaces, registry entries).

// Helpers of these tests unwrap as the tests do (clippy.toml's allow-unwrap-in-tests
// covers only the #[test] functions themselves).
#![allow(clippy::unwrap_used)]

use crate::common;

use common::sh;
use lizard_api::templates::{BuildEvent, BuildStatus};
use lizard_api::CreateSandboxRequest;
use lizard_node::network::NetworkConfig;
use lizard_node::{BuildError, BuildTemplate, BuiltTemplate, Node, NodeError, Result};
use lizard_recipe::{Context, ContextLimits, EntryKind, Recipe};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Namespace and link prefixes of this test's own, so that counts are not disturbed by
/// other nodes on the machine.
fn own_prefixes(c: &mut NetworkConfig) {
    let tag: String = (0..3).map(|_| char::from(b'a' + rand::random::<u8>() % 26)).collect();
    c.netns_prefix = format!("lizard-b{tag}-");
    c.link_prefix = format!("lzb{tag}");
}

async fn test_node() -> (common::TestNode, String, String) {
    let (mut netns, mut links) = (String::new(), String::new());
    let t = common::node_with(|c| {
        let n = c.network.as_mut().expect("the tests run as root: networking is on");
        own_prefixes(n);
        (netns, links) = (n.netns_prefix.clone(), n.link_prefix.clone());
    })
    .await;
    (t, netns, links)
}

fn drop_host_rules(link_prefix: &str) {
    let _ = Command::new("nft").args(["delete", "table", "ip", &format!("lizard_{link_prefix}")]).status();
}

/// A pushed directory: the files, then the context and the blob store a server would
/// have made of it.
struct Pushed {
    dir: tempfile::TempDir,
    blobs: tempfile::TempDir,
}

impl Pushed {
    fn new(files: &[(&str, &str, u32)], links: &[(&str, &str)]) -> Pushed {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        for (path, content, mode) in files {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, content).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode)).unwrap();
        }
        for (path, target) in links {
            std::os::unix::fs::symlink(target, dir.path().join(path)).unwrap();
        }
        Pushed { dir, blobs: tempfile::tempdir().unwrap() }
    }

    fn context(&self) -> Context {
        let ctx = Context::scan(self.dir.path(), ContextLimits::default()).unwrap();
        for e in &ctx.entries {
            if let EntryKind::File { sha256, .. } = &e.kind {
                std::fs::copy(self.dir.path().join(&e.path), self.blobs.path().join(sha256)).unwrap();
            }
        }
        ctx
    }

    fn request(&self, template_ref: &str, base: &str, recipe: &str) -> BuildTemplate {
        BuildTemplate {
            template_ref: template_ref.into(),
            display_name: "test-template".into(),
            recipe: Recipe::from_toml(recipe).unwrap(),
            base_ref: base.into(),
            context: self.context(),
            blobs: self.blobs.path().to_path_buf(),
        }
    }
}

/// Run a build to its end, collecting its events.
async fn build(node: &Arc<Node>, req: BuildTemplate) -> (Result<BuiltTemplate>, Vec<BuildEvent>) {
    build_with(node, req, CancellationToken::new(), |_| {}).await
}

/// Run a build, calling `watch` with each event as it arrives.
async fn build_with(
    node: &Arc<Node>,
    req: BuildTemplate,
    cancel: CancellationToken,
    mut watch: impl FnMut(&BuildEvent),
) -> (Result<BuiltTemplate>, Vec<BuildEvent>) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let node = node.clone();
    let task = tokio::spawn(async move { node.build_template(req, tx, cancel).await });
    let mut events = vec![];
    while let Some(e) = rx.recv().await {
        watch(&e);
        events.push(e);
    }
    (task.await.unwrap(), events)
}

/// A cancel token, and a watcher for [`build_with`] that cancels it `delay` after the first
/// event `at` matches, noting when (in the returned cell).
fn cancel_after(
    delay: Duration,
    at: fn(&BuildEvent) -> bool,
) -> (CancellationToken, impl FnMut(&BuildEvent), Arc<std::sync::Mutex<Option<Instant>>>) {
    let cancel = CancellationToken::new();
    let cancelled_at = Arc::new(std::sync::Mutex::new(None));
    let (trigger, noted) = (cancel.clone(), cancelled_at.clone());
    let mut armed = false;
    let watch = move |e: &BuildEvent| {
        if !armed && at(e) {
            armed = true;
            let (trigger, noted) = (trigger.clone(), noted.clone());
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                *noted.lock().unwrap() = Some(Instant::now());
                trigger.cancel();
            });
        }
    };
    (cancel, watch, cancelled_at)
}

/// What a build could leave behind.
#[derive(Debug, PartialEq, Eq)]
struct Footprint {
    vmms: usize,
    layers: BTreeSet<String>,
    sandboxes: BTreeSet<String>,
    netns: BTreeSet<String>,
    templates: Vec<String>,
}

fn names(dir: &Path, prefix: &str) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|n: &String| n.starts_with(prefix))
        .collect()
}

fn footprint(node: &Node, data: &Path, netns_prefix: &str) -> Footprint {
    Footprint {
        vmms: common::vmm_processes(data).len(),
        layers: names(&data.join("template-layers"), ""),
        sandboxes: names(&data.join("sandboxes"), ""),
        netns: names(Path::new("/run/netns"), netns_prefix),
        templates: node.built_templates(),
    }
}

const CONTEXT_FILES: &[(&str, &str, u32)] = &[
    ("tools/hello.sh", "#!/bin/sh\necho \"hello-$GREETING\"\n", 0o755),
    ("tools/data/readme.txt", "read me\n", 0o640),
    ("srv/index.html", "<h1>served from the snapshot</h1>\n", 0o644),
    ("unused.txt", "never copied\n", 0o644),
];

fn full_recipe(last_run: &str) -> String {
    format!(
        r#"
name = "every-step"
from = "base"
[build]
vcpus = 1
memory_mib = 1024
disk_gb = 5
[[steps]]
apt = ["jq"]
[[steps]]
npm = ["is-number@7.0.0"]
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

async fn out(node: &Node, id: &str, cmd: &str) -> String {
    let r = node.get(id).unwrap().exec_collect(sh(cmd)).await.unwrap();
    assert_eq!(r.exit_code, 0, "{cmd}: {r:?}");
    r.stdout.trim().to_owned()
}

/// GET / through the agent's tunnel to guest port 8080.
async fn get_index(node: &Node, id: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tunnel = node.get(id).unwrap().connect_port(8080).await.expect("the start command's server is up");
    tunnel.write_all(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), tunnel.read_to_end(&mut answer)).await.unwrap().unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn a_template_with_every_step_kind_its_cache_and_its_deletion() {
    let (t, netns, links) = test_node().await;
    let node = t.node.clone();
    let pushed = Pushed::new(CONTEXT_FILES, &[("tools/link.sh", "hello.sh")]);

    let started = Instant::now();
    let (built, events) =
        build(&node, pushed.request("tb-full-1", "base", &full_recipe("echo first > /srv/marker"))).await;
    let cold = started.elapsed();
    let built = built.unwrap_or_else(|e| panic!("build failed: {e}; events: {events:#?}"));
    assert_eq!(built.steps.len(), 9);
    assert!(built.steps.iter().all(|s| !s.cached && s.status == BuildStatus::Ready), "{:?}", built.steps);
    assert!(built.layer_bytes > 0);
    let starts: Vec<(u32, bool)> = events
        .iter()
        .filter_map(|e| match e {
            BuildEvent::Step { index, total: 9, cached, .. } => Some((*index, *cached)),
            _ => None,
        })
        .collect();
    assert_eq!(starts, (1..=9).map(|i| (i, false)).collect::<Vec<_>>());
    assert!(events.iter().any(|e| matches!(e, BuildEvent::Output { data, .. } if data.contains("jq"))));
    assert!(!events.iter().any(|e| matches!(e, BuildEvent::Done { .. })), "Done is the caller's to send");

    // A sandbox of it: restored with the server already running — the tunnel is the
    // first thing that touches it.
    let req = CreateSandboxRequest { template: "tb-full-1".into(), ..Default::default() };
    let s = node.create(req).await.unwrap();
    assert!(s.from_snapshot(), "the build made the template snapshot");
    let page = get_index(&node, &s.id).await;
    assert!(page.starts_with("HTTP/1.0 200") && page.contains("served from the snapshot"), "{page}");
    assert_eq!(out(&node, &s.id, "pwd").await, "/srv");
    assert_eq!(out(&node, &s.id, "id -un").await, "builder");
    assert_eq!(out(&node, &s.id, "echo $GREETING-$MODE").await, "world-test");
    assert_eq!(out(&node, &s.id, "/opt/tools/link.sh").await, "hello-world");
    assert_eq!(out(&node, &s.id, "readlink /opt/tools/link.sh").await, "hello.sh");
    assert_eq!(out(&node, &s.id, "stat -c %a /opt/tools/hello.sh /opt/tools/data/readme.txt").await, "755\n640");
    assert_eq!(out(&node, &s.id, "stat -c %U /srv/index.html /opt/tools/hello.sh").await, "builder\nroot");
    assert_eq!(out(&node, &s.id, "cat /srv/marker; test ! -e /opt/tools/unused.txt && echo ok").await, "first\nok");
    assert!(out(&node, &s.id, "jq --version").await.starts_with("jq-"));
    // `disk_gb = 5` grew the base's 4 GiB root file system.
    let root_kib: u64 = out(&node, &s.id, "df -k --output=size / | tail -1").await.parse().unwrap();
    assert!(root_kib > 4_700_000, "root file system of {root_kib} KiB");
    assert!(events.iter().any(|e| matches!(e, BuildEvent::Phase { message } if message.contains("5 GiB"))));
    assert_eq!(
        out(&node, &s.id, "test -f /usr/local/lib/node_modules/is-number/package.json && echo npm-ok").await,
        "npm-ok"
    );
    // The request's env wins over the template's, its user and directory too.
    let req = CreateSandboxRequest {
        template: "tb-full-1".into(),
        env: [("GREETING".to_owned(), "override".to_owned())].into(),
        ..Default::default()
    };
    let s2 = node.create(req).await.unwrap();
    assert_eq!(out(&node, &s2.id, "echo $GREETING").await, "override");
    let as_root = lizard_api::ExecRequest { user: Some("root".into()), cwd: Some("/tmp".into()), ..sh("id -un; pwd") };
    assert_eq!(node.get(&s2.id).unwrap().exec_collect(as_root).await.unwrap().stdout, "root\n/tmp\n");
    node.kill(&s2.id).await.unwrap();

    // Delete is refused while a sandbox uses it.
    let e = node.delete_template("tb-full-1").await.unwrap_err();
    assert!(matches!(e, NodeError::TemplateInUse { .. }), "{e}");
    assert_eq!(e.to_api().code, lizard_api::ErrorCode::Conflict);
    node.kill(&s.id).await.unwrap();

    // Only the last step changed: every other step comes from the cache.
    let before = footprint(&node, t.dir.path(), &netns);
    let started = Instant::now();
    let (rebuilt, events) =
        build(&node, pushed.request("tb-full-2", "base", &full_recipe("echo second > /srv/marker"))).await;
    let warm = started.elapsed();
    let rebuilt = rebuilt.unwrap_or_else(|e| panic!("rebuild failed: {e}; events: {events:#?}"));
    println!(
        "cold build {cold:?}, rebuild with one changed step {warm:?}; layers over the base: {} KiB and {} KiB \
         (all but the last shared)",
        built.layer_bytes / 1024,
        rebuilt.layer_bytes / 1024
    );
    let cached: Vec<bool> = rebuilt.steps.iter().map(|s| s.cached).collect();
    assert_eq!(cached, [true, true, true, true, true, true, true, true, false]);
    assert!(warm < cold, "the rebuild ({warm:?}) took no less than the cold build ({cold:?})");
    let after = footprint(&node, t.dir.path(), &netns);
    assert_eq!(after.layers.len(), before.layers.len() + 1, "one new layer: {:?} → {:?}", before.layers, after.layers);

    // Templates survive a node restart.
    node.shutdown().await;
    drop(node);
    drop(t.node);
    let node = Node::start(lizard_node::NodeConfig {
        network: {
            let mut n = NetworkConfig::default();
            (n.netns_prefix, n.link_prefix) = (netns.clone(), links.clone());
            Some(n)
        },
        image_root: common::image_root(),
        ..lizard_node::NodeConfig::new(t.dir.path())
    })
    .await
    .unwrap();
    assert_eq!(node.built_templates(), ["tb-full-1", "tb-full-2"]);
    let s = node.create(CreateSandboxRequest { template: "tb-full-2".into(), ..Default::default() }).await.unwrap();
    assert_eq!(out(&node, &s.id, "cat marker").await, "second");
    node.kill(&s.id).await.unwrap();

    // Deleting the second removes only its own layer; the shared ones stay for the first.
    node.delete_template("tb-full-2").await.unwrap();
    assert_eq!(footprint(&node, t.dir.path(), &netns).layers, before.layers);

    // A template built on a built one: its chain holds its base's layers (deleting the
    // base leaves it whole), it runs as its base's user in its base's directory, and it
    // starts its base's start command.
    let child = format!("{QUICK}[[steps]]\nrun = \"cat marker > child-marker\"\n");
    let (r, events) = build(&node, pushed.request("tb-child", "tb-full-1", &child)).await;
    r.unwrap_or_else(|e| panic!("child build failed: {e}; events: {events:#?}"));
    let with_child = footprint(&node, t.dir.path(), &netns).layers;
    assert_eq!(with_child.len(), before.layers.len() + 1);
    node.delete_template("tb-full-1").await.unwrap();
    assert_eq!(footprint(&node, t.dir.path(), &netns).layers, with_child);
    let s = node.create(CreateSandboxRequest { template: "tb-child".into(), ..Default::default() }).await.unwrap();
    assert!(get_index(&node, &s.id).await.contains("served from the snapshot"));
    assert_eq!(out(&node, &s.id, "id -un; cat child-marker").await, "builder\nfirst");
    node.kill(&s.id).await.unwrap();
    node.delete_template("tb-child").await.unwrap();
    let gone = footprint(&node, t.dir.path(), &netns);
    assert!(gone.layers.is_empty() && gone.templates.is_empty(), "{gone:?}");
    let e = node.delete_template("tb-full-1").await.unwrap_err();
    assert_eq!(e.to_api().code, lizard_api::ErrorCode::NotFound);
    let e = node.create(CreateSandboxRequest { template: "tb-full-1".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(e.to_api().code, lizard_api::ErrorCode::InvalidArgument, "{e}");
    node.shutdown().await;
    common::assert_no_leftovers(t.dir.path());
    drop_host_rules(&links);
}

const QUICK: &str = "name = \"q\"\nfrom = \"base\"\n[build]\nvcpus = 1\nmemory_mib = 512\n";

#[tokio::test]
async fn failed_builds_say_why_and_leave_nothing() {
    let (t, netns, links) = test_node().await;
    let node = t.node.clone();
    let pushed = Pushed::new(&[("tools/a.sh", "echo a", 0o755)], &[("tools/out", "../../etc/passwd")]);
    let pushed_ok = Pushed::new(&[("tools/a.sh", "echo a", 0o755)], &[]);
    let clean = footprint(&node, t.dir.path(), &netns);
    let check_clean = |what: &str| {
        let now = footprint(&node, t.dir.path(), &netns);
        assert_eq!(now, clean, "{what} left something behind");
    };

    // A failing step: named, with its output tail; the layer of the step before it
    // (made by this build) is gone too.
    let recipe = format!(
        "{QUICK}[[steps]]\nrun = \"echo made > /made\"\n[[steps]]\nrun = \"echo about to fail; echo the-cause >&2; exit 3\"\n"
    );
    let (r, _) = build(&node, pushed_ok.request("tb-fail", "base", &recipe)).await;
    let e = r.unwrap_err();
    let f = e.build_failure().expect("a build failure");
    assert_eq!((f.code.as_str(), f.step), ("STEP_FAILED", Some(2)), "{f:?}");
    assert!(f.output_tail.as_deref().unwrap_or_default().contains("the-cause"), "{f:?}");
    assert!(f.message.contains("exit code 3"), "{f:?}");
    check_clean("a failed step");

    // Past the time limit, in a build VM without internet.
    let recipe = format!("{QUICK}[[steps]]\nrun = \"sleep 600\"\n")
        .replace("memory_mib = 512", "memory_mib = 512\ntimeout_s = 20\ninternet = false");
    let (r, _) = build(&node, pushed_ok.request("tb-slow", "base", &recipe)).await;
    let e = r.unwrap_err();
    assert!(matches!(e, NodeError::Build(BuildError::TimedOut { limit_s: 20 })), "{e}");
    assert_eq!(e.build_failure().unwrap().code, "TIMED_OUT");
    check_clean("a timeout");

    // Cancelled while a step runs.
    let recipe = format!("{QUICK}[[steps]]\nrun = \"echo first > /x\"\n[[steps]]\nrun = \"sleep 600\"\n");
    let (cancel, watch, _) = cancel_after(Duration::from_secs(1), |e| matches!(e, BuildEvent::Step { index: 2, .. }));
    let (r, _) = build_with(&node, pushed_ok.request("tb-cancel", "base", &recipe), cancel, watch).await;
    let e = r.unwrap_err();
    assert_eq!(e.build_failure().unwrap().code, "CANCELLED", "{e}");
    check_clean("a cancel");

    // A copy of a symlink that points out of the pushed directory: refused before
    // anything boots.
    let recipe = format!("{QUICK}[[steps]]\ncopy = {{ src = \"tools\", dest = \"/opt/\" }}\n");
    let (r, _) = build(&node, pushed.request("tb-escape", "base", &recipe)).await;
    let e = r.unwrap_err();
    let f = e.build_failure().unwrap();
    assert_eq!((f.code.as_str(), f.step), ("INVALID_ARGUMENT", Some(1)), "{f:?}");
    assert!(f.message.contains("outside the pushed directory"), "{f:?}");
    check_clean("a refused copy");

    // An unknown base.
    let (r, _) = build(&node, pushed_ok.request("tb-orphan", "no-such-base", QUICK)).await;
    let e = r.unwrap_err();
    assert_eq!(e.to_api().code, lizard_api::ErrorCode::NotFound);
    assert_eq!(e.to_api().message, "template no-such-base not found");
    check_clean("an unknown base");

    // A start command that never gets ready: the build fails and is not registered.
    let recipe =
        format!("{QUICK}[start]\ncmd = \"echo starting-up; sleep 600\"\nready = {{ port = 9 }}\nready_timeout_s = 5\n");
    let (r, _) = build(&node, pushed_ok.request("tb-never", "base", &recipe)).await;
    let e = r.unwrap_err();
    let f = e.build_failure().unwrap();
    assert_eq!(f.code, "START_NOT_READY", "{e}");
    assert!(f.output_tail.as_deref().unwrap_or_default().contains("starting-up"), "{f:?}");
    check_clean("a start command that never got ready");

    // Cancelled while the template snapshot's start command is awaited: the build ends at
    // once, not when the ready check would give up, and its template VM goes with it.
    let recipe = format!("{QUICK}[start]\ncmd = \"sleep 600\"\nready = {{ port = 9 }}\nready_timeout_s = 600\n");
    // 20 s: past the template VM's boot, into the wait for its start command.
    let (cancel, watch, cancelled_at) = cancel_after(
        Duration::from_secs(20),
        |e| matches!(e, BuildEvent::Phase { message } if message.contains("start command")),
    );
    let (r, _) = build_with(&node, pushed_ok.request("tb-cancel-start", "base", &recipe), cancel, watch).await;
    let e = r.unwrap_err();
    assert_eq!(e.build_failure().unwrap().code, "CANCELLED", "{e}");
    let waited = cancelled_at.lock().unwrap().expect("cancelled in the snapshot's phase").elapsed();
    assert!(waited < Duration::from_secs(30), "the cancel waited {waited:?} for the start command");
    check_clean("a cancel while the start command was awaited");
    // (Lock files of snapshot keys stay, as for every template.)
    let snapshots: Vec<String> =
        names(&t.dir.path().join("snapshots"), "").into_iter().filter(|n| !n.ends_with(".lock")).collect();
    assert!(snapshots.is_empty(), "snapshots left: {snapshots:?}");

    // Bad refs.
    for bad in ["base", "Tb", ""] {
        let (r, _) = build(&node, pushed_ok.request(bad, "base", QUICK)).await;
        assert_eq!(r.unwrap_err().to_api().code, lizard_api::ErrorCode::InvalidArgument);
    }
    t.finish().await;
    drop_host_rules(&links);
}

#[tokio::test]
async fn two_builds_of_one_recipe_make_each_layer_once() {
    let (t, netns, links) = test_node().await;
    let node = t.node.clone();
    let pushed = Pushed::new(&[("a.txt", "a", 0o644)], &[]);
    let recipe =
        format!("{QUICK}[[steps]]\ncopy = {{ src = \"a.txt\", dest = \"/a.txt\" }}\n[[steps]]\nrun = \"sleep 2; cat /a.txt > /b.txt\"\n");
    let (one, two) = tokio::join!(
        build(&node, pushed.request("tb-one", "base", &recipe)),
        build(&node, pushed.request("tb-two", "base", &recipe)),
    );
    let cached = |r: &Result<BuiltTemplate>| r.as_ref().unwrap().steps.iter().map(|s| s.cached).collect::<Vec<_>>();
    let mut flags = [cached(&one.0), cached(&two.0)];
    flags.sort();
    assert_eq!(flags, [vec![false, false], vec![true, true]], "one build made the layers, the other waited for them");
    assert_eq!(footprint(&node, t.dir.path(), &netns).layers.len(), 2);
    for name in ["tb-one", "tb-two"] {
        let s = node.create(CreateSandboxRequest { template: name.into(), ..Default::default() }).await.unwrap();
        assert_eq!(out(&node, &s.id, "cat /b.txt").await, "a");
        node.kill(&s.id).await.unwrap();
    }
    node.delete_template("tb-one").await.unwrap();
    assert_eq!(footprint(&node, t.dir.path(), &netns).layers.len(), 2, "tb-two still uses them");
    node.delete_template("tb-two").await.unwrap();
    assert!(footprint(&node, t.dir.path(), &netns).layers.is_empty());
    t.finish().await;
    drop_host_rules(&links);
}

#[tokio::test]
async fn without_snapshots_a_cold_boot_starts_the_start_command() {
    let mut links = String::new();
    let t = common::node_with(|c| {
        c.snapshots = false;
        let n = c.network.as_mut().expect("the tests run as root: networking is on");
        own_prefixes(n);
        links = n.link_prefix.clone();
    })
    .await;
    let node = t.node.clone();
    let pushed = Pushed::new(&[], &[]);
    // No steps: nothing to boot for the build; the start command runs at each create.
    let recipe = format!(
        "{QUICK}[start]\ncmd = \"mkdir -p /srv && echo cold > /srv/index.html && python3 -m http.server 8080 --bind 127.0.0.1 --directory /srv\"\nready = {{ url = \"http://127.0.0.1:8080/index.html\" }}\n"
    );
    let (r, events) = build(&node, pushed.request("tb-cold", "base", &recipe)).await;
    r.unwrap_or_else(|e| panic!("build failed: {e}; events: {events:#?}"));
    let s = node.create(CreateSandboxRequest { template: "tb-cold".into(), ..Default::default() }).await.unwrap();
    assert!(!s.from_snapshot());
    let page = get_index(&node, &s.id).await;
    assert!(page.starts_with("HTTP/1.0 200") && page.ends_with("cold\n"), "{page}");
    node.kill(&s.id).await.unwrap();
    node.delete_template("tb-cold").await.unwrap();
    t.finish().await;
    drop_host_rules(&links);
}
