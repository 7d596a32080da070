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
use lizard_api::routes::{self, Route};
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

/// One request line: a route of [`lizard_api::routes`] with its path arguments and query,
/// so every path and method the CLI sends comes from that table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    method: routes::Method,
    uri: String,
}

impl Call {
    /// `route` with its `{…}` parameters replaced by `args` (percent-encoded).
    pub fn new(route: &Route, args: &[&str]) -> Call {
        Call { method: route.method, uri: route.uri(args) }
    }

    /// Append `key=value` to the query, `value` percent-encoded.
    pub fn param(mut self, key: &str, value: impl std::fmt::Display) -> Call {
        lizard_api::routes::push_query(&mut self.uri, key, &value.to_string());
        self
    }

    /// Like [`Call::param`], when `value` is there.
    pub fn param_opt(self, key: &str, value: Option<impl std::fmt::Display>) -> Call {
        match value {
            Some(v) => self.param(key, v),
            None => self,
        }
    }

    /// Path and query.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    fn http_method(&self) -> http::Method {
        match self.method {
            routes::Method::Get => http::Method::GET,
            routes::Method::Post => http::Method::POST,
            routes::Method::Put => http::Method::PUT,
            routes::Method::Patch => http::Method::PATCH,
            routes::Method::Delete => http::Method::DELETE,
        }
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
    pub async fn send(&self, call: &Call, body: Body) -> Result<Response<Incoming>> {
        let (method, path_and_query) = (call.http_method(), call.uri());
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
    pub async fn json<T: DeserializeOwned>(&self, call: &Call, body: Body) -> Result<T> {
        let resp = self.send(call, body).await?;
        let bytes = resp.into_body().collect().await?.to_bytes();
        serde_json::from_slice(&bytes).with_context(|| format!("decode answer of {}", call.uri()))
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
    fn calls_take_method_and_path_from_the_route_table() {
        let c = Call::new(&routes::WRITE_FILE, &["sbx 1"]).param("path", "/a b&c").param_opt("mode", None::<u32>);
        assert_eq!(c.uri(), "/v1/sandboxes/sbx%201/files?path=%2Fa%20b%26c");
        assert_eq!(c.http_method(), http::Method::PUT);
        let c = Call::new(&routes::TRANSACTIONS, &[]).param("limit", 5).param_opt("cursor", Some("x"));
        assert_eq!(c.uri(), "/v1/billing/transactions?limit=5&cursor=x");
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
