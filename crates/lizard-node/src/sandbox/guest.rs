//! Operations inside a sandbox's guest, through its agent: commands, files and TCP
//! tunnels to guest ports.

use super::{transfer, Sandbox};
use crate::{NodeError, Result};
use lizard_agent_proto::frame::{Frame, FrameKind};
use std::sync::Arc;

/// Bytes the agent streams out of the guest.
pub type ByteStream = futures_util::stream::BoxStream<'static, std::io::Result<bytes::Bytes>>;

fn streamed(answer: lizard_agent_client::ReadFile) -> ByteStream {
    use futures_util::StreamExt;
    answer.map(|r| r.map_err(std::io::Error::other)).boxed()
}

impl Sandbox {
    /// A command's environment: the sandbox's under the request's `extra`; refused unless
    /// exactly one of `cmd` and a non-empty `argv` is given.
    fn command_env(
        &self,
        cmd: &Option<String>,
        argv: &Option<Vec<String>>,
        extra: std::collections::BTreeMap<String, String>,
    ) -> Result<std::collections::BTreeMap<String, String>> {
        if cmd.is_some() == argv.is_some() {
            return Err(NodeError::ExecCommand);
        }
        if argv.as_ref().is_some_and(|a| a.is_empty()) {
            return Err(NodeError::EmptyArgv);
        }
        let mut env = self.env.clone();
        env.extend(extra);
        Ok(env)
    }

    /// The agent's form of an exec request: the sandbox's environment under the
    /// request's, the template's directory and user unless the request names its own,
    /// stdin as a one-chunk stream.
    fn agent_exec(
        &self,
        req: lizard_api::ExecRequest,
    ) -> Result<(
        lizard_agent_proto::types::ExecRequest,
        Option<futures_util::stream::Once<std::future::Ready<bytes::Bytes>>>,
    )> {
        let env = self.command_env(&req.cmd, &req.argv, req.env)?;
        let stdin = req.stdin.map(|s| futures_util::stream::once(std::future::ready(bytes::Bytes::from(s))));
        let agent_req = lizard_agent_proto::types::ExecRequest {
            cmd: req.cmd,
            argv: req.argv,
            cwd: req.cwd.or_else(|| self.workdir.clone()),
            env,
            user: req.user.or_else(|| self.user.clone()),
            timeout_ms: req.timeout_ms,
            stdin: stdin.is_some(),
        };
        Ok((agent_req, stdin))
    }

    async fn start_exec(&self, req: lizard_api::ExecRequest) -> Result<lizard_agent_client::ExecStream> {
        let (req, stdin) = self.agent_exec(req)?;
        self.live()?.agent().exec(req, stdin).await.map_err(|e| self.agent_error(e))
    }

    /// Run a command to completion and collect its output (lossy UTF-8).
    pub async fn exec_collect(&self, req: lizard_api::ExecRequest) -> Result<lizard_api::ProcessResult> {
        use futures_util::StreamExt;
        let mut stream = self.start_exec(req).await?;
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        while let Some(event) = stream.next().await {
            match event {
                lizard_agent_client::ExecEvent::Stdout(b) => stdout.extend_from_slice(&b),
                lizard_agent_client::ExecEvent::Stderr(b) => stderr.extend_from_slice(&b),
            }
        }
        let status = stream.wait().await.map_err(|e| self.agent_error(e))?;
        Ok(lizard_api::ProcessResult {
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            exit_code: status.exit_code,
            timed_out: status.timed_out,
        })
    }

    /// Run a command, discard its output, and return how it ended (with the guest's own
    /// timing).
    pub async fn exec_status(&self, req: lizard_api::ExecRequest) -> Result<lizard_api::ExitStatus> {
        self.start_exec(req).await?.wait().await.map_err(|e| self.agent_error(e))
    }

    /// Run a command and stream its output as exec frames, ending with `Exit`, or with
    /// `Error` carrying an [`lizard_api::ApiError`].
    pub async fn exec_frames(
        self: &Arc<Self>,
        req: lizard_api::ExecRequest,
    ) -> Result<impl futures_util::Stream<Item = std::io::Result<Frame>> + Send + 'static> {
        use futures_util::StreamExt;
        let stream = self.start_exec(req).await?;
        let me = self.clone();
        Ok(futures_util::stream::unfold(Some(stream), move |state| {
            let me = me.clone();
            async move {
                let mut stream = state?;
                match stream.next().await {
                    Some(lizard_agent_client::ExecEvent::Stdout(b)) => {
                        Some((Ok(Frame::new(FrameKind::Stdout, b)), Some(stream)))
                    }
                    Some(lizard_agent_client::ExecEvent::Stderr(b)) => {
                        Some((Ok(Frame::new(FrameKind::Stderr, b)), Some(stream)))
                    }
                    None => {
                        let last = match stream.wait().await {
                            Ok(status) => Frame::json(FrameKind::Exit, &status),
                            Err(e) => Frame::json(FrameKind::Error, &me.agent_error(e).to_api()),
                        };
                        Some((Ok(last), None))
                    }
                }
            }
        }))
    }

    /// Stream a file out of the guest: its length (when known) and its bytes. The bytes
    /// come through the staging disk where they can (see [`super::transfer`]).
    pub async fn read_file(
        &self,
        path: &str,
    ) -> Result<(Option<u64>, futures_util::stream::BoxStream<'static, std::io::Result<bytes::Bytes>>)> {
        let staging = transfer::staging_file(&self.run_dir);
        let agent = self.live()?.agent();
        let (file, how) = agent.read_file_via(Some(&staging), path).await.map_err(|e| self.agent_error(e))?;
        self.transfers.record(how);
        let len = file.content_length();
        Ok((len, streamed(file)))
    }

    /// Stream `body` into a file in the guest (parents created, replaced atomically) as
    /// `opts` says, through the staging disk where it can.
    pub async fn write_file<S>(
        &self,
        path: &str,
        opts: &lizard_agent_client::WriteOptions,
        body: S,
    ) -> Result<lizard_api::WriteResult>
    where
        S: futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send + 'static,
    {
        let staging = transfer::staging_file(&self.run_dir);
        let agent = self.live()?.agent();
        let (result, how) =
            agent.write_file_via(Some(&staging), path, opts, Box::pin(body)).await.map_err(|e| self.agent_error(e))?;
        self.transfers.record(how);
        Ok(result)
    }

    /// How many of its file transfers went through the staging disk and how many over
    /// the agent channel.
    pub fn transfer_stats(&self) -> super::TransferStats {
        self.transfers.stats()
    }

    pub async fn list_dir(&self, path: &str) -> Result<Vec<lizard_api::FileEntry>> {
        self.live()?.agent().list_dir(path).await.map_err(|e| self.agent_error(e))
    }

    /// Remove a file or a directory tree.
    pub async fn remove(&self, path: &str) -> Result<()> {
        self.live()?.agent().remove(path).await.map_err(|e| self.agent_error(e))
    }

    /// Create a directory and its parents (those it creates belong to `owner`, root
    /// without one).
    pub async fn make_dir(&self, path: &str, owner: Option<&str>) -> Result<()> {
        self.live()?.agent().make_dir(path, owner).await.map_err(|e| self.agent_error(e))
    }

    /// What `lstat` says of `path` in the guest.
    pub async fn file_info(&self, path: &str) -> Result<lizard_api::FileInfo> {
        self.live()?.agent().file_info(path).await.map_err(|e| self.agent_error(e))
    }

    /// Move `from` to `to` in the guest; what is at `to` afterwards.
    pub async fn rename(&self, from: &str, to: &str) -> Result<lizard_api::FileInfo> {
        self.live()?.agent().rename(from, to).await.map_err(|e| self.agent_error(e))
    }

    /// A directory's changes as the agent's NDJSON lines, once its watches are in place.
    /// The stream fails when the agent's channel goes: a pause ends every watch (the
    /// guest frees them with the session), and a client watches again after the resume.
    pub async fn watch(&self, path: &str, recursive: bool) -> Result<ByteStream> {
        let lines = self.live()?.agent().watch(path, recursive).await.map_err(|e| self.agent_error(e))?;
        Ok(streamed(lines))
    }

    /// A directory of the guest as a tar archive, streamed as the agent makes it.
    pub async fn read_archive(&self, path: &str) -> Result<ByteStream> {
        let tar = self.live()?.agent().read_archive(path).await.map_err(|e| self.agent_error(e))?;
        Ok(streamed(tar))
    }

    /// Unpack the tar archive `body` into a directory of the guest (created).
    pub async fn write_archive<S>(&self, path: &str, body: S) -> Result<lizard_api::ArchiveResult>
    where
        S: futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send + 'static,
    {
        self.live()?.agent().write_archive(path, body).await.map_err(|e| self.agent_error(e))
    }

    /// A TCP connection to `port` on the guest's loopback, carried over the agent channel
    /// (not the guest network, which is closed to the host). This is what a reverse proxy for
    /// `{id}-{port}.sandbox.…` URLs writes requests into: raw bytes both ways, so HTTP/1.1
    /// keep-alive, streamed bodies and WebSocket upgrades pass through untouched.
    /// Nothing listening there is [`lizard_api::ErrorCode::Unavailable`]; port 0 is
    /// [`lizard_api::ErrorCode::InvalidArgument`].
    pub async fn connect_port(&self, port: u16) -> Result<lizard_agent_client::TcpTunnel> {
        self.live()?.agent().connect_tcp(port).await.map_err(|e| self.agent_error(e))
    }
}

/// A process's frames as the node passes them on: the agent's, and when the channel
/// breaks (a pause, a VM that stopped) one last `Error` frame carrying the
/// [`lizard_api::ApiError`] — the process itself runs on in the guest.
pub type ProcessFrameStream = futures_util::stream::BoxStream<'static, std::io::Result<Frame>>;

impl Sandbox {
    /// Start a background process (or a PTY): the sandbox's environment under the
    /// request's, the template's directory and user unless the request names its own.
    pub async fn start_process(
        self: &Arc<Self>,
        req: lizard_api::processes::StartProcessRequest,
    ) -> Result<ProcessFrameStream> {
        let env = self.command_env(&req.cmd, &req.argv, req.env)?;
        let agent_req = lizard_agent_proto::types::StartProcess {
            cmd: req.cmd,
            argv: req.argv,
            cwd: req.cwd.or_else(|| self.workdir.clone()),
            env,
            user: req.user.or_else(|| self.user.clone()),
            pty: req.pty.map(Into::into),
        };
        let frames = self.live()?.agent().start_process(&agent_req).await.map_err(|e| self.agent_error(e))?;
        Ok(self.pass_on(frames))
    }

    /// Reattach to a process: its kept output, then live output, then `Exit`.
    pub async fn process_output(self: &Arc<Self>, pid: u32) -> Result<ProcessFrameStream> {
        let frames = self.live()?.agent().process_output(pid).await.map_err(|e| self.agent_error(e))?;
        Ok(self.pass_on(frames))
    }

    /// The processes the guest keeps, running or ended.
    pub async fn list_processes(&self) -> Result<Vec<lizard_api::processes::ProcessInfo>> {
        let list = self.live()?.agent().list_processes().await.map_err(|e| self.agent_error(e))?;
        Ok(list.into_iter().map(Into::into).collect())
    }

    /// Input, end of input, a signal or a resize for a process.
    pub async fn control_process(&self, pid: u32, control: lizard_api::processes::ProcessControl) -> Result<()> {
        use lizard_api::processes::ProcessControl as C;
        let agent = self.live()?.agent();
        let done = match control {
            C::Stdin(data) => agent.process_stdin(pid, data.into()).await,
            C::CloseStdin => agent.close_process_stdin(pid).await,
            C::Signal(signal) => agent.signal_process(pid, &signal).await,
            C::Resize(size) => agent.resize_process(pid, size.into()).await,
        };
        done.map_err(|e| self.agent_error(e))
    }

    /// The TCP ports something listens on in the guest, the platform's own left out.
    pub async fn listening_ports(&self) -> Result<Vec<lizard_api::processes::ListeningPort>> {
        let ports = self.live()?.agent().listening_ports().await.map_err(|e| self.agent_error(e))?;
        Ok(lizard_api::processes::user_ports(ports))
    }

    /// Answer once something listens on TCP `port` in the guest, or `TIMED_OUT`.
    pub async fn wait_for_port(&self, port: u16, timeout_ms: u64) -> Result<()> {
        self.live()?.agent().wait_for_port(port, timeout_ms).await.map_err(|e| self.agent_error(e))
    }

    fn pass_on(self: &Arc<Self>, frames: lizard_agent_client::ProcessFrames) -> ProcessFrameStream {
        use futures_util::StreamExt;
        let me = self.clone();
        futures_util::stream::unfold(Some(frames), move |state| {
            let me = me.clone();
            async move {
                let mut frames = state?;
                match frames.next().await? {
                    Ok(frame) => Some((Ok(frame), Some(frames))),
                    Err(e) => Some((Ok(Frame::json(FrameKind::Error, &me.agent_error(e).to_api())), None)),
                }
            }
        })
        .boxed()
    }
}
