//! Template builds over the node API: the request carries the recipe and the context's
//! files (see [`lizard_api::node_api`]), the answer streams the build's events as NDJSON
//! and ends with how it ended. A client that closes the connection cancels the build.

use super::{parse_json, AppError, Result};
use crate::{Node, NodeError};
use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::TryStreamExt;
use lizard_api::node_api::{NodeBuildLine, NodeBuildRequest};
use lizard_api::templates::{BuildEvent, BuildTemplate};
use lizard_api::{ApiError, ErrorCode};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// The longest header line (recipe and context listing) a build may send.
const MAX_HEADER: u64 = 16 << 20;
/// How often an idle build answer gets a blank line: a write to a closed connection is
/// how the node learns that its client is gone.
const KEEPALIVE: Duration = Duration::from_secs(5);
/// Where a build's received files live while it runs (one directory per build).
const BLOBS_DIR: &str = "build-blobs";

fn bad(message: impl Into<String>) -> AppError {
    AppError(ApiError::new(ErrorCode::InvalidArgument, message))
}

pub async fn build(State(node): State<Arc<Node>>, body: Body) -> Result<Response> {
    let stream = body.into_data_stream().map_err(std::io::Error::other);
    let mut reader = tokio_util::io::StreamReader::new(stream);
    let mut header = Vec::new();
    (&mut reader)
        .take(MAX_HEADER)
        .read_until(b'\n', &mut header)
        .await
        .map_err(|e| bad(format!("the build request could not be read: {e}")))?;
    if header.last() != Some(&b'\n') {
        return Err(bad("the build request must start with its JSON header on one line"));
    }
    let req: NodeBuildRequest = parse_json(&header)?;
    let blob_order = req.blob_order();
    let total: u64 = blob_order.iter().map(|(_, size)| size).sum();
    let limit = lizard_recipe::ContextLimits::default().max_bytes;
    if total > limit {
        return Err(bad(format!("a build's files may total {limit} bytes, not {total}")));
    }
    let root = node.config().data_dir.join(BLOBS_DIR);
    std::fs::create_dir_all(&root).map_err(|e| NodeError::io(format!("create {}", root.display()), e))?;
    let blobs = tempfile::Builder::new()
        .prefix("build-")
        .tempdir_in(&root)
        .map_err(|e| NodeError::io(format!("create a directory in {}", root.display()), e))?;
    for (sha256, size) in blob_order {
        receive_blob(&mut reader, blobs.path(), &sha256, size).await?;
    }
    let mut rest = [0u8; 1];
    if reader.read(&mut rest).await.map_err(|e| bad(format!("the build request could not be read: {e}")))? != 0 {
        return Err(bad("the build request carries more bytes than its context's files"));
    }
    let build = BuildTemplate {
        template_ref: req.template_ref,
        display_name: req.display_name,
        recipe: req.recipe,
        base_ref: req.base_ref,
        context: req.context,
        blobs: blobs.path().to_owned(),
    };
    let cancel = CancellationToken::new();
    let (lines, rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
    let running = cancel.clone();
    tokio::spawn(async move {
        let (events, mut events_rx) = tokio::sync::mpsc::unbounded_channel::<BuildEvent>();
        let out = lines.clone();
        let forward = tokio::spawn(async move {
            while let Some(event) = events_rx.recv().await {
                let _ = out.send(line(&NodeBuildLine::Event { event }));
            }
        });
        let result = node.build_template(build, events, running).await;
        // Every event before the last line.
        let _ = forward.await;
        let last = match result {
            Ok(built) => NodeBuildLine::Built {
                template_ref: built.template_ref,
                steps: built.steps,
                layer_bytes: built.layer_bytes,
            },
            Err(e) => match e.build_failure() {
                Some(failure) => NodeBuildLine::Failed { failure },
                None => NodeBuildLine::Refused { error: e.to_api() },
            },
        };
        let _ = lines.send(line(&last));
        drop(blobs);
    });
    let body = answer_stream(rx, cancel);
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(body)).into_response())
}

/// The answer's lines, a blank one after each quiet [`KEEPALIVE`]; dropping it (the
/// connection closed) cancels the build.
fn answer_stream(
    rx: tokio::sync::mpsc::UnboundedReceiver<Bytes>,
    cancel: CancellationToken,
) -> impl futures_util::Stream<Item = std::io::Result<Bytes>> + Send {
    let guard = cancel.drop_guard();
    futures_util::stream::unfold((rx, guard), |(mut rx, guard)| async move {
        tokio::select! {
            next = rx.recv() => next.map(|l| (Ok(l), (rx, guard))),
            () = tokio::time::sleep(KEEPALIVE) => Some((Ok(Bytes::from_static(b"\n")), (rx, guard))),
        }
    })
}

/// Remove what builds of an earlier process on `data_dir` left (their received files);
/// call it before serving, while no build runs.
pub fn sweep(data_dir: &Path) {
    let dir = data_dir.join(BLOBS_DIR);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => tracing::info!("removed the files of builds an earlier process left in {}", dir.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!("could not remove {}: {e}", dir.display()),
    }
}

fn line(l: &NodeBuildLine) -> Bytes {
    let mut v = serde_json::to_vec(l).expect("build lines serialize");
    v.push(b'\n');
    Bytes::from(v)
}

/// Copy the next `size` bytes of the request into `<dir>/<sha256>`, checking the hash.
async fn receive_blob<R: AsyncRead + Unpin>(reader: &mut R, dir: &Path, sha256: &str, size: u64) -> Result<()> {
    if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
        return Err(bad(format!("{sha256:?} is not a SHA-256 in lower-case hex")));
    }
    let path = dir.join(sha256);
    let mut file =
        tokio::fs::File::create(&path).await.map_err(|e| NodeError::io(format!("create {}", path.display()), e))?;
    let mut hasher = Sha256::new();
    let mut left = size;
    let mut buf = vec![0u8; 64 << 10];
    while left > 0 {
        let want = usize::try_from(left.min(buf.len() as u64)).expect("at most the buffer's length");
        let n = reader.read(&mut buf[..want]).await.map_err(|e| bad(format!("the build request broke off: {e}")))?;
        if n == 0 {
            return Err(bad(format!("the build request ended inside the file {sha256}")));
        }
        hasher.update(&buf[..n]);
        file.write_all(&buf[..n]).await.map_err(|e| NodeError::io(format!("write {}", path.display()), e))?;
        left -= n as u64;
    }
    file.flush().await.map_err(|e| NodeError::io(format!("write {}", path.display()), e))?;
    if hex::encode(hasher.finalize()) != sha256 {
        return Err(bad(format!("the bytes sent for {sha256} have another SHA-256")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn blobs_are_checked_against_their_hash_and_size() {
        let dir = tempfile::tempdir().unwrap();
        let sha = hex::encode(Sha256::digest(b"hello"));
        let mut input: &[u8] = b"hello";
        receive_blob(&mut input, dir.path(), &sha, 5).await.unwrap_or_else(|e| panic!("{}", e.0));
        assert_eq!(std::fs::read(dir.path().join(&sha)).unwrap(), b"hello");
        let mut short: &[u8] = b"hel";
        assert!(receive_blob(&mut short, dir.path(), &sha, 5).await.is_err());
        let mut other: &[u8] = b"jello";
        assert!(receive_blob(&mut other, dir.path(), &sha, 5).await.is_err());
        let mut any: &[u8] = b"x";
        let e = receive_blob(&mut any, dir.path(), "../../etc/passwd", 1).await.err().unwrap();
        assert_eq!(e.0.code, ErrorCode::InvalidArgument);
    }

    #[test]
    fn a_sweep_removes_what_earlier_builds_left() {
        let dir = tempfile::tempdir().unwrap();
        let left = dir.path().join(BLOBS_DIR).join("build-x");
        std::fs::create_dir_all(&left).unwrap();
        std::fs::write(left.join("f"), "x").unwrap();
        sweep(dir.path());
        assert!(!dir.path().join(BLOBS_DIR).exists());
        sweep(dir.path());
    }

    #[tokio::test]
    async fn a_build_is_refused_before_it_runs_when_its_request_is_wrong() {
        use tower::ServiceExt;
        let dir = tempfile::tempdir().unwrap();
        let node = Node::start(crate::NodeConfig::new(dir.path())).await.unwrap();
        let router = crate::http::router(node);
        let header = |size: u64| {
            let mut h = serde_json::to_vec(&serde_json::json!({
                "templateRef": "tb-1", "displayName": "t", "baseRef": "base",
                "recipe": {"name": "t", "from": "base"},
                "context": {"entries": [{"path": "f", "mode": 420, "type": "file", "sha256": "ab".repeat(32), "size": size}]},
            }))
            .unwrap();
            h.push(b'\n');
            h
        };
        let too_big = header(lizard_recipe::ContextLimits::default().max_bytes + 1);
        let short = [header(5), b"abc".to_vec()].concat();
        for (body, why) in [(too_big, "may total"), (short, "ended inside"), (b"{}".to_vec(), "one line")] {
            let req = axum::http::Request::post(lizard_api::routes::node::BUILD_TEMPLATE.path)
                .body(Body::from(body))
                .unwrap();
            let resp = router.clone().oneshot(req).await.unwrap();
            assert_eq!(resp.status(), axum::http::StatusCode::UNPROCESSABLE_ENTITY, "{why}");
            let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
            assert!(String::from_utf8_lossy(&bytes).contains(why), "{why}: {}", String::from_utf8_lossy(&bytes));
        }
        assert!(std::fs::read_dir(dir.path().join(BLOBS_DIR)).unwrap().next().is_none(), "nothing kept");
    }
}
