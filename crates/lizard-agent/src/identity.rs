//! Turn a guest restored from a template snapshot into a machine of its own (see
//! [`lizard_agent_proto::types::Identity`]).
//!
//! Every clone of one snapshot wakes up with the same kernel RNG state, hostname, agent
//! secret and a wall clock stopped at snapshot time. The host sends a fresh identity
//! right after the restore, in the first message of the handshake ([`apply`], called by
//! the handshake before it answers READY), or as `POST /v1/identity` on a session that is
//! already open ([`handle`]: a restored guest that waited, connected, in a warm pool).
//! Either way the agent applies it before answering, so that by the time the host sees
//! the answer no command could run with the template's state.
//!
//! A guest that becomes another sandbox than the one it was (a template's clone, a
//! fork's copy) also gets a boot id of its own ([`new_boot_id`]); one that continues as
//! itself (a resume) keeps its boot id, as it keeps its processes.
//!
//! What a fork's copy does share with its original is what `fork(2)` shares: each
//! running process's memory, a user-space random generator's state included. The kernel's
//! generator is reseeded here; a process that keeps its own seeded generator (most
//! language runtimes do) goes on with the original's sequence until it reseeds.

use crate::app::{AppError, AppState};
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use lizard_agent_proto::handshake::Secret;
use lizard_agent_proto::types::{AgentError, ErrorCode, Identity, IDENTITY_ENTROPY_BYTES};
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;

/// Where programs read the guest's boot id.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
/// The file that answers there once the guest has a boot id of its own (on the guest's
/// /run, a tmpfs).
const OWN_BOOT_ID: &str = "/run/lizard-boot-id";

/// The sandbox this guest last became (its memory is saved with it: a resumed guest
/// remembers, a copy remembers its original).
static BECAME: Mutex<Option<String>> = Mutex::new(None);

/// An [`Identity`] checked and decoded.
#[derive(Debug)]
pub struct Parsed {
    pub sandbox_id: String,
    pub hostname: String,
    pub secret: Secret,
    pub entropy: Vec<u8>,
    pub unix_time_ms: u64,
}

/// Validate an identity without touching the system.
pub fn parse(id: Identity) -> Result<Parsed, AgentError> {
    let bad = |m: String| AgentError::new(ErrorCode::InvalidArgument, m);
    if id.hostname.is_empty() || id.hostname.len() > 64 || id.hostname.bytes().any(|b| b == 0 || b == b'/') {
        return Err(bad(format!("bad hostname {:?}", id.hostname)));
    }
    let secret = Secret::from_hex(&id.secret).map_err(|e| bad(format!("secret: {e}")))?;
    let entropy = hex::decode(&id.entropy).map_err(|e| bad(format!("entropy: {e}")))?;
    if entropy.len() < 32 || entropy.len() > 4 * IDENTITY_ENTROPY_BYTES {
        return Err(bad(format!("entropy must be 32..={} bytes, got {}", 4 * IDENTITY_ENTROPY_BYTES, entropy.len())));
    }
    if id.unix_time_ms < 1_600_000_000_000 {
        return Err(bad(format!("implausible unixTimeMs {}", id.unix_time_ms)));
    }
    Ok(Parsed { sandbox_id: id.sandbox_id, hostname: id.hostname, secret, entropy, unix_time_ms: id.unix_time_ms })
}

pub async fn handle(State(state): State<AppState>, Json(id): Json<Identity>) -> Result<StatusCode, AppError> {
    apply(&state, id)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Check `id`, apply it to the system (as PID 1) and switch to its secret.
pub fn apply(state: &AppState, id: Identity) -> Result<(), AgentError> {
    let parsed = parse(id)?;
    if state.pid1 {
        // A few non-blocking syscalls: run them here rather than wake a blocking-pool
        // thread, which a just-restored guest may first have to create (milliseconds
        // under emulation, on every create).
        apply_to_system(&parsed.hostname, &parsed.entropy, parsed.unix_time_ms)
            .and_then(|()| become_sandbox(&parsed.sandbox_id))
            .map_err(|e| AgentError::new(ErrorCode::Internal, e.to_string()))?;
    }
    // Last: a failure above leaves the old secret, and the host falls back to a cold boot.
    *state.secret.write().unwrap_or_else(|e| e.into_inner()) = parsed.secret;
    Ok(())
}

/// Hostname, RNG and clock: only as PID 1 of a guest, never in dev mode on a host.
fn apply_to_system(hostname: &str, entropy: &[u8], unix_time_ms: u64) -> io::Result<()> {
    let ctx = |what: &'static str| move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
    add_entropy(entropy).map_err(ctx("add entropy"))?;
    let secs = i64::try_from(unix_time_ms / 1000).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // Below 1000 × 1e6: fits any i64.
    let nanos =
        i64::try_from((unix_time_ms % 1000) * 1_000_000).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let ts = nix::sys::time::TimeSpec::new(secs, nanos);
    nix::time::clock_settime(nix::time::ClockId::CLOCK_REALTIME, ts).map_err(|e| ctx("clock_settime")(e.into()))?;
    set_hostname(hostname)
}

/// Set the guest's hostname, and name it in `/etc/hosts` on `127.0.1.1` (as Debian's
/// installer does), so that tools that resolve their own host (`sudo`, for one) find it.
/// Only as PID 1 of a guest. A hosts file that cannot be written is left as it is.
pub(crate) fn set_hostname(hostname: &str) -> io::Result<()> {
    nix::unistd::sethostname(hostname).map_err(|e| io::Error::other(format!("sethostname: {e}")))?;
    let hosts = std::fs::read_to_string(HOSTS).unwrap_or_default();
    let named = with_own_host(&hosts, hostname);
    if named != hosts {
        let tmp = format!("{HOSTS}.lizard-tmp");
        if let Err(e) = std::fs::write(&tmp, named).and_then(|()| std::fs::rename(&tmp, HOSTS)) {
            eprintln!("lizard-agent: cannot name {hostname} in {HOSTS}: {e}");
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok(())
}

/// The guest's hosts file.
const HOSTS: &str = "/etc/hosts";

/// `hosts` with its `127.0.1.1` line naming `hostname` (added when there is none).
fn with_own_host(hosts: &str, hostname: &str) -> String {
    let own = format!("127.0.1.1\t{hostname}");
    let mut found = false;
    let mut lines: Vec<String> = hosts
        .lines()
        .map(|line| match line.split_whitespace().next() {
            Some("127.0.1.1") if !found => {
                found = true;
                own.clone()
            }
            _ => line.to_owned(),
        })
        .collect();
    if !found {
        lines.insert(usize::from(!lines.is_empty() && lines[0].starts_with("127.0.0.1")), own);
    }
    lines.join("\n") + "\n"
}

/// A new boot id when the guest becomes another sandbox than the one it last was.
fn become_sandbox(sandbox_id: &str) -> io::Result<()> {
    let mut became = BECAME.lock().unwrap_or_else(|e| e.into_inner());
    if became.as_deref() != Some(sandbox_id) {
        new_boot_id().map_err(|e| io::Error::new(e.kind(), format!("new boot id: {e}")))?;
        *became = Some(sandbox_id.to_owned());
    }
    Ok(())
}

/// Give the guest a boot id of its own. Linux fixes `boot_id` at its first read and
/// offers no way to change it, so a guest copied while running would go on reporting its
/// original's, telling programs that key state by boot (journals, caches, licence
/// checks) that two machines are one. A file bind-mounted read-only over it answers
/// instead; later changes rewrite that file in place. Called after the reseed: the id
/// comes from the guest's own random stream.
fn new_boot_id() -> io::Result<()> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    std::fs::write(OWN_BOOT_ID, boot_id_text(bytes))?;
    let (own, current) = (std::fs::metadata(OWN_BOOT_ID)?, std::fs::metadata(BOOT_ID)?);
    if (own.dev(), own.ino()) != (current.dev(), current.ino()) {
        use nix::mount::{mount, MsFlags};
        mount(Some(OWN_BOOT_ID), BOOT_ID, None::<&str>, MsFlags::MS_BIND, None::<&str>)?;
        let read_only = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY;
        mount(None::<&str>, BOOT_ID, None::<&str>, read_only, None::<&str>)?;
    }
    Ok(())
}

/// A random (version 4) UUID in the kernel's own `boot_id` form: lowercase, hyphenated,
/// one line. (Written here rather than with a UUID crate: it is one format string over 16
/// random bytes, and the static guest agent stays small.)
fn boot_id_text(mut b: [u8; 16]) -> String {
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!("{}-{}-{}-{}-{}\n", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// `RNDADDENTROPY`: `_IOW('R', 0x03, int[2])`.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
/// `RNDRESEEDCRNG`: `_IO('R', 0x07)`.
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;

/// Mix `bytes` into the input pool, credit them as entropy, and reseed the CRNG now: a
/// credit alone would leave the clones' shared CRNG key in place until the next
/// scheduled reseed (up to a minute), so their first random bytes would still match.
/// (RNDADDENTROPY mixes as well as credits: a plain write before it would only hash the
/// same bytes twice, which costs under emulation.)
fn add_entropy(bytes: &[u8]) -> io::Result<()> {
    let urandom = std::fs::OpenOptions::new().write(true).open("/dev/urandom")?;
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }, as u32
    // words so that the buffer is aligned for it.
    let words = bytes.len().div_ceil(4);
    let mut info = vec![0u32; 2 + words];
    let too_long = || io::Error::new(io::ErrorKind::InvalidInput, "too much entropy for one ioctl");
    info[0] = bytes.len().checked_mul(8).and_then(|bits| u32::try_from(bits).ok()).ok_or_else(too_long)?;
    info[1] = u32::try_from(bytes.len()).map_err(|_| too_long())?;
    for (i, chunk) in bytes.chunks(4).enumerate() {
        let mut w = [0u8; 4];
        w[..chunk.len()].copy_from_slice(chunk);
        info[2 + i] = u32::from_ne_bytes(w);
    }
    // SAFETY: RNDADDENTROPY reads a rand_pool_info: two ints followed by buf_size bytes.
    // `info` holds exactly that (buf_size = bytes.len() <= 4 * words), stays alive and
    // unmoved for the call, and the kernel only reads it.
    if unsafe { libc::ioctl(urandom.as_raw_fd(), RNDADDENTROPY as _, info.as_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: RNDRESEEDCRNG takes no argument and touches no user memory.
    if unsafe { libc::ioctl(urandom.as_raw_fd(), RNDRESEEDCRNG as _) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_file_names_the_guests_own_host() {
        let debian = "127.0.0.1\tlocalhost\n127.0.1.1\tlizard\n::1\tlocalhost ip6-localhost\n";
        let named = with_own_host(debian, "sbxabc");
        assert_eq!(named, "127.0.0.1\tlocalhost\n127.0.1.1\tsbxabc\n::1\tlocalhost ip6-localhost\n");
        assert_eq!(with_own_host(&named, "sbxabc"), named);
        assert_eq!(with_own_host("127.0.0.1 localhost\n", "h"), "127.0.0.1 localhost\n127.0.1.1\th\n");
        assert_eq!(with_own_host("", "h"), "127.0.1.1\th\n");
    }

    fn identity() -> Identity {
        Identity {
            sandbox_id: "sbx".into(),
            hostname: "sbx".into(),
            secret: Secret::generate().to_hex(),
            entropy: hex::encode([7u8; IDENTITY_ENTROPY_BYTES]),
            unix_time_ms: 1_760_000_000_000,
        }
    }

    fn state() -> AppState {
        AppState { secret: std::sync::Arc::new(std::sync::RwLock::new(Secret::generate())), pid1: false }
    }

    /// A bad identity changes nothing, not even the secret.
    #[test]
    fn bad_identity_keeps_the_secret() {
        let state = state();
        let before = state.secret.read().unwrap().clone();
        let err = apply(&state, Identity { entropy: "00".into(), ..identity() }).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArgument);
        assert_eq!(*state.secret.read().unwrap(), before);
    }

    /// Through the handshake: a wrong proof leaves the secret, a right one switches it.
    #[tokio::test]
    async fn handshake_identity_switches_the_secret_only_with_the_right_proof() {
        use lizard_agent_proto::handshake::{agent_accept, host_connect_with_identity, HandshakeError};
        let state = state();
        let old = state.secret.read().unwrap().clone();
        let id = identity();
        let new = Secret::from_hex(&id.secret).unwrap();
        for (host_secret, expect_new) in [(Secret::generate(), false), (old.clone(), true)] {
            let (mut a, mut h) = tokio::io::duplex(8192);
            let st = state.clone();
            let agent = tokio::spawn(async move {
                let secret = st.secret.read().unwrap().clone();
                agent_accept(&mut a, &secret, |id| apply(&st, id)).await
            });
            let r = host_connect_with_identity(&mut h, &host_secret, &id).await;
            let agent = agent.await.unwrap();
            if expect_new {
                r.unwrap();
                agent.unwrap();
                assert_eq!(*state.secret.read().unwrap(), new);
            } else {
                assert!(matches!(r, Err(HandshakeError::Denied)));
                assert!(matches!(agent, Err(HandshakeError::Denied)));
                assert_eq!(*state.secret.read().unwrap(), old);
            }
        }
    }

    #[test]
    fn boot_ids_take_the_kernels_form() {
        let text = boot_id_text([0xff; 16]);
        assert_eq!(text, "ffffffff-ffff-4fff-bfff-ffffffffffff\n");
        assert_eq!(boot_id_text([0; 16]), "00000000-0000-4000-8000-000000000000\n");
    }

    #[test]
    fn parses_and_rejects() {
        let p = parse(identity()).unwrap();
        assert_eq!(p.entropy.len(), IDENTITY_ENTROPY_BYTES);
        for bad in [
            Identity { secret: "zz".into(), ..identity() },
            Identity { entropy: "00".into(), ..identity() },
            Identity { hostname: String::new(), ..identity() },
            Identity { hostname: "a".repeat(65), ..identity() },
            Identity { unix_time_ms: 5, ..identity() },
        ] {
            assert_eq!(parse(bad).unwrap_err().code, ErrorCode::InvalidArgument);
        }
    }

    /// Outside PID 1 (dev mode, this test) only the secret changes.
    #[tokio::test]
    async fn dev_mode_swaps_only_the_secret() {
        let state = AppState { secret: std::sync::Arc::new(std::sync::RwLock::new(Secret::generate())), pid1: false };
        let id = identity();
        let new = Secret::from_hex(&id.secret).unwrap();
        let host_before = nix::unistd::gethostname().unwrap();
        assert_eq!(handle(State(state.clone()), Json(id)).await.unwrap(), StatusCode::NO_CONTENT);
        assert_eq!(*state.secret.read().unwrap(), new);
        assert_eq!(nix::unistd::gethostname().unwrap(), host_before);
    }
}
