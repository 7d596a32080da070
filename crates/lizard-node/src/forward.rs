//! The host end of guest → API connections (see "Forwarded connections" in
//! `lizard_agent_proto::routes`): a few `accept_forward` calls kept waiting on the agent;
//! each connection a guest process makes is piped to the one configured target, the
//! control plane's API. The guest chooses nothing but the bytes it sends; what it may do
//! is decided by the API key it holds.
//!
//! Bounded, because every piped connection costs the host two file descriptors in the
//! server's process: a sandbox has at most [`PER_SANDBOX`] open (a waiter takes a slot
//! before it accepts, so more wait in the agent's queue inside the guest), and a
//! connection with no bytes either way for [`IDLE_TIMEOUT`] is closed. Fairly: the first
//! [`RESERVED`] of a sandbox's connections are its own, and only the ones beyond draw from
//! the node's shared pool ([`SharedSlots`], [`TOTAL`] by default). Sandboxes that fill the
//! pool (32 × 64 filled 2048 before) make others wait for more than their reserved few,
//! never for their first.

use lizard_agent_client::{AgentClient, ClientError, TcpTunnel};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Guest connections picked up at once; more wait in the agent's queue.
const WAITERS: usize = 4;
/// How long connecting to the target may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections one sandbox may have open to the API at once.
pub const PER_SANDBOX: usize = 64;
/// Of those, the ones no other sandbox can take from it.
pub const RESERVED: usize = 8;
/// Default size of the pool the connections beyond [`RESERVED`] share, all sandboxes of
/// a node together.
pub const TOTAL: usize = 2048;
/// A connection idle this long (no bytes either way) is closed. Long enough for a
/// long-running call that streams nothing for minutes.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// The node's pool of connections beyond each sandbox's reserved ones.
#[derive(Clone)]
pub struct SharedSlots(Arc<Semaphore>);

impl SharedSlots {
    pub fn new(total: usize) -> Self {
        SharedSlots(Arc::new(Semaphore::new(total)))
    }
}

/// One sandbox's slots: its reserved ones, and its allowance of the shared pool.
#[derive(Clone)]
struct SandboxSlots {
    reserved: Arc<Semaphore>,
    beyond: Arc<Semaphore>,
    shared: SharedSlots,
}

/// A connection's slot, given back when dropped: one of the sandbox's own, and one of the
/// shared pool when it is beyond the reserved ones.
struct Slot {
    _own: OwnedSemaphorePermit,
    _pool: Option<OwnedSemaphorePermit>,
}

/// Serve `agent`'s forwarded connections until its channel closes.
pub fn spawn(id: String, agent: AgentClient, target: SocketAddr, shared: &SharedSlots) {
    let slots = SandboxSlots {
        reserved: Arc::new(Semaphore::new(RESERVED)),
        beyond: Arc::new(Semaphore::new(PER_SANDBOX - RESERVED)),
        shared: shared.clone(),
    };
    for _ in 0..WAITERS {
        let (agent, id, own) = (agent.clone(), id.clone(), slots.clone());
        tokio::spawn(async move {
            loop {
                let slots = tokio::select! {
                    s = take_slot(&own) => s,
                    _ = agent.closed() => return,
                };
                let tunnel = tokio::select! {
                    t = agent.accept_forward() => t,
                    _ = agent.closed() => return,
                };
                match tunnel {
                    Ok(t) => {
                        tokio::spawn(async move {
                            pipe(t, target).await;
                            drop(slots);
                        });
                    }
                    Err(ClientError::Closed) => return,
                    Err(e) => {
                        // An agent without the route, or a listener it could not bind:
                        // this sandbox gets no API access, and says so once per waiter.
                        tracing::warn!(%id, "API forwarding stopped: {e}");
                        return;
                    }
                }
            }
        });
    }
}

/// A reserved slot if one is free, else one beyond them and one of the shared pool —
/// whichever comes first.
async fn take_slot(own: &SandboxSlots) -> Slot {
    const OPEN: &str = "forwarding slots are never closed";
    if let Ok(mine) = own.reserved.clone().try_acquire_owned() {
        return Slot { _own: mine, _pool: None };
    }
    let shared = async {
        let mine = own.beyond.clone().acquire_owned().await.expect(OPEN);
        let pool = own.shared.0.clone().acquire_owned().await.expect(OPEN);
        Slot { _own: mine, _pool: Some(pool) }
    };
    tokio::select! {
        mine = own.reserved.clone().acquire_owned() => Slot { _own: mine.expect(OPEN), _pool: None },
        slot = shared => slot,
    }
}

/// Copy both ways between a guest connection and a new connection to `target`.
async fn pipe(mut guest: TcpTunnel, target: SocketAddr) {
    let mut upstream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return tracing::debug!("forward to {target}: {e}"),
        Err(_) => return tracing::debug!("forward to {target}: connect timed out"),
    };
    let _ = upstream.set_nodelay(true);
    if let Err(e) = copy_until_idle(&mut guest, &mut upstream, IDLE_TIMEOUT).await {
        tracing::debug!("forward to {target}: {e}");
    }
}

/// Copy both ways until both sides have finished, or until nothing moved (no byte read,
/// no write completed) for `idle`.
pub(crate) async fn copy_until_idle<A, B>(a: &mut A, b: &mut B, idle: Duration) -> std::io::Result<()>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    copy_until_idle_checked(a, b, idle, |bytes, out| {
        out.extend_from_slice(bytes);
        Ok(())
    })
    .await
}

/// [`copy_until_idle`], with what `a` sends passed through `check` first: it appends
/// to its second argument what may go to `b` now, or fails, which ends the copy.
pub(crate) async fn copy_until_idle_checked<A, B, F>(
    a: &mut A,
    b: &mut B,
    idle: Duration,
    mut check: F,
) -> std::io::Result<()>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
    F: FnMut(&[u8], &mut Vec<u8>) -> std::io::Result<()>,
{
    let timed_out = || std::io::Error::new(std::io::ErrorKind::TimedOut, "idle connection closed");
    let (mut a_buf, mut b_buf) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    let mut checked = Vec::with_capacity(16 * 1024);
    let (mut a_open, mut b_open) = (true, true);
    while a_open || b_open {
        tokio::select! {
            r = a.read(&mut a_buf), if a_open => match r? {
                0 => {
                    a_open = false;
                    let _ = b.shutdown().await;
                }
                n => {
                    checked.clear();
                    check(&a_buf[..n], &mut checked)?;
                    tokio::time::timeout(idle, b.write_all(&checked)).await.map_err(|_| timed_out())??
                }
            },
            r = b.read(&mut b_buf), if b_open => match r? {
                0 => {
                    b_open = false;
                    let _ = a.shutdown().await;
                }
                n => tokio::time::timeout(idle, a.write_all(&b_buf[..n])).await.map_err(|_| timed_out())??,
            },
            _ = tokio::time::sleep(idle) => return Err(timed_out()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(shared: &SharedSlots) -> SandboxSlots {
        SandboxSlots {
            reserved: Arc::new(Semaphore::new(RESERVED)),
            beyond: Arc::new(Semaphore::new(PER_SANDBOX - RESERVED)),
            shared: shared.clone(),
        }
    }

    async fn taken(slots: &SandboxSlots) -> Option<Slot> {
        tokio::time::timeout(Duration::from_millis(50), take_slot(slots)).await.ok()
    }

    #[tokio::test]
    async fn a_sandbox_that_fills_the_shared_pool_leaves_others_their_reserved_slots() {
        let shared = SharedSlots::new(16);
        let (greedy, other) = (sandbox(&shared), sandbox(&shared));
        let mut held = Vec::new();
        while let Some(slot) = taken(&greedy).await {
            held.push(slot);
        }
        assert_eq!(held.len(), RESERVED + 16, "its own, then all of the pool");
        let mut others = Vec::new();
        while let Some(slot) = taken(&other).await {
            others.push(slot);
        }
        assert_eq!(others.len(), RESERVED, "the other sandbox still gets its reserved slots");
        // A slot of the pool given back goes to whoever waits for it.
        let waiting = tokio::spawn({
            let other = other.clone();
            async move { take_slot(&other).await }
        });
        held.pop();
        let slot = tokio::time::timeout(Duration::from_secs(1), waiting).await.expect("served").unwrap();
        assert!(slot._pool.is_some(), "a slot of the pool");
    }

    #[tokio::test]
    async fn one_sandbox_holds_at_most_its_share() {
        let shared = SharedSlots::new(TOTAL);
        let greedy = sandbox(&shared);
        let mut held = Vec::new();
        while let Some(slot) = taken(&greedy).await {
            held.push(slot);
        }
        assert_eq!(held.len(), PER_SANDBOX);
        assert_eq!(shared.0.available_permits(), TOTAL - (PER_SANDBOX - RESERVED));
    }

    #[tokio::test]
    async fn bytes_pass_both_ways_and_both_ends_finish() {
        let (mut client, mut a) = tokio::io::duplex(1024);
        let (mut b, mut server) = tokio::io::duplex(1024);
        let copy = tokio::spawn(async move { copy_until_idle(&mut a, &mut b, Duration::from_secs(5)).await });
        client.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        server.write_all(b"pong").await.unwrap();
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"pong");
        drop(client);
        drop(server);
        copy.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn an_idle_connection_is_closed_and_traffic_keeps_one_open() {
        let (mut client, mut a) = tokio::io::duplex(1024);
        let (mut b, mut server) = tokio::io::duplex(1024);
        let idle = Duration::from_millis(300);
        let started = tokio::time::Instant::now();
        let copy = tokio::spawn(async move { copy_until_idle(&mut a, &mut b, idle).await });
        // Bytes every 100 ms for a second: never idle for 300 ms.
        for _ in 0..10 {
            client.write_all(b"x").await.unwrap();
            let mut one = [0u8; 1];
            server.read_exact(&mut one).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(!copy.is_finished(), "closed while in use after {:?}", started.elapsed());
        let r = copy.await.unwrap();
        assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::TimedOut);
    }
}
