//! A non-streamed exec: the command's output frames collected into one
//! [`ProcessResult`], up to [`MAX_EXEC_OUTPUT_BYTES`] — past it the collection stops
//! (the stream is dropped, which ends the command's channel) and the client is told to
//! stream instead. Without the cap, a command printing 1 GiB made the server hold it all.
//! What it holds is charged to the sandbox's and the server's [`GuestBuffers`] budgets, so
//! many such execs at once cannot exhaust the server either (503 `UNAVAILABLE` past them):
//! the output and the JSON answer it becomes, which escaping can make six times larger
//! (a NUL byte is `\u0000`), until the answer is sent.
//!
//! Streamed or not, an exec's latency, from its request to its exit frame, is recorded
//! ([`timed`]).

use crate::error::{ApiResult, AppError};
use crate::guest_buffers::{Charge, Exhausted, GuestBuffers};
use crate::limits::MAX_EXEC_OUTPUT_BYTES;
use crate::telemetry::{Operation, Telemetry};
use futures_util::StreamExt;
use lizard_agent_proto::frame::FrameKind;
use lizard_api::{ApiError, ErrorCode, ExitStatus, ProcessResult};
use lizard_node_client::FrameStream;
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

/// A non-streamed exec's answer: its [`ProcessResult`] as JSON, with the charge of the
/// memory it holds (to be given back once it is sent).
#[derive(Debug)]
pub struct CollectedAnswer {
    pub json: Vec<u8>,
    pub charge: Charge,
}

/// Collect `frames` (an exec's in `sandbox_id`, ending with `Exit` or `Error`) into one
/// JSON answer.
pub async fn collect(buffers: &GuestBuffers, sandbox_id: &str, frames: FrameStream) -> ApiResult<CollectedAnswer> {
    let (result, charge) = collect_capped(frames, MAX_EXEC_OUTPUT_BYTES, buffers.charge(sandbox_id)).await?;
    let json = serde_json::to_vec(&result).map_err(AppError::internal)?;
    Ok(CollectedAnswer { json, charge })
}

/// An upper bound of the JSON text `bytes` become in a string (escaped controls, quotes
/// and backslashes; invalid UTF-8 as U+FFFD).
fn json_len_bound(bytes: &[u8]) -> usize {
    bytes
        .iter()
        .map(|&b| match b {
            0..0x20 => 6,
            b'"' | b'\\' => 2,
            0x80.. => 3,
            _ => 1,
        })
        .sum()
}

async fn collect_capped(mut frames: FrameStream, cap: usize, mut charge: Charge) -> ApiResult<(ProcessResult, Charge)> {
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    // What the output and its answer will hold.
    let mut held = 0;
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
                held += frame.data.len() + json_len_bound(&frame.data);
                charge.hold(held).map_err(|e| match e {
                    Exhausted::TooLarge(_) => AppError::new(
                        ErrorCode::OutputTooLarge,
                        format!("the command's output as JSON: {e}; run it with ?stream=true to receive any amount"),
                    ),
                    _ => AppError::new(
                        ErrorCode::Unavailable,
                        format!("{e}; run the command with ?stream=true, or again when fewer calls collect output"),
                    ),
                })?;
                let out = if frame.kind == FrameKind::Stdout { &mut stdout } else { &mut stderr };
                out.extend_from_slice(&frame.data);
            }
            FrameKind::Exit => {
                let status: ExitStatus = serde_json::from_slice(&frame.data)
                    .map_err(|e| AppError::internal(format!("an exec's exit frame is not an exit status: {e}")))?;
                let result = ProcessResult {
                    stdout: text(stdout),
                    stderr: text(stderr),
                    exit_code: status.exit_code,
                    timed_out: status.timed_out,
                };
                return Ok((result, charge));
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

/// Output as text, without a second copy when it is UTF-8 already.
fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
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
        let buffers = GuestBuffers::new(1 << 20);
        let (r, _) = collect_capped(stream(frames), 9, buffers.charge("s")).await.unwrap();
        assert_eq!((r.stdout.as_str(), r.stderr.as_str(), r.exit_code), ("hello", "oops", 3));
        let frames = vec![out(FrameKind::Stdout, "hello"), out(FrameKind::Stderr, "oops!"), exit(0)];
        let e = collect_capped(stream(frames), 9, buffers.charge("s")).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::OutputTooLarge);
        assert!(e.0.message.contains("stream=true"), "{}", e.0.message);
        assert_eq!(buffers.held_kib(), 0, "an ended collection holds nothing");
    }

    #[tokio::test]
    async fn output_past_the_sandboxs_share_of_the_buffers_is_refused() {
        let buffers = GuestBuffers::new(64 << 10);
        let mut other_call = buffers.charge("s");
        other_call.hold(10 << 10).unwrap();
        // 4 KiB of output, 8 KiB with its JSON: more than the 16 KiB share holds beside 10.
        let frames = vec![Frame::new(FrameKind::Stdout, Bytes::from(vec![b'x'; 4 << 10])), exit(0)];
        let e = collect_capped(stream(frames), 1 << 20, buffers.charge("s")).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::Unavailable);
        assert!(e.0.message.contains("stream=true"), "{}", e.0.message);
        assert_eq!(buffers.held_kib(), 10, "the refused call gave back what it held");
        // 3 KiB of NUL bytes is 18 KiB of JSON: never fits a share of 16.
        drop(other_call);
        let frames = vec![Frame::new(FrameKind::Stdout, Bytes::from(vec![0; 3 << 10])), exit(0)];
        let e = collect_capped(stream(frames), 1 << 20, buffers.charge("s")).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::OutputTooLarge);
        // An answer keeps its charge until it is sent.
        let frames = vec![Frame::new(FrameKind::Stdout, Bytes::from(vec![b'x'; 3 << 10])), exit(0)];
        let answer = collect(&buffers, "s", stream(frames)).await.unwrap();
        assert_eq!(buffers.held_kib(), 6);
        assert!(answer.json.len() > 3 << 10);
        drop(answer);
        assert_eq!(buffers.held_kib(), 0);
    }

    #[test]
    fn the_json_bound_holds() {
        for bytes in [&b"plain"[..], b"\0\n\"\\", "é✓".as_bytes(), &[0xff, 0xfe, b'a']] {
            let json = serde_json::to_string(&text(bytes.to_vec())).unwrap();
            assert!(json.len() - 2 <= json_len_bound(bytes), "{bytes:?} → {json}");
        }
    }

    #[tokio::test]
    async fn an_error_frame_or_a_cut_stream_is_an_error() {
        let err = Frame::json(FrameKind::Error, &ApiError::new(ErrorCode::NotFound, "sandbox s not found"));
        let buffers = GuestBuffers::new(1 << 20);
        assert_eq!(collect(&buffers, "s", stream(vec![err])).await.unwrap_err().code(), ErrorCode::NotFound);
        assert_eq!(collect(&buffers, "s", stream(vec![])).await.unwrap_err().code(), ErrorCode::Unavailable);
    }
}
