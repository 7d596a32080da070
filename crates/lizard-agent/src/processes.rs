//! Background processes and pseudo-terminals: the agent's process table.
//!
//! An exec ([`crate::exec`]) lives as long as its request; a process started here lives
//! as long as the guest, whoever is connected.
//!
//! 1. `POST /v1/processes` resolves the command as an exec does (user, directory,
//!    environment), spawns it through the [`crate::reaper`] in a session of its own — on
//!    pipes, or on a pseudo-terminal ([`crate::pty`]) that becomes its controlling
//!    terminal — records it in the table under its pid, and answers with the stream that
//!    `GET /v1/processes/{pid}/output` gives: `Started`, output, `Exit`.
//! 2. One reader task per process appends what it prints to the process's output buffer,
//!    at most [`OUTPUT_CAP`] bytes (plus one read): past that the oldest output is dropped.
//!    The reader never waits for a client, so a slow or absent client never blocks the
//!    process.
//! 3. `…/output` replays what the buffer holds, follows live output, and ends with `Exit`
//!    once the process ended. Any number of readers follow a process at once, each at its
//!    own position; one that falls behind the buffer skips what was dropped.
//! 4. Input goes to the stdin pipe or the terminal's master side; signals go to the
//!    process group (the process leads its session), and `SIGHUP` to one on a terminal
//!    hangs the terminal up too, as closing its window does; a resize is `TIOCSWINSZ` on the
//!    master, and the kernel sends `SIGWINCH` to the terminal's foreground group.
//! 5. Ended processes stay listed, with their output and exit code, so that a client that
//!    reattaches late still learns how they ended: the [`KEEP_EXITED`] most recent.
//!
//! The table belongs to the agent process, not to a session: when the host goes away (a
//! pause freezes the whole VM; a node restart reconnects) processes, terminals and
//! buffers stay as they were, and a new session reattaches with `…/output`.

use crate::app::AppError;
use crate::exec::{self, ExecError};
use crate::pty;
use crate::reaper;
use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::Path;
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::{Stream, StreamExt};
use lizard_agent_proto::frame::{Frame, FrameKind};
use lizard_agent_proto::routes::FRAMES_CONTENT_TYPE;
use lizard_agent_proto::types::{
    AgentError, ErrorCode, ExecRequest, ExitStatus, ProcessInfo, PtySize, SignalRequest, StartProcess,
};
use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::WaitStatus;
use nix::unistd::Pid;
use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Stdio;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::io::unix::AsyncFd;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::sync::{oneshot, watch};

/// Output kept per process; past it the oldest output is dropped.
pub const OUTPUT_CAP: u64 = 1 << 20;
/// Ended processes kept in the table (with their output and exit code).
pub const KEEP_EXITED: usize = 64;
/// Processes running at once.
pub const MAX_RUNNING: usize = 1024;
/// Largest read from a pipe or terminal.
const CHUNK: usize = 64 * 1024;
/// After the process ended, read at most this much more of what it left in its pipes.
const DRAIN_LIMIT: usize = 1 << 20;
/// The largest terminal side accepted, in cells.
const MAX_CELLS: u16 = 1000;
/// What `closeStdin` sends to a terminal: end-of-transmission (`^D`), as a keyboard would.
const EOT: &[u8] = b"\x04";

/// Why a process request failed.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// The request body or path is malformed.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// No process of that pid in the table.
    #[error("no process {0}")]
    NotFound(u32),
    /// A resize of a process without a terminal.
    #[error("process {0} has no terminal")]
    NoPty(u32),
    /// Input after the process's stdin was closed, or after it ended.
    #[error("process {0} takes no more input")]
    StdinClosed(u32),
    #[error("unknown signal {0:?}")]
    Signal(String),
    #[error("a terminal must be 1..={MAX_CELLS} columns and rows, not {cols}x{rows}")]
    Size { cols: u16, rows: u16 },
    #[error("{MAX_RUNNING} processes are running already")]
    TooMany,
    #[error("cannot open a pseudo-terminal: {0}")]
    Pty(io::Error),
    #[error("signal to process {pid}: {cause}")]
    Kill { pid: u32, cause: nix::Error },
}

impl From<ProcessError> for AgentError {
    fn from(e: ProcessError) -> AgentError {
        let code = match &e {
            ProcessError::Exec(inner) => inner.code(),
            ProcessError::BadRequest(_) | ProcessError::Signal(_) | ProcessError::Size { .. } => {
                ErrorCode::InvalidArgument
            }
            ProcessError::NotFound(_) => ErrorCode::NotFound,
            ProcessError::NoPty(_) | ProcessError::StdinClosed(_) | ProcessError::TooMany => ErrorCode::Conflict,
            ProcessError::Pty(_) | ProcessError::Kill { .. } => ErrorCode::Internal,
        };
        AgentError::new(code, e.to_string())
    }
}

/// Where a process's input goes.
enum Input {
    Pipe(pipe::Sender),
    Terminal(Arc<AsyncFd<OwnedFd>>),
}

/// One piece of output, at its offset in everything the process printed.
struct Chunk {
    at: u64,
    kind: FrameKind,
    data: Bytes,
}

/// What a process printed (the newest [`OUTPUT_CAP`] bytes of it) and how it ended.
#[derive(Default)]
struct Output {
    chunks: VecDeque<Chunk>,
    /// Bytes printed in all.
    end: u64,
    exit: Option<ExitStatus>,
}

impl Output {
    fn push(&mut self, kind: FrameKind, data: Bytes) {
        let at = self.end;
        self.end += data.len() as u64;
        self.chunks.push_back(Chunk { at, kind, data });
        while self.chunks.len() > 1 && self.chunks.front().is_some_and(|c| self.end - c.at > OUTPUT_CAP) {
            self.chunks.pop_front();
        }
    }

    /// The frames of everything from offset `from` on (from the oldest kept byte when
    /// `from` was dropped), and the offset after them.
    fn since(&self, from: u64) -> (Vec<Frame>, u64) {
        let mut next = from;
        let mut frames = Vec::new();
        for c in &self.chunks {
            let end = c.at + c.data.len() as u64;
            if end <= next {
                continue;
            }
            let skip = usize::try_from(next.saturating_sub(c.at)).unwrap_or(usize::MAX).min(c.data.len());
            frames.push(Frame::new(c.kind, c.data.slice(skip..)));
            next = end;
        }
        (frames, next)
    }
}

/// A process in the table.
struct Process {
    info: ProcessInfo,
    /// Order of starts, to forget the oldest ended processes first.
    seq: u64,
    input: tokio::sync::Mutex<Option<Input>>,
    terminal: Option<Arc<AsyncFd<OwnedFd>>>,
    output: Mutex<Output>,
    /// Bumped on every change of `output`.
    changed: watch::Sender<()>,
}

impl Process {
    fn output(&self) -> std::sync::MutexGuard<'_, Output> {
        self.output.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, kind: FrameKind, data: &[u8]) {
        self.output().push(kind, Bytes::copy_from_slice(data));
        self.changed.send_replace(());
    }

    fn finish(&self, exit: ExitStatus) {
        self.output().exit = Some(exit);
        self.changed.send_replace(());
    }

    fn exit_code(&self) -> Option<i32> {
        self.output().exit.as_ref().map(|e| e.exit_code)
    }

    fn info(&self) -> ProcessInfo {
        ProcessInfo { exit_code: self.exit_code(), ..self.info.clone() }
    }

    /// `Started`, then every kept and every later piece of output, then `Exit`.
    fn follow(self: Arc<Self>) -> impl Stream<Item = Frame> + Send + 'static {
        let started = Frame::json(FrameKind::Started, &self.info());
        let rx = self.changed.subscribe();
        let rest = futures_util::stream::unfold(Some((self, rx, 0u64)), |state| async move {
            let (process, mut rx, from) = state?;
            loop {
                rx.borrow_and_update();
                let (frames, next, exit) = {
                    let out = process.output();
                    let (frames, next) = out.since(from);
                    (frames, next, out.exit.clone())
                };
                if !frames.is_empty() {
                    return Some((frames, Some((process, rx, next))));
                }
                if let Some(exit) = exit {
                    return Some((vec![Frame::json(FrameKind::Exit, &exit)], None));
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        });
        futures_util::stream::once(std::future::ready(started)).chain(rest.flat_map(futures_util::stream::iter))
    }
}

static TABLE: Mutex<BTreeMap<u32, Arc<Process>>> = Mutex::new(BTreeMap::new());
static STARTS: AtomicU64 = AtomicU64::new(0);

fn table() -> std::sync::MutexGuard<'static, BTreeMap<u32, Arc<Process>>> {
    TABLE.lock().unwrap_or_else(|e| e.into_inner())
}

fn find(pid: u32) -> Result<Arc<Process>, ProcessError> {
    table().get(&pid).cloned().ok_or(ProcessError::NotFound(pid))
}

/// Record `process`, forgetting the oldest ended ones past [`KEEP_EXITED`].
fn insert(process: Arc<Process>) {
    let mut table = table();
    table.insert(process.info.pid, process);
    let mut ended: Vec<(u64, u32)> =
        table.values().filter(|p| p.exit_code().is_some()).map(|p| (p.seq, p.info.pid)).collect();
    if ended.len() > KEEP_EXITED {
        ended.sort_unstable();
        for (_, pid) in &ended[..ended.len() - KEEP_EXITED] {
            table.remove(pid);
        }
    }
}

fn check_size(size: PtySize) -> Result<PtySize, ProcessError> {
    if (1..=MAX_CELLS).contains(&size.cols) && (1..=MAX_CELLS).contains(&size.rows) {
        Ok(size)
    } else {
        Err(ProcessError::Size { cols: size.cols, rows: size.rows })
    }
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).unwrap_or(0)
}

/// Spawn `req` and put it in the table; its reader runs in the background.
async fn start(req: StartProcess) -> Result<Arc<Process>, ProcessError> {
    if table().values().filter(|p| p.exit_code().is_none()).count() >= MAX_RUNNING {
        return Err(ProcessError::TooMany);
    }
    let size = req.pty.map(check_size).transpose()?;
    let cmd = match (&req.cmd, &req.argv) {
        (Some(cmd), _) => cmd.clone(),
        (None, Some(argv)) => argv.join(" "),
        (None, None) => String::new(),
    };
    let mut env = req.env;
    if size.is_some() {
        // Programs on a terminal draw with what TERM promises.
        env.entry("TERM".to_string()).or_insert_with(|| "xterm-256color".to_string());
    }
    let exec_req = ExecRequest {
        cmd: req.cmd,
        argv: req.argv,
        cwd: req.cwd,
        env,
        user: req.user,
        timeout_ms: None,
        stdin: size.is_none(),
    };
    let (mut child, exit, master) = tokio::task::spawn_blocking(move || {
        let mut plan = exec::plan(exec_req)?;
        let pair = size.map(pty::open).transpose().map_err(ProcessError::Pty)?;
        plan.controlling_tty = pair.is_some();
        let mut command = plan.command();
        let master = match pair {
            Some(pty::Pair { master, slave }) => {
                let stdio = |fd: &OwnedFd| fd.try_clone().map(Stdio::from).map_err(ProcessError::Pty);
                command.stdin(stdio(&slave)?).stdout(stdio(&slave)?).stderr(Stdio::from(slave));
                Some(master)
            }
            None => None,
        };
        let (child, exit) =
            reaper::spawn(&mut command).map_err(|cause| ExecError::Spawn { program: plan.program.clone(), cause })?;
        // `command` holds our copies of the terminal's slave side: they go with it, so
        // that the master reads EOF once the process and its children closed theirs.
        drop(command);
        Ok::<_, ProcessError>((child, exit, master))
    })
    .await
    .map_err(|e| ProcessError::Exec(ExecError::Pipe(io::Error::other(e))))??;
    let pid = child.id();
    let kill_it = |e: io::Error| {
        let _ = killpg(Pid::from_raw(pid_i32(pid)), Signal::SIGKILL);
        ProcessError::Exec(ExecError::Pipe(e))
    };
    let info = ProcessInfo { pid, cmd, started_at_ms: unix_ms(), pty: master.is_some(), exit_code: None };
    let seq = STARTS.fetch_add(1, Ordering::Relaxed);
    let started = Instant::now();
    let process = match master {
        Some(master) => {
            let master = Arc::new(crate::transport::register(master).map_err(kill_it)?);
            let process = Arc::new(Process {
                info,
                seq,
                input: tokio::sync::Mutex::new(Some(Input::Terminal(master.clone()))),
                terminal: Some(master.clone()),
                output: Mutex::default(),
                changed: watch::Sender::new(()),
            });
            tokio::spawn(read_terminal(process.clone(), master, exit, started));
            process
        }
        None => {
            let receiver = |fd: Option<OwnedFd>| {
                pipe::Receiver::from_owned_fd(fd.ok_or_else(|| io::Error::other("pipe missing"))?)
            };
            let stdout = receiver(child.stdout.take().map(Into::into)).map_err(kill_it)?;
            let stderr = receiver(child.stderr.take().map(Into::into)).map_err(kill_it)?;
            let stdin = child.stdin.take().ok_or_else(|| io::Error::other("pipe missing")).map_err(kill_it)?;
            let stdin = pipe::Sender::from_owned_fd(stdin.into()).map_err(kill_it)?;
            let process = Arc::new(Process {
                info,
                seq,
                input: tokio::sync::Mutex::new(Some(Input::Pipe(stdin))),
                terminal: None,
                output: Mutex::default(),
                changed: watch::Sender::new(()),
            });
            tokio::spawn(read_pipes(process.clone(), stdout, stderr, exit, started));
            process
        }
    };
    insert(process.clone());
    Ok(process)
}

fn pid_i32(pid: u32) -> i32 {
    i32::try_from(pid).unwrap_or(i32::MAX)
}

/// Record the process's end from its wait status.
fn finish(process: &Process, status: Option<WaitStatus>, started: Instant) {
    let exit = match status {
        Some(ws) => exec::exit_status(ws, false, started.elapsed()),
        // The reaper lost it (it cannot, short of a bug): report it ended, cause unknown.
        None => ExitStatus { exit_code: -1, signal: None, timed_out: false, duration_ms: 0 },
    };
    process.finish(exit);
}

/// Append what is in `pipe` right now, without waiting.
fn drain_pipe(process: &Process, pipe: &mut Option<pipe::Receiver>, kind: FrameKind, buf: &mut [u8]) {
    let Some(p) = pipe else { return };
    drain_fd(process, p.as_raw_fd(), kind, buf);
}

/// Append what can be read from `fd` right now, at most [`DRAIN_LIMIT`] bytes.
fn drain_fd(process: &Process, fd: std::os::fd::RawFd, kind: FrameKind, buf: &mut [u8]) {
    let mut taken = 0;
    while taken < DRAIN_LIMIT {
        match nix::unistd::read(fd, buf) {
            Ok(0) => return,
            Ok(n) => {
                process.push(kind, &buf[..n]);
                taken += n;
            }
            Err(nix::errno::Errno::EINTR) => continue,
            // EAGAIN: nothing more now; EIO: a terminal whose other side closed.
            Err(_) => return,
        }
    }
}

async fn read_pipes(
    process: Arc<Process>,
    stdout: pipe::Receiver,
    stderr: pipe::Receiver,
    mut exit: oneshot::Receiver<WaitStatus>,
    started: Instant,
) {
    let (mut stdout, mut stderr) = (Some(stdout), Some(stderr));
    let (mut obuf, mut ebuf) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
    let status = loop {
        let (kind, pipe, buf, r) = tokio::select! {
            biased;
            st = &mut exit => break st.ok(),
            r = exec::read_some(&mut stdout, &mut obuf) => (FrameKind::Stdout, &mut stdout, &obuf, r),
            r = exec::read_some(&mut stderr, &mut ebuf) => (FrameKind::Stderr, &mut stderr, &ebuf, r),
        };
        match r {
            Ok(n) if n > 0 => process.push(kind, &buf[..n]),
            _ => *pipe = None,
        }
    };
    drain_pipe(&process, &mut stdout, FrameKind::Stdout, &mut obuf);
    drain_pipe(&process, &mut stderr, FrameKind::Stderr, &mut ebuf);
    finish(&process, status, started);
    // Background children may hold the pipes on: read and forget until they close them.
    drop((obuf, ebuf));
    let discard = |pipe: Option<pipe::Receiver>| async move {
        if let Some(mut p) = pipe {
            let _ = tokio::io::copy(&mut p, &mut tokio::io::sink()).await;
        }
    };
    tokio::join!(discard(stdout), discard(stderr));
}

async fn read_terminal(
    process: Arc<Process>,
    master: Arc<AsyncFd<OwnedFd>>,
    mut exit: oneshot::Receiver<WaitStatus>,
    started: Instant,
) {
    let mut buf = vec![0u8; CHUNK];
    let mut open = true;
    let status = loop {
        tokio::select! {
            biased;
            st = &mut exit => break st.ok(),
            r = pty::read(&master, &mut buf), if open => match r {
                Ok(n) if n > 0 => process.push(FrameKind::Stdout, &buf[..n]),
                // EOF, or EIO: every slave side is closed.
                _ => open = false,
            },
        }
    };
    if open {
        drain_fd(&process, master.as_raw_fd(), FrameKind::Stdout, &mut buf);
    }
    finish(&process, status, started);
}

impl Process {
    async fn write(&self, data: &[u8]) -> Result<(), ProcessError> {
        let mut input = self.input.lock().await;
        let written = match input.as_mut() {
            None => return Err(ProcessError::StdinClosed(self.info.pid)),
            Some(Input::Pipe(p)) => p.write_all(data).await,
            Some(Input::Terminal(master)) => pty::write_all(master, data).await,
        };
        // EPIPE or EIO: the process (and whatever shared its input) is gone.
        written.map_err(|_| ProcessError::StdinClosed(self.info.pid))
    }

    async fn close_stdin(&self) -> Result<(), ProcessError> {
        let mut input = self.input.lock().await;
        match input.as_ref() {
            Some(Input::Terminal(master)) => {
                pty::write_all(master, EOT).await.map_err(|_| ProcessError::StdinClosed(self.info.pid))
            }
            _ => {
                // Dropping the pipe's only writer gives the process EOF.
                input.take();
                Ok(())
            }
        }
    }

    /// `SIGHUP` to a process on a terminal hangs the terminal up as well ([`pty::hang_up`]).
    fn signal(&self, signal: Signal) -> Result<(), ProcessError> {
        if self.exit_code().is_some() {
            // Ended already: nothing to signal, and its pid may belong to another process.
            return Ok(());
        }
        if let (Signal::SIGHUP, Some(master)) = (signal, &self.terminal) {
            if let Err(e) = pty::hang_up(master.get_ref()) {
                eprintln!("lizard-agent: hanging up the terminal of {}: {e}", self.info.pid);
            }
        }
        let pid = Pid::from_raw(pid_i32(self.info.pid));
        // The process leads its own group; a group gone (it changed its own) falls back
        // to the process alone.
        match killpg(pid, signal) {
            Ok(()) => Ok(()),
            Err(nix::errno::Errno::ESRCH) => match kill(pid, signal) {
                Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
                Err(cause) => Err(ProcessError::Kill { pid: self.info.pid, cause }),
            },
            Err(cause) => Err(ProcessError::Kill { pid: self.info.pid, cause }),
        }
    }

    fn resize(&self, size: PtySize) -> Result<(), ProcessError> {
        let size = check_size(size)?;
        let master = self.terminal.as_ref().ok_or(ProcessError::NoPty(self.info.pid))?;
        pty::resize(master.get_ref(), size).map_err(ProcessError::Pty)
    }
}

/// A signal by name (`SIGTERM`, `term`) or number.
pub fn parse_signal(name: &str) -> Result<Signal, ProcessError> {
    let bad = || ProcessError::Signal(name.to_string());
    if let Ok(n) = name.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| bad());
    }
    let upper = name.trim().to_ascii_uppercase();
    let full = if upper.starts_with("SIG") { upper } else { format!("SIG{upper}") };
    Signal::from_str(&full).map_err(|_| bad())
}

fn frames_response(frames: impl Stream<Item = Frame> + Send + 'static) -> Response {
    let body = Body::from_stream(frames.map(|f| Ok::<_, Infallible>(f.to_bytes())));
    ([(CONTENT_TYPE, FRAMES_CONTENT_TYPE)], body).into_response()
}

fn pid_of(path: Result<Path<u32>, PathRejection>) -> Result<u32, ProcessError> {
    path.map(|Path(pid)| pid).map_err(|e| ProcessError::BadRequest(e.body_text()))
}

fn json_of<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ProcessError> {
    serde_json::from_slice(body).map_err(|e| ProcessError::BadRequest(e.to_string()))
}

/// `POST /v1/processes`.
pub async fn start_handler(body: Bytes) -> Result<Response, AppError> {
    let process = start(json_of(&body)?).await?;
    Ok(frames_response(process.follow()))
}

/// `GET /v1/processes`: every process in the table, oldest first.
pub async fn list_handler() -> Json<Vec<ProcessInfo>> {
    let mut processes: Vec<Arc<Process>> = table().values().cloned().collect();
    processes.sort_by_key(|p| p.seq);
    Json(processes.iter().map(|p| p.info()).collect())
}

/// `GET /v1/processes/{pid}/output`.
pub async fn output_handler(path: Result<Path<u32>, PathRejection>) -> Result<Response, AppError> {
    Ok(frames_response(find(pid_of(path)?)?.follow()))
}

/// `POST /v1/processes/{pid}/stdin`.
pub async fn stdin_handler(path: Result<Path<u32>, PathRejection>, body: Bytes) -> Result<StatusCode, AppError> {
    find(pid_of(path)?)?.write(&body).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /v1/processes/{pid}/stdin`.
pub async fn close_stdin_handler(path: Result<Path<u32>, PathRejection>) -> Result<StatusCode, AppError> {
    find(pid_of(path)?)?.close_stdin().await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/processes/{pid}/signal`.
pub async fn signal_handler(path: Result<Path<u32>, PathRejection>, body: Bytes) -> Result<StatusCode, AppError> {
    let pid = pid_of(path)?;
    let signal = parse_signal(&json_of::<SignalRequest>(&body)?.signal)?;
    find(pid)?.signal(signal)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/processes/{pid}/resize`.
pub async fn resize_handler(path: Result<Path<u32>, PathRejection>, body: Bytes) -> Result<StatusCode, AppError> {
    let pid = pid_of(path)?;
    find(pid)?.resize(json_of(&body)?)?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// How long a test waits for something that should happen at once.
    const PATIENCE: Duration = Duration::from_secs(10);
    use crate::server::tests::call;
    use bytes::BytesMut;
    use lizard_agent_proto::routes;
    use tokio_util::codec::Decoder;

    fn decode(body: &[u8]) -> Vec<Frame> {
        let mut buf = BytesMut::from(body);
        let mut frames = vec![];
        while let Some(f) = lizard_agent_proto::frame::FrameCodec.decode(&mut buf).unwrap() {
            frames.push(f);
        }
        frames
    }

    fn text(frames: &[Frame], kind: FrameKind) -> String {
        String::from_utf8(frames.iter().filter(|f| f.kind == kind).flat_map(|f| f.data.to_vec()).collect()).unwrap()
    }

    async fn start_json(req: serde_json::Value) -> Vec<Frame> {
        let (status, body) = tokio::time::timeout(PATIENCE, call("POST", routes::PROCESSES, req.to_string()))
            .await
            .expect("the process ends");
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        decode(&body)
    }

    #[test]
    fn output_keeps_the_newest_bytes_and_resumes_at_an_offset() {
        let mut out = Output::default();
        let chunk = Bytes::from(vec![b'a'; 300 * 1024]);
        for _ in 0..5 {
            out.push(FrameKind::Stdout, chunk.clone());
        }
        out.push(FrameKind::Stderr, Bytes::from_static(b"tail"));
        let kept: u64 = out.chunks.iter().map(|c| c.data.len() as u64).sum();
        assert!(kept <= OUTPUT_CAP + CHUNK as u64 * 5, "{kept}");
        assert!(kept >= OUTPUT_CAP - 300 * 1024, "{kept}");
        // From 0 (dropped): from the oldest kept byte on; the last frame is the tail.
        let (frames, next) = out.since(0);
        assert_eq!(next, out.end);
        assert_eq!(frames.last().unwrap().data, Bytes::from_static(b"tail"));
        // From the middle of the tail: only its rest.
        let (frames, next) = out.since(out.end - 2);
        assert_eq!((frames.len(), &frames[0].data[..], next), (1, &b"il"[..], out.end));
        assert!(out.since(out.end).0.is_empty());
    }

    #[test]
    fn signals_by_name_or_number() {
        assert_eq!(parse_signal("SIGTERM").unwrap(), Signal::SIGTERM);
        assert_eq!(parse_signal("kill").unwrap(), Signal::SIGKILL);
        assert_eq!(parse_signal("2").unwrap(), Signal::SIGINT);
        for bad in ["", "SIGNOPE", "999", "-1"] {
            assert!(matches!(parse_signal(bad), Err(ProcessError::Signal(_))), "{bad}");
        }
    }

    #[tokio::test]
    async fn a_started_process_streams_started_output_and_exit() {
        let frames = start_json(serde_json::json!({"cmd": "echo out; echo err >&2; exit 3"})).await;
        assert_eq!(frames[0].kind, FrameKind::Started);
        let info: ProcessInfo = serde_json::from_slice(&frames[0].data).unwrap();
        assert_eq!((info.cmd.as_str(), info.pty), ("echo out; echo err >&2; exit 3", false));
        assert_eq!(text(&frames, FrameKind::Stdout), "out\n");
        assert_eq!(text(&frames, FrameKind::Stderr), "err\n");
        let exit: ExitStatus = serde_json::from_slice(&frames.last().unwrap().data).unwrap();
        assert_eq!((frames.last().unwrap().kind, exit.exit_code), (FrameKind::Exit, 3));
        // It stays listed with its exit code, and a late reader gets the whole story.
        let (_, body) = call("GET", routes::PROCESSES, Body::empty()).await;
        let list: Vec<ProcessInfo> = serde_json::from_slice(&body).unwrap();
        let listed = list.iter().find(|p| p.pid == info.pid).expect("listed");
        assert_eq!(listed.exit_code, Some(3));
        let (status, body) = call("GET", &routes::process_output(info.pid), Body::empty()).await;
        assert_eq!(status, 200);
        let again = decode(&body);
        assert_eq!((text(&again, FrameKind::Stdout), again.last().unwrap().kind), ("out\n".into(), FrameKind::Exit));
    }

    #[tokio::test]
    async fn unknown_pids_bad_signals_and_bad_sizes_are_refused() {
        let (status, body) = call("GET", &routes::process_output(u32::MAX - 1), Body::empty()).await;
        assert_eq!(status, 404, "{}", String::from_utf8_lossy(&body));
        let (status, _) = call("POST", &routes::process_stdin(u32::MAX - 1), "x").await;
        assert_eq!(status, 404);
        let (status, body) = call("POST", routes::PROCESSES, r#"{"cmd":"true","pty":{"cols":0,"rows":5}}"#).await;
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
        let (status, _) = call("POST", routes::PROCESSES, r#"{"bogus":1}"#).await;
        assert_eq!(status, 400);
        let (status, _) = call("POST", routes::PROCESSES, "{}").await;
        assert_eq!(status, 400);
    }
}
