//! `lizard sandbox shell ID`: an interactive terminal in a sandbox, like `ssh`.
//!
//! 1. Start a PTY process of the local terminal's size (`POST …/processes` with `pty`):
//!    its answer streams the terminal's output.
//! 2. Put the local terminal in raw mode (keys pass through untouched: `^C` goes to the
//!    sandbox, not to this CLI), and restore it however the command ends.
//! 3. Copy stdin to the process (`POST …/processes/{pid}/stdin`), the output to stdout,
//!    and on every `SIGWINCH` send the new size (`POST …/resize`).
//! 4. Exit with the remote shell's exit code once it ends.
//!
//! The same routes exist on the local node and on a server, so this works in both modes.
//! Stdin is read on a thread of its own: a blocking read of a terminal cannot be
//! cancelled, and the process exits when the shell does.

use crate::client::{json_body, ApiClient, Call};
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::Args;
use futures_util::StreamExt;
use http_body_util::BodyExt;
use lizard_agent_proto::frame::{FrameCodec, FrameKind};
use lizard_api::processes::{ProcessInfo, PtySize, StartProcessRequest};
use lizard_api::routes;
use nix::sys::termios::{self, SetArg, Termios};
use std::io::{IsTerminal, Read, Write};
use tokio::signal::unix::{signal, SignalKind};

/// The size when stdout is not a terminal.
const FALLBACK_SIZE: PtySize = PtySize { cols: 80, rows: 24 };

#[derive(Args, Debug)]
pub struct ShellArgs {
    id: String,
    /// A shell command to run on the terminal instead of the login shell.
    #[arg(long)]
    cmd: Option<String>,
    /// Working directory in the guest.
    #[arg(long)]
    cwd: Option<String>,
    /// Guest user to run as.
    #[arg(long)]
    user: Option<String>,
}

nix::ioctl_read_bad!(window_size, nix::libc::TIOCGWINSZ, nix::pty::Winsize);

/// The local terminal's size (stdout's), if it is one.
fn local_size() -> Option<PtySize> {
    let mut ws = nix::pty::Winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes one `struct winsize` into `ws`, which lives for the call;
    // fd 1 is this process's stdout (an error leaves `ws` as it was).
    unsafe { window_size(1, &mut ws) }.ok()?;
    (ws.ws_col > 0 && ws.ws_row > 0).then_some(PtySize { cols: ws.ws_col, rows: ws.ws_row })
}

/// The local terminal in raw mode until dropped.
struct RawMode(Termios);

impl RawMode {
    fn enter() -> Result<Option<RawMode>> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Ok(None);
        }
        let saved = termios::tcgetattr(&stdin).context("read the terminal's settings")?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(&stdin, SetArg::TCSANOW, &raw).context("put the terminal in raw mode")?;
        Ok(Some(RawMode(saved)))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, &self.0);
    }
}

/// Run the shell; `Ok(its exit code)`.
pub async fn shell(api: &ApiClient, a: ShellArgs) -> Result<i32> {
    let req = StartProcessRequest {
        cmd: Some(a.cmd.unwrap_or_else(|| lizard_api::processes::DEFAULT_SHELL.to_string())),
        cwd: a.cwd,
        user: a.user,
        pty: Some(local_size().unwrap_or(FALLBACK_SIZE)),
        ..Default::default()
    };
    let resp = api.send(&Call::new(&routes::START_PROCESS, &[&a.id]), json_body(&req)).await?;
    let body = resp.into_body().into_data_stream().map(|r| r.map_err(std::io::Error::other));
    let mut frames = tokio_util::codec::FramedRead::new(tokio_util::io::StreamReader::new(body), FrameCodec);
    let pid = match frames.next().await {
        Some(Ok(f)) if f.kind == FrameKind::Started => serde_json::from_slice::<ProcessInfo>(&f.data)?.pid,
        _ => bail!("the sandbox did not start a terminal"),
    };
    let _raw = RawMode::enter()?;
    let keyboard = tokio::spawn(forward_input(api.clone(), a.id.clone(), pid));
    let resizes = tokio::spawn(forward_resizes(api.clone(), a.id.clone(), pid));
    let mut stdout = std::io::stdout();
    let code = loop {
        let Some(frame) = frames.next().await else { bail!("the terminal's stream ended without an exit status") };
        let frame = frame.context("the sandbox stopped answering (the shell may still run)")?;
        match frame.kind {
            FrameKind::Stdout | FrameKind::Stderr => {
                stdout.write_all(&frame.data)?;
                stdout.flush()?;
            }
            FrameKind::Exit => break serde_json::from_slice::<lizard_api::ExitStatus>(&frame.data)?.exit_code,
            FrameKind::Error => bail!(serde_json::from_slice::<lizard_api::ApiError>(&frame.data)?),
            other => bail!("unexpected frame {other:?} in the terminal's output"),
        }
    };
    keyboard.abort();
    resizes.abort();
    Ok(code)
}

/// Stdin → the process, chunk by chunk as it is typed; at its end, `^D`.
async fn forward_input(api: ApiClient, id: String, pid: u32) -> Result<()> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = stdin.read(&mut buf) {
            if tx.blocking_send(Bytes::copy_from_slice(&buf[..n])).is_err() {
                return;
            }
        }
    });
    let pid = pid.to_string();
    while let Some(chunk) = rx.recv().await {
        let body = http_body_util::Full::new(chunk).map_err(|never| match never {}).boxed();
        api.send(&Call::new(&routes::PROCESS_STDIN, &[&id, &pid]), body).await?;
    }
    api.send(&Call::new(&routes::CLOSE_PROCESS_STDIN, &[&id, &pid]), crate::client::empty()).await?;
    Ok(())
}

/// Every `SIGWINCH`: the local terminal's new size → the process's terminal.
async fn forward_resizes(api: ApiClient, id: String, pid: u32) -> Result<()> {
    let mut winch = signal(SignalKind::window_change())?;
    let pid = pid.to_string();
    while winch.recv().await.is_some() {
        if let Some(size) = local_size() {
            api.send(&Call::new(&routes::RESIZE_PROCESS, &[&id, &pid]), json_body(&size)).await?;
        }
    }
    Ok(())
}
