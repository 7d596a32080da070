//! Challenge-response authentication that opens every session.
//!
//! ```text
//! agent → host   LIZARD/1 CHALLENGE <64 hex chars: 32 random bytes>\n
//! host  → agent  LIZARD/1 AUTH <hex HMAC-SHA256(secret, challenge bytes)>\n
//! agent → host   LIZARD/1 READY\n        (or LIZARD/1 DENIED\n, then the session ends)
//! ```
//!
//! Both sides read one byte at a time so that no byte of the HTTP/2 stream that follows
//! is swallowed by a buffer. Lines that do not start with the expected prefix are skipped
//! (bounded): after a snapshot restore, stale bytes from the previous session may still be
//! in flight on a virtio-serial port.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const CHALLENGE: &str = "LIZARD/1 CHALLENGE ";
const AUTH: &str = "LIZARD/1 AUTH ";
const READY: &str = "LIZARD/1 READY";
const DENIED: &str = "LIZARD/1 DENIED";
/// Longest line either side accepts.
const MAX_LINE: usize = 512;
/// How many bytes of unrelated lines either side skips before giving up.
const MAX_SKIP: usize = 1 << 20;

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The transport failed.
    #[error("handshake i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The peer closed the stream before the handshake finished.
    #[error("peer closed the channel during the handshake")]
    Closed,
    /// The peer sent something that is not this protocol.
    #[error("handshake protocol violation: {0}")]
    Protocol(String),
    /// The agent rejected the host's answer: the secret is wrong.
    #[error("the agent rejected the credentials")]
    Denied,
}

/// A per-sandbox secret: 32 random bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret([u8; 32]);

impl Secret {
    /// A fresh random secret.
    pub fn generate() -> Self {
        let mut b = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut b);
        Secret(b)
    }
    /// Parse the hex form written by [`Secret::to_hex`].
    pub fn from_hex(s: &str) -> Result<Self, HandshakeError> {
        let v = hex::decode(s.trim()).map_err(|_| HandshakeError::Protocol("secret is not hex".into()))?;
        let b: [u8; 32] = v.try_into().map_err(|_| HandshakeError::Protocol("secret must be 32 bytes".into()))?;
        Ok(Secret(b))
    }
    /// Hex form, for the kernel command line and files.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
    fn answer(&self, challenge: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(challenge);
        mac
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Read one `\n`-terminated line without reading past it.
async fn read_line<R: AsyncRead + Unpin>(r: &mut R) -> Result<String, HandshakeError> {
    let mut line = Vec::with_capacity(96);
    loop {
        let mut b = [0u8; 1];
        if r.read(&mut b).await? == 0 {
            return Err(HandshakeError::Closed);
        }
        if b[0] == b'\n' {
            return Ok(String::from_utf8_lossy(&line).trim_end_matches('\r').to_string());
        }
        if line.len() < MAX_LINE {
            line.push(b[0]);
        }
    }
}

/// Read lines until one starts with `prefix` (or, if given, equals `alt`); skip the rest.
async fn read_expected<R: AsyncRead + Unpin>(r: &mut R, prefixes: &[&str]) -> Result<String, HandshakeError> {
    let mut skipped = 0usize;
    loop {
        let line = read_line(r).await?;
        if prefixes.iter().any(|p| line.starts_with(p)) {
            return Ok(line);
        }
        skipped += line.len() + 1;
        if skipped > MAX_SKIP {
            return Err(HandshakeError::Protocol("no handshake line from peer".into()));
        }
    }
}

/// Agent side: challenge the host and accept only a correct answer.
pub async fn agent_accept<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: &Secret,
) -> Result<(), HandshakeError> {
    let mut challenge = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut challenge);
    stream.write_all(format!("{CHALLENGE}{}\n", hex::encode(challenge)).as_bytes()).await?;
    stream.flush().await?;
    let line = read_expected(stream, &[AUTH]).await?;
    let answer = hex::decode(&line[AUTH.len()..]).unwrap_or_default();
    // verify_slice compares in constant time.
    if secret.answer(&challenge).verify_slice(&answer).is_err() {
        stream.write_all(format!("{DENIED}\n").as_bytes()).await?;
        stream.flush().await?;
        return Err(HandshakeError::Denied);
    }
    stream.write_all(format!("{READY}\n").as_bytes()).await?;
    stream.flush().await?;
    Ok(())
}

/// Host side: answer the agent's challenge with the sandbox's secret.
pub async fn host_connect<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: &Secret,
) -> Result<(), HandshakeError> {
    let line = read_expected(stream, &[CHALLENGE]).await?;
    let challenge =
        hex::decode(&line[CHALLENGE.len()..]).map_err(|_| HandshakeError::Protocol("challenge is not hex".into()))?;
    let answer = hex::encode(secret.answer(&challenge).finalize().into_bytes());
    stream.write_all(format!("{AUTH}{answer}\n").as_bytes()).await?;
    stream.flush().await?;
    match read_expected(stream, &[READY, DENIED]).await?.as_str() {
        READY => Ok(()),
        _ => Err(HandshakeError::Denied),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn right_secret_is_accepted_and_stream_stays_aligned() {
        let secret = Secret::generate();
        let (mut a, mut h) = tokio::io::duplex(1024);
        let s2 = secret.clone();
        let agent = tokio::spawn(async move {
            agent_accept(&mut a, &s2).await.unwrap();
            a.write_all(b"after").await.unwrap();
        });
        // Stale bytes from an earlier session must be skipped.
        host_connect(&mut h, &secret).await.unwrap();
        agent.await.unwrap();
        let mut buf = [0u8; 5];
        h.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"after");
    }

    #[tokio::test]
    async fn wrong_secret_is_denied() {
        let (mut a, mut h) = tokio::io::duplex(1024);
        let agent = tokio::spawn(async move { agent_accept(&mut a, &Secret::generate()).await });
        let r = host_connect(&mut h, &Secret::generate()).await;
        assert!(matches!(r, Err(HandshakeError::Denied)));
        assert!(matches!(agent.await.unwrap(), Err(HandshakeError::Denied)));
    }

    #[tokio::test]
    async fn garbage_before_challenge_is_skipped() {
        let secret = Secret::generate();
        let (mut a, mut h) = tokio::io::duplex(4096);
        a.write_all(b"\x00\x01stale bytes\nmore junk\n").await.unwrap();
        let s2 = secret.clone();
        let agent = tokio::spawn(async move { agent_accept(&mut a, &s2).await });
        host_connect(&mut h, &secret).await.unwrap();
        agent.await.unwrap().unwrap();
    }

    #[test]
    fn secret_hex_roundtrip() {
        let s = Secret::generate();
        assert_eq!(Secret::from_hex(&s.to_hex()).unwrap(), s);
        assert!(Secret::from_hex("abcd").is_err());
    }
}
