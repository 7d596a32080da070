//! How much of what guests decide the server holds in memory at once.
//!
//! Some routes must hold a guest's bytes before answering: a non-streamed exec collects
//! the command's output, a code execution parses each line of the code service's answer.
//! Any process in a sandbox decides those sizes, so each such call charges what it holds
//! to two budgets: its sandbox's share and the whole server's. A charge that would pass
//! either fails at once (the call ends with a clear error; it never waits, so a tenant
//! cannot park others behind its own slow reads), and everything is given back when the
//! call ends. Without it, six code calls answering 60 MiB lines took a server from 73 MB to
//! 909 MB; with 256 calls per key and several keys, tens of GB were within reach.
//!
//! Counted in KiB (a semaphore's permits), rounded up.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Default [`crate::config::TrafficLimits::guest_buffer_bytes`]: 512 MiB, so that a
/// sandbox's share (128 MiB) holds the largest non-streamed exec answer: 16 MiB of output
/// and its JSON, up to six times that.
pub const DEFAULT_TOTAL_BYTES: usize = 512 << 20;
/// The part of the total one sandbox's calls may hold together.
const SANDBOX_SHARE_DIVISOR: usize = 4;

/// The server's budgets.
pub struct GuestBuffers {
    total: Arc<Semaphore>,
    total_kib: usize,
    /// Each sandbox's share, while some call of it holds a charge.
    sandboxes: Mutex<HashMap<String, Weak<Semaphore>>>,
}

/// A charge would pass a budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Exhausted {
    /// The call alone would hold more than a sandbox's whole share (KiB): it never fits.
    #[error("the call would hold more than the {} MiB the server keeps for one sandbox", .0 / 1024)]
    TooLarge(usize),
    /// The sandbox's share (KiB) is taken.
    #[error("this sandbox's calls already hold {} MiB of its output in the server", .0 / 1024)]
    Sandbox(usize),
    /// The server's total (KiB) is taken.
    #[error("the server holds all the sandbox output it can at once ({} MiB)", .0 / 1024)]
    Server(usize),
}

/// One call's charge: grows and shrinks with what it holds, given back when dropped.
#[derive(Debug)]
pub struct Charge {
    sandbox: Arc<Semaphore>,
    share_kib: usize,
    total: Arc<Semaphore>,
    total_kib: usize,
    held: Option<(OwnedSemaphorePermit, OwnedSemaphorePermit)>,
}

impl GuestBuffers {
    pub fn new(total_bytes: usize) -> Self {
        let total_kib = kib(total_bytes).clamp(1, Semaphore::MAX_PERMITS);
        GuestBuffers { total: Arc::new(Semaphore::new(total_kib)), total_kib, sandboxes: Mutex::default() }
    }

    /// A charge of nothing yet, against `sandbox_id`'s share.
    pub fn charge(&self, sandbox_id: &str) -> Charge {
        let share_kib = (self.total_kib / SANDBOX_SHARE_DIVISOR).max(1);
        let sandbox = {
            let mut sandboxes = self.sandboxes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match sandboxes.get(sandbox_id).and_then(Weak::upgrade) {
                Some(share) => share,
                None => {
                    sandboxes.retain(|_, share| share.strong_count() > 0);
                    let share = Arc::new(Semaphore::new(share_kib));
                    sandboxes.insert(sandbox_id.to_string(), Arc::downgrade(&share));
                    share
                }
            }
        };
        Charge { sandbox, share_kib, total: self.total.clone(), total_kib: self.total_kib, held: None }
    }

    /// KiB held by every call together.
    #[cfg(test)]
    pub(crate) fn held_kib(&self) -> usize {
        self.total_kib - self.total.available_permits()
    }
}

impl Charge {
    /// Hold `bytes` in all (more or less than before); on refusal the charge is unchanged.
    pub fn hold(&mut self, bytes: usize) -> Result<(), Exhausted> {
        let want = kib(bytes);
        let have = self.held.as_ref().map_or(0, |(share, _)| share.num_permits());
        if want < have {
            if let Some((share, total)) = self.held.as_mut() {
                drop(share.split(have - want));
                drop(total.split(have - want));
            }
        } else if want > self.share_kib {
            return Err(Exhausted::TooLarge(self.share_kib));
        } else if want > have {
            let more = u32::try_from(want - have).map_err(|_| Exhausted::Sandbox(self.share_kib))?;
            let share =
                self.sandbox.clone().try_acquire_many_owned(more).map_err(|_| Exhausted::Sandbox(self.share_kib))?;
            let total =
                self.total.clone().try_acquire_many_owned(more).map_err(|_| Exhausted::Server(self.total_kib))?;
            match self.held.as_mut() {
                Some((held_share, held_total)) => {
                    held_share.merge(share);
                    held_total.merge(total);
                }
                None => self.held = Some((share, total)),
            }
        }
        Ok(())
    }
}

fn kib(bytes: usize) -> usize {
    bytes.div_ceil(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_charge_grows_shrinks_and_is_given_back() {
        let buffers = GuestBuffers::new(64 << 10);
        let mut a = buffers.charge("a");
        a.hold(10 << 10).unwrap();
        assert_eq!(buffers.held_kib(), 10);
        a.hold(3 << 10).unwrap();
        assert_eq!(buffers.held_kib(), 3);
        drop(a);
        assert_eq!(buffers.held_kib(), 0);
    }

    #[test]
    fn one_sandbox_holds_at_most_its_share_and_leaves_the_rest_to_others() {
        let buffers = GuestBuffers::new(64 << 10);
        let (mut a1, mut a2) = (buffers.charge("a"), buffers.charge("a"));
        a1.hold(10 << 10).unwrap();
        assert_eq!(a2.hold(7 << 10), Err(Exhausted::Sandbox(16)), "16 KiB share, 10 held by the sandbox's other call");
        a2.hold(6 << 10).unwrap();
        // Three other sandboxes fill the server; a fourth is refused by the total.
        let mut others: Vec<Charge> = ["b", "c", "d"].iter().map(|id| buffers.charge(id)).collect();
        for other in &mut others {
            other.hold(16 << 10).unwrap();
        }
        assert_eq!(buffers.charge("e").hold(1), Err(Exhausted::Server(64)));
        assert_eq!(buffers.charge("f").hold(17 << 10), Err(Exhausted::TooLarge(16)), "more than a share never fits");
        assert_eq!(
            a2.hold(6 << 10),
            Ok(()),
            "a refused charge changes nothing, a charge of the same size is no change"
        );
        drop(others);
        buffers.charge("e").hold(16 << 10).unwrap();
    }
}
