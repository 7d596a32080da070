//! The Connect protocol as E2B's SDKs use it: the JSON codec, over HTTP/1.1.
//!
//! A unary call is a plain JSON body both ways; its error is an HTTP status with
//! `{"code": "<name>", "message"}`. A stream is a sequence of envelopes — one flags
//! byte, a big-endian `u32` length, the JSON message — ending, on the answer's side, with
//! an end-stream envelope (flags `0x02`) that carries the error if there was one.

use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;

/// Content type of unary calls.
pub const UNARY_CONTENT_TYPE: &str = "application/json";
/// Content type of streaming calls (both directions).
pub const STREAM_CONTENT_TYPE: &str = "application/connect+json";
/// The request header carrying a call's deadline in milliseconds.
pub const TIMEOUT_HEADER: &str = "connect-timeout-ms";

/// Flags of the envelope that ends an answer stream.
const END_STREAM: u8 = 0x02;
/// Flags of a compressed envelope (the SDKs never compress; one is refused).
const COMPRESSED: u8 = 0x01;
/// Largest request message read (a stream's start, a chunk of input): far above any.
pub const MAX_MESSAGE: usize = 16 << 20;

/// Connect's error codes, by their wire names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    InvalidArgument,
    Unauthenticated,
    PermissionDenied,
    NotFound,
    AlreadyExists,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
    DeadlineExceeded,
}

impl Code {
    /// The HTTP status a unary error answers with.
    pub fn http_status(self) -> u16 {
        match self {
            Code::InvalidArgument | Code::FailedPrecondition => 400,
            Code::Unauthenticated => 401,
            Code::PermissionDenied => 403,
            Code::NotFound => 404,
            Code::AlreadyExists => 409,
            Code::ResourceExhausted => 429,
            Code::Unimplemented => 501,
            Code::Internal => 500,
            Code::Unavailable => 503,
            Code::DeadlineExceeded => 504,
        }
    }
}

/// A Connect error: its code and a message for the caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Error {
    pub code: Code,
    pub message: String,
}

impl Error {
    pub fn new(code: Code, message: impl Into<String>) -> Error {
        Error { code, message: message.into() }
    }
}

/// One envelope around `message`.
pub fn envelope<T: Serialize>(message: &T) -> Bytes {
    let json = serde_json::to_vec(message).expect("envd messages serialize");
    frame(0, &json)
}

/// The envelope that ends an answer stream: `{}`, or the error.
pub fn end_stream(error: Option<&Error>) -> Bytes {
    #[derive(Serialize)]
    struct End<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<&'a Error>,
    }
    let json = serde_json::to_vec(&End { error }).expect("an end of stream serializes");
    frame(END_STREAM, &json)
}

fn frame(flags: u8, json: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + json.len());
    out.put_u8(flags);
    out.put_u32(u32::try_from(json.len()).expect("an envd message under 4 GiB"));
    out.put_slice(json);
    out.freeze()
}

/// Why a request's envelopes could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvelopeError {
    /// The body ended inside an envelope.
    Truncated,
    /// An envelope longer than [`MAX_MESSAGE`].
    TooLarge(usize),
    /// A compressed envelope (no compression is offered).
    Compressed,
}

impl std::fmt::Display for EnvelopeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnvelopeError::Truncated => write!(f, "the request ended inside a Connect envelope"),
            EnvelopeError::TooLarge(n) => write!(f, "a Connect message of {n} bytes is over the {MAX_MESSAGE} allowed"),
            EnvelopeError::Compressed => write!(f, "compressed Connect messages are not accepted"),
        }
    }
}

/// Take the next whole envelope's message off the front of `buf`: None while `buf` holds
/// less than one envelope (read more, or at the body's end [`EnvelopeError::Truncated`]).
pub fn next_message(buf: &mut BytesMut) -> Result<Option<Bytes>, EnvelopeError> {
    if buf.len() < 5 {
        return Ok(None);
    }
    if buf[0] & COMPRESSED != 0 {
        return Err(EnvelopeError::Compressed);
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if len > MAX_MESSAGE {
        return Err(EnvelopeError::TooLarge(len));
    }
    if buf.len() < 5 + len {
        return Ok(None);
    }
    let whole = buf.split_to(5 + len).freeze();
    Ok(Some(whole.slice(5..)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_and_end_with_the_error() {
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&envelope(&serde_json::json!({"a": 1})));
        buf.extend_from_slice(&envelope(&serde_json::json!({"b": 2}))[..4]);
        assert_eq!(next_message(&mut buf).unwrap().unwrap(), Bytes::from_static(br#"{"a":1}"#));
        assert_eq!(next_message(&mut buf).unwrap(), None, "half an envelope is no message");
        let end = end_stream(Some(&Error::new(Code::NotFound, "no such process")));
        assert_eq!(end[0], END_STREAM);
        assert_eq!(&end[5..], br#"{"error":{"code":"not_found","message":"no such process"}}"#);
        assert_eq!(&end_stream(None)[5..], b"{}");
        let mut compressed = BytesMut::from(&[1u8, 0, 0, 0, 0][..]);
        assert_eq!(next_message(&mut compressed), Err(EnvelopeError::Compressed));
        let mut huge = BytesMut::from(&[0u8, 0xff, 0xff, 0xff, 0xff][..]);
        assert!(matches!(next_message(&mut huge), Err(EnvelopeError::TooLarge(_))));
    }
}
