//! `POST /v1/exec`: run a command and stream its output back as frames.
//!
//! 1. The request body starts with a `Start` frame holding the [`ExecRequest`]; it is read
//!    before the response begins, so a malformed request gets a plain 400.
//! 2. The command is spawned through the [`crate::reaper`] in a session of its own
//!    (`setsid`), so a timeout can kill the whole process group, and as the requested user.
//!    If it cannot start, the response is a single `Error` frame.
//! 3. Output is read from non-blocking pipes and sent as `Stdout`/`Stderr` frames through a
//!    small bounded channel: when the host reads slowly, HTTP/2 flow control fills, the
//!    channel fills, and the agent stops reading the pipes, so the command blocks instead of
//!    the agent buffering its output.
//! 4. When the main process exits, whatever is already in the pipes is sent, then `Exit`.
//!    Background children (`server &`) may still hold the pipes open; the agent keeps reading
//!    and discarding until they close, so those children never block or get SIGPIPE.
//!
//! If the host goes away mid-command (the response is dropped), the command keeps running
//! with its output discarded: a session ending, e.g. around a snapshot, must not kill
//! processes.

use crate::app::AppError;
use crate::reaper;
use crate::users::{self, User, UserError};
use axum::body::Body;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::{Stream, StreamExt, TryStreamExt};
use lizard_agent_proto::frame::{Frame, FrameCodec, FrameError, FrameKind};
use lizard_agent_proto::routes::FRAMES_CONTENT_TYPE;
use lizard_agent_proto::types::{AgentError, ErrorCode, ExecRequest, ExitStatus};
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::WaitStatus;
use nix::unistd::{Gid, Pid, Uid};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::FramedRead;
use tokio_util::io::StreamReader;

/// Default `PATH` of every command.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Largest read from a pipe, hence largest output frame.
const CHUNK: usize = 64 * 1024;
/// How long a short read waits for more output before it is sent.
const GATHER_WINDOW: Duration = Duration::from_millis(1);
/// Frames queued between the pipe readers and HTTP/2; small, so backpressure is quick.
const CHANNEL_DEPTH: usize = 4;
/// After the main process exits, send at most this much more per pipe (a background child
/// could otherwise keep the drain going forever).
const DRAIN_LIMIT: usize = 1 << 20;

/// Why a command could not be run.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The request body did not begin with a valid start frame.
    #[error("bad exec request: {0}")]
    BadRequest(String),
    /// The request named no command, or both a shell command and an argv.
    #[error("give exactly one of cmd or a non-empty argv")]
    NoCommand,
    /// The requested user does not exist.
    #[error(transparent)]
    User(#[from] UserError),
    /// Only a root agent can switch users.
    #[error("the agent does not run as root and cannot run commands as uid {0}")]
    NotRoot(u32),
    /// The working directory is missing or unusable.
    #[error("working directory {path}: {cause}")]
    Cwd { path: String, cause: io::Error },
    /// The working directory is not a directory.
    #[error("working directory {0} is not a directory")]
    CwdNotDir(String),
    /// The program could not be started.
    #[error("cannot start {program}: {cause}")]
    Spawn { program: String, cause: io::Error },
    /// A pipe to the command could not be set up.
    #[error("cannot set up pipes: {0}")]
    Pipe(io::Error),
}

impl ExecError {
    /// The stable code a client is given.
    pub(crate) fn code(&self) -> ErrorCode {
        match self {
            ExecError::BadRequest(_) | ExecError::NoCommand => ErrorCode::InvalidArgument,
            ExecError::User(_) => ErrorCode::NotFound,
            ExecError::NotRoot(_) => ErrorCode::PermissionDenied,
            ExecError::CwdNotDir(_) => ErrorCode::NotADirectory,
            ExecError::Cwd { cause: source, .. } | ExecError::Spawn { cause: source, .. } => {
                AgentError::from_io(source, "").code
            }
            ExecError::Pipe(_) => ErrorCode::Internal,
        }
    }
}

impl From<ExecError> for AgentError {
    fn from(e: ExecError) -> AgentError {
        AgentError::new(e.code(), e.to_string())
    }
}

/// The handler: read the start frame, spawn, stream.
pub async fn handle(body: Body) -> Result<Response, AppError> {
    let reader = StreamReader::new(body.into_data_stream().map_err(io::Error::other));
    let mut frames = FramedRead::new(reader, FrameCodec);
    let req = read_start(&mut frames).await?;
    let (tx, mut rx) = mpsc::channel(CHANNEL_DEPTH);
    match start(req).await {
        Ok(mut running) => {
            if let Some(stdin) = running.stdin.take() {
                tokio::spawn(feed_stdin(frames, stdin));
            }
            tokio::spawn(running.pump(tx));
        }
        Err(e) => {
            let _ = tx.try_send(Frame::json(FrameKind::Error, &AgentError::from(e)));
        }
    }
    let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)).map(|f| Ok::<_, Infallible>(f.to_bytes()));
    Ok(([(CONTENT_TYPE, FRAMES_CONTENT_TYPE)], Body::from_stream(stream)).into_response())
}

async fn read_start<S>(frames: &mut S) -> Result<ExecRequest, ExecError>
where
    S: Stream<Item = Result<Frame, FrameError>> + Unpin,
{
    match frames.next().await {
        Some(Ok(f)) if f.kind == FrameKind::Start => {
            serde_json::from_slice(&f.data).map_err(|e| ExecError::BadRequest(e.to_string()))
        }
        Some(Ok(f)) => Err(ExecError::BadRequest(format!("expected a start frame, got {:?}", f.kind))),
        Some(Err(e)) => Err(ExecError::BadRequest(e.to_string())),
        None => Err(ExecError::BadRequest("empty request body".into())),
    }
}

/// Copy `Stdin` frames into the command's stdin until `StdinEof`, the end of the request
/// body, or the command closing its stdin. Dropping the pipe gives the command EOF.
async fn feed_stdin<S>(mut frames: S, mut stdin: pipe::Sender)
where
    S: Stream<Item = Result<Frame, FrameError>> + Unpin,
{
    while let Some(Ok(frame)) = frames.next().await {
        if frame.kind != FrameKind::Stdin || stdin.write_all(&frame.data).await.is_err() {
            return;
        }
    }
}

/// Everything needed to spawn, resolved from a request.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) program: String,
    args: Vec<String>,
    cwd: PathBuf,
    env: BTreeMap<String, String>,
    /// Credentials to switch to; `None` keeps the agent's own.
    creds: Option<User>,
    stdin: bool,
    /// Make the command's stdin (a terminal's slave side, set by the caller) its
    /// controlling terminal.
    pub(crate) controlling_tty: bool,
}

/// Resolve user, working directory and environment. Reads /etc and stats the cwd.
pub(crate) fn plan(req: ExecRequest) -> Result<Plan, ExecError> {
    let (program, args) = match (req.cmd, req.argv) {
        (Some(cmd), None) => ("/bin/sh".to_string(), vec!["-c".to_string(), cmd]),
        (None, Some(argv)) if !argv.is_empty() => {
            let mut it = argv.into_iter();
            (it.next().unwrap_or_default(), it.collect())
        }
        _ => return Err(ExecError::NoCommand),
    };
    let euid = Uid::effective().as_raw();
    let user = users::resolve(req.user.as_deref().unwrap_or(&euid.to_string()))?;
    let creds = match (euid, user.uid) {
        (0, _) => Some(user.clone()),
        (me, uid) if me == uid => None,
        (_, uid) => return Err(ExecError::NotRoot(uid)),
    };
    let home = if user.home.is_dir() { user.home.clone() } else { PathBuf::from("/") };
    let cwd = match req.cwd {
        // Relative directories are taken from the user's home, as a login shell would.
        Some(dir) => {
            let path = home.join(&dir);
            let meta = std::fs::metadata(&path).map_err(|cause| ExecError::Cwd { path: dir.clone(), cause })?;
            if !meta.is_dir() {
                return Err(ExecError::CwdNotDir(dir));
            }
            path
        }
        None => home,
    };
    let mut env: BTreeMap<String, String> = [
        ("PATH", DEFAULT_PATH),
        ("LANG", "C.UTF-8"),
        ("TERM", "xterm"),
        ("HOME", &user.home.to_string_lossy()),
        ("USER", &user.name),
        ("LOGNAME", &user.name),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    env.extend(req.env);
    Ok(Plan { program, args, cwd, env, creds, stdin: req.stdin, controlling_tty: false })
}

impl Plan {
    pub(crate) fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .env_clear()
            .envs(&self.env)
            .current_dir(&self.cwd)
            .stdin(if self.stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let tty = self.controlling_tty;
        let creds = self.creds.as_ref().map(|u| {
            (Uid::from_raw(u.uid), Gid::from_raw(u.gid), u.groups.iter().map(|g| Gid::from_raw(*g)).collect::<Vec<_>>())
        });
        // SAFETY: the closure runs in the child between fork and exec, where only
        // async-signal-safe calls are allowed: it only makes the setsid/ioctl/setgroups/
        // setgid/setuid system calls, on data allocated before the fork, and allocates
        // nothing.
        unsafe {
            cmd.pre_exec(move || {
                nix::unistd::setsid()?;
                // std has already made the terminal's slave side fd 0: the new session
                // takes it as its controlling terminal (job control, ^C, SIGWINCH).
                if tty && libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                if let Some((uid, gid, groups)) = &creds {
                    nix::unistd::setgroups(groups)?;
                    nix::unistd::setgid(*gid)?;
                    nix::unistd::setuid(*uid)?;
                }
                Ok(())
            })
        };
        cmd
    }
}

/// A spawned command and the ends of its pipes.
struct Running {
    pid: Pid,
    stdin: Option<pipe::Sender>,
    stdout: pipe::Receiver,
    stderr: pipe::Receiver,
    exit: oneshot::Receiver<WaitStatus>,
    started: Instant,
    timeout: Option<Duration>,
}

async fn start(req: ExecRequest) -> Result<Running, ExecError> {
    let timeout = req.timeout_ms.map(Duration::from_millis);
    let (mut child, exit, started) = tokio::task::spawn_blocking(move || {
        let plan = plan(req)?;
        let started = Instant::now();
        let (child, exit) = reaper::spawn(&mut plan.command())
            .map_err(|cause| ExecError::Spawn { program: plan.program.clone(), cause })?;
        Ok::<_, ExecError>((child, exit, started))
    })
    .await
    .map_err(|e| ExecError::Pipe(io::Error::other(e)))??;
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("pids fit in i32"));
    let receiver =
        |fd: Option<OwnedFd>| pipe::Receiver::from_owned_fd(fd.ok_or_else(|| io::Error::other("pipe missing"))?);
    let (stdout, stderr) =
        match (receiver(child.stdout.take().map(Into::into)), receiver(child.stderr.take().map(Into::into))) {
            (Ok(o), Ok(e)) => (o, e),
            (Err(e), _) | (_, Err(e)) => {
                let _ = killpg(pid, Signal::SIGKILL);
                return Err(ExecError::Pipe(e));
            }
        };
    let stdin = match child.stdin.take() {
        Some(fd) => Some(pipe::Sender::from_owned_fd(fd.into()).map_err(ExecError::Pipe)?),
        None => None,
    };
    Ok(Running { pid, stdin, stdout, stderr, exit, started, timeout })
}

/// Where output frames go; forgets the host once it stopped listening.
struct Output(Option<mpsc::Sender<Frame>>);

impl Output {
    async fn send(&mut self, frame: Frame) {
        if let Some(tx) = &self.0 {
            if tx.send(frame).await.is_err() {
                self.0 = None;
            }
        }
    }
}

/// Read once from `pipe` unless it is closed; a closed pipe never completes.
pub(crate) async fn read_some(pipe: &mut Option<pipe::Receiver>, buf: &mut [u8]) -> io::Result<usize> {
    match pipe {
        Some(p) => p.read(buf).await,
        None => std::future::pending().await,
    }
}

/// After a read of `n` bytes into `buf`, keep reading for up to [`GATHER_WINDOW`] while
/// the buffer has room: programs that write in small pieces (4 KiB at a time, say) would
/// otherwise cost one frame each, which dominates in a slow guest. Returns the new length.
async fn gather(pipe: &mut Option<pipe::Receiver>, buf: &mut [u8], mut n: usize) -> usize {
    let Some(p) = pipe else { return n };
    let deadline = tokio::time::Instant::now() + GATHER_WINDOW;
    while n < buf.len() {
        tokio::select! {
            r = p.read(&mut buf[n..]) => match r {
                Ok(m) if m > 0 => n += m,
                // EOF or an error: the next read reports it.
                _ => break,
            },
            _ = tokio::time::sleep_until(deadline) => break,
        }
    }
    n
}

/// Read what is in `pipe` right now, without waiting (and without trusting tokio's cached
/// readiness, which may lag behind the exit notification).
async fn drain_now(pipe: &mut Option<pipe::Receiver>, kind: FrameKind, buf: &mut [u8], out: &mut Output) {
    let Some(p) = pipe else { return };
    let mut sent = 0;
    while sent < DRAIN_LIMIT {
        match nix::unistd::read(p.as_raw_fd(), buf) {
            Ok(0) => {
                *pipe = None;
                return;
            }
            Ok(n) => {
                out.send(Frame::new(kind, Bytes::copy_from_slice(&buf[..n]))).await;
                sent += n;
            }
            Err(nix::errno::Errno::EINTR) => continue,
            // EAGAIN: empty for now; the rest belongs to background children.
            Err(_) => return,
        }
    }
}

impl Running {
    /// Stream output until the main process exits, then send `Exit` and keep the pipes
    /// drained until every holder closes them.
    async fn pump(self, tx: mpsc::Sender<Frame>) {
        let Running { pid, stdout, stderr, mut exit, started, timeout, .. } = self;
        let mut out = Output(Some(tx));
        let timed_out = Arc::new(AtomicBool::new(false));
        let watchdog = timeout.map(|t| {
            let flag = timed_out.clone();
            tokio::spawn(async move {
                tokio::time::sleep(t).await;
                flag.store(true, Ordering::SeqCst);
                // The command runs in its own session: its pid is its process group.
                let _ = killpg(pid, Signal::SIGKILL);
            })
        });
        let (mut stdout, mut stderr) = (Some(stdout), Some(stderr));
        let (mut obuf, mut ebuf) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
        let status = loop {
            let (kind, pipe, buf, r) = tokio::select! {
                biased;
                st = &mut exit => break st.ok(),
                r = read_some(&mut stdout, &mut obuf) => (FrameKind::Stdout, &mut stdout, &mut obuf, r),
                r = read_some(&mut stderr, &mut ebuf) => (FrameKind::Stderr, &mut stderr, &mut ebuf, r),
            };
            match r {
                Ok(n) if n > 0 => {
                    let n = gather(pipe, buf, n).await;
                    out.send(Frame::new(kind, Bytes::copy_from_slice(&buf[..n]))).await
                }
                _ => *pipe = None,
            }
        };
        if let Some(w) = watchdog {
            w.abort();
        }
        drain_now(&mut stdout, FrameKind::Stdout, &mut obuf, &mut out).await;
        drain_now(&mut stderr, FrameKind::Stderr, &mut ebuf, &mut out).await;
        let last = match status {
            Some(ws) => {
                Frame::json(FrameKind::Exit, &exit_status(ws, timed_out.load(Ordering::SeqCst), started.elapsed()))
            }
            None => Frame::json(FrameKind::Error, &AgentError::new(ErrorCode::Internal, "lost the exit status")),
        };
        out.send(last).await;
        // Background children may hold the pipes for days: keep no more than the pipes.
        drop((out, obuf, ebuf));
        let discard = |pipe: Option<pipe::Receiver>| async move {
            if let Some(mut p) = pipe {
                let _ = tokio::io::copy(&mut p, &mut tokio::io::sink()).await;
            }
        };
        tokio::join!(discard(stdout), discard(stderr));
    }
}

/// Map a wait status onto the protocol's exit status (`128 + signal` like a shell; 124
/// when our timeout killed it).
pub(crate) fn exit_status(ws: WaitStatus, timeout_fired: bool, elapsed: Duration) -> ExitStatus {
    let (code, signal) = match ws {
        WaitStatus::Exited(_, code) => (code, None),
        WaitStatus::Signaled(_, sig, _) => (128 + sig as i32, Some(sig as i32)),
        other => unreachable!("waitpid without WUNTRACED/WCONTINUED returned {other:?}"),
    };
    // Only a death by our signal counts: the command may have exited on its own just then.
    let timed_out = timeout_fired && signal == Some(Signal::SIGKILL as i32);
    ExitStatus {
        exit_code: if timed_out { 124 } else { code },
        signal,
        timed_out,
        duration_ms: u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::tests::call;
    use bytes::BytesMut;
    use tokio_util::codec::Decoder;

    fn req(cmd: &str) -> ExecRequest {
        ExecRequest { cmd: Some(cmd.into()), ..Default::default() }
    }

    #[test]
    fn plans_shell_argv_cwd_and_env() {
        let p = plan(ExecRequest { env: [("A".into(), "1".into())].into(), ..req("echo") }).unwrap();
        assert_eq!((p.program.as_str(), p.args.as_slice()), ("/bin/sh", &["-c".to_string(), "echo".into()][..]));
        assert_eq!(p.env["A"], "1");
        assert_eq!(p.env["PATH"], DEFAULT_PATH);
        let p = plan(ExecRequest {
            argv: Some(vec!["ls".into(), "-l".into()]),
            cwd: Some("/tmp".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!((p.program.as_str(), p.cwd), ("ls", PathBuf::from("/tmp")));
        assert!(matches!(plan(ExecRequest::default()), Err(ExecError::NoCommand)));
        assert!(matches!(plan(ExecRequest { argv: Some(vec![]), ..Default::default() }), Err(ExecError::NoCommand)));
        let e = AgentError::from(plan(ExecRequest { cwd: Some("/no/such/dir".into()), ..req("true") }).unwrap_err());
        assert_eq!(e.code, ErrorCode::NotFound);
        let e = AgentError::from(plan(ExecRequest { cwd: Some("/etc/passwd".into()), ..req("true") }).unwrap_err());
        assert_eq!(e.code, ErrorCode::NotADirectory);
    }

    #[test]
    fn maps_wait_statuses() {
        let pid = Pid::from_raw(1);
        let s = exit_status(WaitStatus::Exited(pid, 3), false, Duration::from_millis(5));
        assert_eq!((s.exit_code, s.signal, s.timed_out, s.duration_ms), (3, None, false, 5));
        let s = exit_status(WaitStatus::Signaled(pid, Signal::SIGTERM, false), false, Duration::ZERO);
        assert_eq!((s.exit_code, s.signal), (143, Some(15)));
        let s = exit_status(WaitStatus::Signaled(pid, Signal::SIGKILL, false), true, Duration::ZERO);
        assert_eq!((s.exit_code, s.timed_out), (124, true));
        let s = exit_status(WaitStatus::Exited(pid, 0), true, Duration::ZERO);
        assert_eq!((s.exit_code, s.timed_out), (0, false));
    }

    #[tokio::test]
    async fn handler_streams_frames() {
        let start = Frame::json(FrameKind::Start, &req("echo out; echo err >&2; exit 7")).to_bytes();
        let (status, body) = call("POST", lizard_agent_proto::routes::EXEC, start).await;
        assert_eq!(status, 200);
        let mut buf = BytesMut::from(&body[..]);
        let mut frames = vec![];
        while let Some(f) = FrameCodec.decode(&mut buf).unwrap() {
            frames.push(f);
        }
        let last = frames.pop().unwrap();
        assert_eq!(last.kind, FrameKind::Exit);
        assert_eq!(serde_json::from_slice::<ExitStatus>(&last.data).unwrap().exit_code, 7);
        let text = |k| frames.iter().filter(|f| f.kind == k).flat_map(|f| f.data.to_vec()).collect::<Vec<u8>>();
        assert_eq!(text(FrameKind::Stdout), b"out\n");
        assert_eq!(text(FrameKind::Stderr), b"err\n");
    }

    #[tokio::test]
    async fn bad_start_frame_is_a_400() {
        let (status, body) =
            call("POST", lizard_agent_proto::routes::EXEC, Frame::new(FrameKind::Stdin, "x").to_bytes()).await;
        assert_eq!(status, 400);
        let e: AgentError = serde_json::from_slice(&body).unwrap();
        assert_eq!(e.code, ErrorCode::InvalidArgument);
    }
}
