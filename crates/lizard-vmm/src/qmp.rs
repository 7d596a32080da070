//! A minimal QMP (QEMU Machine Protocol) client: JSON lines over a Unix socket.
//!
//! QEMU greets with `{"QMP": …}`; the client must send `qmp_capabilities` before any
//! command. Each command is answered by one `{"return": …}` or `{"error": …}` line, in
//! order; asynchronous `{"event": …}` lines may arrive at any time, also while no command
//! runs. One reader task per connection reads every line as it comes: answers go to the
//! command waiting for them, and the events that matter ([`IoHalt`]) to a watch, so that a
//! VM stopped by a failed disk write is seen at once, not at the next command.

use crate::IoHalt;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch, Mutex};

/// Why a QMP exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    /// The socket did not start with QEMU's greeting.
    #[error("unexpected greeting {0}")]
    Greeting(String),
    /// Connecting to the socket failed.
    #[error("connect {}: {cause}", path.display())]
    Connect { path: std::path::PathBuf, cause: std::io::Error },
    /// Writing a command failed.
    #[error("{command}: {cause}")]
    Send { command: &'static str, cause: std::io::Error },
    /// A command line went out only in part.
    #[error("{command}: sent {sent} of {len} bytes")]
    PartialSend { command: &'static str, sent: usize, len: usize },
    /// Reading an answer failed.
    #[error("read: {0}")]
    Read(std::io::Error),
    /// QEMU closed the socket.
    #[error("QMP socket closed")]
    Closed,
    /// A line that is not JSON.
    #[error("bad QMP line {line:?}: {cause}")]
    BadLine { line: String, cause: serde_json::Error },
    /// QEMU answered a command with an error.
    #[error("{command}: {desc}")]
    Command { command: &'static str, class: String, desc: String },
    /// A migration (save or load) ended without completing.
    #[error("migration {status}: {desc}")]
    Migration { status: String, desc: String },
}

type Result<T, E = QmpError> = std::result::Result<T, E>;

/// One command at a time: the writer, and the answers the reader task passes on.
struct Exchange {
    writer: OwnedWriteHalf,
    answers: mpsc::UnboundedReceiver<Result<Value>>,
}

pub(crate) struct Qmp {
    exchange: Mutex<Exchange>,
    halt: std::sync::Arc<watch::Sender<Option<IoHalt>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Qmp {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Qmp {
    /// Connect to QEMU's QMP socket, retrying while QEMU is still creating it.
    pub async fn connect(path: &Path, deadline: Duration) -> Result<Qmp> {
        let start = std::time::Instant::now();
        let stream = loop {
            match UnixStream::connect(path).await {
                Ok(s) => break s,
                Err(e) if start.elapsed() < deadline => {
                    tracing::trace!("qmp connect {}: {e}", path.display());
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                Err(cause) => return Err(QmpError::Connect { path: path.to_path_buf(), cause }),
            }
        };
        let (r, writer) = stream.into_split();
        let mut r = BufReader::new(r);
        let greeting = read_json(&mut r).await?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Greeting(greeting.to_string()));
        }
        let (answer_tx, answers) = mpsc::unbounded_channel();
        let halt = std::sync::Arc::new(watch::Sender::new(None));
        let reader = tokio::spawn(read_lines(r, answer_tx, halt.clone()));
        let qmp = Qmp { exchange: Mutex::new(Exchange { writer, answers }), halt, reader };
        qmp.execute("qmp_capabilities", json!({})).await?;
        Ok(qmp)
    }

    /// Whether the VM stands stopped by a failed disk operation, as QEMU reported it.
    pub fn io_halt(&self) -> watch::Receiver<Option<IoHalt>> {
        self.halt.subscribe()
    }

    /// Ask QEMU whether the VM stands halted by a disk error now: for a VM taken back
    /// after the events that halted it went to a connection that is gone.
    pub async fn recheck_io_halt(&self) -> Result<()> {
        let status = self.execute("query-status", json!({})).await?;
        if status["status"] != "io-error" {
            return Ok(());
        }
        let disks = self.execute("query-block", json!({})).await?;
        let failed =
            disks.as_array().into_iter().flatten().find(|d| d["io-status"].as_str().is_some_and(|s| s != "ok"));
        let halt = IoHalt {
            disk: failed.and_then(|d| d["device"].as_str()).unwrap_or("").to_string(),
            no_space: failed.is_some_and(|d| d["io-status"] == "nospace"),
        };
        self.halt.send_replace(Some(halt));
        Ok(())
    }

    /// Run one command and return its `return` value.
    pub async fn execute(&self, command: &'static str, arguments: Value) -> Result<Value> {
        let mut g = self.exchange.lock().await;
        let line = command_line(command, arguments);
        g.writer.write_all(&line).await.map_err(|cause| QmpError::Send { command, cause })?;
        Self::answer(&mut g.answers, command).await
    }

    /// Hand QEMU an open file under `name` (`getfd`, the descriptor passed with the
    /// command as SCM_RIGHTS), for a later `fd:NAME` migration: no shell and `cat` to
    /// spawn per save or restore.
    pub async fn send_fd(&self, name: &str, fd: std::os::fd::BorrowedFd<'_>) -> Result<()> {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
        use std::os::fd::AsRawFd;
        let mut g = self.exchange.lock().await;
        let line = command_line("getfd", json!({ "fdname": name }));
        let sock: &UnixStream = g.writer.as_ref();
        let fds = [fd.as_raw_fd()];
        loop {
            sock.writable().await.map_err(|cause| QmpError::Send { command: "getfd", cause })?;
            let sent = sock.try_io(tokio::io::Interest::WRITABLE, || {
                let iov = [std::io::IoSlice::new(&line)];
                sendmsg::<()>(sock.as_raw_fd(), &iov, &[ControlMessage::ScmRights(&fds)], MsgFlags::empty(), None)
                    .map_err(std::io::Error::from)
            });
            match sent {
                Ok(n) if n == line.len() => break,
                // A partial send would leave half a command: the line is far below any
                // socket buffer, so this does not happen; refuse rather than guess.
                Ok(sent) => return Err(QmpError::PartialSend { command: "getfd", sent, len: line.len() }),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(cause) => return Err(QmpError::Send { command: "getfd", cause }),
            }
        }
        Self::answer(&mut g.answers, "getfd").await.map(drop)
    }

    /// The answer to `command`: the next answer line the reader passes on.
    async fn answer(answers: &mut mpsc::UnboundedReceiver<Result<Value>>, command: &'static str) -> Result<Value> {
        let v = answers.recv().await.unwrap_or(Err(QmpError::Closed))?;
        if let Some(r) = v.get("return") {
            return Ok(r.clone());
        }
        let e = &v["error"];
        let text = |key: &str| e[key].as_str().unwrap_or("").to_string();
        Err(QmpError::Command { command, class: text("class"), desc: text("desc") })
    }

    /// Set whether migration skips RAM in shared memory backends. On, guest memory is
    /// already in its file, so saving and loading a VM moves only device state; off, a
    /// save carries all of guest memory.
    pub async fn set_ignore_shared(&self, on: bool) -> Result<()> {
        let caps = json!({"capabilities": [{"capability": "x-ignore-shared", "state": on}]});
        self.execute("migrate-set-capabilities", caps).await.map(drop)
    }

    /// Poll `query-migrate` until migration (save or load) completes.
    pub async fn wait_migration(&self, deadline: Duration) -> crate::Result<()> {
        let start = std::time::Instant::now();
        let mut pause = Duration::from_micros(200);
        loop {
            let v = self.execute("query-migrate", json!({})).await?;
            match v["status"].as_str().unwrap_or("") {
                "completed" => return Ok(()),
                "failed" | "cancelled" => {
                    return Err(QmpError::Migration {
                        status: v["status"].as_str().unwrap_or("").to_string(),
                        desc: v["error-desc"].as_str().unwrap_or("no detail").to_string(),
                    }
                    .into())
                }
                _ => {}
            }
            if start.elapsed() > deadline {
                return Err(crate::VmmError::Timeout("migration"));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    }
}

fn command_line(command: &str, arguments: Value) -> Vec<u8> {
    let mut line = serde_json::to_vec(&json!({"execute": command, "arguments": arguments})).expect("json serializes");
    line.push(b'\n');
    line
}

/// Read every line QEMU sends until the socket closes: answers to the waiting command
/// (the failure that ended reading as the last), events into `halt`.
async fn read_lines(
    mut r: BufReader<OwnedReadHalf>,
    answers: mpsc::UnboundedSender<Result<Value>>,
    halt: std::sync::Arc<watch::Sender<Option<IoHalt>>>,
) {
    loop {
        let v = match read_json(&mut r).await {
            Ok(v) => v,
            Err(e) => {
                let _ = answers.send(Err(e));
                return;
            }
        };
        match v.get("event").and_then(Value::as_str) {
            Some(event) => note_event(event, &v["data"], &halt),
            None => {
                // Nobody waits only when the command's caller went away (its future
                // dropped); the answer has no one to go to.
                let _ = answers.send(Ok(v));
            }
        }
    }
}

/// A disk error QEMU stopped the VM for (`werror`/`rerror` `stop`, or `enospc` when the
/// host filesystem is full) halts it until a `cont`, whose `RESUME` ends the halt.
fn note_event(event: &str, data: &Value, halt: &watch::Sender<Option<IoHalt>>) {
    match event {
        "BLOCK_IO_ERROR" if data["action"] == "stop" => {
            let found = IoHalt {
                disk: data["device"].as_str().unwrap_or("").to_string(),
                no_space: data["nospace"].as_bool().unwrap_or(false),
            };
            halt.send_replace(Some(found));
        }
        "RESUME" => {
            halt.send_replace(None);
        }
        _ => {}
    }
}

async fn read_json(r: &mut BufReader<OwnedReadHalf>) -> Result<Value> {
    let mut line = String::new();
    let n = r.read_line(&mut line).await.map_err(QmpError::Read)?;
    if n == 0 {
        return Err(QmpError::Closed);
    }
    serde_json::from_str(&line).map_err(|cause| QmpError::BadLine { line: line.clone(), cause })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

    type Lines = tokio::io::Lines<BufReader<OwnedReadHalf>>;

    /// A QEMU stand-in's start: accept the client, greet it, accept its capabilities.
    async fn accept_and_greet(listener: tokio::net::UnixListener) -> (Lines, OwnedWriteHalf) {
        let (stream, _) = listener.accept().await.unwrap();
        let (r, mut w) = stream.into_split();
        let mut lines = BufReader::new(r).lines();
        w.write_all(b"{\"QMP\": {\"version\": {}}}\n").await.unwrap();
        lines.next_line().await.unwrap().unwrap();
        w.write_all(b"{\"return\": {}}\n").await.unwrap();
        (lines, w)
    }

    /// A QEMU stand-in that answers each command line with the next of `answers` (an
    /// event first, which the client must skip).
    async fn fake_qemu(listener: tokio::net::UnixListener, answers: Vec<&'static str>) {
        let (mut lines, mut w) = accept_and_greet(listener).await;
        for answer in answers {
            lines.next_line().await.unwrap().unwrap();
            w.write_all(b"{\"event\": \"STOP\"}\n").await.unwrap();
            w.write_all(answer.as_bytes()).await.unwrap();
            w.write_all(b"\n").await.unwrap();
        }
    }

    #[tokio::test]
    async fn qemu_errors_keep_their_class_and_description() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let answers = vec![
            r#"{"return": {"status": "running"}}"#,
            r#"{"error": {"class": "GenericError", "desc": "no such device"}}"#,
            r#"{"return": {"status": "failed", "error-desc": "disk full"}}"#,
        ];
        let qemu = tokio::spawn(fake_qemu(listener, answers));
        let qmp = Qmp::connect(&path, Duration::from_secs(5)).await.unwrap();
        assert_eq!(qmp.execute("query-status", json!({})).await.unwrap()["status"], "running");
        match qmp.execute("block_resize", json!({})).await {
            Err(QmpError::Command { command, class, desc }) => {
                assert_eq!((command, class.as_str(), desc.as_str()), ("block_resize", "GenericError", "no such device"))
            }
            other => panic!("not a command error: {other:?}"),
        }
        match qmp.wait_migration(Duration::from_secs(5)).await {
            Err(crate::VmmError::Control(QmpError::Migration { status, desc })) => {
                assert_eq!((status.as_str(), desc.as_str()), ("failed", "disk full"))
            }
            other => panic!("not a failed migration: {other:?}"),
        }
        qemu.await.unwrap();
        // QEMU gone: the write or the read fails, whichever notices first.
        let gone = qmp.execute("stop", json!({})).await;
        assert!(matches!(gone, Err(QmpError::Closed | QmpError::Send { command: "stop", .. })), "{gone:?}");
    }

    /// A disk error that stops the VM arrives while no command runs, and is seen then; a
    /// resume ends it; an error QEMU only reports halts nothing.
    #[tokio::test]
    async fn a_vm_halted_by_a_disk_error_is_seen_without_a_command_and_a_resume_ends_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let (go, ready) = tokio::sync::oneshot::channel::<()>();
        let qemu = tokio::spawn(async move {
            let (mut lines, mut w) = accept_and_greet(listener).await;
            ready.await.unwrap();
            let report =
                r#"{"event": "BLOCK_IO_ERROR", "data": {"device": "disk1", "action": "report", "nospace": false}}"#;
            let stop = r#"{"event": "BLOCK_IO_ERROR", "data": {"device": "disk0", "action": "stop", "nospace": true}}"#;
            for line in [report, stop, r#"{"event": "STOP"}"#] {
                w.write_all(format!("{line}\n").as_bytes()).await.unwrap();
            }
            assert!(lines.next_line().await.unwrap().unwrap().contains("cont"));
            w.write_all(b"{\"event\": \"RESUME\"}\n{\"return\": {}}\n").await.unwrap();
            lines.next_line().await.unwrap();
        });
        let qmp = Qmp::connect(&path, Duration::from_secs(5)).await.unwrap();
        let mut halt = qmp.io_halt();
        assert_eq!(*halt.borrow(), None);
        go.send(()).unwrap();
        let seen = tokio::time::timeout(Duration::from_secs(5), halt.wait_for(Option::is_some)).await;
        let seen = seen.expect("the halt was not seen").unwrap().clone();
        assert_eq!(seen, Some(IoHalt { disk: "disk0".into(), no_space: true }));
        qmp.execute("cont", json!({})).await.unwrap();
        assert_eq!(*qmp.io_halt().borrow(), None, "the resume did not end the halt");
        drop(qmp);
        qemu.await.unwrap();
    }
}
