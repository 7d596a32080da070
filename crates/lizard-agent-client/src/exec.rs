//! The client side of an exec: decode the agent's frames into events and an exit status.

use crate::{ClientError, Conn};
use bytes::{Bytes, BytesMut};
use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use lizard_agent_proto::frame::{Frame, FrameCodec, FrameKind};
use lizard_agent_proto::types::{AgentError, ExitStatus};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio_util::codec::Decoder;

/// Output of a running command, in the order the agent read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    Stdout(Bytes),
    Stderr(Bytes),
}

/// Everything a finished command printed, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub status: ExitStatus,
}

/// A running command: a stream of [`ExecEvent`]s that ends when the command does; then
/// [`ExecStream::wait`] tells how it ended. Dropping it detaches the command, which keeps
/// running in the guest with its output discarded.
pub struct ExecStream {
    steps: BoxStream<'static, Step>,
    result: Option<Result<ExitStatus, ClientError>>,
}

enum Step {
    Event(ExecEvent),
    Done(Result<ExitStatus, ClientError>),
}

struct Decoding {
    body: http_body_util::BodyDataStream<Incoming>,
    buf: BytesMut,
    conn: Conn,
}

impl ExecStream {
    pub(crate) fn new(body: Incoming, conn: Conn) -> ExecStream {
        let start = Decoding { body: body.into_data_stream(), buf: BytesMut::new(), conn };
        let steps = futures_util::stream::unfold(Some(start), |state| async move {
            let mut d = state?;
            loop {
                match FrameCodec.decode(&mut d.buf) {
                    Ok(Some(frame)) => {
                        return Some(match step(frame) {
                            event @ Step::Event(_) => (event, Some(d)),
                            done => (done, None),
                        })
                    }
                    Ok(None) => {}
                    Err(e) => return Some((Step::Done(Err(ClientError::Protocol(e.to_string()))), None)),
                }
                match d.body.next().await {
                    Some(Ok(chunk)) => d.buf.extend_from_slice(&chunk),
                    Some(Err(e)) => return Some((Step::Done(Err(d.conn.classify(e).await)), None)),
                    None => {
                        let e = ClientError::Protocol("exec stream ended without an exit status".into());
                        return Some((Step::Done(Err(e)), None));
                    }
                }
            }
        });
        ExecStream { steps: steps.boxed(), result: None }
    }

    /// Wait for the command to end (output not yet taken is skipped) and return its
    /// status, or why it could not run ([`ClientError::Agent`]).
    pub async fn wait(mut self) -> Result<ExitStatus, ClientError> {
        while self.next().await.is_some() {}
        self.result.take().unwrap_or(Err(ClientError::Protocol("exec status already taken".into())))
    }
}

fn step(frame: Frame) -> Step {
    let json_err = |e: serde_json::Error| ClientError::Protocol(format!("bad {:?} frame: {e}", frame.kind));
    match frame.kind {
        FrameKind::Stdout => Step::Event(ExecEvent::Stdout(frame.data)),
        FrameKind::Stderr => Step::Event(ExecEvent::Stderr(frame.data)),
        FrameKind::Exit => Step::Done(serde_json::from_slice::<ExitStatus>(&frame.data).map_err(json_err)),
        FrameKind::Error => Step::Done(Err(match serde_json::from_slice::<AgentError>(&frame.data) {
            Ok(e) => ClientError::Agent(e),
            Err(e) => json_err(e),
        })),
        other => Step::Done(Err(ClientError::Protocol(format!("unexpected {other:?} frame from the agent")))),
    }
}

impl Stream for ExecStream {
    type Item = ExecEvent;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ExecEvent>> {
        if self.result.is_some() {
            return Poll::Ready(None);
        }
        match ready!(self.steps.poll_next_unpin(cx)) {
            Some(Step::Event(e)) => Poll::Ready(Some(e)),
            Some(Step::Done(r)) => {
                self.result = Some(r);
                Poll::Ready(None)
            }
            None => {
                self.result = Some(Err(ClientError::Protocol("exec stream ended twice".into())));
                Poll::Ready(None)
            }
        }
    }
}
