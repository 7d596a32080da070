//! Keep an idle guest from waking its VMM.
//!
//! Under TCG every wakeup of the VMM costs host CPU, and an idle sandbox should cost
//! next to none. Two things woke an idle guest's VMM about 58 times a second (measured
//! on a restored `base` sandbox with QEMU 10: ≈9.5 ms of host CPU per second; ≈0.7 ms
//! once both are off):
//!
//! - The PIT. The firmware leaves channel 0 counting in mode 3 (the BIOS's 18.2 Hz
//!   tick); Linux 6.1 uses the LAPIC timer and never stops it, so QEMU wakes at each edge
//!   of its output (≈36 times a second) to raise an interrupt the guest has masked.
//!   Newer kernels stop it themselves, with the same writes as [`stop_pit`].
//! - Periodic kernel work that nothing in a sandbox needs: proactive compaction (a
//!   check every 500 ms; compaction on demand stays) and the soft-lockup watchdog (a
//!   timer and a stopper-thread run every 4 s; a paused and resumed guest is all it
//!   would ever report).
//!
//! This runs once, at a cold boot: template snapshots are taken after it, so every
//! restored sandbox starts with the PIT stopped and these settings in place.

use std::io;

/// The kernel settings this module writes, as (`/proc/sys` path, value).
const SYSCTLS: [(&str, &str); 2] = [("/proc/sys/vm/compaction_proactiveness", "0"), ("/proc/sys/kernel/watchdog", "0")];

/// Stop the PIT and the kernel's periodic work; each failure is logged, none is fatal.
pub fn quiet_idle_wakeups() {
    if let Err(e) = stop_pit() {
        eprintln!("lizard-agent: cannot stop the PIT: {e}");
    }
    for (path, value) in SYSCTLS {
        if let Err(e) = std::fs::write(path, value) {
            eprintln!("lizard-agent: write {path}: {e}");
        }
    }
}

/// PIT channel 0's data port and the PIT's mode register.
#[cfg(target_arch = "x86_64")]
const PIT_CHANNEL0: u16 = 0x40;
#[cfg(target_arch = "x86_64")]
const PIT_MODE: u16 = 0x43;

/// Put PIT channel 0 in mode 0 (one shot) with a zero count: it fires once more and then
/// stays quiet. `ioperm` grants the ports to this thread (threads it started meanwhile
/// would inherit them; it starts none), and the grant is taken back before returning.
#[cfg(target_arch = "x86_64")]
fn stop_pit() -> io::Result<()> {
    // SAFETY: ioperm only changes which I/O ports this thread may use; it touches no memory.
    if unsafe { libc::ioperm(PIT_CHANNEL0.into(), 4, 1) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // Channel 0, low byte then high byte, mode 0; then the count, 0 (= 65536).
    for (port, value) in [(PIT_MODE, 0x30u8), (PIT_CHANNEL0, 0), (PIT_CHANNEL0, 0)] {
        // SAFETY: `out` to a PIT port that ioperm above opened to this thread; it reads and
        // writes no memory and leaves the stack and flags alone.
        unsafe {
            std::arch::asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack, preserves_flags))
        };
    }
    // SAFETY: as above; this closes the ports again.
    if unsafe { libc::ioperm(PIT_CHANNEL0.into(), 4, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(target_arch = "x86_64"))]
fn stop_pit() -> io::Result<()> {
    Ok(())
}
