//! A guest fills the host's disk (the node's data directory on a small filesystem of the
//! test's own): before, QEMU stopped every VM whose next write found the disk full, nothing
//! noticed, their calls hung, and they never ran again once space returned. Now each
//! halted VM is seen at once, its calls are refused with UNAVAILABLE, it is billed as
//! paused, a pause of it is refused with it left running, new sandboxes are refused below
//! the disk headroom, and every halted VM continues — its write completed, billed as
//! running again — once the space is freed.

#![allow(clippy::unwrap_used)]

use lizard_attacks::control::eventually;
use lizard_attacks::leftovers;
use lizard_attacks::system::System;
use reqwest::Method;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A loop-mounted ext4 of `size` at `mount`, unmounted (and its image removed) on drop.
struct SmallDisk {
    mount: PathBuf,
    image: PathBuf,
}

impl SmallDisk {
    fn mount_at(mount: &Path, size: &str) -> SmallDisk {
        let image = PathBuf::from(format!("/var/tmp/lizard-attack-disk-{}.img", std::process::id()));
        std::fs::create_dir_all(mount).unwrap();
        let ok = |c: &mut Command| assert!(c.status().unwrap().success(), "{c:?}");
        ok(Command::new("truncate").args(["-s", size]).arg(&image));
        // No blocks kept for root: the node runs as root and would write into them.
        ok(Command::new("mkfs.ext4").args(["-q", "-F", "-m", "0"]).arg(&image));
        ok(Command::new("mount").args(["-o", "loop"]).arg(&image).arg(mount));
        SmallDisk { mount: mount.to_path_buf(), image }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

/// Status and body of an exec of `cmd` in `id`, or None when no answer came within `limit`.
async fn exec_within(system: &System, id: &str, cmd: &str, limit: Duration) -> Option<(u16, serde_json::Value)> {
    let req = system.request(Method::POST, &format!("/v1/sandboxes/{id}/exec")).json(&json!({"cmd": cmd}));
    let answer = tokio::time::timeout(limit, req.send()).await.ok()?.ok()?;
    let status = answer.status().as_u16();
    Some((status, answer.json().await.unwrap_or_default()))
}

/// How `/v1/billing/live` meters sandbox `id` ("running", "paused"), if it does.
async fn metered_state(system: &System, id: &str) -> Option<String> {
    let (status, live) = system.call(Method::GET, "/v1/billing/live", None).await;
    assert_eq!(status, 200, "{live}");
    let entry = live["sandboxes"].as_array()?.iter().find(|s| s["sandboxId"] == id)?.clone();
    entry["state"].as_str().map(str::to_owned)
}

/// 503 UNAVAILABLE saying the sandbox is halted for a full disk, with no host path.
fn assert_halted(what: &str, status: u16, body: &serde_json::Value) {
    let message = body["message"].as_str().unwrap_or_default();
    assert_eq!((status, body["code"].as_str()), (503, Some("UNAVAILABLE")), "{what}: {body}");
    assert!(
        message.contains("halted") && message.contains("disk is full") && !message.contains('/'),
        "{what}: {message}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_that_fills_the_host_disk_halts_writers_until_space_returns_and_nothing_is_lost() {
    let mut disk = None;
    let mut system =
        System::start_prepared(&[], |data| disk = Some(SmallDisk::mount_at(&data.join("server"), "3G"))).await;
    let disk = disk.unwrap();
    let victim = system.create_sandbox("base", json!({"timeoutMs": 900_000})).await;
    let filler = system.create_sandbox("base", json!({"timeoutMs": 900_000})).await;
    system.exec(&victim, "echo before > /root/note.txt && sync").await;

    // The attack: write more than the host's disk holds, in the background.
    let fill = "setsid sh -c 'dd if=/dev/zero of=/root/fill bs=1M count=4000 conv=fsync' >/dev/null 2>&1 < /dev/null &";
    system.exec(&filler, fill).await;
    let halted = eventually(Duration::from_secs(300), || async {
        matches!(exec_within(&system, &filler, "true", Duration::from_secs(5)).await, Some((503, _)))
    })
    .await;
    assert!(halted, "the filler's VM was not seen halting on the full disk");

    // A neighbour's write finds the disk full: its VM halts; its calls are refused, not hung.
    let writer = {
        let req = system.request(Method::POST, &format!("/v1/sandboxes/{victim}/exec")).json(
            &json!({"cmd": "dd if=/dev/zero of=/root/late bs=1M count=16 conv=fsync 2>/dev/null && echo written"}),
        );
        tokio::spawn(async move { req.send().await.unwrap().json::<serde_json::Value>().await.unwrap() })
    };
    let halted = eventually(Duration::from_secs(120), || async {
        matches!(exec_within(&system, &victim, "true", Duration::from_secs(5)).await, Some((503, _)))
    })
    .await;
    assert!(halted, "the victim's VM was not seen halting");
    let (status, body) =
        exec_within(&system, &victim, "echo hi", Duration::from_secs(10)).await.expect("an exec hangs");
    assert_halted("exec", status, &body);
    let (status, body) = system.call(Method::POST, &format!("/v1/sandboxes/{victim}/pause"), None).await;
    assert_halted("pause", status, &body);
    let (_, info) = system.call(Method::GET, &format!("/v1/sandboxes/{victim}"), None).await;
    assert_eq!(info["state"], "running", "a refused pause leaves it running: {info}");
    let (status, body) = system
        .call(Method::POST, "/v1/sandboxes", Some(json!({"template": "base", "projectId": system.project})))
        .await;
    assert_eq!((status, body["code"].as_str()), (503, Some("UNAVAILABLE")), "a create on a full disk: {body}");
    let log = system.log();
    assert!(log.contains(&victim) && log.contains("halted"), "the operator's log does not say why");
    let billed_as = |state: &'static str| {
        let system = &system;
        let victim = victim.clone();
        move || {
            let victim = victim.clone();
            async move { metered_state(system, &victim).await.as_deref() == Some(state) }
        }
    };
    assert!(eventually(Duration::from_secs(10), billed_as("paused")).await, "a halted sandbox is billed as running");

    // Space returns when the filler ends: the victim goes on, its write completed.
    let (status, body) = system.call(Method::DELETE, &format!("/v1/sandboxes/{filler}"), None).await;
    assert!(status == 204 || status == 200, "kill the filler: {status} {body}");
    let written =
        tokio::time::timeout(Duration::from_secs(120), writer).await.expect("the halted write never ended").unwrap();
    assert!(eventually(Duration::from_secs(10), billed_as("running")).await, "a sandbox that runs again is not billed");
    assert_eq!(written["exitCode"], 0, "the halted write failed: {written}");
    assert_eq!(written["stdout"], "written\n", "{written}");
    let (code, out, _) = system.exec(&victim, "cat /root/note.txt; stat -c %s /root/late").await;
    assert_eq!((code, out.as_str()), (0, format!("before\n{}\n", 16 << 20).as_str()), "data lost across the halt");
    let again = system.create_sandbox("base", json!({})).await;
    assert_eq!(system.exec(&again, "echo up").await.1, "up\n");
    let vmms = leftovers::vmm_pids(system.data_dir());
    assert_eq!(vmms.len(), 2, "the filler's VMM is gone, the victim's and the new one run: {vmms:?}");
    // The server and its VMMs first, then the filesystem under them: the data directory
    // can be removed only once nothing is mounted in it.
    system.stop();
    drop(disk);
    drop(system);
}
