//! Starting a process inside a network namespace: the VMM (its TAP device lives there) and
//! the node's `ip`/`nft` calls that configure one.

use std::os::fd::AsRawFd;

/// Makes `cmd`'s child join the network namespace open as `netns` before it execs.
/// `netns` must stay open until the child has been spawned.
pub fn enter_before_exec(cmd: &mut tokio::process::Command, netns: &std::fs::File) {
    let fd = netns.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and only makes the setns(2)
    // system call, which is async-signal-safe; the caller keeps `fd` open until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
