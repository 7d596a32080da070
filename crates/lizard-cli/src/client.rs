//! A small HTTP/1.1 client for Lizard's API: the local node's Unix socket, or a Lizard
//! server over TCP.
//!
//! One connection per request is all the CLI needs, so this uses hyper's
//! connection-level API directly instead of a pooled client; both endpoints share one
//! code path over any stream.

use anyhow::{anyhow, bail, Context, Result};
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// The local node's socket.
    Unix(PathBuf),
    /// A Lizard server, plain HTTP/1.1 over TCP.
    Tcp {
        /// `host:port`: what is dialled and sent as `Host`.
        authority: String,
        /// Path prefix the API is mounted under (`""` at the root; never a trailing `/`).
        base_path: String,
        /// The URL as given, for messages.
        url: String,
    },
}

impl Endpoint {
    /// Parse `LIZARD_API_URL`. Only `http://` is supported: TLS belongs to whatever
    /// terminates it in front of the server.
    pub fn parse_url(url: &str) -> Result<Endpoint> {
        let url = url.trim();
        let uri: http::Uri = url.parse().with_context(|| format!("invalid LIZARD_API_URL {url:?}"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => bail!(
                "LIZARD_API_URL {url:?}: https:// is not supported by this CLI; TLS termination belongs in \
                 front of the Lizard server (a reverse proxy), so point the CLI at the server's own \
                 http:// listener, e.g. http://127.0.0.1:7171"
            ),
            Some(other) => bail!("LIZARD_API_URL {url:?}: unsupported scheme {other:?}; expected http://HOST:PORT"),
            None => {
                bail!("LIZARD_API_URL {url:?} has no scheme; expected http://HOST:PORT, e.g. http://127.0.0.1:7171")
            }
        }
        let authority =
            uri.authority().ok_or_else(|| anyhow!("LIZARD_API_URL {url:?} has no host; expected http://HOST:PORT"))?;
        if authority.as_str().contains('@') {
            bail!("LIZARD_API_URL {url:?}: credentials in the URL are not supported; use LIZARD_API_KEY");
        }
        if uri.query().is_some() {
            bail!("LIZARD_API_URL {url:?}: a query string is not supported");
        }
        let port = authority.port_u16().unwrap_or(80);
        let host = authority.host();
        let authority = format!("{host}:{port}");
        let base_path = uri.path().trim_end_matches('/').to_string();
        Ok(Endpoint::Tcp { authority, base_path, url: url.to_string() })
    }
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
    /// Whether this talks to a Lizard server (not the local node).
    pub fn is_server(&self) -> bool {
        matches!(self.endpoint, Endpoint::Tcp { .. })
    }

    /// Send one request; a non-2xx answer becomes the server's [`ApiError`] (recover it
    /// with `err.downcast_ref::<ApiError>()`).
    pub async fn send(&self, method: http::Method, path_and_query: &str, body: Body) -> Result<Response<Incoming>> {
        let (uri, host) = match &self.endpoint {
            Endpoint::Unix(_) => (path_and_query.to_string(), "lizard"),
            Endpoint::Tcp { authority, base_path, .. } => (format!("{base_path}{path_and_query}"), authority.as_str()),
        };
        let mut req = Request::builder().method(method).uri(uri).header("host", host);
        if let Some(k) = &self.api_key {
            req = req.header("x-api-key", k);
        }
        let req = req
            .header("content-type", "application/json")
            .header("user-agent", concat!("lizard-cli/", env!("CARGO_PKG_VERSION")))
            .body(body)?;
        let resp = match &self.endpoint {
            Endpoint::Unix(p) => {
                let s = tokio::net::UnixStream::connect(p).await.with_context(|| format!("connect {}", p.display()))?;
                send_on(s, req).await?
            }
            Endpoint::Tcp { authority, url, .. } => {
                let s = tokio::net::TcpStream::connect(authority.as_str())
                    .await
                    .with_context(|| format!("cannot reach the Lizard server at {url}"))?;
                let _ = s.set_nodelay(true);
                send_on(s, req).await.with_context(|| format!("request to the Lizard server at {url} failed"))?
            }
        };
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        match serde_json::from_slice::<ApiError>(&bytes) {
            Ok(e) => Err(anyhow!(e)),
            Err(_) => Err(anyhow!("HTTP {status}: {}", String::from_utf8_lossy(&bytes).trim())),
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

/// One path segment (an id, slug or name), percent-encoded.
pub fn seg(s: &str) -> String {
    urlencoding::encode(s).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(url: &str) -> (String, String) {
        match Endpoint::parse_url(url).unwrap() {
            Endpoint::Tcp { authority, base_path, .. } => (authority, base_path),
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn parses_http_urls() {
        assert_eq!(tcp("http://127.0.0.1:7171"), ("127.0.0.1:7171".into(), "".into()));
        assert_eq!(tcp("http://127.0.0.1:7171/"), ("127.0.0.1:7171".into(), "".into()));
        assert_eq!(tcp("http://lizard.internal"), ("lizard.internal:80".into(), "".into()));
        assert_eq!(tcp("http://[::1]:9000/api/"), ("[::1]:9000".into(), "/api".into()));
        assert_eq!(tcp(" http://h:1 "), ("h:1".into(), "".into()));
    }

    #[test]
    fn refuses_https_and_junk() {
        let e = Endpoint::parse_url("https://lizard.build").unwrap_err().to_string();
        assert!(e.contains("TLS termination belongs in front of the Lizard server"), "{e}");
        for bad in ["127.0.0.1:7171", "ftp://h", "http://u:p@h:1", "http://h:1/?x=1", "not a url"] {
            assert!(Endpoint::parse_url(bad).is_err(), "{bad}");
        }
    }
}
