//! A small HTTP/1.1 client for the node's Unix socket.
//!
//! One connection per CLI invocation is all the CLI needs, so this uses hyper's
//! connection-level API directly instead of a pooled client.

use anyhow::{anyhow, Context, Result};
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use lizard_api::ApiError;
use serde::de::DeserializeOwned;
use std::path::PathBuf;

pub type Body = BoxBody<Bytes, std::io::Error>;

/// Where the API lives.
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// The local node's socket.
    Unix(PathBuf),
}

#[derive(Debug, Clone)]
pub struct ApiClient {
    pub endpoint: Endpoint,
    pub api_key: Option<String>,
}

pub fn empty() -> Body {
    Full::new(Bytes::new()).map_err(|never| match never {}).boxed()
}

pub fn json_body<T: serde::Serialize>(v: &T) -> Body {
    Full::new(Bytes::from(serde_json::to_vec(v).expect("serializes"))).map_err(|never| match never {}).boxed()
}

impl ApiClient {
    /// Send one request; a non-2xx answer becomes the server's [`ApiError`].
    pub async fn send(&self, method: http::Method, path_and_query: &str, body: Body) -> Result<Response<Incoming>> {
        let mut req = Request::builder().method(method).uri(path_and_query).header("host", "lizard");
        if let Some(k) = &self.api_key {
            req = req.header("x-api-key", k);
        }
        let req = req.header("content-type", "application/json").body(body)?;
        let resp = match &self.endpoint {
            Endpoint::Unix(p) => {
                let s = tokio::net::UnixStream::connect(p).await.with_context(|| format!("connect {}", p.display()))?;
                send_on(s, req).await?
            }
        };
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        match serde_json::from_slice::<ApiError>(&bytes) {
            Ok(e) => Err(anyhow!(e)),
            Err(_) => Err(anyhow!("HTTP {status}: {}", String::from_utf8_lossy(&bytes))),
        }
    }

    /// Send and decode a JSON answer.
    pub async fn json<T: DeserializeOwned>(&self, method: http::Method, path: &str, body: Body) -> Result<T> {
        let resp = self.send(method, path, body).await?;
        let bytes = resp.into_body().collect().await?.to_bytes();
        serde_json::from_slice(&bytes).with_context(|| format!("decode answer of {path}"))
    }
}

async fn send_on<S>(stream: S, req: Request<Body>) -> Result<Response<Incoming>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!("connection: {e}");
        }
    });
    Ok(sender.send_request(req).await?)
}

/// `?path=<urlencoded>` for file routes.
pub fn path_query(path: &str) -> String {
    format!("path={}", urlencoding::encode(path))
}
