//! Host-side client of `lizard-agent`.
//!
//! [`AgentClient::connect`] takes any byte stream into the guest (a virtio-serial socket, a
//! vsock connection, a Unix socket to a dev-mode agent), runs the handshake, and then speaks
//! HTTP/2 over it. The client is cheap to clone and every clone shares the one connection,
//! which carries any number of concurrent calls. When the channel goes away (the VM died,
//! the node restarted it), calls fail with [`ClientError::Closed`] and
//! [`AgentClient::closed`] resolves.
//!
//! Exec output and file contents stream in both directions under HTTP/2 flow control:
//! neither side holds a whole file or a whole command's output. [`AgentClient::connect_tcp`]
//! opens a TCP connection to a port inside the guest, carried on the same channel.

mod cut;
mod error;
mod exec;
mod process;
mod staged;
mod staging_file;
mod tunnel;

pub use error::ClientError;
pub use exec::{ExecEvent, ExecOutput, ExecStream};
pub use lizard_agent_proto::handshake::Secret;
pub use lizard_agent_proto::types::{
    AgentError, ArchiveResult, ErrorCode, ExecRequest, ExitStatus, FileEntry, FileInfo, FileType, FsEvent, FsEventKind,
    Health, ProcessInfo, PtySize, StartProcess, WriteOptions, WriteResult,
};
pub use process::ProcessFrames;
pub use staged::TransferPath;
pub use staging_file::{StagingFile, StagingFileError};
pub use tunnel::TcpTunnel;

use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt, TryStreamExt};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full, Limited, StreamBody};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use lizard_agent_proto::frame::{Frame, FrameKind, MAX_FRAME};
use lizard_agent_proto::{handshake, routes};
use serde::de::DeserializeOwned;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

/// HTTP/2 flow-control windows; large, so that one stream can fill a fast channel.
const STREAM_WINDOW: u32 = 4 << 20;
const CONNECTION_WINDOW: u32 = 16 << 20;
const MAX_FRAME_SIZE: u32 = 1 << 20;
/// Largest error body read from the agent.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// How long a failed call waits to see whether the whole connection went down with it.
const CLOSE_GRACE: Duration = Duration::from_millis(50);

/// The type to name when [`AgentClient::exec`] gets no stdin: `None::<NoStdin>`.
pub type NoStdin = futures_util::stream::Empty<Bytes>;

type ReqBody = UnsyncBoxBody<Bytes, std::io::Error>;

/// A connection to one agent. Clone freely; all clones share the connection, which closes
/// once every clone and every response still being read ([`ExecStream`], [`ReadFile`]) or
/// tunnel still open ([`TcpTunnel`]) is dropped. A virtio-serial channel has one peer at a time, so drop all of them before
/// connecting again.
#[derive(Clone)]
pub struct AgentClient {
    tx: SendRequest<ReqBody>,
    conn: Conn,
}

/// Watches the connection task; turns errors into [`ClientError::Closed`] once it ended.
#[derive(Clone)]
struct Conn {
    done: watch::Receiver<bool>,
    /// Ends the connection task whoever still holds a handle.
    stop: std::sync::Arc<tokio::sync::Notify>,
}

impl Conn {
    fn is_closed(&self) -> bool {
        *self.done.borrow()
    }

    async fn closed(&self) {
        // An error means the task is gone without a word: closed all the same.
        let _ = self.done.clone().wait_for(|done| *done).await;
    }

    /// Classify an HTTP error: did the channel die, did our own body fail, or what else.
    async fn classify(&self, e: hyper::Error) -> ClientError {
        if e.is_closed() || e.is_canceled() || tokio::time::timeout(CLOSE_GRACE, self.closed()).await.is_ok() {
            return ClientError::Closed;
        }
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            if let Some(io) = s.downcast_ref::<std::io::Error>() {
                return ClientError::Io(std::io::Error::new(io.kind(), io.to_string()));
            }
            source = s.source();
        }
        ClientError::Http(e)
    }
}

impl AgentClient {
    /// Authenticate on `stream` with the sandbox's secret and open the HTTP/2 session.
    pub async fn connect<S>(mut stream: S, secret: &Secret) -> Result<AgentClient, ClientError>
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        handshake::host_connect(&mut stream, secret).await?;
        tracing::debug!("agent handshake done");
        Self::open_session(stream).await
    }

    /// Authenticate to a guest restored from a snapshot with the secret it was saved with,
    /// giving it `identity` in the same message (one round trip instead of a handshake and
    /// an [`AgentClient::identity`] call). Once this returns, the guest has applied the
    /// identity and only `identity.secret` opens later sessions; this one carries on.
    pub async fn connect_with_identity<S>(
        mut stream: S,
        saved_secret: &Secret,
        identity: &lizard_agent_proto::types::Identity,
    ) -> Result<AgentClient, ClientError>
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        handshake::host_connect_with_identity(&mut stream, saved_secret, identity).await?;
        tracing::debug!("agent handshake with identity done");
        Self::open_session(stream).await
    }

    /// The HTTP/2 session over an authenticated stream.
    async fn open_session<S>(stream: S) -> Result<AgentClient, ClientError>
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let (stream, cutter) = cut::Cuttable::new(stream);
        let (tx, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_frame_size(MAX_FRAME_SIZE)
            .max_send_buf_size(MAX_FRAME_SIZE as usize)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(ClientError::Http)?;
        tracing::debug!("agent http/2 session open");
        let (done_tx, done) = watch::channel(false);
        let stop = std::sync::Arc::new(tokio::sync::Notify::new());
        let stopped = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = connection => {}
                // hyper's own task drives the connection on while a handle or body uses
                // it: its stream is cut, so that it (and every stream on it) ends now.
                _ = stopped.notified() => cutter.cut(),
            }
            let _ = done_tx.send(true);
        });
        Ok(AgentClient { tx, conn: Conn { done, stop } })
    }

    /// Whether the channel to the agent is gone.
    pub fn is_closed(&self) -> bool {
        self.conn.is_closed() || self.tx.is_closed()
    }

    /// Resolves once the channel to the agent is gone (e.g. the VM exited).
    pub async fn closed(&self) {
        self.conn.closed().await
    }

    /// Drop this handle and wait until the connection has ended, which it does once no
    /// other clone, response or tunnel still uses it. Use it before connecting again over
    /// a channel that takes one peer at a time (virtio-serial).
    pub async fn close(self) {
        let conn = self.conn.clone();
        drop(self);
        conn.closed().await
    }

    /// End the connection now, for every handle, response and tunnel that uses it (the VM
    /// is about to be paused: the agent must see its host leave while it still runs).
    pub async fn shutdown(&self) {
        self.conn.stop.notify_one();
        self.conn.closed().await
    }

    /// Give a guest restored from a snapshot its own identity (new secret, hostname,
    /// entropy, wall clock); see [`lizard_agent_proto::types::Identity`]. This session
    /// stays usable; later ones must use the new secret.
    pub async fn identity(&self, identity: &lizard_agent_proto::types::Identity) -> Result<(), ClientError> {
        self.post_json(routes::IDENTITY, identity).await
    }

    /// Mount the volume disk at `/workspace` once the guest sees it as `size_bytes` long.
    pub async fn mount_volume(&self, size_bytes: u64) -> Result<(), ClientError> {
        self.post_json(routes::VOLUME_MOUNT, &lizard_agent_proto::types::VolumeMount { size_bytes }).await
    }

    /// Write everything the guest cached for `/workspace` to the volume disk.
    pub async fn sync_volume(&self) -> Result<(), ClientError> {
        self.call(Method::POST, routes::VOLUME_SYNC.to_string(), empty()).await.map(drop)
    }

    /// The agent's version, kernel, hostname and uptime.
    pub async fn health(&self) -> Result<Health, ClientError> {
        self.json(self.call(Method::GET, routes::HEALTH.to_string(), empty()).await?).await
    }

    /// Start a command. Output arrives as [`ExecEvent`]s on the returned stream; its
    /// [`ExecStream::wait`] gives the exit status. With `stdin`, its chunks are fed to the
    /// command, which sees EOF when the stream ends; without (`None::<NoStdin>`), stdin is
    /// /dev/null. `req.stdin` is set from `stdin`.
    pub async fn exec<S>(&self, mut req: ExecRequest, stdin: Option<S>) -> Result<ExecStream, ClientError>
    where
        S: Stream<Item = Bytes> + Send + 'static,
    {
        req.stdin = stdin.is_some();
        let start = Frame::json(FrameKind::Start, &req).to_bytes();
        let body = match stdin {
            None => Full::new(start).map_err(|never| match never {}).boxed_unsync(),
            Some(input) => {
                let frames = futures_util::stream::once(async { start })
                    .chain(input.flat_map(|chunk| futures_util::stream::iter(stdin_frames(chunk))))
                    .chain(futures_util::stream::once(async {
                        Frame::new(FrameKind::StdinEof, Bytes::new()).to_bytes()
                    }));
                StreamBody::new(frames.map(|b| Ok(hyper::body::Frame::data(b)))).boxed_unsync()
            }
        };
        let resp = self.call(Method::POST, routes::EXEC.to_string(), body).await?;
        Ok(ExecStream::new(resp.into_body(), self.conn.clone()))
    }

    /// Run a command without stdin and collect all of its output.
    pub async fn exec_collect(&self, req: ExecRequest) -> Result<ExecOutput, ClientError> {
        let mut stream = self.exec(req, None::<NoStdin>).await?;
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        while let Some(event) = stream.next().await {
            match event {
                ExecEvent::Stdout(b) => stdout.extend_from_slice(&b),
                ExecEvent::Stderr(b) => stderr.extend_from_slice(&b),
            }
        }
        Ok(ExecOutput { stdout, stderr, status: stream.wait().await? })
    }

    /// Write `body` to the absolute `path` (parents are created) as `opts` says. The agent
    /// replaces the file atomically once the whole body arrived.
    pub async fn write_file<S>(&self, path: &str, opts: &WriteOptions, body: S) -> Result<WriteResult, ClientError>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
    {
        let uri = file_uri(routes::FILES, path) + &write_query(opts);
        let body = StreamBody::new(body.map_ok(hyper::body::Frame::data)).boxed_unsync();
        self.json(self.call(Method::PUT, uri, body).await?).await
    }

    /// Stream the file at the absolute `path`.
    pub async fn read_file(&self, path: &str) -> Result<ReadFile, ClientError> {
        let resp = self.call(Method::GET, file_uri(routes::FILES, path), empty()).await?;
        Ok(self.streamed(resp))
    }

    /// What `lstat` says of `path` (a link is described, not followed).
    pub async fn file_info(&self, path: &str) -> Result<FileInfo, ClientError> {
        self.json(self.call(Method::GET, file_uri(routes::FILES_INFO, path), empty()).await?).await
    }

    /// Move `from` to `to` (`rename(2)`); what is at `to` afterwards.
    pub async fn rename(&self, from: &str, to: &str) -> Result<FileInfo, ClientError> {
        let uri = format!("{}&to={}", file_uri(routes::FILES_RENAME, from), urlencoding::encode(to));
        self.json(self.call(Method::POST, uri, empty()).await?).await
    }

    /// Watch the directory `path` (and, `recursive`, everything under it): NDJSON
    /// [`FsEvent`] lines (blank lines between them keep it checked) until dropped, which
    /// frees the watches. Returns once the watches are in place.
    pub async fn watch(&self, path: &str, recursive: bool) -> Result<ReadFile, ClientError> {
        let uri = format!("{}&recursive={recursive}", file_uri(routes::FILES_WATCH, path));
        Ok(self.streamed(self.call(Method::GET, uri, empty()).await?))
    }

    /// The directory `path` as a tar archive, streamed as the agent makes it.
    pub async fn read_archive(&self, path: &str) -> Result<ReadFile, ClientError> {
        Ok(self.streamed(self.call(Method::GET, file_uri(routes::FILES_ARCHIVE, path), empty()).await?))
    }

    /// Unpack the tar archive `body` into the directory `path` (created with its
    /// parents); an entry that would land outside it is refused.
    pub async fn write_archive<S>(&self, path: &str, body: S) -> Result<ArchiveResult, ClientError>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
    {
        let body = StreamBody::new(body.map_ok(hyper::body::Frame::data)).boxed_unsync();
        self.json(self.call(Method::PUT, file_uri(routes::FILES_ARCHIVE, path), body).await?).await
    }

    /// A streamed answer's body, with the length it announced.
    fn streamed(&self, resp: Response<Incoming>) -> ReadFile {
        let content_length =
            resp.headers().get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
        let conn = self.conn.clone();
        let chunks = resp
            .into_body()
            .into_data_stream()
            .then(move |r| {
                let conn = conn.clone();
                async move {
                    match r {
                        Ok(b) => Ok(b),
                        Err(e) => Err(conn.classify(e).await),
                    }
                }
            })
            .boxed();
        ReadFile { content_length, chunks }
    }

    /// The entries of the directory at `path`, sorted by name.
    pub async fn list_dir(&self, path: &str) -> Result<Vec<FileEntry>, ClientError> {
        self.json(self.call(Method::GET, file_uri(routes::FILES_LIST, path), empty()).await?).await
    }

    /// Remove a file, symlink, or directory (recursively).
    pub async fn remove(&self, path: &str) -> Result<(), ClientError> {
        self.call(Method::DELETE, file_uri(routes::FILES, path), empty()).await.map(drop)
    }

    /// Create a directory and its parents; an existing directory is fine.
    pub async fn make_dir(&self, path: &str, owner: Option<&str>) -> Result<(), ClientError> {
        let opts = WriteOptions { owner: owner.map(str::to_owned), ..WriteOptions::default() };
        self.call(Method::POST, file_uri(routes::FILES_MKDIR, path) + &write_query(&opts), empty()).await.map(drop)
    }

    /// Open a TCP connection to `port` on the guest's loopback (`127.0.0.1`, or `::1`
    /// for a service bound only there), tunnelled through the agent. Fails with
    /// [`ErrorCode::ConnectionRefused`] when nothing listens there, and with
    /// [`ErrorCode::InvalidArgument`] for port 0. Any number of tunnels may be open at
    /// once, next to execs and file transfers.
    pub async fn connect_tcp(&self, port: u16) -> Result<TcpTunnel, ClientError> {
        self.open_tunnel(&routes::tunnel_authority(port), port).await
    }

    /// Wait for the next connection a guest process makes to the agent's forward
    /// listener ([`routes::FORWARD_GUEST_ADDR`]) and return it as a byte stream. Pending
    /// calls queue on the agent; dropping one gives up its place without losing a
    /// connection.
    pub async fn accept_forward(&self) -> Result<TcpTunnel, ClientError> {
        self.open_tunnel(routes::FORWARD_AUTHORITY, 0).await
    }

    /// CONNECT to `authority` and take over the upgraded stream as a tunnel to guest
    /// `port` (0 for a forwarded connection).
    async fn open_tunnel(&self, authority: &str, port: u16) -> Result<TcpTunnel, ClientError> {
        let req = Request::builder()
            .method(Method::CONNECT)
            .uri(authority)
            .body(empty())
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let resp = self.send(req).await?;
        if resp.status() != StatusCode::OK {
            // hyper hands over the stream only on exactly 200.
            return Err(ClientError::Protocol(format!("CONNECT answered {}", resp.status())));
        }
        match hyper::upgrade::on(resp).await {
            Ok(upgraded) => Ok(TcpTunnel::new(upgraded, port)),
            Err(e) => Err(self.conn.classify(e).await),
        }
    }

    /// Send one request; a non-success answer becomes [`ClientError::Agent`].
    async fn call(
        &self,
        method: Method,
        path_and_query: String,
        body: ReqBody,
    ) -> Result<Response<Incoming>, ClientError> {
        let req = Request::builder()
            .method(method)
            .uri(format!("http://lizard-agent{path_and_query}"))
            .body(body)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.send(req).await
    }

    /// POST `value` as JSON to `route`; only whether it succeeded is kept of the answer.
    async fn post_json<T: serde::Serialize>(&self, route: &str, value: &T) -> Result<(), ClientError> {
        self.call_json(Method::POST, route.to_string(), value).await.map(drop)
    }

    /// Send `value` as a JSON body; a non-success answer becomes [`ClientError::Agent`].
    async fn call_json<T: serde::Serialize>(
        &self,
        method: Method,
        path_and_query: String,
        value: &T,
    ) -> Result<Response<Incoming>, ClientError> {
        let body = serde_json::to_vec(value).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let body = Full::new(Bytes::from(body)).map_err(|never| match never {}).boxed_unsync();
        let req = Request::builder()
            .method(method)
            .uri(format!("http://lizard-agent{path_and_query}"))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.send(req).await
    }

    /// Send a built request; a non-success answer becomes [`ClientError::Agent`].
    async fn send(&self, req: Request<ReqBody>) -> Result<Response<Incoming>, ClientError> {
        let resp = self.send_raw(req).await?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(error_of(resp).await)
    }

    /// Send a built request and return whatever the agent answered.
    async fn send_raw(&self, req: Request<ReqBody>) -> Result<Response<Incoming>, ClientError> {
        let mut tx = self.tx.clone();
        if let Err(e) = tx.ready().await {
            return Err(self.conn.classify(e).await);
        }
        match tx.send_request(req).await {
            Ok(r) => Ok(r),
            Err(e) => Err(self.conn.classify(e).await),
        }
    }

    /// Read a whole (small) JSON answer.
    async fn json<T: DeserializeOwned>(&self, resp: Response<Incoming>) -> Result<T, ClientError> {
        let body = match resp.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return Err(self.conn.classify(e).await),
        };
        serde_json::from_slice(&body).map_err(|e| ClientError::Protocol(format!("bad JSON from the agent: {e}")))
    }
}

fn empty() -> ReqBody {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

fn file_uri(route: &str, path: &str) -> String {
    format!("{route}?path={}", urlencoding::encode(path))
}

/// The query parameters of `opts` (each after a `&`).
fn write_query(opts: &WriteOptions) -> String {
    let mut q = String::new();
    if let Some(mode) = opts.mode {
        q.push_str(&format!("&mode={mode:o}"));
    }
    if let Some(owner) = &opts.owner {
        q.push_str(&format!("&user={}", urlencoding::encode(owner)));
    }
    if !opts.metadata.is_empty() {
        let json = serde_json::to_string(&opts.metadata).expect("maps of strings serialize");
        q.push_str(&format!("&metadata={}", urlencoding::encode(&json)));
    }
    q
}

/// Stdin chunks as frames of at most [`MAX_FRAME`] bytes.
fn stdin_frames(chunk: Bytes) -> Vec<Bytes> {
    (0..chunk.len())
        .step_by(MAX_FRAME)
        .map(|at| Frame::new(FrameKind::Stdin, chunk.slice(at..chunk.len().min(at + MAX_FRAME))).to_bytes())
        .collect()
}

/// The error an unsuccessful answer carries.
async fn error_of(resp: Response<Incoming>) -> ClientError {
    let status = resp.status();
    match Limited::new(resp.into_body(), MAX_ERROR_BODY).collect().await {
        Ok(body) => error_from_body(status, &body.to_bytes()),
        Err(e) => ClientError::Protocol(format!("HTTP {status}, unreadable body: {e}")),
    }
}

fn error_from_body(status: StatusCode, body: &[u8]) -> ClientError {
    match serde_json::from_slice::<AgentError>(body) {
        Ok(e) => ClientError::Agent(e),
        Err(_) => ClientError::Protocol(format!("HTTP {status}: {}", String::from_utf8_lossy(body))),
    }
}

/// A streamed answer (a file being read, an archive, a watch's lines): a stream of
/// chunks, and the length the agent announced.
pub struct ReadFile {
    content_length: Option<u64>,
    chunks: BoxStream<'static, Result<Bytes, ClientError>>,
}

impl ReadFile {
    /// The file's size, unless the file system could not tell (files in /proc, say).
    pub fn content_length(&self) -> Option<u64> {
        self.content_length
    }
}

impl Stream for ReadFile {
    type Item = Result<Bytes, ClientError>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.chunks.poll_next_unpin(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_is_shareable() {
        fn assert_send_sync_clone<T: Send + Sync + Clone + 'static>() {}
        assert_send_sync_clone::<AgentClient>();
        fn assert_send<T: Send>() {}
        assert_send::<ExecStream>();
        assert_send::<ReadFile>();
        fn assert_stream<T: AsyncRead + AsyncWrite + Send + Unpin + 'static>() {}
        assert_stream::<TcpTunnel>();
    }

    #[test]
    fn splits_stdin_and_encodes_paths() {
        let frames = stdin_frames(Bytes::from(vec![1u8; MAX_FRAME * 2 + 3]));
        assert_eq!(frames.iter().map(|f| f.len() - 5).collect::<Vec<_>>(), vec![MAX_FRAME, MAX_FRAME, 3]);
        assert!(stdin_frames(Bytes::new()).is_empty());
        assert_eq!(file_uri(routes::FILES, "/a b/c&d"), "/v1/files?path=%2Fa%20b%2Fc%26d");
    }

    #[test]
    fn error_bodies() {
        let e = error_from_body(StatusCode::NOT_FOUND, br#"{"code":"NOT_FOUND","message":"/x: gone"}"#);
        assert!(matches!(e, ClientError::Agent(AgentError { code: ErrorCode::NotFound, .. })));
        assert!(matches!(error_from_body(StatusCode::BAD_GATEWAY, b"oops"), ClientError::Protocol(_)));
    }
}
