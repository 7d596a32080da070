//! The VMM behind a sandbox assumed broken: what a guest that took over its QEMU would
//! hold, read back from the kernel (/proc, the cgroup files) — its own unprivileged uid,
//! no capabilities, `no_new_privs`, a seccomp filter, resource limits, cgroups of its
//! own, no way to change the memory other clones start from — and what a tenant can make
//! the host spend: CPUs and memory beyond the node's, sizes that each leave a snapshot on
//! disk, a console log without end, a neighbour's latency under a CPU spinner and a fork
//! bomb.

#![allow(clippy::unwrap_used)]

use lizard_attacks::confine::{
    cgroup_value, cgroups, cpu_time, dir_names, host_tasks, limits, median, status, vmm_pid,
};
use lizard_attacks::leftovers;
use lizard_attacks::system::System;
use reqwest::Method;
use serde_json::json;
use std::time::{Duration, Instant};

/// The node's default range of VMM uids.
const FIRST_VMM_UID: u32 = 1_500_000;

#[tokio::test(flavor = "multi_thread")]
async fn every_vmm_runs_as_its_own_uid_without_privileges_in_cgroups_of_its_own() {
    let system = System::start(&[]).await;
    let a = system.create_sandbox("base", json!({})).await;
    let b = system.create_sandbox("base", json!({"vcpus": 2, "memoryMib": 1024})).await;
    let mut uids = vec![];
    for (id, vcpus, memory_mib) in [(&a, 1u64, 512u64), (&b, 2, 1024)] {
        let pid = vmm_pid(id).expect("the sandbox's QEMU runs");
        let st = status(pid);
        let uid: Vec<u32> = st["Uid"].split_whitespace().map(|u| u.parse().unwrap()).collect();
        assert!(uid.iter().all(|u| *u == uid[0]), "real, effective, saved and fs uid agree: {uid:?}");
        assert!(uid[0] >= FIRST_VMM_UID, "QEMU runs as root or a host user: uid {}", uid[0]);
        let gid: Vec<u32> = st["Gid"].split_whitespace().map(|g| g.parse().unwrap()).collect();
        assert!(gid.iter().all(|g| *g == uid[0]), "its gid is its own: {gid:?}");
        assert_eq!(st["Groups"], (FIRST_VMM_UID - 1).to_string(), "only the VMMs' shared group");
        for caps in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_eq!(st[caps], "0000000000000000", "{caps} of QEMU");
        }
        assert_eq!(st["NoNewPrivs"], "1");
        assert_eq!(st["Seccomp"], "2", "QEMU runs under its seccomp filter");
        // What an idle VMM holds: 4 KiB pages only, not a 2 MiB huge page per ROM it read.
        assert_eq!(st["THP_enabled"], "0", "QEMU may use transparent huge pages");
        let lim = limits(pid);
        assert_eq!(lim["Max open files"], "512");
        assert_eq!(lim["Max core file size"], "0");
        assert_eq!(lim["Max processes"], "256");
        assert_ne!(lim["Max file size"], "unlimited");
        uids.push(uid[0]);

        let groups = cgroups(pid);
        let name = format!("vmm-{}", uid[0]);
        for controller in ["cpu", "memory", "pids"] {
            let dir = &groups[controller];
            assert!(dir.ends_with(format!("lizard/{name}")), "{controller} cgroup {}", dir.display());
        }
        assert_eq!(cgroup_value(&groups["cpu"], "cpu.cfs_quota_us"), (vcpus * 100_000).to_string());
        assert_eq!(cgroup_value(&groups["cpu"], "cpu.cfs_period_us"), "100000");
        assert_eq!(cgroup_value(&groups["cpu"], "cpu.cfs_burst_us"), (vcpus * 100_000).to_string());
        let memory_limit: u64 = cgroup_value(&groups["memory"], "memory.limit_in_bytes").parse().unwrap();
        assert_eq!(memory_limit, (memory_mib + 512) << 20, "guest memory + the VMM's 512 MiB");
        assert_eq!(cgroup_value(&groups["pids"], "pids.max"), "256");

        // The run directory is the VMM's and nobody else's.
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let run_dir = std::fs::metadata(system.node_dir().join("sandboxes").join(id)).unwrap();
        assert_eq!((run_dir.uid(), run_dir.permissions().mode() & 0o777), (uid[0], 0o700));
        // Its own mount namespace, in which the host's other trees are empty.
        let ns = |p: &str| std::fs::read_link(p).unwrap();
        assert_ne!(ns(&format!("/proc/{pid}/ns/mnt")), ns("/proc/self/ns/mnt"), "QEMU shares the node's mounts");
        for hidden in ["root", "home", "run", "srv", "opt"] {
            if std::path::Path::new("/").join(hidden).is_dir() {
                let seen = std::fs::read_dir(format!("/proc/{pid}/root/{hidden}")).unwrap().count();
                assert_eq!(seen, 0, "QEMU sees /{hidden}");
            }
        }
        // Its work still runs: the guest answers.
        assert_eq!(system.exec(id, "echo ok").await.1, "ok\n");
    }
    assert_ne!(uids[0], uids[1], "two VMMs share a uid");

    // Killed: its cgroups go with it, its files are root's again, its uid's claim file
    // is removed (the host-wide claims directory does not grow with every VMM ever run).
    let pid = vmm_pid(&b).unwrap();
    let claim = std::path::Path::new("/run/lizard/vmm-uids").join(format!("uid-{}.lock", uids[1]));
    assert!(claim.exists(), "a running VMM's uid is claimed by {}", claim.display());
    let groups = cgroups(pid);
    assert!(lizard_attacks::confine::vmm_cgroups().contains(&groups["memory"]), "the census lists it");
    let (status_code, _) = system.call(Method::DELETE, &format!("/v1/sandboxes/{b}"), None).await;
    assert!(status_code < 300, "kill: {status_code}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while (groups.values().any(|d| d.exists()) || claim.exists()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (controller, dir) in &groups {
        if ["cpu", "memory", "pids"].contains(&controller.as_str()) {
            assert!(!dir.exists(), "{controller} cgroup {} left behind", dir.display());
        }
    }
    assert!(!lizard_attacks::confine::vmm_cgroups().contains(&groups["memory"]), "the census still lists it");
    assert!(!claim.exists(), "{} left behind", claim.display());
}

/// Files under `dir` (to `depth` levels) that are `(dev, ino)`.
fn files_of_inode(dir: &std::path::Path, inode: (u64, u64), depth: usize, found: &mut Vec<std::path::PathBuf>) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for path in entries.flatten().map(|e| e.path()) {
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        if meta.is_dir() && depth > 0 {
            files_of_inode(&path, inode, depth - 1, found);
        } else if meta.is_file() && (meta.dev(), meta.ino()) == inode {
            found.push(path);
        }
    }
}

/// What a taken-over VMM tries against the memory its clone maps, by each path it is
/// given (the clone's base, the template's file, QEMU's own descriptor for it): open it
/// for writing, truncate it, make it writable. Prints what got through.
const TAMPER: &str = r#"
import os, sys
got = []
for path in sys.argv[1:]:
    for what, attempt in [
        ("opened", lambda: os.open(path, os.O_RDWR)),
        ("truncated", lambda: os.truncate(path, 4096)),
        ("made writable", lambda: os.chmod(path, 0o666)),
    ]:
        try:
            attempt(); got.append(what + " " + path)
        except PermissionError:
            pass
print(";".join(got) or "refused")
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_vmm_taken_over_cannot_change_the_memory_other_clones_start_from() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    let system = System::start(&[]).await;
    let a = system.create_sandbox("base", json!({})).await;
    let b = system.create_sandbox("base", json!({})).await;
    assert_eq!(system.exec(&a, "echo $((6 * 7)) > /tmp/kept").await.0, 0);
    let pid = vmm_pid(&a).unwrap();
    let uid: u32 = status(pid)["Uid"].split_whitespace().next().unwrap().parse().unwrap();
    let shared_gid = FIRST_VMM_UID - 1;

    // The clone's base (a link to the template's memory) is root's and only readable to
    // the VMMs' group.
    let base = system.node_dir().join("sandboxes").join(&a).join("base-memory");
    let meta = std::fs::metadata(&base).unwrap();
    let owner = (meta.uid(), meta.gid(), meta.permissions().mode() & 0o777);
    assert_eq!(owner, (0, shared_gid, 0o440), "{}", base.display());
    let mut names = vec![];
    files_of_inode(&system.node_dir(), (meta.dev(), meta.ino()), 6, &mut names);
    let template = names.iter().find(|p| !p.starts_with(system.node_dir().join("sandboxes"))).cloned();
    let template = template.unwrap_or_else(|| panic!("the template's memory file among {names:?}"));
    // QEMU holds it read-only, and maps it private and writable (copy-on-write).
    let held: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == base))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!held.is_empty(), "QEMU holds no descriptor of {}", base.display());
    for fd in &held {
        let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).unwrap();
        let flags = info.lines().find_map(|l| l.strip_prefix("flags:")).unwrap().trim();
        let flags = u32::from_str_radix(flags, 8).unwrap();
        assert_eq!(flags & 0o3, 0, "QEMU's descriptor {fd} of the memory is not read-only: {info}");
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mapped = maps.lines().find(|l| l.ends_with(base.to_str().unwrap())).expect("QEMU maps the base");
    assert_eq!(mapped.split_whitespace().nth(1), Some("rw-p"), "{mapped}");

    // As the VMM's uid and groups, with its descriptor at hand: nothing gets through.
    let before = std::fs::metadata(&template).unwrap();
    let mut tamper = std::process::Command::new("python3");
    tamper.args(["-c", TAMPER]).arg(&base).arg(&template).arg(format!("/proc/{pid}/fd/{}", held[0]));
    // SAFETY: only system calls between fork and exec.
    unsafe {
        tamper.pre_exec(move || {
            use nix::unistd::{Gid, Uid};
            nix::unistd::setgroups(&[Gid::from_raw(shared_gid)])?;
            nix::unistd::setgid(Gid::from_raw(uid))?;
            nix::unistd::setuid(Uid::from_raw(uid))?;
            Ok(())
        });
    }
    let out = tamper.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "refused");
    let after = std::fs::metadata(&template).unwrap();
    let stamp = |m: &std::fs::Metadata| (m.len(), m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec(), m.mode());
    assert_eq!(stamp(&after), stamp(&before), "the template's memory changed");

    // The clones work on, and a pause saves (and a resume maps) through the read-only file.
    assert_eq!(system.exec(&b, "echo ok").await.1, "ok\n");
    let path = |id: &str, action: &str| format!("/v1/sandboxes/{id}/{action}");
    assert_eq!(system.call(Method::POST, &path(&a, "pause"), None).await.0, 200);
    let (code, err) = system.call(Method::POST, &path(&a, "resume"), None).await;
    assert_eq!(code, 200, "{err}");
    assert_eq!(system.exec(&a, "cat /tmp/kept").await.1, "42\n");
    let pid = vmm_pid(&a).unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(maps.contains(base.to_str().unwrap()), "the resumed VMM maps no {}", base.display());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_beyond_the_nodes_cpus_and_memory_is_refused_and_leaves_nothing() {
    let system = System::start(&[]).await;
    let running = system.create_sandbox("base", json!({})).await;
    let vmms = leftovers::vmm_pids(system.data_dir()).len();
    let dirs = leftovers::sandbox_dirs(&system.node_dir());
    // 1 + 16 vCPUs on a 2-core host, over the default 8 vCPUs a core.
    let cpus = std::thread::available_parallelism().unwrap().get();
    assert!(cpus * 8 < 17, "this test assumes a host of at most 2 CPUs, it has {cpus}");
    let body = json!({"template": "base", "projectId": system.project, "vcpus": 16, "memoryMib": 16384});
    let (code, err) = system.call(Method::POST, "/v1/sandboxes", Some(body)).await;
    assert_eq!(code, 503, "{err}");
    assert_eq!(err["code"], "UNAVAILABLE", "{err}");
    let message = err["message"].as_str().unwrap();
    assert!(message.contains("16 vCPUs") && message.contains("promised"), "{message}");
    let data_dir = system.data_dir().to_string_lossy().into_owned();
    assert!(!message.contains(&data_dir) && !message.contains("/sys/"), "no host path reaches the client: {message}");
    assert_eq!(leftovers::vmm_pids(system.data_dir()).len(), vmms, "a VMM was started");
    assert_eq!(leftovers::sandbox_dirs(&system.node_dir()), dirs, "a run directory was left");
    // The running one is untouched.
    assert_eq!(system.exec(&running, "echo ok").await.1, "ok\n");
    drop(system);

    // With a lower ratio the node refuses it even with nothing running: 16 > 2 × 4.
    let strict = System::start(&["--cpu-overcommit", "4"]).await;
    let body = json!({"template": "base", "projectId": strict.project, "vcpus": 16, "memoryMib": 16384});
    let (code, err) = strict.call(Method::POST, "/v1/sandboxes", Some(body)).await;
    assert_eq!((code, err["code"].as_str()), (503, Some("UNAVAILABLE")), "{err}");
    assert!(leftovers::vmm_pids(strict.data_dir()).is_empty(), "a VMM was started");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resume_is_admitted_like_a_create() {
    // A node that promises one vCPU in all: one running sandbox fills it.
    let cpus = std::thread::available_parallelism().unwrap().get();
    let ratio = format!("{}", 1.0 / cpus as f64);
    let system = System::start(&["--cpu-overcommit", &ratio]).await;
    let paused = system.create_sandbox("base", json!({})).await;
    assert_eq!(system.exec(&paused, "echo $((6 * 7)) > /tmp/kept").await.0, 0);
    let path = |id: &str, action: &str| format!("/v1/sandboxes/{id}/{action}");
    assert_eq!(system.call(Method::POST, &path(&paused, "pause"), None).await.0, 200);
    let running = system.create_sandbox("base", json!({})).await;
    // Resuming the paused one now would promise two vCPUs: refused, and it stays paused.
    let vmms = leftovers::vmm_pids(system.data_dir()).len();
    let (code, err) = system.call(Method::POST, &path(&paused, "resume"), None).await;
    assert_eq!((code, err["code"].as_str()), (503, Some("UNAVAILABLE")), "{err}");
    assert!(err["message"].as_str().unwrap().contains("promised"), "{err}");
    assert_eq!(leftovers::vmm_pids(system.data_dir()).len(), vmms, "a VMM was started");
    let (_, info) = system.call(Method::GET, &format!("/v1/sandboxes/{paused}"), None).await;
    assert_eq!(info["state"], "paused", "{info}");
    // With the CPU given back, the same sandbox resumes with what it held.
    assert_eq!(system.call(Method::DELETE, &format!("/v1/sandboxes/{running}"), None).await.0, 204);
    let (code, err) = system.call(Method::POST, &path(&paused, "resume"), None).await;
    assert_eq!(code, 200, "{err}");
    assert_eq!(system.exec(&paused, "cat /tmp/kept").await.1, "42\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_writing_its_disk_flat_out_is_held_to_the_disk_limit() {
    // 4 MiB/s per disk: 24 MiB written past the guest's page cache take at least ~5 s.
    let system = System::start(&["--vmm-disk-mib-per-second", "4"]).await;
    let id = system.create_sandbox("base", json!({})).await;
    let pid = vmm_pid(&id).expect("the sandbox's QEMU runs");
    let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap().replace('\0', " ");
    assert!(cmdline.contains(&format!("throttling.bps-total={}", 4 << 20)), "{cmdline}");
    let started = Instant::now();
    let (code, _, err) =
        system.exec(&id, "dd if=/dev/zero of=/root/io bs=1M count=24 oflag=direct 2>&1 >/dev/null; sync").await;
    let took = started.elapsed();
    assert_eq!(code, 0, "{err}");
    let mib_per_s = 24.0 / took.as_secs_f64();
    eprintln!("24 MiB direct in {took:?}: {mib_per_s:.1} MiB/s ({err})");
    assert!(mib_per_s <= 6.0, "the guest wrote at {mib_per_s:.1} MiB/s past a 4 MiB/s limit");
    // Within its limit the disk works: the file is whole.
    assert_eq!(system.exec(&id, "stat -c %s /root/io").await.1, format!("{}\n", 24 << 20));
}

#[tokio::test(flavor = "multi_thread")]
async fn sizes_outside_the_documented_set_are_refused_before_any_snapshot_is_made() {
    let system = System::start(&[]).await;
    let snapshots = || dir_names(&system.node_dir().join("snapshots"));
    let before = snapshots();
    for (field, value) in [("memoryMib", 129), ("memoryMib", 130), ("memoryMib", 384 + 1), ("vcpus", 3)] {
        let body = json!({"template": "base", "projectId": system.project, field: value});
        let (code, err) = system.call(Method::POST, "/v1/sandboxes", Some(body)).await;
        assert_eq!(code, 422, "{field}={value}: {err}");
        assert_eq!(err["code"], "INVALID_ARGUMENT");
        assert!(err["message"].as_str().unwrap().contains(field), "{err}");
    }
    assert_eq!(snapshots(), before, "a refused size left a template snapshot");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_flooding_its_console_does_not_grow_the_host_log_without_bound() {
    let system = System::start(&[]).await;
    let id = system.create_sandbox("base", json!({})).await;
    let log = system.node_dir().join("sandboxes").join(&id).join("console.log");
    // 8 MiB at the serial port, as fast as the guest can.
    let (code, _, err) =
        system.exec(&id, "timeout 120 dd if=/dev/zero bs=64k count=128 of=/dev/ttyS0 2>&1 | tail -1 >&2; exit 0").await;
    assert_eq!(code, 0, "{err}");
    let written: u64 = err.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0);
    let size = std::fs::metadata(&log).unwrap().len();
    eprintln!("guest wrote {written} bytes to its console; the host log holds {size}");
    assert!(written >= 4 << 20, "the flood was too slow to test the bound: {err}");
    // 1 MiB cap, checked twice a second: at most what the guest writes in between on top.
    assert!(size <= 2 << 20, "console log grew to {size} bytes");
}

/// Median latency of `exec echo` in `id` over `n` calls.
async fn exec_latency(system: &System, id: &str, n: usize) -> Duration {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        assert_eq!(system.exec(id, "echo ok").await.1, "ok\n");
        samples.push(t.elapsed());
    }
    median(&mut samples)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cpu_spinner_and_a_fork_bomb_leave_a_neighbour_responsive_and_the_host_bounded() {
    let system = System::start(&[]).await;
    let neighbour = system.create_sandbox("base", json!({})).await;
    let spinner = system.create_sandbox("base", json!({"vcpus": 2})).await;
    let bomber = system.create_sandbox("base", json!({})).await;
    let baseline = exec_latency(&system, &neighbour, 25).await;
    let tasks_before = host_tasks();

    // Every vCPU of the spinner busy, and a fork bomb in the other, both bounded in time.
    let spin = "for i in 1 2 3 4; do setsid timeout 90 sh -c 'while :; do :; done' >/dev/null 2>&1 </dev/null & done";
    system.exec(&spinner, spin).await;
    let bomb = "setsid timeout 90 bash -c ':(){ :|:& };:' >/dev/null 2>&1 </dev/null &";
    system.exec(&bomber, bomb).await;
    tokio::time::sleep(Duration::from_secs(5)).await;

    let spinner_pid = vmm_pid(&spinner).expect("the spinner's QEMU runs");
    let bomber_pid = vmm_pid(&bomber).expect("the fork bomb's QEMU runs");
    let (spun_before, bombed_before, t) = (cpu_time(spinner_pid), cpu_time(bomber_pid), Instant::now());
    let loaded = exec_latency(&system, &neighbour, 25).await;
    // A fork bomb's CPU use comes in lumps (forks fail, children die, the guest reclaims):
    // shares are read over at least 5 s.
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(t.elapsed())).await;
    let spun = cpu_time(spinner_pid) - spun_before;
    let bombed = cpu_time(bomber_pid) - bombed_before;
    let window = t.elapsed();
    let bomber_tasks: u32 = status(bomber_pid)["Threads"].parse().unwrap();
    let tasks_during = host_tasks();
    eprintln!(
        "exec echo median: {baseline:?} alone, {loaded:?} beside a 2-vCPU spinner and a fork bomb; \
         host tasks {tasks_before} → {tasks_during}; the bomber's QEMU has {bomber_tasks} threads; \
         the spinner used {spun:?} and the bomber {bombed:?} of CPU in {window:?}"
    );
    // The attacks were real: the bomber used at least 10 % of a CPU (an idle guest uses
    // under 1 %; measured 19–66 % beside the spinner), and the spinner took what CPU it
    // could get on this 2-core host (measured: 0.5–1.1 CPU), and no more than its 2-CPU quota.
    assert!(bombed >= window.mul_f64(0.1), "the fork bomb used only {bombed:?} in {window:?}");
    assert!(spun >= window.mul_f64(0.25), "the spinner used only {spun:?} in {window:?}");
    assert!(spun <= window.mul_f64(2.2), "the spinner used {spun:?} in {window:?}, beyond its 2-CPU quota");
    // The fork bomb runs in the guest: the host sees only its VMM's threads, which its
    // pids limit bounds.
    assert!(bomber_tasks <= 256, "the bomber's VMM has {bomber_tasks} threads");
    let pids = cgroups(bomber_pid)["pids"].clone();
    assert!(pids.to_string_lossy().contains("/lizard/vmm-"), "the bomber's VMM has no pids cgroup of its own");
    let current: u32 = cgroup_value(&pids, "pids.current").parse().unwrap();
    assert!(current <= 256, "pids.current {current}");
    assert!(tasks_during <= tasks_before + 2 * 256, "host tasks {tasks_before} → {tasks_during}");
    // The bound: on 2 cores, the neighbour's VMM keeps a fair share (its own cgroup beside
    // theirs) whatever many threads they run; an exec stays within 4× its time alone, or
    // 600 ms where that is less (the issue measured 390–600 ms beside one 4-vCPU spinner
    // before cgroups).
    let bound = (baseline * 4).max(Duration::from_millis(600));
    assert!(loaded <= bound, "exec echo {loaded:?} beside the spinner and the bomb (alone {baseline:?})");
    for id in [&neighbour, &spinner, &bomber] {
        let memory = cgroups(vmm_pid(id).unwrap())["memory"].clone();
        let peak: u64 = cgroup_value(&memory, "memory.max_usage_in_bytes").parse().unwrap_or(0);
        eprintln!("{id}: peak memory of its VMM's cgroup {} MiB", peak >> 20);
    }
    for id in [&spinner, &bomber] {
        let _ = system.call(Method::DELETE, &format!("/v1/sandboxes/{id}"), None).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_that_cannot_confine_refuses_sandboxes_unless_told_to_run_them_insecure() {
    // Uid 0 cannot be a VMM's: the range is unusable, so nothing can be confined.
    // A warm pool would start VMMs by itself: none may start either.
    let refusing = System::start(&["--vmm-uids", "0:16", "--warm-pool", "base=1"]).await;
    let body = json!({"template": "base", "projectId": refusing.project});
    let (code, err) = refusing.call(Method::POST, "/v1/sandboxes", Some(body)).await;
    assert_eq!(code, 503, "{err}");
    assert_eq!(err["code"], "UNAVAILABLE");
    let message = err["message"].as_str().unwrap();
    assert!(message.contains("cannot confine") && message.contains("uid range"), "{message}");
    assert!(message.contains("--insecure-no-confine"), "{message}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(leftovers::vmm_pids(refusing.data_dir()).is_empty(), "a VMM was started");
    assert!(refusing.log().contains("cannot confine VMMs"), "the operator's log says why");
    drop(refusing);

    let insecure = System::start(&["--vmm-uids", "0:16", "--insecure-no-confine"]).await;
    let id = insecure.create_sandbox("base", json!({})).await;
    assert_eq!(insecure.exec(&id, "echo ok").await.1, "ok\n");
    let st = status(vmm_pid(&id).unwrap());
    assert!(st["Uid"].starts_with("0\t"), "unconfined as asked: {}", st["Uid"]);
    assert!(insecure.log().contains("INSECURE"), "the log says so loudly");
}
