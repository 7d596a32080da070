//! Pseudo-terminals for [`crate::processes`]: a pair from `openpty(3)`, reads and writes on
//! the master side through tokio, resizes, and hang-ups.
//!
//! The slave side becomes the process's stdin, stdout and stderr, and its controlling
//! terminal ([`crate::exec::Plan::controlling_tty`]); the agent keeps the master. Both
//! ends are close-on-exec, so no other process inherits them.

use lizard_agent_proto::types::PtySize;
use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use nix::pty::{openpty, Winsize};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use tokio::io::unix::AsyncFd;

/// Both sides of a new terminal.
pub struct Pair {
    /// Non-blocking, for [`read`] and [`write_all`].
    pub master: OwnedFd,
    pub slave: OwnedFd,
}

fn winsize(size: PtySize) -> Winsize {
    Winsize { ws_row: size.rows, ws_col: size.cols, ws_xpixel: 0, ws_ypixel: 0 }
}

/// A new terminal of `size`.
pub fn open(size: PtySize) -> io::Result<Pair> {
    let pair = openpty(&winsize(size), None)?;
    for fd in [&pair.master, &pair.slave] {
        fcntl(fd.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    }
    fcntl(pair.master.as_raw_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    Ok(Pair { master: pair.master, slave: pair.slave })
}

/// Set the terminal's size; the kernel signals `SIGWINCH` to its foreground group.
pub fn resize(master: &OwnedFd, size: PtySize) -> io::Result<()> {
    let ws = winsize(size);
    // SAFETY: TIOCSWINSZ reads one `struct winsize` from the pointer, which points at a
    // live, initialised value for the whole call; the descriptor is owned and open.
    let rc = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws as *const Winsize) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Hang the terminal up, as closing a terminal window does: the kernel sends `SIGHUP` to
/// the session's leader and foreground group, and every descriptor of the terminal the
/// processes hold reads EOF from then on. A shell that ignores `SIGHUP`, or was still
/// starting when the signal came, ends at its next read; a signal alone can miss both.
/// The master stays open, so what was printed before is still read. Needs
/// `CAP_SYS_ADMIN` (the agent runs as root).
pub fn hang_up(master: &OwnedFd) -> io::Result<()> {
    let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: TIOCGPTPEER takes open(2) flags by value and returns a new descriptor of the
    // master's slave side (or -1); the master is owned and open.
    let peer = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, flags) };
    if peer < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `peer` was just returned by the kernel as a new descriptor nothing else owns.
    let slave = unsafe { OwnedFd::from_raw_fd(peer) };
    // SAFETY: TIOCVHANGUP takes no argument; the descriptor is owned and open.
    let rc = unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCVHANGUP) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Read what the terminal printed; `EIO` once every slave side is closed.
pub async fn read(master: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        let mut guard = master.readable().await?;
        match guard.try_io(|fd| nix::unistd::read(fd.as_raw_fd(), buf).map_err(io::Error::from)) {
            Ok(r) => return r,
            Err(_would_block) => continue,
        }
    }
}

/// Type `data` into the terminal (waits while its input queue is full).
pub async fn write_all(master: &AsyncFd<OwnedFd>, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        let mut guard = master.writable().await?;
        match guard.try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(io::Error::from)) {
            Ok(Ok(n)) => data = &data[n..],
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
    Ok(())
}
