//! Challenge-response authentication that opens every session, optionally carrying the
//! guest's new identity in the host's one message.
//!
//! ```text
//! agent → host   LIZARD/1 CHALLENGE <64 hex chars: 32 random bytes>\n
//! host  → agent  LIZARD/1 AUTH <hex HMAC-SHA256(secret, challenge)>\n
//!          or    LIZARD/1 AUTH <hex HMAC-SHA256(secret, challenge ‖ identity)> <identity>\n
//! agent → host   LIZARD/1 READY\n        (LIZARD/1 DENIED\n: wrong proof;
//!                                          LIZARD/1 FAILED\n: the identity was not applied)
//! ```
//!
//! `<identity>` is an [`Identity`] as compact JSON (one line: JSON escapes newlines). A
//! guest restored from a snapshot is thus made a machine of its own in the same round trip
//! that authenticates the host: the agent checks the proof with the secret it has (the
//! template's), applies the identity (new secret, hostname, entropy, clock) and only then
//! answers READY. The proof covers the agent's fresh challenge, so a recorded AUTH line is
//! useless in any later session, and a wrong proof is refused before the identity is even
//! parsed.
//!
//! Both sides read one byte at a time so that no byte of the HTTP/2 stream that follows
//! is swallowed by a buffer. Lines without the expected prefix are skipped (bounded), and
//! bytes before the prefix on its line are dropped: after a snapshot restore, stale bytes
//! from the previous session may still be in flight on a virtio-serial port.
//!
//! A guest saved mid-session (a fork's copy: the source's host was connected) wakes up
//! serving a host that is gone, and would not see the new host's connection until that
//! one hung up. The host therefore opens every connection with
//! [`STALE_SESSION_BREAKER`]: a stale session takes it for a frame it must refuse and
//! ends, and the agent starts this handshake on the same connection.
//!
//! The breaker also reaches an agent in the middle of this handshake when the host it
//! challenged gave up and another connected (a slow guest). That agent's challenge may
//! have gone to the host that left, or reached the new one: it cannot tell. So it sends
//! another challenge and accepts an answer to either; a host that already answered the
//! first skips the second line as it waits for READY.

use crate::types::Identity;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const CHALLENGE: &str = "LIZARD/1 CHALLENGE ";
const AUTH: &str = "LIZARD/1 AUTH ";
const READY: &str = "LIZARD/1 READY";
const DENIED: &str = "LIZARD/1 DENIED";
const FAILED: &str = "LIZARD/1 FAILED";
/// Longest line either side accepts (an AUTH line with an identity is ≈ 400 bytes).
const MAX_LINE: usize = 4096;
/// How many bytes of unrelated lines either side skips before giving up.
const MAX_SKIP: usize = 1 << 20;
/// How many challenges one agent handshake sends at most: the first, and one for each
/// host that connected during it.
const MAX_CHALLENGES: usize = 8;

/// What a host sends first on every connection to an agent, for a guest that may have been
/// saved or left mid-session. To a stale HTTP/2 session it is a frame header announcing a 16 MiB DATA frame on stream 0 — over the largest frame
/// the agent accepts, and on a stream DATA may not use: a connection error, so the session
/// ends at once (its GOAWAY reaches the host before the challenge and is skipped). An
/// agent that is already in this handshake answers it with another challenge.
pub const STALE_SESSION_BREAKER: &[u8] = b"\xff\xff\xff\x00\x00\x00\x00\x00\x00\n";

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The transport failed.
    #[error("handshake i/o: {0}")]
    Io(std::io::Error),
    /// The peer closed the stream before the handshake finished.
    #[error("peer closed the channel during the handshake")]
    Closed,
    /// The peer sent something that is not this protocol.
    #[error("handshake protocol violation: {0}")]
    Protocol(String),
    /// The agent rejected the host's answer: the secret is wrong.
    #[error("the agent rejected the credentials")]
    Denied,
    /// The proof was right but the agent could not apply the identity it carried (the
    /// agent's console says why); the guest keeps its old secret.
    #[error("the agent could not apply the identity")]
    IdentityFailed,
}

impl From<std::io::Error> for HandshakeError {
    fn from(e: std::io::Error) -> Self {
        HandshakeError::Io(e)
    }
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
    /// The proof for `challenge` and the identity line that goes with it (empty: none).
    fn answer(&self, challenge: &[u8], identity: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        // The challenge has a fixed length, so challenge ‖ identity is unambiguous.
        mac.update(challenge);
        mac.update(identity);
        mac
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Read one `\n`-terminated line (without it) and read no further.
async fn read_line<R: AsyncRead + Unpin>(r: &mut R) -> Result<Vec<u8>, HandshakeError> {
    let mut line = Vec::with_capacity(96);
    loop {
        let mut b = [0u8; 1];
        if r.read(&mut b).await? == 0 {
            return Err(HandshakeError::Closed);
        }
        if b[0] == b'\n' {
            return Ok(line);
        }
        if line.len() < MAX_LINE {
            line.push(b[0]);
        }
    }
}

/// A line read while waiting for a handshake line.
enum Line {
    /// The line, from the first of the expected prefixes on (what precedes it on the
    /// line is stale bytes).
    Expected(String),
    /// A [`STALE_SESSION_BREAKER`]: a host (re)connected.
    Breaker,
}

/// Read lines until one holds one of `prefixes` or is a breaker; skip the rest. `skipped`
/// counts the bytes of skipped lines and breakers over the whole handshake: a peer that
/// sends either without end is cut off.
async fn read_expected_or_breaker<R: AsyncRead + Unpin>(
    r: &mut R,
    prefixes: &[&str],
    skipped: &mut usize,
) -> Result<Line, HandshakeError> {
    let breaker = &STALE_SESSION_BREAKER[..STALE_SESSION_BREAKER.len() - 1];
    loop {
        let bytes = read_line(r).await?;
        let line = String::from_utf8_lossy(&bytes);
        let line = line.trim_end_matches('\r');
        if let Some(at) = prefixes.iter().filter_map(|p| line.find(p)).min() {
            return Ok(Line::Expected(line[at..].to_string()));
        }
        *skipped += bytes.len() + 1;
        if *skipped > MAX_SKIP {
            return Err(HandshakeError::Protocol("no handshake line from peer".into()));
        }
        if bytes.ends_with(breaker) {
            return Ok(Line::Breaker);
        }
    }
}

/// Read lines until one holds one of `prefixes`, and return it from the prefix on; skip
/// the rest (a breaker among them).
async fn read_expected<R: AsyncRead + Unpin>(r: &mut R, prefixes: &[&str]) -> Result<String, HandshakeError> {
    let mut skipped = 0;
    loop {
        if let Line::Expected(line) = read_expected_or_breaker(r, prefixes, &mut skipped).await? {
            return Ok(line);
        }
    }
}

/// Agent side: challenge the host and accept only a correct answer. An identity that
/// comes with a correct answer is handed to `apply` before the host hears READY; if
/// `apply` fails the host hears FAILED and the session ends. A wrong answer is DENIED
/// without `apply` ever being called. A breaker from a host that connected meanwhile
/// brings another challenge (see the module doc).
pub async fn agent_accept<S, F, E>(stream: &mut S, secret: &Secret, apply: F) -> Result<(), HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: FnOnce(Identity) -> Result<(), E>,
    E: std::fmt::Display,
{
    let (mut challenges, mut skipped) = (Vec::new(), 0);
    let line = loop {
        if challenges.len() == MAX_CHALLENGES {
            return Err(HandshakeError::Protocol("too many hosts connected during one handshake".into()));
        }
        let mut challenge = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut challenge);
        stream.write_all(format!("{CHALLENGE}{}\n", hex::encode(challenge)).as_bytes()).await?;
        stream.flush().await?;
        challenges.push(challenge);
        if let Line::Expected(line) = read_expected_or_breaker(stream, &[AUTH], &mut skipped).await? {
            break line;
        }
    };
    let (proof, identity) = line[AUTH.len()..].split_once(' ').unwrap_or((&line[AUTH.len()..], ""));
    let proof = hex::decode(proof).unwrap_or_default();
    // verify_slice compares in constant time.
    let proven = challenges.iter().any(|c| secret.answer(c, identity.as_bytes()).verify_slice(&proof).is_ok());
    if !proven {
        send_line(stream, DENIED).await?;
        return Err(HandshakeError::Denied);
    }
    if !identity.is_empty() {
        let applied = serde_json::from_str::<Identity>(identity)
            .map_err(|e| e.to_string())
            .and_then(|id| apply(id).map_err(|e| e.to_string()));
        if let Err(e) = applied {
            eprintln!("lizard-agent: identity from the handshake not applied: {e}");
            send_line(stream, FAILED).await?;
            return Err(HandshakeError::IdentityFailed);
        }
    }
    send_line(stream, READY).await
}

/// Host side: answer the agent's challenge with the sandbox's secret.
pub async fn host_connect<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: &Secret,
) -> Result<(), HandshakeError> {
    host_answer(stream, secret, None).await
}

/// Host side, for a guest restored from a snapshot: authenticate with the secret it was
/// saved with and give it `identity` in the same message. Once this returns Ok the guest
/// has applied it, and only `identity.secret` opens later sessions.
pub async fn host_connect_with_identity<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: &Secret,
    identity: &Identity,
) -> Result<(), HandshakeError> {
    let json = serde_json::to_string(identity).map_err(|e| HandshakeError::Protocol(e.to_string()))?;
    host_answer(stream, secret, Some(&json)).await
}

async fn host_answer<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: &Secret,
    identity: Option<&str>,
) -> Result<(), HandshakeError> {
    stream.write_all(STALE_SESSION_BREAKER).await?;
    let line = read_expected(stream, &[CHALLENGE]).await?;
    let challenge =
        hex::decode(&line[CHALLENGE.len()..]).map_err(|_| HandshakeError::Protocol("challenge is not hex".into()))?;
    send_line(stream, &auth_line(secret, &challenge, identity)).await?;
    match read_expected(stream, &[READY, DENIED, FAILED]).await?.as_str() {
        READY => Ok(()),
        FAILED => Err(HandshakeError::IdentityFailed),
        _ => Err(HandshakeError::Denied),
    }
}

/// The host's AUTH line (without its newline) for `challenge`.
fn auth_line(secret: &Secret, challenge: &[u8], identity: Option<&str>) -> String {
    let identity = identity.unwrap_or("");
    let proof = hex::encode(secret.answer(challenge, identity.as_bytes()).finalize().into_bytes());
    if identity.is_empty() {
        format!("{AUTH}{proof}")
    } else {
        format!("{AUTH}{proof} {identity}")
    }
}

async fn send_line<S: AsyncWrite + Unpin>(stream: &mut S, line: &str) -> Result<(), HandshakeError> {
    stream.write_all(format!("{line}\n").as_bytes()).await?;
    stream.flush().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    fn no_identity(_: Identity) -> Result<(), String> {
        panic!("no identity was sent")
    }

    fn identity() -> Identity {
        Identity {
            sandbox_id: "sbx-1".into(),
            hostname: "sbx 1\nwith a newline".into(),
            secret: Secret::generate().to_hex(),
            entropy: hex::encode([9u8; crate::types::IDENTITY_ENTROPY_BYTES]),
            unix_time_ms: 1_760_000_000_000,
        }
    }

    type Applied = Arc<Mutex<Vec<Identity>>>;
    type AgentTask = tokio::task::JoinHandle<Result<(), HandshakeError>>;

    /// An agent on `a` that records the identities it applies; `fail` makes applying fail.
    fn agent(mut a: tokio::io::DuplexStream, secret: Secret, fail: bool) -> (Applied, AgentTask) {
        let applied = Arc::new(Mutex::new(Vec::new()));
        let record = applied.clone();
        let task = tokio::spawn(async move {
            agent_accept(&mut a, &secret, |id| {
                if fail {
                    return Err("no");
                }
                record.lock().unwrap().push(id);
                Ok(())
            })
            .await
        });
        (applied, task)
    }

    #[tokio::test]
    async fn identity_arrives_with_the_proof() {
        let secret = Secret::generate();
        let (a, mut h) = tokio::io::duplex(8192);
        let (applied, task) = agent(a, secret.clone(), false);
        let id = identity();
        host_connect_with_identity(&mut h, &secret, &id).await.unwrap();
        task.await.unwrap().unwrap();
        assert_eq!(*applied.lock().unwrap(), vec![id]);
    }

    #[tokio::test]
    async fn wrong_proof_is_refused_and_changes_nothing() {
        let (a, mut h) = tokio::io::duplex(8192);
        let (applied, task) = agent(a, Secret::generate(), false);
        let r = host_connect_with_identity(&mut h, &Secret::generate(), &identity()).await;
        assert!(matches!(r, Err(HandshakeError::Denied)), "{r:?}");
        assert!(matches!(task.await.unwrap(), Err(HandshakeError::Denied)));
        assert!(applied.lock().unwrap().is_empty());
    }

    /// The proof covers the identity: a changed identity under a valid proof is refused.
    #[tokio::test]
    async fn tampered_identity_is_refused() {
        let secret = Secret::generate();
        let (a, mut h) = tokio::io::duplex(8192);
        let (applied, task) = agent(a, secret.clone(), false);
        let line = read_expected(&mut h, &[CHALLENGE]).await.unwrap();
        let challenge = hex::decode(&line[CHALLENGE.len()..]).unwrap();
        let genuine = serde_json::to_string(&identity()).unwrap();
        let forged = serde_json::to_string(&Identity { hostname: "other".into(), ..identity() }).unwrap();
        let auth = auth_line(&secret, &challenge, Some(&genuine)).replace(&genuine, &forged);
        send_line(&mut h, &auth).await.unwrap();
        assert_eq!(read_line(&mut h).await.unwrap(), DENIED.as_bytes());
        assert!(matches!(task.await.unwrap(), Err(HandshakeError::Denied)));
        assert!(applied.lock().unwrap().is_empty());
    }

    /// An AUTH line recorded from one session opens no later one: each has its challenge.
    #[tokio::test]
    async fn replayed_first_message_is_refused() {
        let secret = Secret::generate();
        let json = serde_json::to_string(&identity()).unwrap();
        let (a, mut h) = tokio::io::duplex(8192);
        let (applied, task) = agent(a, secret.clone(), false);
        let line = read_expected(&mut h, &[CHALLENGE]).await.unwrap();
        let recorded = auth_line(&secret, &hex::decode(&line[CHALLENGE.len()..]).unwrap(), Some(&json));
        send_line(&mut h, &recorded).await.unwrap();
        assert_eq!(read_line(&mut h).await.unwrap(), READY.as_bytes());
        task.await.unwrap().unwrap();
        assert_eq!(applied.lock().unwrap().len(), 1);

        let (a, mut h) = tokio::io::duplex(8192);
        let (applied, task) = agent(a, secret, false);
        read_expected(&mut h, &[CHALLENGE]).await.unwrap();
        send_line(&mut h, &recorded).await.unwrap();
        assert_eq!(read_line(&mut h).await.unwrap(), DENIED.as_bytes());
        assert!(matches!(task.await.unwrap(), Err(HandshakeError::Denied)));
        assert!(applied.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn identity_that_cannot_be_applied_fails_the_handshake() {
        let secret = Secret::generate();
        let (a, mut h) = tokio::io::duplex(8192);
        let (_, task) = agent(a, secret.clone(), true);
        let r = host_connect_with_identity(&mut h, &secret, &identity()).await;
        assert!(matches!(r, Err(HandshakeError::IdentityFailed)), "{r:?}");
        assert!(matches!(task.await.unwrap(), Err(HandshakeError::IdentityFailed)));
    }

    #[tokio::test]
    async fn identity_that_is_not_json_fails_the_handshake() {
        let secret = Secret::generate();
        let (a, mut h) = tokio::io::duplex(8192);
        let (applied, task) = agent(a, secret.clone(), false);
        let line = read_expected(&mut h, &[CHALLENGE]).await.unwrap();
        let challenge = hex::decode(&line[CHALLENGE.len()..]).unwrap();
        send_line(&mut h, &auth_line(&secret, &challenge, Some("{not json"))).await.unwrap();
        assert_eq!(read_line(&mut h).await.unwrap(), FAILED.as_bytes());
        assert!(matches!(task.await.unwrap(), Err(HandshakeError::IdentityFailed)));
        assert!(applied.lock().unwrap().is_empty());
    }

    /// The host's breaker reaches the agent after its first challenge, so the agent sends a
    /// second one: the host answers the first, skips the second, and what follows READY
    /// arrives intact.
    #[tokio::test]
    async fn right_secret_is_accepted_and_stream_stays_aligned() {
        let secret = Secret::generate();
        let (mut a, mut h) = tokio::io::duplex(1024);
        let s2 = secret.clone();
        let agent = tokio::spawn(async move {
            agent_accept(&mut a, &s2, no_identity).await.unwrap();
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
        let agent = tokio::spawn(async move { agent_accept(&mut a, &Secret::generate(), no_identity).await });
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
        let agent = tokio::spawn(async move { agent_accept(&mut a, &s2, no_identity).await });
        host_connect(&mut h, &secret).await.unwrap();
        agent.await.unwrap().unwrap();
    }

    /// The stale session's last bytes (a GOAWAY, no newline) may precede the challenge on
    /// its line; the breaker reaches an agent already in the handshake, which skips it.
    #[tokio::test]
    async fn a_fork_copys_handshake_gets_past_the_stale_session() {
        let secret = Secret::generate();
        let (mut a, mut h) = tokio::io::duplex(4096);
        a.write_all(b"\0\0\x08\x07\0\0\0\0\0\0\0\0\x01\0\0\0\x02").await.unwrap();
        let (applied, agent) = agent(a, secret.clone(), false);
        let id = identity();
        host_connect_with_identity(&mut h, &secret, &id).await.unwrap();
        agent.await.unwrap().unwrap();
        assert_eq!(applied.lock().unwrap().as_slice(), std::slice::from_ref(&id));
    }

    /// The host the agent challenged gave up before reading the challenge, and another
    /// connected: its breaker brings a second challenge, which it answers.
    #[tokio::test]
    async fn a_host_that_connects_after_the_challenge_was_lost_gets_another() {
        let secret = Secret::generate();
        let (a, mut h) = tokio::io::duplex(8192);
        let (applied, agent) = agent(a, secret.clone(), false);
        read_expected(&mut h, &[CHALLENGE]).await.unwrap();
        let id = identity();
        let connect = host_connect_with_identity(&mut h, &secret, &id);
        tokio::time::timeout(Duration::from_secs(5), connect).await.expect("no second challenge").unwrap();
        agent.await.unwrap().unwrap();
        assert_eq!(applied.lock().unwrap().as_slice(), std::slice::from_ref(&id));
    }

    /// Hosts that keep connecting during one handshake end it after a bound.
    #[tokio::test]
    async fn breakers_without_end_end_the_handshake() {
        let (mut a, mut h) = tokio::io::duplex(1 << 16);
        let agent = tokio::spawn(async move { agent_accept(&mut a, &Secret::generate(), no_identity).await });
        for _ in 0..MAX_CHALLENGES {
            h.write_all(STALE_SESSION_BREAKER).await.unwrap();
        }
        let r = tokio::time::timeout(Duration::from_secs(5), agent).await.expect("the handshake ran on").unwrap();
        assert!(matches!(r, Err(HandshakeError::Protocol(_))), "{r:?}");
    }

    /// A guest that sends breakers without end does not hold the host's handshake.
    #[tokio::test]
    async fn a_host_reading_breakers_without_end_gives_up() {
        let (mut a, mut h) = tokio::io::duplex(1 << 16);
        let flood = tokio::spawn(async move { while a.write_all(STALE_SESSION_BREAKER).await.is_ok() {} });
        let r = tokio::time::timeout(Duration::from_secs(20), host_connect(&mut h, &Secret::generate())).await;
        assert!(matches!(r.expect("the host read on"), Err(HandshakeError::Protocol(_))));
        drop(h);
        flood.await.unwrap();
    }

    #[test]
    fn secret_hex_roundtrip() {
        let s = Secret::generate();
        assert_eq!(Secret::from_hex(&s.to_hex()).unwrap(), s);
        assert!(Secret::from_hex("abcd").is_err());
    }
}
