//! The node's calls to the control plane: join (with a join token), heartbeat and
//! sandbox-ended events (with the node's credential), each a route of
//! [`lizard_api::routes`].

use lizard_api::cluster::{HeartbeatResponse, JoinRequest, JoinResponse, NodeReport, SandboxEnded, SandboxHalt};
use lizard_api::routes::{self, Route};
use lizard_api::ApiError;
use std::time::Duration;

/// How long one call to the server may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No answer: the server is down or unreachable (try again later).
    #[error("the server at {url} is not reachable: {cause}")]
    Unreachable { url: String, cause: reqwest::Error },
    /// The server answered with an error.
    #[error("the server refused: {0}")]
    Refused(ApiError),
    /// The server answered something that is not Lizard's API.
    #[error("the server answered HTTP {status}: {body}")]
    Unexpected { status: u16, body: String },
}

impl CallError {
    /// Whether trying again later may succeed (the server was unreachable or failed).
    pub fn is_transient(&self) -> bool {
        match self {
            CallError::Unreachable { .. } => true,
            CallError::Refused(e) => e.code.status() >= 500 || e.code == lizard_api::ErrorCode::RateLimited,
            CallError::Unexpected { status, .. } => *status >= 500,
        }
    }
}

/// The control plane, as this node calls it.
#[derive(Clone)]
pub struct ServerApi {
    base: String,
    http: reqwest::Client,
}

impl ServerApi {
    /// The server at `url` (`http://host:port`).
    pub fn new(url: &str) -> ServerApi {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(CALL_TIMEOUT)
            .build()
            .expect("a plain HTTP client builds");
        ServerApi { base: url.trim_end_matches('/').to_owned(), http }
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        route: &Route,
        args: &[&str],
        bearer: &str,
        body: &impl serde::Serialize,
    ) -> Result<Option<T>, CallError> {
        let url = format!("{}{}", self.base, route.uri(args));
        let method = reqwest::Method::from_bytes(route.method.as_str().as_bytes()).expect("route methods are valid");
        let resp = self
            .http
            .request(method, &url)
            .bearer_auth(bearer)
            .json(body)
            .send()
            .await
            .map_err(|cause| CallError::Unreachable { url: self.base.clone(), cause })?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|cause| CallError::Unreachable { url: self.base.clone(), cause })?;
        if !status.is_success() {
            return Err(match serde_json::from_slice::<ApiError>(&bytes) {
                Ok(e) => CallError::Refused(e),
                Err(_) => CallError::Unexpected {
                    status: status.as_u16(),
                    body: String::from_utf8_lossy(&bytes[..bytes.len().min(512)]).into_owned(),
                },
            });
        }
        if bytes.is_empty() {
            return Ok(None);
        }
        serde_json::from_slice(&bytes).map(Some).map_err(|_| CallError::Unexpected {
            status: status.as_u16(),
            body: String::from_utf8_lossy(&bytes[..bytes.len().min(512)]).into_owned(),
        })
    }

    fn answer<T>(answer: Option<T>) -> Result<T, CallError> {
        answer.ok_or(CallError::Unexpected { status: 200, body: String::new() })
    }

    pub async fn join(&self, token: &str, req: &JoinRequest) -> Result<JoinResponse, CallError> {
        Self::answer(self.call(&routes::CLUSTER_JOIN, &[], token, req).await?)
    }

    pub async fn heartbeat(
        &self,
        node_id: &str,
        credential: &str,
        report: &NodeReport,
    ) -> Result<HeartbeatResponse, CallError> {
        Self::answer(self.call(&routes::CLUSTER_HEARTBEAT, &[node_id], credential, report).await?)
    }

    pub async fn events(&self, node_id: &str, credential: &str, ended: &[SandboxEnded]) -> Result<(), CallError> {
        self.call::<serde_json::Value>(&routes::CLUSTER_EVENTS, &[node_id], credential, &ended).await.map(|_| ())
    }

    pub async fn halts(&self, node_id: &str, credential: &str, halts: &[SandboxHalt]) -> Result<(), CallError> {
        self.call::<serde_json::Value>(&routes::CLUSTER_HALTS, &[node_id], credential, &halts).await.map(|_| ())
    }
}
