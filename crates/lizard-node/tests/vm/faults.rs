//! Bad input and faults: each gets a clear error with a stable code and harms nothing else.

use crate::common;

use common::sh;
use lizard_api::{CreateSandboxRequest, ErrorCode, ExecRequest};
use std::time::{Duration, Instant};

fn base() -> CreateSandboxRequest {
    CreateSandboxRequest { template: "base".into(), ..Default::default() }
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_template_and_bad_sizes_are_rejected_without_leftovers() {
    let t = common::node().await;
    let e = t
        .node
        .create(CreateSandboxRequest { template: "no-such-template".into(), ..Default::default() })
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.to_string().contains("no-such-template") && e.to_string().contains("base"), "{e}");
    let e = t.node.create(CreateSandboxRequest { memory_mib: Some(1), ..base() }).await.err().unwrap();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    let e = t.node.create(CreateSandboxRequest { vcpus: Some(0), ..base() }).await.err().unwrap();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(t.node.list().is_empty());
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_and_file_errors_are_clear_and_bounded() {
    let t = common::node().await;
    let sbx = t.node.create(base()).await.unwrap();

    // A command that does not exist: the shell's 127, promptly.
    let start = Instant::now();
    let r = sbx.exec_collect(sh("nosuchcommand --flag")).await.unwrap();
    assert_eq!(r.exit_code, 127, "{r:?}");
    assert!(r.stderr.contains("not found"), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(10));
    // Without a shell, a missing program is an error, not an exit code.
    let e = sbx
        .exec_collect(ExecRequest { argv: Some(vec!["/no/such/binary".into()]), ..Default::default() })
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), ErrorCode::NotFound, "{e}");
    let e = sbx.exec_collect(ExecRequest { cwd: Some("/no/such/dir".into()), ..sh("pwd") }).await.err().unwrap();
    assert!(matches!(e.code(), ErrorCode::NotFound | ErrorCode::InvalidArgument), "{e}");
    let e = sbx.exec_collect(ExecRequest::default()).await.err().unwrap();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");

    // Exit codes, stderr, env, cwd, stdin, user.
    let r = sbx
        .exec_collect(ExecRequest {
            cwd: Some("/tmp".into()),
            env: [("GREETING".to_string(), "hi".to_string())].into(),
            stdin: Some("from stdin".into()),
            ..sh("pwd; echo $GREETING; cat; echo oops >&2; exit 3")
        })
        .await
        .unwrap();
    assert_eq!((r.exit_code, r.stdout.as_str(), r.stderr.as_str()), (3, "/tmp\nhi\nfrom stdin", "oops\n"));
    let r = sbx.exec_collect(ExecRequest { user: Some("nobody".into()), ..sh("id -un") }).await.unwrap();
    assert_eq!(r.stdout, "nobody\n", "{r:?}");

    // 50 MB of output arrives complete.
    let r = sbx.exec_collect(sh("head -c 50000000 /dev/zero | tr '\\0' x")).await.unwrap();
    assert_eq!(r.exit_code, 0);
    assert_eq!(r.stdout.len(), 50_000_000);
    assert!(r.stdout.bytes().all(|b| b == b'x'));

    // A command that never ends is killed at its timeout, children included.
    let start = Instant::now();
    let r = sbx
        .exec_collect(ExecRequest { timeout_ms: Some(1500), ..sh("sleep 1000 & echo $! > /tmp/child; sleep 1000") })
        .await
        .unwrap();
    assert!(r.timed_out, "{r:?}");
    assert_eq!(r.exit_code, 124);
    assert!(start.elapsed() < Duration::from_secs(15), "timeout took {:?}", start.elapsed());
    let r = sbx.exec_collect(sh("kill -0 $(cat /tmp/child) 2>/dev/null && echo alive || echo gone")).await.unwrap();
    assert_eq!(r.stdout, "gone\n", "the timed-out command's child survived");

    // Files: missing, a directory, not a directory, relative paths, removing /.
    fn code<T>(r: Result<T, lizard_node::NodeError>) -> Option<ErrorCode> {
        r.err().map(|e| e.code())
    }
    assert_eq!(code(sbx.read_file("/no/such/file").await.map(drop)), Some(ErrorCode::NotFound));
    assert_eq!(code(sbx.read_file("/etc").await.map(drop)), Some(ErrorCode::InvalidArgument));
    assert_eq!(code(sbx.list_dir("/etc/hostname").await), Some(ErrorCode::InvalidArgument));
    assert_eq!(code(sbx.list_dir("/no/such/dir").await), Some(ErrorCode::NotFound));
    assert_eq!(code(sbx.list_dir("relative/path").await), Some(ErrorCode::InvalidArgument));
    assert_eq!(code(sbx.remove("/no/such/file").await), Some(ErrorCode::NotFound));
    assert_eq!(code(sbx.remove("/").await), Some(ErrorCode::InvalidArgument));
    assert!(code(sbx.make_dir("/etc/hostname/sub", None).await).is_some());

    // None of that harmed the sandbox.
    let r = sbx.exec_collect(sh("echo still fine")).await.unwrap();
    assert_eq!(r.stdout, "still fine\n");
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vmm_that_dies_is_reported_and_cleaned_up() {
    let t = common::node().await;
    let sbx = t.node.create(base()).await.unwrap();
    let id = sbx.id.clone();
    let dir = t.dir.path().join("sandboxes").join(&id);
    assert!(dir.join("root.qcow2").exists());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sbx.live().unwrap().vm().pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();

    // An operation in flight or after the crash fails clearly instead of hanging.
    let e = tokio::time::timeout(Duration::from_secs(10), sbx.exec_collect(sh("echo hi")))
        .await
        .expect("exec on a dead VM hung")
        .expect_err("exec on a dead VM succeeded");
    assert!(matches!(e.code(), ErrorCode::NotFound | ErrorCode::Unavailable), "{e}");

    let deadline = Instant::now() + Duration::from_secs(10);
    while t.node.get(&id).is_ok() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let e = t.node.get(&id).expect_err("dead sandbox still listed");
    assert_eq!(e.code(), ErrorCode::NotFound);
    assert!(e.to_string().contains("stopped unexpectedly"), "{e}");
    assert!(!dir.exists(), "files of the dead sandbox were not cleaned up");
    drop(sbx);
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_that_never_gets_ready_hits_the_boot_deadline() {
    let t = common::node_with(|c| c.boot_timeout = Duration::from_millis(30)).await;
    // Build the images and probe first, so only the boot itself races the deadline.
    t.node.prepare("base").await.unwrap();
    let start = Instant::now();
    let e = t.node.create(base()).await.expect_err("a 30 ms boot succeeded");
    assert_eq!(e.code(), ErrorCode::BootFailed, "{e}");
    assert!(e.to_string().contains("did not answer"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(20));
    assert!(t.node.list().is_empty());
    t.finish().await;
}
