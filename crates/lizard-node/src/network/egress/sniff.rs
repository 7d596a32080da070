//! The name a client asks for in the first bytes of a connection: the server name of a
//! TLS ClientHello (RFC 8446 §4.1.2, RFC 6066 §3), or the `Host` of an HTTP/1 request.
//! Nothing is decrypted or changed: the bytes read are passed on as they came.

/// What the bytes read so far say.
#[derive(Debug, PartialEq, Eq)]
pub enum Sniffed {
    /// The name asked for (lowercase, no port, no trailing dot).
    Name(String),
    /// No name can come of these bytes.
    Absent,
    /// Read more.
    NeedMore,
}

/// Bytes of a record or message, read front to back.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2).map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
}

/// The server name of a TLS ClientHello in its first record.
pub fn tls_server_name(buf: &[u8]) -> Sniffed {
    let mut r = Reader(buf);
    let (Some(kind), Some(_version), Some(len)) = (r.u8(), r.u16(), r.u16()) else { return Sniffed::NeedMore };
    // A handshake record.
    if kind != 0x16 {
        return Sniffed::Absent;
    }
    let Some(record) = r.take(len) else { return Sniffed::NeedMore };
    client_hello_name(record).map_or(Sniffed::Absent, Sniffed::Name)
}

fn client_hello_name(record: &[u8]) -> Option<String> {
    let mut r = Reader(record);
    // ClientHello; its 24-bit length (a hello split over records is not read).
    if r.u8()? != 1 {
        return None;
    }
    let len = (r.u8()? << 16) | r.u16()?;
    let mut hello = Reader(r.take(len)?);
    hello.take(2 + 32)?; // legacy_version, random
    let n = hello.u8()?;
    hello.take(n)?; // session id
    let n = hello.u16()?;
    hello.take(n)?; // cipher suites
    let n = hello.u8()?;
    hello.take(n)?; // compression methods
    let n = hello.u16()?;
    let mut exts = Reader(hello.take(n)?);
    while let (Some(kind), Some(len)) = (exts.u16(), exts.u16()) {
        let data = exts.take(len)?;
        if kind != 0 {
            continue;
        }
        // server_name: a list of (type, name); type 0 is a host name.
        let mut list = Reader(data);
        let n = list.u16()?;
        let mut names = Reader(list.take(n)?);
        while let (Some(kind), Some(len)) = (names.u8(), names.u16()) {
            let name = names.take(len)?;
            if kind == 0 {
                return clean_name(std::str::from_utf8(name).ok()?);
            }
        }
        return None;
    }
    None
}

/// The `Host` of an HTTP/1 request whose head is complete within `limit` bytes.
pub fn http_host(buf: &[u8], limit: usize) -> Sniffed {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if buf.len() >= limit { Sniffed::Absent } else { Sniffed::NeedMore };
    };
    let Ok(head) = std::str::from_utf8(&buf[..end]) else { return Sniffed::Absent };
    let mut hosts = head.split("\r\n").skip(1).filter_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim().eq_ignore_ascii_case("host").then(|| value.trim())
    });
    match (hosts.next(), hosts.next()) {
        // Exactly one Host: two could name two hosts to two readers.
        (Some(host), None) => {
            let host =
                host.rsplit_once(':').filter(|(_, p)| p.bytes().all(|b| b.is_ascii_digit())).map_or(host, |(h, _)| h);
            clean_name(host).map_or(Sniffed::Absent, Sniffed::Name)
        }
        _ => Sniffed::Absent,
    }
}

/// `name` lowercased without a trailing dot, if it is made of name characters only.
fn clean_name(name: &str) -> Option<String> {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    ok.then_some(name)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A ClientHello record for `name` (a minimal but well-formed one).
    pub(crate) fn client_hello(name: &str) -> Vec<u8> {
        let n = name.len();
        let mut sni = vec![0, 0]; // extension type server_name
        let list_len = 3 + n;
        sni.extend_from_slice(&u16::try_from(list_len + 2).unwrap().to_be_bytes());
        sni.extend_from_slice(&u16::try_from(list_len).unwrap().to_be_bytes());
        sni.push(0);
        sni.extend_from_slice(&u16::try_from(n).unwrap().to_be_bytes());
        sni.extend_from_slice(name.as_bytes());
        let other_ext = [0u8, 0x2b, 0, 3, 2, 3, 4]; // supported_versions
        let mut hello = vec![3, 3];
        hello.extend_from_slice(&[7u8; 32]);
        hello.push(0); // session id
        hello.extend_from_slice(&[0, 2, 0x13, 0x01]); // one cipher suite
        hello.extend_from_slice(&[1, 0]); // null compression
        let exts_len = other_ext.len() + sni.len();
        hello.extend_from_slice(&u16::try_from(exts_len).unwrap().to_be_bytes());
        hello.extend_from_slice(&other_ext);
        hello.extend_from_slice(&sni);
        let mut hs = vec![1, 0];
        hs.extend_from_slice(&u16::try_from(hello.len()).unwrap().to_be_bytes());
        hs.extend_from_slice(&hello);
        let mut rec = vec![0x16, 3, 1];
        rec.extend_from_slice(&u16::try_from(hs.len()).unwrap().to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn the_server_name_of_a_client_hello() {
        let rec = client_hello("Registry.Example");
        assert_eq!(tls_server_name(&rec), Sniffed::Name("registry.example".into()));
        assert_eq!(tls_server_name(&rec[..3]), Sniffed::NeedMore);
        assert_eq!(tls_server_name(&rec[..rec.len() - 1]), Sniffed::NeedMore);
        assert_eq!(tls_server_name(b"GET / HTTP/1.1\r\n"), Sniffed::Absent);
        let mut bad = rec.clone();
        bad[5] = 2; // not a ClientHello
        assert_eq!(tls_server_name(&bad), Sniffed::Absent);
    }

    #[test]
    fn the_host_of_an_http_request() {
        let limit = 1024;
        let req = b"GET / HTTP/1.1\r\nUser-Agent: x\r\nhost: Registry.Example:80\r\n\r\n";
        assert_eq!(http_host(req, limit), Sniffed::Name("registry.example".into()));
        assert_eq!(http_host(&req[..20], limit), Sniffed::NeedMore);
        assert_eq!(http_host(b"GET / HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n", limit), Sniffed::Absent);
        assert_eq!(http_host(b"GET / HTTP/1.1\r\n\r\n", limit), Sniffed::Absent);
        assert_eq!(http_host(b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", limit), Sniffed::Absent);
        assert_eq!(http_host(&[b'x'; 2000], limit), Sniffed::Absent);
    }
}
