//! File transfers through the staging disk, with the agent channel as the fallback.
//!
//! The channel (virtio-serial) hands the guest 4 KiB per interrupt; under TCG that bounds
//! a plain transfer near 40 MiB/s. Through the staging disk the bytes move in 4 MiB
//! windows by virtio-blk, double-buffered, and the channel carries one short notice per
//! window (protocol: `lizard_agent_proto::staging`). The API is the plain one's: the
//! same streaming, modes, atomic replace and error codes; only the path differs, and
//! [`TransferPath`] says which one a transfer took.
//!
//! The staged path is skipped, before any data moved, when the VM has no staging file,
//! every slot is busy, or the agent has no staging disk or staged routes.

use crate::staging_file::{Slot, StagingFile, StagingFileError};
use crate::{error_of, AgentClient, ClientError, ReadFile, ReqBody, WriteOptions, WriteResult};
use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Incoming;
use lizard_agent_proto::staging::{
    self, AgentMsg, HostMsg, LineBuffer, STAGED_READ, STAGED_WRITE, WINDOW, WINDOWS_PER_SLOT,
};
use tokio::sync::mpsc;

/// Response header the agent's staged routes always set (see the agent's `staged`).
const STAGED_HEADER: &str = "x-lizard-staged";

/// Which way a transfer's bytes went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferPath {
    /// Through the staging disk.
    Staged,
    /// Over the agent channel.
    Channel,
}

/// The outcome of trying the staged path: done, or not possible (nothing was sent).
enum Attempt<T, B> {
    Done(T),
    Unavailable(B),
}

impl AgentClient {
    /// [`AgentClient::write_file`] through a slot of `staging` when one is free and the
    /// guest has the disk, else over the channel.
    pub async fn write_file_via<S>(
        &self,
        staging: Option<&StagingFile>,
        path: &str,
        opts: &WriteOptions,
        body: S,
    ) -> Result<(WriteResult, TransferPath), ClientError>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send + Unpin + 'static,
    {
        let body = match claim(staging) {
            Some(slot) => match self.write_staged(&slot, path, opts, body).await? {
                Attempt::Done(r) => {
                    release(&slot).await;
                    return Ok((r, TransferPath::Staged));
                }
                Attempt::Unavailable(body) => body,
            },
            None => body,
        };
        Ok((self.write_file(path, opts, body).await?, TransferPath::Channel))
    }

    /// [`AgentClient::read_file`] through a slot of `staging` when one is free and the
    /// guest has the disk, else over the channel.
    pub async fn read_file_via(
        &self,
        staging: Option<&StagingFile>,
        path: &str,
    ) -> Result<(ReadFile, TransferPath), ClientError> {
        if let Some(slot) = claim(staging) {
            if let Attempt::Done(file) = self.read_staged(slot, path).await? {
                return Ok((file, TransferPath::Staged));
            }
        }
        Ok((self.read_file(path).await?, TransferPath::Channel))
    }

    /// Send the request of a staged transfer; `None` if this agent cannot do it.
    async fn start_staged(
        &self,
        route: &str,
        slot: &Slot,
        path: &str,
        opts: &WriteOptions,
    ) -> Result<Option<(Response<Incoming>, mpsc::UnboundedSender<Bytes>)>, ClientError> {
        let uri = format!(
            "http://lizard-agent{}&slot={}{}",
            crate::file_uri(route, path),
            slot.number(),
            crate::write_query(opts)
        );
        let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
        let notices = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
        let body: ReqBody = StreamBody::new(notices.map(|b| Ok(hyper::body::Frame::data(b)))).boxed_unsync();
        let req = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header(http::header::CONTENT_TYPE, staging::CONTENT_TYPE)
            .body(body)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let resp = self.send_raw(req).await?;
        if resp.status().is_success() {
            return Ok(Some((resp, tx)));
        }
        // No marker: an agent without staged routes. 503: no staging disk in the guest.
        if !resp.headers().contains_key(STAGED_HEADER) || resp.status() == StatusCode::SERVICE_UNAVAILABLE {
            tracing::debug!(status = %resp.status(), "staged transfer unavailable; using the channel");
            return Ok(None);
        }
        Err(error_of(resp).await)
    }

    async fn write_staged<S>(
        &self,
        slot: &Slot,
        path: &str,
        opts: &WriteOptions,
        mut body: S,
    ) -> Result<Attempt<WriteResult, S>, ClientError>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send + Unpin + 'static,
    {
        let Some((resp, tx)) = self.start_staged(STAGED_WRITE, slot, path, opts).await? else {
            return Ok(Attempt::Unavailable(body));
        };
        let mut answers = Notices::new(resp.into_body(), self);
        let mut free = [true; WINDOWS_PER_SLOT];
        let (mut window, mut total) = (0usize, 0u64);
        let mut pending = BytesMut::new();
        let mut source_done = false;
        loop {
            // Up to a window of the source.
            while !source_done && (pending.len() as u64) < WINDOW {
                match body.next().await {
                    Some(Ok(chunk)) => pending.extend_from_slice(&chunk),
                    Some(Err(e)) => return Err(ClientError::Io(e)),
                    None => source_done = true,
                }
            }
            if pending.is_empty() {
                break;
            }
            let take = pending.len().min(usize::try_from(WINDOW).unwrap_or(usize::MAX));
            let data = pending.split_to(take).freeze();
            while !free[window] {
                match answers.next().await? {
                    AgentMsg::Ack { window: w } => mark_free(&mut free, w)?,
                    other => return Err(unexpected(other)),
                }
            }
            let len = data.len() as u64;
            slot.put(window as u64, data).await.map_err(host_side)?;
            if send(&tx, &HostMsg::Chunk { window: window as u64, len }).is_err() {
                return Err(answers.why_closed().await);
            }
            free[window] = false;
            window = (window + 1) % free.len();
            total += len;
        }
        if send(&tx, &HostMsg::End { bytes: total }).is_err() {
            return Err(answers.why_closed().await);
        }
        loop {
            match answers.next().await? {
                AgentMsg::Ack { window: w } => mark_free(&mut free, w)?,
                AgentMsg::Written(r) => return Ok(Attempt::Done(r)),
                other => return Err(unexpected(other)),
            }
        }
    }

    async fn read_staged(&self, slot: Slot, path: &str) -> Result<Attempt<ReadFile, ()>, ClientError> {
        let Some((resp, tx)) = self.start_staged(STAGED_READ, &slot, path, &WriteOptions::default()).await? else {
            return Ok(Attempt::Unavailable(()));
        };
        let content_length = resp
            .headers()
            .get(staging::LENGTH_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let answers = Notices::new(resp.into_body(), self);
        let state = ReadState { answers, tx, slot, received: 0, content_length, done: false };
        let chunks = futures_util::stream::unfold(state, |mut s| async move {
            if s.done {
                return None;
            }
            let item = s.next_chunk().await;
            match item {
                Ok(Some(b)) => Some((Ok(b), s)),
                Ok(None) => {
                    release(&s.slot).await;
                    None
                }
                Err(e) => {
                    s.done = true;
                    Some((Err(e), s))
                }
            }
        })
        .boxed();
        Ok(Attempt::Done(ReadFile { content_length, chunks }))
    }
}

/// A free slot of `staging`, if any. A staging file that cannot be opened or locked is
/// no reason to fail a transfer: the channel still works.
fn claim(staging: Option<&StagingFile>) -> Option<Slot> {
    match staging?.claim() {
        Ok(slot) => slot,
        Err(e) => {
            tracing::warn!("staging file: {e}; using the agent channel");
            None
        }
    }
}

/// Hand a finished transfer's windows back to the host's file system.
async fn release(slot: &Slot) {
    if let Err(e) = slot.release_space().await {
        tracing::debug!("staging file: {e}");
    }
}

/// A failure on the staging file: the operator's log gets the cause (it names a host
/// path), the error only what kind of failure it was, since it may reach a client.
fn host_side(e: StagingFileError) -> ClientError {
    match e {
        StagingFileError::Layout(e) => ClientError::Protocol(e.to_string()),
        StagingFileError::Io { cause: ref source, .. } => {
            tracing::error!("{e}");
            ClientError::Io(std::io::Error::new(source.kind(), "the staging file of the transfer failed"))
        }
    }
}

fn send(tx: &mpsc::UnboundedSender<Bytes>, msg: &HostMsg) -> Result<(), ClientError> {
    // The request body is gone only when the stream was reset or the connection closed.
    tx.send(staging::encode(msg)).map_err(|_| ClientError::Closed)
}

fn mark_free(free: &mut [bool], window: u64) -> Result<(), ClientError> {
    match usize::try_from(window).ok().and_then(|w| free.get_mut(w)) {
        Some(f) => {
            *f = true;
            Ok(())
        }
        None => Err(ClientError::Protocol(format!("ack of window {window}"))),
    }
}

fn unexpected(msg: AgentMsg) -> ClientError {
    match msg {
        AgentMsg::Error(e) => ClientError::Agent(e),
        other => ClientError::Protocol(format!("unexpected staging notice {other:?}")),
    }
}

/// The agent's notices, read line by line from an answer's body.
struct Notices {
    body: Incoming,
    lines: LineBuffer,
    conn: crate::Conn,
}

impl Notices {
    fn new(body: Incoming, client: &AgentClient) -> Notices {
        Notices { body, lines: LineBuffer::default(), conn: client.conn.clone() }
    }

    /// Why the agent stopped reading the request: the error it sent, if any.
    async fn why_closed(&mut self) -> ClientError {
        match self.next().await {
            Ok(msg) => unexpected(msg),
            Err(e) => e,
        }
    }

    /// The next notice; a body that ends without one is a lost connection.
    async fn next(&mut self) -> Result<AgentMsg, ClientError> {
        loop {
            if let Some(msg) = self.lines.next_message().map_err(|e| ClientError::Protocol(e.to_string()))? {
                return Ok(msg);
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        self.lines.push(data);
                    }
                }
                Some(Err(e)) => return Err(self.conn.classify(e).await),
                None if self.conn.is_closed() => return Err(ClientError::Closed),
                None => return Err(ClientError::Protocol("the staged transfer ended without a word".into())),
            }
        }
    }
}

/// A staged read in progress.
struct ReadState {
    answers: Notices,
    tx: mpsc::UnboundedSender<Bytes>,
    slot: Slot,
    received: u64,
    content_length: Option<u64>,
    done: bool,
}

impl ReadState {
    /// The next chunk of the file; `None` at its announced end.
    async fn next_chunk(&mut self) -> Result<Option<Bytes>, ClientError> {
        match self.answers.next().await? {
            AgentMsg::Chunk { window, len } => {
                if self.content_length.is_some_and(|n| self.received + len > n) {
                    return Err(ClientError::Protocol("the agent sent more than the file's length".into()));
                }
                let data = self.slot.take(window, len).await.map_err(host_side)?;
                // An agent that stopped reading acks needs none: if it did, its answer
                // ends without `End`, which fails the read below.
                let _ = send(&self.tx, &HostMsg::Ack { window });
                self.received += len;
                Ok(Some(data))
            }
            AgentMsg::End { bytes } if bytes == self.received => {
                self.done = true;
                Ok(None)
            }
            AgentMsg::End { bytes } => {
                Err(ClientError::Protocol(format!("the agent announced {bytes} bytes but sent {}", self.received)))
            }
            other => Err(unexpected(other)),
        }
    }
}
