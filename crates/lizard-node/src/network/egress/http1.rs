//! Every request of a plain-HTTP connection through the egress proxy, framed as it passes,
//! so that a keep-alive connection cannot ask the allowed address for another virtual
//! host after its first request (domain fronting inside one connection).
//!
//! A request's head is held back until it is complete and checked: exactly one `Host`,
//! the connection's name; an origin-form target (no absolute URL naming another host);
//! CRLF line ends, no folded lines; a body framed one way only (`Content-Length` or
//! `Transfer-Encoding: chunked`, never both); no `CONNECT` and no `Upgrade` (after which
//! the bytes would no longer be HTTP). Its body then passes as it comes, by that framing,
//! up to the next head. Anything else closes the connection — an upstream server never
//! sees a head the proxy did not check, whatever it makes of ambiguous framing. The proxy
//! reads only the guest's side; answers pass untouched.
//!
//! Heads and chunk-size lines are parsed by `httparse`; the framing around them is kept
//! here because the bytes must reach the server exactly as the guest sent them (hyper
//! would parse and write requests anew), and because this check is stricter than a
//! lenient parser (bare LFs, repeated framing headers).

use super::sniff::{self, Sniffed};

/// Why a connection's next request was not carried.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("a request for {0} on a connection opened for {1}")]
    OtherHost(String, String),
    #[error("a request the proxy cannot frame: {0}")]
    Unframed(&'static str),
}

/// Where the guest's stream is.
#[derive(Debug, PartialEq, Eq)]
enum State {
    /// Collecting a head (held back until complete).
    Head,
    /// Passing this many body bytes.
    Body(u64),
    /// A chunk's size line.
    ChunkSize,
    /// Passing this many bytes of a chunk, then its CRLF.
    ChunkData(u64),
    /// The CRLF after a chunk's data (bytes of it still expected).
    ChunkEnd(u8),
    /// The trailer section after the last chunk, up to its empty line.
    Trailers,
}

/// The requests of one connection opened for `name` (see the module doc).
pub struct Requests {
    name: String,
    limit: usize,
    state: State,
    /// A head or a size / trailer line not yet complete.
    pending: Vec<u8>,
}

impl Requests {
    /// `limit`: the most bytes a head may take.
    pub fn new(name: String, limit: usize) -> Requests {
        Requests { name, limit, state: State::Head, pending: Vec::new() }
    }

    /// Take `bytes` the guest sent; append to `out` what may go upstream now.
    pub fn feed(&mut self, mut bytes: &[u8], out: &mut Vec<u8>) -> Result<(), Refused> {
        while !bytes.is_empty() {
            match self.state {
                State::Head => {
                    let (done, used) = self.collect(bytes, b"\r\n\r\n")?;
                    bytes = &bytes[used..];
                    if done {
                        self.state = check_head(&self.pending, &self.name)?;
                        out.append(&mut self.pending);
                    }
                }
                State::Body(left) => {
                    let left = pass(left, &mut bytes, out);
                    self.state = if left == 0 { State::Head } else { State::Body(left) };
                }
                State::ChunkData(left) => {
                    let left = pass(left, &mut bytes, out);
                    self.state = if left == 0 { State::ChunkEnd(2) } else { State::ChunkData(left) };
                }
                State::ChunkEnd(left) => {
                    let expected = &b"\r\n"[2 - usize::from(left)..];
                    let n = expected.len().min(bytes.len());
                    if bytes[..n] != expected[..n] {
                        return Err(Refused::Unframed("a chunk not followed by CRLF"));
                    }
                    out.extend_from_slice(&bytes[..n]);
                    bytes = &bytes[n..];
                    let left = left - u8::try_from(n).expect("at most 2");
                    self.state = if left == 0 { State::ChunkSize } else { State::ChunkEnd(left) };
                }
                State::ChunkSize => {
                    let (done, used) = self.collect(bytes, b"\r\n")?;
                    bytes = &bytes[used..];
                    if done {
                        let size = chunk_size(&self.pending)?;
                        out.append(&mut self.pending);
                        self.state = if size == 0 { State::Trailers } else { State::ChunkData(size) };
                    }
                }
                State::Trailers => {
                    // Trailer fields one line at a time, up to the empty line.
                    let (done, used) = self.collect(bytes, b"\r\n")?;
                    bytes = &bytes[used..];
                    if done {
                        if self.pending.iter().filter(|&&b| b == b'\n').count() != 1 {
                            return Err(Refused::Unframed("a bare LF in trailers"));
                        }
                        if self.pending == b"\r\n" {
                            self.state = State::Head;
                        }
                        out.append(&mut self.pending);
                    }
                }
            }
        }
        Ok(())
    }

    /// Move bytes into `pending` up to and including the first `end` (searched across
    /// what was pending): whether it was found, and how many bytes of `bytes` were used.
    fn collect(&mut self, bytes: &[u8], end: &[u8]) -> Result<(bool, usize), Refused> {
        let before = self.pending.len();
        // An end may straddle what was pending and what came.
        let from = before.saturating_sub(end.len() - 1);
        self.pending.extend_from_slice(bytes);
        let found = self.pending[from..].windows(end.len()).position(|w| w == end).map(|i| from + i + end.len());
        let keep = found.unwrap_or(self.pending.len());
        self.pending.truncate(keep);
        if self.pending.len() > self.limit {
            return Err(Refused::Unframed("a head or line past the limit"));
        }
        Ok((found.is_some(), keep - before))
    }
}

/// Pass up to `left` bytes of `bytes` to `out`; how many are still to come.
fn pass(left: u64, bytes: &mut &[u8], out: &mut Vec<u8>) -> u64 {
    let n = usize::try_from(left).unwrap_or(usize::MAX).min(bytes.len());
    out.extend_from_slice(&bytes[..n]);
    *bytes = &bytes[n..];
    left - u64::try_from(n).expect("at most left")
}

/// Headers a head may have.
const MAX_HEADERS: usize = 128;

/// Check a complete head (see the module doc); the state its body starts in.
fn check_head(head: &[u8], name: &str) -> Result<State, Refused> {
    if head.iter().filter(|&&b| b == b'\n').count() != head.windows(2).filter(|w| w == b"\r\n").count() {
        return Err(Refused::Unframed("a bare LF in a head"));
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(n)) if n == head.len() => {}
        _ => return Err(Refused::Unframed("a malformed head")),
    }
    let (method, target) = (request.method.unwrap_or_default(), request.path.unwrap_or_default());
    if method.eq_ignore_ascii_case("CONNECT") {
        return Err(Refused::Unframed("not an HTTP/1 request the proxy carries"));
    }
    if !(target.starts_with('/') || target == "*") {
        return Err(Refused::Unframed("a target that is not a path"));
    }
    let (mut length, mut chunked) = (None, false);
    for header in request.headers.iter() {
        let value =
            std::str::from_utf8(header.value).map_err(|_| Refused::Unframed("a header that is not text"))?.trim();
        match header.name.to_ascii_lowercase().as_str() {
            "content-length" => {
                let n = value.parse::<u64>().map_err(|_| Refused::Unframed("a bad Content-Length"))?;
                if length.replace(n).is_some_and(|m| m != n) || !value.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(Refused::Unframed("a bad Content-Length"));
                }
            }
            "transfer-encoding" if value.eq_ignore_ascii_case("chunked") && !chunked => chunked = true,
            "transfer-encoding" => return Err(Refused::Unframed("a transfer coding other than one chunked")),
            "upgrade" => return Err(Refused::Unframed("a protocol upgrade")),
            _ => {}
        }
    }
    match sniff::http_host(head, head.len() + 1) {
        Sniffed::Name(host) if host == name => {}
        Sniffed::Name(host) => return Err(Refused::OtherHost(host, name.to_string())),
        _ => return Err(Refused::Unframed("not exactly one Host")),
    }
    match (length, chunked) {
        (Some(_), true) => Err(Refused::Unframed("both Content-Length and chunked")),
        (_, true) => Ok(State::ChunkSize),
        (Some(n), false) if n > 0 => Ok(State::Body(n)),
        _ => Ok(State::Head),
    }
}

/// The size of a chunk from its whole size line (`1a;ext=1\r\n`).
fn chunk_size(line: &[u8]) -> Result<u64, Refused> {
    match httparse::parse_chunk_size(line) {
        Ok(httparse::Status::Complete((used, size))) if used == line.len() => Ok(size),
        _ => Err(Refused::Unframed("a bad chunk size")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: usize = 1024;

    /// Feed `parts` one after another; what went upstream, or the refusal.
    fn carry(parts: &[&[u8]]) -> Result<Vec<u8>, (Refused, Vec<u8>)> {
        let mut r = Requests::new("allowed.test".into(), LIMIT);
        let mut out = Vec::new();
        for p in parts {
            if let Err(e) = r.feed(p, &mut out) {
                return Err((e, out));
            }
        }
        Ok(out)
    }

    const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n";

    #[test]
    fn keep_alive_requests_for_the_name_pass_unchanged_in_any_split() {
        let post = b"POST /x HTTP/1.1\r\nhost: Allowed.Test:80\r\nContent-Length: 5\r\n\r\nhello";
        let chunked = b"PUT /c HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n\
                        5;x=y\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n";
        let all: Vec<u8> = [GET, &post[..], &chunked[..], GET].concat();
        assert_eq!(carry(&[&all]).unwrap(), all);
        // Byte by byte: every boundary inside heads, bodies, sizes and trailers.
        let bytes: Vec<&[u8]> = all.chunks(1).collect();
        assert_eq!(carry(&bytes).unwrap(), all);
    }

    #[test]
    fn a_second_request_for_another_host_is_refused_before_any_of_its_head_passes() {
        let other = b"GET /secret HTTP/1.1\r\nHost: other.test\r\n\r\n";
        let (e, out) = carry(&[GET, &other[..20], &other[20..]]).unwrap_err();
        assert_eq!(e, Refused::OtherHost("other.test".into(), "allowed.test".into()));
        assert_eq!(out, GET, "nothing of the second head went upstream");
        // Hidden in a body the proxy frames differently from a lax server: refused too.
        let post = b"POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(matches!(carry(&[post]), Err((Refused::Unframed(_), _))));
    }

    #[test]
    fn heads_a_server_could_read_otherwise_are_refused() {
        for bad in [
            &b"GET / HTTP/1.1\nHost: allowed.test\n\nGET / HTTP/1.1\r\nHost: other.test\r\n\r\n"[..],
            b"GET http://other.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: other.test\r\n\r\n",
            b"GET / HTTP/1.1\r\nX: a\r\n Host: other.test\r\nHost: allowed.test\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: websocket\r\n\r\n",
            b"CONNECT other.test:443 HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
        ] {
            let (_, out) = carry(&[bad]).unwrap_err();
            assert!(out.is_empty(), "{:?}", String::from_utf8_lossy(bad));
        }
        let chunked = b"POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
        assert!(carry(&[chunked]).is_err(), "a bad chunk size");
        assert!(carry(&[&[b'x'; 2000]]).is_err(), "a head past the limit");
    }
}
