//! The one place in the agent that waits for children.
//!
//! As PID 1 the agent inherits every orphan in the guest and has to reap them, yet a
//! `waitpid(-1)` anywhere else (tokio::process, std's `Child::wait`) would steal the exit
//! status of a command that `exec` is waiting for, or find it already gone. So exactly one
//! loop in the process reaps: on each SIGCHLD it calls `waitpid(-1, WNOHANG)` until nothing
//! is left and hands each status to whoever registered that pid; everything else (orphans)
//! is reaped silently. The loop runs on its own thread, so it does not depend on any one
//! tokio runtime staying alive.
//!
//! Spawning happens under a read lock that the reaping loop's write lock excludes. A child
//! is therefore registered before the reaper can ever see it exit, and the `waitpid` that
//! std's `Command::spawn` itself runs when `exec` fails in the child never races the reaper
//! (were the reaper first, std would panic on `ECHILD`).

use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::collections::HashMap;
use std::process::{Child, Command};
use std::sync::{Mutex, OnceLock, RwLock};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::oneshot;

/// Why the reaper could not start.
#[derive(Debug, thiserror::Error)]
pub enum ReaperError {
    /// The reaper's thread, runtime or SIGCHLD handler could not be set up.
    #[error("cannot start the reaper: {0}")]
    Start(std::io::Error),
    /// `prctl(PR_SET_CHILD_SUBREAPER)` failed.
    #[error("cannot become a child subreaper: {0}")]
    Subreaper(nix::Error),
}

struct Reaper {
    /// Read-held while spawning, write-held while reaping.
    spawn_lock: RwLock<()>,
    /// Children whose exit status someone is waiting for.
    waiters: Mutex<HashMap<i32, oneshot::Sender<WaitStatus>>>,
}

static REAPER: OnceLock<Reaper> = OnceLock::new();

/// Start the process-wide reaper (idempotent). With `subreaper`, orphans of our children
/// are re-parented to this process (dev mode; PID 1 gets them anyway).
pub fn start(subreaper: bool) -> Result<(), ReaperError> {
    if subreaper {
        nix::sys::prctl::set_child_subreaper(true).map_err(ReaperError::Subreaper)?;
    }
    static STARTED: Mutex<bool> = Mutex::new(false);
    let mut started = STARTED.lock().unwrap_or_else(|e| e.into_inner());
    if *started {
        return Ok(());
    }
    let reaper = REAPER.get_or_init(|| Reaper { spawn_lock: RwLock::new(()), waiters: Mutex::new(HashMap::new()) });
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("reaper".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => return drop(ready_tx.send(Err(e))),
            };
            rt.block_on(async {
                let mut sigchld = match signal(SignalKind::child()) {
                    Ok(s) => s,
                    Err(e) => return drop(ready_tx.send(Err(e))),
                };
                let _ = ready_tx.send(Ok(()));
                loop {
                    // Reap first: children may have exited before the handler was installed.
                    reaper.reap_all();
                    if sigchld.recv().await.is_none() {
                        return;
                    }
                }
            })
        })
        .map_err(ReaperError::Start)?;
    ready_rx
        .recv()
        .map_err(|_| ReaperError::Start(std::io::Error::other("reaper thread died")))?
        .map_err(ReaperError::Start)?;
    *started = true;
    Ok(())
}

/// Spawn `cmd` and register its pid; the receiver gets its exit status. Blocking (fork +
/// exec): call it from `spawn_blocking`. [`start`] must have been called.
pub fn spawn(cmd: &mut Command) -> std::io::Result<(Child, oneshot::Receiver<WaitStatus>)> {
    let reaper = REAPER.get().ok_or_else(|| std::io::Error::other("the reaper is not running"))?;
    let _guard = reaper.spawn_lock.read().unwrap_or_else(|e| e.into_inner());
    let child = cmd.spawn()?;
    let (tx, rx) = oneshot::channel();
    let pid = i32::try_from(child.id()).expect("pids fit in i32");
    reaper.waiters.lock().unwrap_or_else(|e| e.into_inner()).insert(pid, tx);
    Ok((child, rx))
}

impl Reaper {
    fn reap_all(&self) {
        let _guard = self.spawn_lock.write().unwrap_or_else(|e| e.into_inner());
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => return,
                Ok(status) => {
                    let Some(pid) = status.pid() else { continue };
                    let waiter = self.waiters.lock().unwrap_or_else(|e| e.into_inner()).remove(&pid.as_raw());
                    if let Some(tx) = waiter {
                        // The waiter may have given up (its exec was abandoned); that is fine.
                        let _ = tx.send(status);
                    }
                }
                Err(nix::errno::Errno::EINTR) => continue,
                // ECHILD: no children at all.
                Err(_) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn delivers_statuses_and_survives_failed_exec() {
        start(false).unwrap();
        start(false).unwrap();
        let mut rxs = vec![];
        for code in 0..5 {
            let (_child, rx) = tokio::task::spawn_blocking(move || {
                spawn(Command::new("/bin/sh").arg("-c").arg(format!("exit {code}")))
            })
            .await
            .unwrap()
            .unwrap();
            rxs.push((code, rx));
        }
        // A failed exec makes std wait for the child itself; that must not panic.
        let err =
            tokio::task::spawn_blocking(|| spawn(&mut Command::new("/nonexistent/prog"))).await.unwrap().unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
        for (code, rx) in rxs {
            let st = tokio::time::timeout(Duration::from_secs(5), rx).await.unwrap().unwrap();
            assert!(matches!(st, WaitStatus::Exited(_, c) if c == code), "{st:?}");
        }
    }
}
