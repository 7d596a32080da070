//! A non-streamed exec: the command's output frames collected into one
//! [`ProcessResult`], up to [`MAX_EXEC_OUTPUT_BYTES`] — past it the collection stops
//! (the stream is dropped, which ends the command's channel) and the client is told to
//! stream instead. Without the cap, a command printing 1 GiB made the server hold it all.
//!
//! Streamed or not, an exec's latency, from its request to its exit frame, is recorded
//! ([`timed`]).

use crate::error::{ApiResult, AppError};
use crate::limits::MAX_EXEC_OUTPUT_BYTES;
use crate::nodes::FrameStream;
use crate::telemetry::{Operation, Telemetry};
use futures_util::StreamExt;
use lizard_agent_proto::frame::FrameKind;
use lizard_api::{ApiError, ErrorCode, ExitStatus, ProcessResult};
use std::sync::Arc;
use std::time::Instant;

/// Records an exec's latency once: at its exit frame (`ok`), or at an error frame, a
/// broken stream or when the stream is dropped before its end (`error`).
struct ExecTimer {
    telemetry: Arc<Telemetry>,
    started: Instant,
    recorded: bool,
}

impl ExecTimer {
    fn finish(&mut self, ok: bool) {
        if !std::mem::replace(&mut self.recorded, true) {
            self.telemetry.operation(Operation::Exec, ok, self.started.elapsed());
        }
    }
}

impl Drop for ExecTimer {
    fn drop(&mut self) {
        self.finish(false);
    }
}

/// `frames` (an exec started at `started`), recording its latency as it ends.
pub fn timed(telemetry: Arc<Telemetry>, started: Instant, frames: FrameStream) -> FrameStream {
    let mut timer = ExecTimer { telemetry, started, recorded: false };
    frames
        .inspect(move |frame| match frame {
            Ok(f) if f.kind == FrameKind::Exit => timer.finish(true),
            Ok(f) if f.kind == FrameKind::Error => timer.finish(false),
            Ok(_) => {}
            Err(_) => timer.finish(false),
        })
        .boxed()
}

/// Collect `frames` (an exec's, ending with `Exit` or `Error`) into one result.
pub async fn collect(frames: FrameStream) -> ApiResult<ProcessResult> {
    collect_capped(frames, MAX_EXEC_OUTPUT_BYTES).await
}

async fn collect_capped(mut frames: FrameStream, cap: usize) -> ApiResult<ProcessResult> {
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    while let Some(frame) = frames.next().await {
        let frame = frame.map_err(|e| {
            tracing::warn!("an exec's output stream broke: {e}");
            AppError::new(ErrorCode::Unavailable, "the command's output stream broke")
        })?;
        match frame.kind {
            FrameKind::Stdout | FrameKind::Stderr => {
                if stdout.len() + stderr.len() + frame.data.len() > cap {
                    return Err(AppError::new(
                        ErrorCode::OutputTooLarge,
                        format!(
                            "the command's output passed {cap} bytes (stdout and stderr together); \
                             run it with ?stream=true to receive any amount"
                        ),
                    ));
                }
                let out = if frame.kind == FrameKind::Stdout { &mut stdout } else { &mut stderr };
                out.extend_from_slice(&frame.data);
            }
            FrameKind::Exit => {
                let status: ExitStatus = serde_json::from_slice(&frame.data)
                    .map_err(|e| AppError::internal(format!("an exec's exit frame is not an exit status: {e}")))?;
                return Ok(ProcessResult {
                    stdout: String::from_utf8_lossy(&stdout).into_owned(),
                    stderr: String::from_utf8_lossy(&stderr).into_owned(),
                    exit_code: status.exit_code,
                    timed_out: status.timed_out,
                });
            }
            FrameKind::Error => {
                let error: ApiError = serde_json::from_slice(&frame.data)
                    .map_err(|e| AppError::internal(format!("an exec's error frame is not an error: {e}")))?;
                return Err(AppError(error));
            }
            FrameKind::Start | FrameKind::Stdin | FrameKind::StdinEof | FrameKind::Started => {}
        }
    }
    Err(AppError::new(ErrorCode::Unavailable, "the exec stream ended before the command did; try again"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use lizard_agent_proto::frame::Frame;

    fn stream(frames: Vec<Frame>) -> FrameStream {
        futures_util::stream::iter(frames.into_iter().map(Ok)).boxed()
    }

    fn exit(code: i32) -> Frame {
        Frame::json(FrameKind::Exit, &ExitStatus { exit_code: code, signal: None, timed_out: false, duration_ms: 1 })
    }

    #[tokio::test]
    async fn output_is_collected_up_to_the_cap() {
        let out = |kind, s: &'static str| Frame::new(kind, Bytes::from_static(s.as_bytes()));
        let frames =
            vec![out(FrameKind::Stdout, "hel"), out(FrameKind::Stderr, "oops"), out(FrameKind::Stdout, "lo"), exit(3)];
        let r = collect_capped(stream(frames), 9).await.unwrap();
        assert_eq!((r.stdout.as_str(), r.stderr.as_str(), r.exit_code), ("hello", "oops", 3));
        let frames = vec![out(FrameKind::Stdout, "hello"), out(FrameKind::Stderr, "oops!"), exit(0)];
        let e = collect_capped(stream(frames), 9).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::OutputTooLarge);
        assert!(e.0.message.contains("stream=true"), "{}", e.0.message);
    }

    #[tokio::test]
    async fn an_error_frame_or_a_cut_stream_is_an_error() {
        let err = Frame::json(FrameKind::Error, &ApiError::new(ErrorCode::NotFound, "sandbox s not found"));
        assert_eq!(collect(stream(vec![err])).await.unwrap_err().code(), ErrorCode::NotFound);
        assert_eq!(collect(stream(vec![])).await.unwrap_err().code(), ErrorCode::Unavailable);
    }
}
