//! A real `base` guest end to end: its own kernel, Node.js, files, background processes.

// Helpers of these tests unwrap as the tests do (clippy.toml's allow-unwrap-in-tests
// covers only the #[test] functions themselves).
#![allow(clippy::unwrap_used)]

use crate::common;
use lizard_node::WriteOptions;

use bytes::Bytes;
use common::sh;
use futures_util::StreamExt;
use lizard_api::{CreateSandboxRequest, ErrorCode};
use sha2::{Digest, Sha256};

fn base() -> CreateSandboxRequest {
    CreateSandboxRequest { template: "base".into(), ..Default::default() }
}

/// A node over an image root that has a kernel prepares its boot files on its own after a
/// start (apt's answer about the kernel package, the initramfs check), so that its first
/// create does not wait for them.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_prepares_its_boot_files_at_start() {
    assert!(
        lizard_image::ImageStore::new(common::image_root()).has_kernel(),
        "no kernel in the test image root: scripts/test.sh builds the images first"
    );
    let t = common::node().await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !t.node.has_boot_files() {
        assert!(std::time::Instant::now() < deadline, "boot files not prepared 60 s after the start");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    t.finish().await;
}

/// PIT channel 0's status byte by the read-back command, from inside the guest: Python
/// has no `in`/`out`, so three instructions (`mov edx, edi; mov eax, esi; out dx, al`, then
/// `mov edx, edi; xor eax, eax; in al, dx`) run from an executable mapping.
const PIT_STATUS_PY: &str = r#"
import ctypes, mmap
libc = ctypes.CDLL(None, use_errno=True)
assert libc.ioperm(0x40, 4, 1) == 0, ctypes.get_errno()
code = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
code.write(bytes([0x89, 0xFA, 0x89, 0xF0, 0xEE, 0xC3, 0x89, 0xFA, 0x31, 0xC0, 0xEC, 0xC3]))
base = ctypes.addressof(ctypes.c_char.from_buffer(code))
outb = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int)(base)
inb = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(base + 6)
outb(0x43, 0xE2)
print((inb(0x40) >> 1) & 7)
"#;

/// An idle guest does not wake its VMM for nothing: the PIT that the firmware left
/// ticking is stopped (mode 0, where it was mode 3) and the kernel's proactive compaction
/// and soft-lockup watchdog are off, in a sandbox restored from the template snapshot.
#[tokio::test(flavor = "multi_thread")]
async fn an_idle_guest_has_its_pit_and_periodic_kernel_work_stopped() {
    let t = common::node().await;
    let sbx = t.node.create(base()).await.unwrap();
    let r = sbx.exec_collect(sh("cat /proc/sys/vm/compaction_proactiveness /proc/sys/kernel/watchdog")).await.unwrap();
    assert_eq!((r.exit_code, r.stdout.as_str()), (0, "0\n0\n"), "{r:?}");
    let w = sbx
        .write_file("/root/pit.py", &WriteOptions::default(), bytes_stream(PIT_STATUS_PY.as_bytes().to_vec()))
        .await
        .unwrap();
    assert_eq!(w.bytes_written, PIT_STATUS_PY.len() as u64);
    let r = sbx.exec_collect(sh("python3 /root/pit.py")).await.unwrap();
    assert_eq!((r.exit_code, r.stdout.as_str()), (0, "0\n"), "PIT channel 0 not in mode 0: {r:?}");
    t.node.kill(&sbx.id).await.unwrap();
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn base_template_boots_a_real_vm_with_files_and_processes() {
    let t = common::node().await;
    let sbx = t.node.create(base()).await.unwrap();

    // The agent's secret is in no process's arguments on the host.
    let args = std::fs::read(format!("/proc/{}/cmdline", sbx.live().unwrap().vm().pid())).unwrap();
    assert!(!String::from_utf8_lossy(&args).contains("lizard.secret"), "secret visible in the VMM's arguments");

    // Its own kernel: not the host's.
    let host = nix::sys::utsname::uname().unwrap().release().to_string_lossy().into_owned();
    let r = sbx.exec_collect(sh("uname -r")).await.unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    assert!(!r.stdout.trim().is_empty());
    assert_ne!(r.stdout.trim(), host, "guest runs the host's kernel?");

    let r = sbx.exec_collect(sh("node -e 'console.log(6*7)'")).await.unwrap();
    assert_eq!((r.exit_code, r.stdout.as_str()), (0, "42\n"), "{r:?}");

    // Text and binary files, parents created.
    let bin: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let w = sbx.write_file("/app/deep/data.bin", &WriteOptions::default(), bytes_stream(bin.clone())).await.unwrap();
    assert_eq!(w.bytes_written, bin.len() as u64);
    assert_eq!(read_all(&sbx, "/app/deep/data.bin").await, bin);
    let r = sbx.exec_collect(sh("sha256sum /app/deep/data.bin | cut -d' ' -f1")).await.unwrap();
    assert_eq!(r.stdout.trim(), hex::encode(Sha256::digest(&bin)));

    // 100 MB in both directions, streamed: generated on the fly, hashed on the fly.
    const BIG: usize = 100 * 1024 * 1024;
    let chunk = Bytes::from((0..1024 * 1024).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    let mut expected = Sha256::new();
    for _ in 0..BIG / chunk.len() {
        expected.update(&chunk);
    }
    let expected = hex::encode(expected.finalize());
    let c2 = chunk.clone();
    let upload = futures_util::stream::iter(0..BIG / chunk.len()).map(move |_| Ok::<_, std::io::Error>(c2.clone()));
    let w = sbx.write_file("/root/big.bin", &WriteOptions::default(), upload).await.unwrap();
    assert_eq!(w.bytes_written, BIG as u64);
    let r = sbx.exec_collect(sh("sha256sum /root/big.bin | cut -d' ' -f1")).await.unwrap();
    assert_eq!(r.stdout.trim(), expected, "guest sees a different file");
    let (len, mut stream) = sbx.read_file("/root/big.bin").await.unwrap();
    assert_eq!(len, Some(BIG as u64));
    let mut got = Sha256::new();
    let mut n = 0usize;
    while let Some(c) = stream.next().await {
        let c = c.unwrap();
        n += c.len();
        got.update(&c);
    }
    assert_eq!((n, hex::encode(got.finalize())), (BIG, expected));

    // Listing, mkdir, remove.
    sbx.make_dir("/app/x/y/z", None).await.unwrap();
    let names: Vec<String> = sbx.list_dir("/app").await.unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, vec!["deep", "x"]);
    sbx.remove("/app/x").await.unwrap();
    let names: Vec<String> = sbx.list_dir("/app").await.unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, vec!["deep"]);

    // `cmd &` returns at once and the background process keeps running.
    let start = std::time::Instant::now();
    let r = sbx.exec_collect(sh("sleep 600 >/dev/null 2>&1 & echo $!")).await.unwrap();
    assert!(start.elapsed() < std::time::Duration::from_secs(5), "exec waited for the background job");
    let pid = r.stdout.trim().to_string();
    assert!(pid.parse::<u32>().is_ok(), "{r:?}");
    let r = sbx.exec_collect(sh(&format!("kill -0 {pid} && echo alive"))).await.unwrap();
    assert_eq!(r.stdout, "alive\n");
    // A background server that keeps writing to the inherited pipe must not die.
    // (Its pid goes to a file: the ticks share stdout with anything echoed here.)
    sbx.exec_collect(sh("(while true; do echo tick; sleep 0.2; done) & echo $! > /tmp/ticker")).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let r = sbx.exec_collect(sh("kill -0 $(cat /tmp/ticker) && echo alive")).await.unwrap();
    assert_eq!(r.stdout, "alive\n", "background writer died after exec returned");

    // Many operations at once on one channel.
    let mut tasks = vec![];
    for i in 0..10 {
        let s = sbx.clone();
        tasks.push(tokio::spawn(async move { s.exec_collect(sh(&format!("echo {i}"))).await.unwrap().stdout }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(t.await.unwrap(), format!("{i}\n"));
    }

    // Killed: everything is gone, and the id says so.
    let id = sbx.id.clone();
    let dir = t.dir.path().join("sandboxes").join(&id);
    assert!(dir.exists());
    t.node.kill(&id).await.unwrap();
    assert!(!dir.exists(), "sandbox directory survived kill");
    let e = t.node.get(&id).expect_err("killed sandbox still found");
    assert_eq!(e.code(), ErrorCode::NotFound);
    assert!(e.to_string().contains("killed"), "{e}");
    assert_eq!(t.node.kill(&id).await.err().unwrap().code(), ErrorCode::NotFound);
    assert_eq!(t.node.get("nosuchsandbox").err().unwrap().code(), ErrorCode::NotFound);
    t.finish().await;
}

fn bytes_stream(data: Vec<u8>) -> impl futures_util::Stream<Item = std::io::Result<Bytes>> + Send + 'static {
    futures_util::stream::iter(data.chunks(10_000).map(|c| Ok(Bytes::copy_from_slice(c))).collect::<Vec<_>>())
}

async fn read_all(sbx: &lizard_node::Sandbox, path: &str) -> Vec<u8> {
    let (_, mut s) = sbx.read_file(path).await.unwrap();
    let mut v = vec![];
    while let Some(c) = s.next().await {
        v.extend_from_slice(&c.unwrap());
    }
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_vm_runs_nothing_until_resumed() {
    let t = common::node().await;
    let sbx = t.node.create(base()).await.unwrap();
    sbx.live().unwrap().vm().pause().await.unwrap();
    // The vCPUs are stopped: a command cannot even start.
    let frozen = tokio::time::timeout(std::time::Duration::from_secs(2), sbx.exec_collect(sh("echo thawed"))).await;
    assert!(frozen.is_err(), "a paused guest answered: {frozen:?}");
    sbx.live().unwrap().vm().resume().await.unwrap();
    let r = sbx.exec_collect(sh("echo thawed")).await.unwrap();
    assert_eq!(r.stdout, "thawed\n");
    t.finish().await;
}

/// Read NDJSON watch lines from `stream` until `n` events came (heartbeats skipped).
async fn watch_events(
    stream: &mut futures_util::stream::BoxStream<'static, std::io::Result<Bytes>>,
    n: usize,
) -> Vec<lizard_api::FsEvent> {
    let mut buf = Vec::new();
    let mut out = vec![];
    // Heartbeats (blank lines) come every 15 s: bound the wait for events as a whole.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while out.len() < n {
        let chunk = tokio::time::timeout_at(deadline, stream.next())
            .await
            .unwrap_or_else(|_| panic!("{n} events within 60 s; got {out:?}"))
            .expect("the watch goes on")
            .unwrap();
        buf.extend_from_slice(&chunk);
        while let Some(end) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=end).collect();
            if line.len() > 1 {
                out.push(serde_json::from_slice(&line[..line.len() - 1]).unwrap());
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn file_info_rename_archives_and_a_watch_that_a_pause_ends() {
    use lizard_api::{FileType, FsEventKind};
    let t = common::node().await;
    let sbx = t.node.create(base()).await.unwrap();
    sbx.make_dir("/srv/w", None).await.unwrap();
    let mut watch = sbx.watch("/srv/w", true).await.unwrap();

    // Several files in one archive; what is at a path; a rename.
    let mut tar = tar::Builder::new(Vec::new());
    for (name, data) in [("a.txt", &b"alpha"[..]), ("deep/b.txt", b"beta")] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o600);
        tar.append_data(&mut h, name, data).unwrap();
    }
    let body = futures_util::stream::iter([Ok::<_, std::io::Error>(Bytes::from(tar.into_inner().unwrap()))]);
    let r = sbx.write_archive("/srv/w", body).await.unwrap();
    assert_eq!((r.entries, r.bytes_written), (2, 9));
    let info = sbx.file_info("/srv/w/a.txt").await.unwrap();
    assert_eq!((info.file_type, info.size, info.mode, info.owner.as_str()), (FileType::File, 5, 0o600, "root"));
    sbx.rename("/srv/w/a.txt", "/srv/w/c.txt").await.unwrap();
    let mut seen = watch_events(&mut watch, 1).await;
    while !seen.iter().any(|e| e.kind == FsEventKind::Rename) {
        eprintln!("watch so far: {seen:?}");
        seen.extend(watch_events(&mut watch, 1).await);
    }
    assert!(seen.iter().any(|e| e.kind == FsEventKind::Create && e.path == "/srv/w/deep/b.txt"), "{seen:?}");
    assert!(seen.iter().any(|e| e.new_path.as_deref() == Some("/srv/w/c.txt")), "{seen:?}");

    // The directory back, as one archive.
    let mut bytes = Vec::new();
    let mut stream = sbx.read_archive("/srv/w").await.unwrap();
    while let Some(c) = stream.next().await {
        bytes.extend_from_slice(&c.unwrap());
    }
    let mut names: Vec<String> = tar::Archive::new(&bytes[..])
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["c.txt", "deep", "deep/b.txt"]);

    // Errors a client sees: a missing path, a file where a directory is expected.
    let code = |e: lizard_node::NodeError| e.to_api().code;
    assert_eq!(code(sbx.file_info("/srv/w/nothing").await.unwrap_err()), ErrorCode::NotFound);
    assert_eq!(code(sbx.read_archive("/srv/w/c.txt").await.err().unwrap()), ErrorCode::InvalidArgument);
    assert_eq!(code(sbx.watch("/srv/w/c.txt", false).await.err().unwrap()), ErrorCode::InvalidArgument);

    // A pause ends the watch (the guest drops it with the session); a new one works after.
    t.node.pause(&sbx.id).await.unwrap();
    let end = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            match watch.next().await {
                None => return "ended",
                Some(Err(_)) => return "failed",
                Some(Ok(_)) => continue,
            }
        }
    })
    .await
    .expect("the watch ends at the pause");
    assert!(["ended", "failed"].contains(&end));
    let sbx = t.node.resume(&sbx.id).await.unwrap();
    let mut again = sbx.watch("/srv/w", false).await.unwrap();
    let r = sbx.exec_collect(sh("touch /srv/w/after && ls -l /proc/1/fd | grep -c inotify")).await.unwrap();
    assert_eq!(r.stdout.trim(), "1", "only the new watch is left in the guest: {r:?}");
    let seen = watch_events(&mut again, 1).await;
    assert_eq!((seen[0].kind, seen[0].path.as_str()), (FsEventKind::Create, "/srv/w/after"));
    t.node.kill(&sbx.id).await.unwrap();
}
