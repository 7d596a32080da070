//! Waiting for a VMM process that is not our child: one a previous node process started
//! and a new one takes back. `waitpid` works only for children, so the exit is watched
//! through a pidfd (Linux ≥ 5.3), which becomes readable when the process ends; its exit
//! status went to its new parent and is not known here.

use crate::VmExit;
use std::os::fd::OwnedFd;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// A watch on one process, which from its opening refers to that process even if its pid
/// is reused after it ends.
pub struct ExitWatch(AsyncFd<OwnedFd>);

impl ExitWatch {
    /// Watch `pid` (it must run now). Needs a tokio runtime.
    pub fn open(pid: u32) -> std::io::Result<ExitWatch> {
        let pid = i32::try_from(pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        let fd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())?;
        // SAFETY: an OwnedFd stays open until dropped and always reports the same
        // descriptor, and the AsyncFd takes ownership of it.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) };
        Ok(ExitWatch(fd.map_err(|e| e.into_parts().1)?))
    }

    /// Resolves once the process has ended (or the runtime shuts down).
    pub async fn ended(self) -> VmExit {
        let _ = self.0.readable().await;
        VmExit { code: None, signal: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn an_ended_process_is_seen_ending() {
        let mut child = std::process::Command::new("sleep").arg("0.2").spawn().unwrap();
        let watch = ExitWatch::open(child.id()).unwrap();
        assert!(tokio::time::timeout(Duration::from_secs(5), watch.ended()).await.is_ok(), "the exit was not seen");
        child.wait().unwrap();
    }

    #[tokio::test]
    async fn a_running_process_is_not_seen_ending() {
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let watch = ExitWatch::open(child.id()).unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(300), watch.ended()).await.is_err());
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[tokio::test]
    async fn no_such_process_is_an_error() {
        assert!(ExitWatch::open(0).is_err());
        assert!(ExitWatch::open(u32::MAX).is_err());
    }
}
