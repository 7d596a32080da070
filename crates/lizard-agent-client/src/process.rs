//! Background processes and terminals (the agent's process table), and waiting for a
//! guest port to listen: see `lizard_agent_proto::routes::PROCESSES`.

use crate::{empty, AgentClient, ClientError, Conn};
use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use http::Method;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use lizard_agent_proto::frame::{Frame, FrameCodec, FrameError};
use lizard_agent_proto::routes;
use lizard_agent_proto::types::{ListeningPort, ProcessInfo, PtySize, SignalRequest, StartProcess};

/// A process's frames as the agent sends them: `Started`, `Stdout`/`Stderr`, `Exit`. An
/// error ends the stream (the channel went away: the process runs on, and
/// [`AgentClient::process_output`] reattaches).
pub type ProcessFrames = BoxStream<'static, Result<Frame, ClientError>>;

fn frames(body: Incoming, conn: Conn) -> ProcessFrames {
    let data = body.into_data_stream().map_err(std::io::Error::other);
    tokio_util::codec::FramedRead::new(tokio_util::io::StreamReader::new(data), FrameCodec)
        .map(move |r| match r {
            Ok(frame) => Ok(frame),
            Err(FrameError::Io(_)) if conn.is_closed() => Err(ClientError::Closed),
            Err(FrameError::Io(e)) => Err(ClientError::Io(e)),
            Err(other) => Err(ClientError::Protocol(other.to_string())),
        })
        .boxed()
}

impl AgentClient {
    /// Start a process that outlives this call and this session; its frames follow.
    pub async fn start_process(&self, req: &StartProcess) -> Result<ProcessFrames, ClientError> {
        let resp = self.call_json(Method::POST, routes::PROCESSES.to_string(), req).await?;
        Ok(frames(resp.into_body(), self.conn.clone()))
    }

    /// Follow a process: its kept output, what it prints from now on, how it ends.
    pub async fn process_output(&self, pid: u32) -> Result<ProcessFrames, ClientError> {
        let resp = self.call(Method::GET, routes::process_output(pid), empty()).await?;
        Ok(frames(resp.into_body(), self.conn.clone()))
    }

    /// Every process the agent keeps, running or ended, oldest first.
    pub async fn list_processes(&self) -> Result<Vec<ProcessInfo>, ClientError> {
        self.json(self.call(Method::GET, routes::PROCESSES.to_string(), empty()).await?).await
    }

    /// Write `data` to a process's stdin (its terminal, for a PTY).
    pub async fn process_stdin(&self, pid: u32, data: Bytes) -> Result<(), ClientError> {
        let body = Full::new(data).map_err(|never| match never {}).boxed_unsync();
        self.call(Method::POST, routes::process_stdin(pid), body).await.map(drop)
    }

    /// Close a process's stdin (a PTY gets `^D`).
    pub async fn close_process_stdin(&self, pid: u32) -> Result<(), ClientError> {
        self.call(Method::DELETE, routes::process_stdin(pid), empty()).await.map(drop)
    }

    /// Send a signal (`SIGTERM`, `KILL`, `9`) to a process's group.
    pub async fn signal_process(&self, pid: u32, signal: &str) -> Result<(), ClientError> {
        let body = SignalRequest { signal: signal.to_string() };
        self.call_json(Method::POST, routes::process_signal(pid), &body).await.map(drop)
    }

    /// Resize a process's terminal.
    pub async fn resize_process(&self, pid: u32, size: PtySize) -> Result<(), ClientError> {
        self.call_json(Method::POST, routes::process_resize(pid), &size).await.map(drop)
    }

    /// The guest's listening TCP sockets, ordered by port.
    pub async fn listening_ports(&self) -> Result<Vec<ListeningPort>, ClientError> {
        self.json(self.call(Method::GET, routes::PORTS.to_string(), empty()).await?).await
    }

    /// Answer once something listens on TCP `port` in the guest; the agent's
    /// `TIMED_OUT` after `timeout_ms`.
    pub async fn wait_for_port(&self, port: u16, timeout_ms: u64) -> Result<(), ClientError> {
        let uri = format!("{}?timeoutMs={timeout_ms}", routes::port_wait(port));
        self.call(Method::GET, uri, empty()).await.map(drop)
    }
}
