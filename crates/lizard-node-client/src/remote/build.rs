//! A template build on a remote node: the request streams the recipe and the context's
//! files from this server's blob directory; the answer's lines are the build's events
//! and how it ended. Cancelling closes the connection, which cancels the node's build.

use super::channel::{Call, Channel, Payload, SLOW};
use crate::{BuildError, BuildTemplate, BuiltTemplate};
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use http_body_util::{BodyExt, StreamBody};
use lizard_api::node_api::{NodeBuildLine, NodeBuildRequest};
use lizard_api::routes::node as table;
use lizard_api::templates::{BuildEvent, BuildFailure};
use lizard_api::{ApiError, ErrorCode};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::codec::{FramedRead, LinesCodec};
use tokio_util::sync::CancellationToken;

/// The longest answer line (a step's output comes in pieces well below this).
const MAX_LINE: usize = 16 << 20;

/// The request body: the header line, then each blob's bytes in [`NodeBuildRequest::blob_order`].
fn request_body(build: BuildTemplate) -> super::channel::Body {
    let blobs = build.blobs.clone();
    let req = NodeBuildRequest {
        template_ref: build.template_ref,
        display_name: build.display_name,
        recipe: build.recipe,
        base_ref: build.base_ref,
        context: build.context,
    };
    let mut header = serde_json::to_vec(&req).expect("build requests serialize");
    header.push(b'\n');
    let paths: Vec<_> = req.blob_order().into_iter().map(|(sha256, _)| blobs.join(sha256)).collect();
    let files = futures_util::stream::iter(paths)
        .then(|path| async move {
            tokio::fs::File::open(&path)
                .await
                .map_err(|e| std::io::Error::new(e.kind(), format!("open {}: {e}", path.display())))
        })
        .map_ok(tokio_util::io::ReaderStream::new)
        .try_flatten();
    let stream = futures_util::stream::once(async move { Ok(Bytes::from(header)) }).chain(files);
    BodyExt::boxed_unsync(StreamBody::new(stream.map_ok(hyper::body::Frame::data)))
}

pub async fn build(
    channel: &Channel,
    build: BuildTemplate,
    events: UnboundedSender<BuildEvent>,
    cancel: CancellationToken,
) -> Result<BuiltTemplate, BuildError> {
    let call = Call::new(&table::BUILD_TEMPLATE, &[]).head_timeout(Some(SLOW));
    let sent = channel.send(&call, Payload::Stream(request_body(build)));
    let resp = tokio::select! {
        resp = sent => resp.map_err(BuildError::Refused)?,
        () = cancel.cancelled() => return Err(cancelled()),
    };
    let body = resp.into_body().into_data_stream().map_err(std::io::Error::other);
    let mut lines = FramedRead::new(tokio_util::io::StreamReader::new(body), LinesCodec::new_with_max_length(MAX_LINE));
    loop {
        let next = tokio::select! {
            next = lines.next() => next,
            // Dropping the answer closes the connection: the node cancels its build.
            () = cancel.cancelled() => return Err(cancelled()),
        };
        let text = match next {
            Some(Ok(text)) => text,
            Some(Err(e)) => return Err(BuildError::Refused(channel.unreachable(format!("build answer: {e}")))),
            None => return Err(BuildError::Refused(channel.unreachable("the build answer ended without its result"))),
        };
        if text.trim().is_empty() {
            continue;
        }
        let line: NodeBuildLine = serde_json::from_str(&text).map_err(|e| {
            tracing::error!(node = %channel.node_id(), "unreadable build line {text:?}: {e}");
            BuildError::Refused(ApiError::new(
                ErrorCode::Internal,
                format!("node {} gave an answer this server cannot read", channel.node_id()),
            ))
        })?;
        match line {
            NodeBuildLine::Event { event } => {
                let _ = events.send(event);
            }
            NodeBuildLine::Built { template_ref, steps, layer_bytes } => {
                return Ok(BuiltTemplate { template_ref, steps, layer_bytes })
            }
            NodeBuildLine::Failed { failure } => return Err(BuildError::Failed(failure)),
            NodeBuildLine::Refused { error } => return Err(BuildError::Refused(error)),
        }
    }
}

fn cancelled() -> BuildError {
    BuildError::Failed(BuildFailure {
        code: "CANCELLED".into(),
        message: "the build was cancelled".into(),
        step: None,
        output_tail: None,
    })
}
