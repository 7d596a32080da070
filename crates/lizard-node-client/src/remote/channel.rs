//! The HTTP channel to one node's API: the credential on every request, timeouts on the
//! connect and on the answer's head, retries of idempotent calls whose connection failed,
//! and the node's errors as [`ApiError`]s (a node that cannot be reached is 503
//! `UNAVAILABLE`; the cause goes to the log only).

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use lizard_api::routes::{Method, Route};
use lizard_api::{ApiError, ErrorCode};
use std::time::Duration;

/// A request body.
pub type Body = UnsyncBoxBody<Bytes, std::io::Error>;

/// How long a TCP connect to a node may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a quick call (a lookup, a file operation) may wait for its answer's head.
pub const QUICK: Duration = Duration::from_secs(60);
/// How long a call that boots or saves a VM may wait (a first create of a template
/// builds its snapshot; a built-in may be built first).
pub const SLOW: Duration = Duration::from_secs(30 * 60);
/// Tries of an idempotent call whose connection failed.
const TRIES: u32 = 3;
/// The most of an error answer that is read.
const MAX_ERROR_BODY: usize = 64 << 10;
/// Largest JSON answer read from a node: some carry what a guest decides (its processes,
/// a directory's entries), so none is read without bound.
const MAX_JSON_BODY: usize = 64 << 20;

/// One node's API.
#[derive(Clone)]
pub struct Channel {
    node_id: String,
    /// `http://host:port`, no trailing `/`.
    base: String,
    /// `Bearer <credential>`.
    authorization: String,
    client: Client<HttpConnector, Body>,
}

/// A call: a route of the node table, its path arguments filled, maybe a query.
pub struct Call {
    method: Method,
    uri: String,
    head_timeout: Option<Duration>,
}

impl Call {
    pub fn new(route: &Route, args: &[&str]) -> Call {
        Call { method: route.method, uri: route.uri(args), head_timeout: Some(QUICK) }
    }

    /// Append `key=value` to the query, `value` percent-encoded.
    pub fn param(mut self, key: &str, value: impl std::fmt::Display) -> Call {
        lizard_api::routes::push_query(&mut self.uri, key, &value.to_string());
        self
    }

    /// Wait this long for the head (`None`: as long as it takes, e.g. a command without
    /// a time limit; the connection's keepalive still notices a dead node).
    pub fn head_timeout(mut self, timeout: Option<Duration>) -> Call {
        self.head_timeout = timeout;
        self
    }

    /// GETs, PUTs and DELETEs of the node table may be sent again: they change nothing
    /// twice. (Only a try whose connection failed is sent again.)
    fn idempotent(&self) -> bool {
        matches!(self.method, Method::Get | Method::Delete | Method::Put)
    }

    fn http_method(&self) -> hyper::Method {
        match self.method {
            Method::Get => hyper::Method::GET,
            Method::Post => hyper::Method::POST,
            Method::Put => hyper::Method::PUT,
            Method::Patch => hyper::Method::PATCH,
            Method::Delete => hyper::Method::DELETE,
        }
    }
}

pub fn bytes(b: Bytes) -> Body {
    Full::new(b).map_err(|never| match never {}).boxed_unsync()
}

pub fn json<T: serde::Serialize>(v: &T) -> Bytes {
    Bytes::from(serde_json::to_vec(v).expect("API types serialize"))
}

/// What to send: bytes that can be sent again, or a stream sent once.
pub enum Payload {
    Bytes(Bytes),
    Stream(Body),
}

impl Channel {
    pub fn new(node_id: String, address: &str, credential: &str) -> Channel {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        connector.set_nodelay(true);
        // A node that vanishes mid-call (power, network) is noticed by the kernel.
        connector.set_keepalive(Some(Duration::from_secs(30)));
        let client = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(60)).build(connector);
        Channel {
            node_id,
            base: address.trim_end_matches('/').to_owned(),
            authorization: format!("Bearer {credential}"),
            client,
        }
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// 503: the node could not be reached or did not answer; `cause` is logged.
    pub fn unreachable(&self, cause: impl std::fmt::Display) -> ApiError {
        tracing::warn!(node = %self.node_id, address = %self.base, "node call failed: {cause}");
        ApiError::new(ErrorCode::Unavailable, format!("node {} is not reachable", self.node_id))
    }

    fn request(&self, call: &Call, body: Body, extra: &[(&str, &str)]) -> Result<Request<Body>, ApiError> {
        let mut req = Request::builder()
            .method(call.http_method())
            .uri(format!("{}{}", self.base, call.uri))
            .header(hyper::header::AUTHORIZATION, &self.authorization)
            .header(hyper::header::CONTENT_TYPE, "application/json");
        for (k, v) in extra {
            req = req.header(*k, *v);
        }
        req.body(body).map_err(|e| self.unreachable(format!("a request to {} could not be made: {e}", call.uri)))
    }

    /// Send `call` and answer its response when it is a success (any 1xx/2xx), else the
    /// node's error.
    pub async fn send(&self, call: &Call, payload: Payload) -> Result<Response<Incoming>, ApiError> {
        self.send_with(call, payload, &[]).await
    }

    /// [`Channel::send`] with extra headers.
    pub async fn send_with(
        &self,
        call: &Call,
        payload: Payload,
        extra: &[(&str, &str)],
    ) -> Result<Response<Incoming>, ApiError> {
        let resp = match payload {
            Payload::Stream(body) => self.once(call, body, extra).await.map_err(|f| self.failed(f))?,
            Payload::Bytes(b) => {
                let mut tries = 0;
                loop {
                    tries += 1;
                    match self.once(call, bytes(b.clone()), extra).await {
                        Err(Failure::Connect(e)) if call.idempotent() && tries < TRIES => {
                            tracing::debug!(node = %self.node_id, "retrying {}: {e}", call.uri);
                            tokio::time::sleep(Duration::from_millis(200 * u64::from(tries))).await;
                        }
                        other => break other.map_err(|f| self.failed(f))?,
                    }
                }
            }
        };
        if resp.status().is_success() || resp.status().is_informational() {
            return Ok(resp);
        }
        Err(self.error_answer(call, resp).await)
    }

    async fn once(&self, call: &Call, body: Body, extra: &[(&str, &str)]) -> Result<Response<Incoming>, Failure> {
        let req = self.request(call, body, extra).map_err(Failure::Answered)?;
        let sent = self.client.request(req);
        let answer = match call.head_timeout {
            Some(t) => tokio::time::timeout(t, sent).await.map_err(|_| {
                Failure::Answered(self.unreachable(format!("no answer to {} within {} s", call.uri, t.as_secs())))
            })?,
            None => sent.await,
        };
        answer.map_err(|e| {
            if e.is_connect() {
                Failure::Connect(format!("{e:?}"))
            } else {
                Failure::Answered(self.unreachable(format!("{}: {e:?}", call.uri)))
            }
        })
    }

    fn failed(&self, f: Failure) -> ApiError {
        match f {
            Failure::Answered(e) => e,
            Failure::Connect(cause) => self.unreachable(cause),
        }
    }

    /// The node's `{code, message}`, or 500 for an answer that is not one.
    async fn error_answer(&self, call: &Call, resp: Response<Incoming>) -> ApiError {
        let status = resp.status();
        let body = http_body_util::Limited::new(resp.into_body(), MAX_ERROR_BODY).collect().await;
        if status == StatusCode::UNAUTHORIZED {
            // This server's credential for the node is wrong: its operator's problem,
            // never the caller's key.
            tracing::error!(node = %self.node_id, "node refused this server's credential for {}", call.uri);
            return ApiError::new(ErrorCode::Unavailable, format!("node {} is not reachable", self.node_id));
        }
        let bytes = match body {
            Ok(b) => b.to_bytes(),
            Err(e) => return self.unreachable(format!("{}: the error answer broke off: {e}", call.uri)),
        };
        match serde_json::from_slice::<ApiError>(&bytes) {
            Ok(e) => e,
            Err(_) => {
                tracing::error!(
                    node = %self.node_id, %status, "node answered {} with {:?}", call.uri, String::from_utf8_lossy(&bytes)
                );
                ApiError::new(ErrorCode::Internal, format!("node {} answered HTTP {}", self.node_id, status.as_u16()))
            }
        }
    }

    /// Send and decode a JSON answer.
    pub async fn json<T: serde::de::DeserializeOwned>(&self, call: &Call, payload: Payload) -> Result<T, ApiError> {
        let resp = self.send(call, payload).await?;
        let bytes = http_body_util::Limited::new(resp.into_body(), MAX_JSON_BODY)
            .collect()
            .await
            .map_err(|e| self.unreachable(format!("{}: the answer broke off: {e}", call.uri)))?
            .to_bytes();
        serde_json::from_slice(&bytes).map_err(|e| {
            tracing::error!(node = %self.node_id, "node answered {} with what is not its type: {e}", call.uri);
            ApiError::new(ErrorCode::Internal, format!("node {} gave an answer this server cannot read", self.node_id))
        })
    }

    /// Send and expect nothing back.
    pub async fn unit(&self, call: &Call, payload: Payload) -> Result<(), ApiError> {
        let resp = self.send(call, payload).await?;
        // Read to the end so the connection goes back to the pool.
        let _ = resp.into_body().collect().await;
        Ok(())
    }
}

/// Why one try failed.
enum Failure {
    /// No connection was made: nothing reached the node, another try is safe.
    Connect(String),
    /// Anything else, as the caller's answer.
    Answered(ApiError),
}
