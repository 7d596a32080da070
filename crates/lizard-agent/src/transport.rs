//! Byte streams from the host: a virtio-serial port (QEMU; survives snapshots), vsock
//! (Firecracker), or a Unix socket (dev mode on the host). Each hands streams to
//! [`server::serve_connection`].
//!
//! virtio-serial has one peer at a time and no "accept": while the host side is not
//! connected, `read` returns 0 and `poll` reports POLLHUP at once, so a level-triggered
//! wait would spin. But Linux's virtio_console wakes the port's wait queue when the host
//! connects (the VIRTIO_CONSOLE_PORT_OPEN control message; `port_fops_poll` waits on that
//! queue), and an edge-triggered epoll registration turns each wake-up into one event
//! (see [`wait_for_host`]). The agent therefore sleeps in epoll until the port's state changes, checks
//! whether POLLHUP cleared (the host connected), runs one session on it, closes the port
//! (the kernel then discards whatever the old session left unread) and starts over. After
//! a snapshot restore the host's connect is exactly what wakes it, and an idle agent
//! makes no timer wake-ups at all.

use crate::app::AppState;
use crate::server;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::socket::{self, AddressFamily, Backlog, SockFlag, SockType, VsockAddr};
use std::convert::Infallible;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How long to wait for the serial port device to appear at boot.
const PORT_WAIT: Duration = Duration::from_secs(10);

/// Why a transport failed for good.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The virtio-serial port never appeared.
    #[error("virtio-serial port {0:?} not found")]
    NoPort(String),
    /// Opening, polling or listening failed.
    #[error("{what}: {cause}")]
    Io { what: String, cause: io::Error },
}

impl TransportError {
    fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> TransportError {
        let what = what.into();
        move |cause| TransportError::Io { what, cause }
    }
}

/// A non-blocking file descriptor (serial port, vsock connection) as a tokio stream.
///
/// The stream ends when its peer is gone: a vsock connection that closed, a virtio-serial
/// port whose host side is disconnected. A port's host may also leave and another connect
/// while a session runs (a node gave up a handshake that took too long and connected
/// again). Then the stream carries on with the new host's bytes: each host opens with the
/// protocol's stale-session breaker, which ends a session that served the old host or
/// restarts a handshake, so the stream need not guess whom the session served. (Ending it
/// instead broke a session that had shaken hands with the new host: the old host's
/// hang-up could land after the session began and before its challenge reached the new
/// host, and the next session's challenge then cut into the new host's HTTP/2 stream.)
///
/// tokio keeps "closed" as a final readiness state, so after a hang-up it would report the
/// port ready for good and a read that would block would spin — in a 1-vCPU guest, on the
/// runtime's only worker, stalling every other task of the agent. A stream whose host
/// came back therefore registers its descriptor anew (a duplicate of it, so that the
/// port stays open), which forgets that state.
pub struct FdStream(AsyncFd<OwnedFd>);

impl FdStream {
    /// `fd` must already be non-blocking.
    pub fn new(fd: OwnedFd) -> io::Result<FdStream> {
        Ok(FdStream(register(fd)?))
    }

    /// After a would-block on a registration that saw the peer hang up: whether the
    /// stream ended (no peer now), or it has one again and goes on under a fresh
    /// registration (see [`FdStream`]).
    fn ended_or_renewed(&mut self) -> io::Result<bool> {
        if hung_up(self.0.get_ref()) {
            return Ok(true);
        }
        self.0 = register(self.0.get_ref().try_clone()?)?;
        Ok(false)
    }
}

/// Register an owned (non-blocking) descriptor with the tokio reactor.
pub(crate) fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd stays open until dropped and always reports the same descriptor,
    // and the AsyncFd takes ownership of it.
    unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)
}

impl AsyncRead for FdStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.0.poll_read_ready(cx))?;
            let hung_up_since = guard.ready().is_read_closed();
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|fd| read_available(fd.as_raw_fd(), unfilled)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                // See [`FdStream`]: no host, end of stream; or another host, read on.
                Err(_would_block) if hung_up_since => {
                    drop(guard);
                    if self.ended_or_renewed()? {
                        return Poll::Ready(Ok(()));
                    }
                }
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for FdStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.0.poll_write_ready(cx))?;
            let hung_up_since = guard.ready().is_write_closed();
            match guard.try_io(|fd| nix::unistd::write(fd.get_ref().as_fd(), buf).map_err(io::Error::from)) {
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(result) => return Poll::Ready(result),
                // A virtio-serial port whose host went away reports "would block" on write
                // for good, and no writability event will ever follow: a broken pipe. One
                // whose host came back writes on (see [`FdStream`]).
                Err(_would_block) if hung_up_since || hung_up(self.0.get_ref()) => {
                    drop(guard);
                    if self.ended_or_renewed()? {
                        return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
                    }
                }
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Read as much as is available into `dst`, in several reads if need be: a virtio-serial
/// port hands out one 4 KiB buffer per `read`, and the per-call overhead above it (tokio,
/// HTTP/2) is what limits throughput in a slow guest. `Ok(0)` only at end of stream.
fn read_available(fd: RawFd, dst: &mut [u8]) -> io::Result<usize> {
    let mut total = 0;
    while total < dst.len() {
        match nix::unistd::read(fd, &mut dst[total..]) {
            Ok(0) => break,
            Ok(n) => total += n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::EAGAIN) if total > 0 => break,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(total)
}

/// Whether the peer of `fd` is gone (POLLHUP).
fn hung_up(fd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::empty())];
    matches!(nix::poll::poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
        && fds[0].revents().is_some_and(|r| r.contains(PollFlags::POLLHUP))
}

/// Dev mode: serve every connection on a Unix socket at `path`, concurrently.
pub async fn serve_unix(path: &Path, state: AppState) -> Result<Infallible, TransportError> {
    let _ = std::fs::remove_file(path);
    let listener =
        tokio::net::UnixListener::bind(path).map_err(TransportError::io(format!("bind {}", path.display())))?;
    loop {
        let (stream, _) = listener.accept().await.map_err(TransportError::io("accept"))?;
        spawn_session(stream, state.clone());
    }
}

/// Guest with vsock: serve every connection to [`lizard_agent_proto::VSOCK_PORT`].
pub async fn serve_vsock(state: AppState) -> Result<Infallible, TransportError> {
    let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
    let fd = socket::socket(AddressFamily::Vsock, SockType::Stream, flags, None)
        .map_err(|e| TransportError::Io { what: "vsock socket".into(), cause: e.into() })?;
    let addr = VsockAddr::new(libc::VMADDR_CID_ANY, lizard_agent_proto::VSOCK_PORT);
    socket::bind(fd.as_raw_fd(), &addr)
        .and_then(|_| socket::listen(&fd, Backlog::MAXCONN))
        .map_err(|e| TransportError::Io { what: "vsock listen".into(), cause: e.into() })?;
    let listener = register(fd).map_err(TransportError::io("vsock listener"))?;
    loop {
        let mut guard = listener.readable().await.map_err(TransportError::io("vsock accept"))?;
        match guard.try_io(|fd| socket::accept4(fd.as_raw_fd(), flags).map_err(io::Error::from)) {
            Ok(Ok(raw)) => {
                // SAFETY: accept4 just returned this descriptor; nothing else owns it.
                let conn = unsafe { OwnedFd::from_raw_fd(raw) };
                match FdStream::new(conn) {
                    Ok(stream) => spawn_session(stream, state.clone()),
                    Err(e) => eprintln!("lizard-agent: vsock connection: {e}"),
                }
            }
            // Aborted connections and the like concern one peer, not the listener.
            Ok(Err(e)) => eprintln!("lizard-agent: vsock accept: {e}"),
            Err(_would_block) => continue,
        }
    }
}

fn spawn_session<S>(stream: S, state: AppState)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        if let Err(e) = server::serve_connection(stream, state).await {
            eprintln!("lizard-agent: session ended: {e}");
        }
    });
}

/// Guest with virtio-serial: one session at a time on the agent's port, forever.
pub async fn serve_serial(state: AppState) -> Result<Infallible, TransportError> {
    let port = wait_for_port(Path::new("/dev"), Path::new("/sys/class/virtio-ports"), PORT_WAIT).await?;
    loop {
        let fd = nix::fcntl::open(
            &port,
            nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| TransportError::Io { what: format!("open {}", port.display()), cause: e.into() })?;
        // SAFETY: open just returned this descriptor; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        wait_for_host(&fd).await.map_err(TransportError::io("wait for the host"))?;
        let stream = FdStream::new(fd).map_err(TransportError::io("register serial port"))?;
        if let Err(e) = server::serve_connection(stream, state.clone()).await {
            eprintln!("lizard-agent: session ended: {e}");
        }
    }
}

/// Sleep until the host side of the port is connected (POLLHUP clears), without a timer.
///
/// tokio cannot watch this by itself: it keeps "closed" (POLLHUP) as a final state, so
/// once the port hung up it would report it ready for good and a wait loop would spin. An
/// epoll instance of our own, with the port registered edge-triggered, turns each wake-up
/// of the port's wait queue (the host connecting among them) into one event; tokio
/// watches that instance, which is readable exactly while it holds undrained events.
/// Each round drains it first and checks the port after, so a connect that lands between
/// the check and the sleep still wakes the next sleep.
async fn wait_for_host(port: &OwnedFd) -> io::Result<()> {
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(io::Error::from)?;
    let all = EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT | EpollFlags::EPOLLHUP | EpollFlags::EPOLLET;
    epoll.add(port.as_fd(), EpollEvent::new(all, 0)).map_err(io::Error::from)?;
    let watch = register(epoll.0.try_clone()?)?;
    let mut events = [EpollEvent::empty(); 4];
    loop {
        if !hung_up(port) {
            return Ok(());
        }
        let mut guard = watch.readable().await?;
        guard.clear_ready();
        // Drain: each wake-up reports once (edge-triggered), then the instance is quiet.
        while epoll.wait(&mut events, 0u8).map_err(io::Error::from)? > 0 {}
    }
}

/// The device node of the agent's port. udev's `/dev/virtio-ports/<name>` link is used
/// when present; a bare guest has no udev, so the name is also looked up in sysfs.
async fn wait_for_port(dev: &Path, sysfs: &Path, wait: Duration) -> Result<PathBuf, TransportError> {
    let name = lizard_agent_proto::SERIAL_PORT_NAME;
    let deadline = Instant::now() + wait;
    loop {
        if let Some(p) = find_port(dev, sysfs, name) {
            return Ok(p);
        }
        if Instant::now() >= deadline {
            return Err(TransportError::NoPort(name.to_string()));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn find_port(dev: &Path, sysfs: &Path, name: &str) -> Option<PathBuf> {
    let link = dev.join("virtio-ports").join(name);
    if link.exists() {
        return Some(link);
    }
    std::fs::read_dir(sysfs).ok()?.flatten().find_map(|entry| {
        let port_name = std::fs::read_to_string(entry.path().join("name")).ok()?;
        let node = dev.join(entry.file_name());
        (port_name.trim() == name && node.exists()).then_some(node)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn finds_ports_by_sysfs_name() {
        let root = tempfile::tempdir().unwrap();
        let (dev, sys) = (root.path().join("dev"), root.path().join("sys"));
        for (port, name) in [("vport0p0", "other"), ("vport0p1", "lizard.agent")] {
            std::fs::create_dir_all(sys.join(port)).unwrap();
            std::fs::write(sys.join(port).join("name"), format!("{name}\n")).unwrap();
        }
        std::fs::create_dir_all(&dev).unwrap();
        assert!(wait_for_port(&dev, &sys, Duration::from_millis(30)).await.is_err());
        std::fs::write(dev.join("vport0p1"), "").unwrap();
        assert_eq!(wait_for_port(&dev, &sys, Duration::ZERO).await.unwrap(), dev.join("vport0p1"));
    }

    /// A FIFO stands in for the port: its reader sees POLLHUP once the writer left, and a
    /// writer's return clears it and wakes the reader's wait queue. (A connected port
    /// reports POLLOUT; a FIFO's reader has no such state, so this "host" also sends a
    /// byte, which makes the wake-up visible as POLLIN.)
    #[tokio::test]
    async fn waits_for_the_host_without_spinning_and_wakes_on_its_return() {
        use nix::fcntl::OFlag;
        use nix::time::{clock_gettime, ClockId};
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("port");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let open = |flags| {
            let fd = nix::fcntl::open(&fifo, flags | OFlag::O_NONBLOCK, nix::sys::stat::Mode::empty()).unwrap();
            // SAFETY: open just returned this descriptor; nothing else owns it.
            unsafe { OwnedFd::from_raw_fd(fd) }
        };
        let port = open(OFlag::O_RDONLY);
        drop(open(OFlag::O_WRONLY));
        assert!(hung_up(&port), "a FIFO whose writer left must report POLLHUP");

        // This runtime has one thread: the waiter and this test share it, so its CPU
        // time over the wait says whether the waiter spun.
        let cpu = || clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).unwrap();
        let before = cpu();
        let (woke_tx, mut woke) = tokio::sync::oneshot::channel();
        let waiter = tokio::spawn(async move {
            wait_for_host(&port).await.unwrap();
            let _ = woke_tx.send(());
            port
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(woke.try_recv().is_err(), "returned while the host was away");
        let used = Duration::from(cpu() - before);
        assert!(used < Duration::from_millis(30), "waiting used {used:?} of CPU in 300 ms");

        let host = open(OFlag::O_WRONLY);
        nix::unistd::write(&host, b"x").unwrap();
        let port = tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("not woken").unwrap();
        assert!(!hung_up(&port));
    }

    /// A host that left and another that connected before the session read again (a
    /// FIFO again: a new writer clears POLLHUP, and its reader then reads "would block").
    /// The stream carries on with the new host's bytes, waits for more without spinning,
    /// and ends once no host is left. The reads run on a runtime of their own thread: a
    /// spinning read never lets a timer of its runtime fire, and that thread's CPU time
    /// says whether it spun.
    #[test]
    fn a_stream_whose_host_left_and_another_came_carries_on_without_spinning() {
        use nix::fcntl::OFlag;
        use nix::time::{clock_gettime, ClockId};
        use tokio::io::AsyncReadExt;
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("port");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let open = move |flags| {
            let fd = nix::fcntl::open(&fifo, flags | OFlag::O_NONBLOCK, nix::sys::stat::Mode::empty()).unwrap();
            // SAFETY: open just returned this descriptor; nothing else owns it.
            unsafe { OwnedFd::from_raw_fd(fd) }
        };
        let port = open(OFlag::O_RDONLY);
        let first_host = open(OFlag::O_WRONLY);
        let (left_tx, left) = std::sync::mpsc::channel::<()>();
        let (back_tx, back) = std::sync::mpsc::channel::<()>();
        let (waited_tx, waited) = std::sync::mpsc::channel::<()>();
        let (gone_tx, gone) = std::sync::mpsc::channel::<()>();
        let session = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let mut stream = FdStream::new(port).unwrap();
                nix::unistd::write(&first_host, b"x").unwrap();
                let mut byte = [0u8; 1];
                assert_eq!(stream.read(&mut byte).await.unwrap(), 1);
                drop(first_host);
                // The reactor takes in the hang-up while the session does something else.
                tokio::time::sleep(Duration::from_millis(100)).await;
                let _ = left_tx.send(());
                back.recv().unwrap();
                assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "the new host's byte");
                assert_eq!(&byte, b"y");
                let cpu = || clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).unwrap();
                let before = cpu();
                let wait = tokio::time::timeout(Duration::from_millis(300), stream.read(&mut byte)).await;
                assert!(wait.is_err(), "the read returned while the new host was there: {wait:?}");
                let used = Duration::from(cpu() - before);
                assert!(used < Duration::from_millis(30), "waiting used {used:?} of CPU in 300 ms");
                let _ = waited_tx.send(());
                gone.recv().unwrap();
                stream.read(&mut byte).await.map_err(|e| e.kind())
            })
        });
        left.recv_timeout(Duration::from_secs(5)).unwrap();
        let second_host = open(OFlag::O_WRONLY);
        nix::unistd::write(&second_host, b"y").unwrap();
        back_tx.send(()).unwrap();
        waited.recv_timeout(Duration::from_secs(5)).expect("the read spun or failed");
        drop(second_host);
        gone_tx.send(()).unwrap();
        assert_eq!(session.join().unwrap(), Ok(0), "end of stream once no host is left");
    }

    #[tokio::test]
    async fn fd_stream_carries_bytes() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        b.set_nonblocking(true).unwrap();
        let (mut a, mut b) = (FdStream::new(a.into()).unwrap(), FdStream::new(b.into()).unwrap());
        let payload = vec![7u8; 1 << 20];
        let p2 = payload.clone();
        let writer = tokio::spawn(async move { a.write_all(&p2).await.unwrap() });
        let mut got = vec![0u8; payload.len()];
        b.read_exact(&mut got).await.unwrap();
        writer.await.unwrap();
        assert_eq!(got, payload);
    }
}
