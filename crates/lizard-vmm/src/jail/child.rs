//! What a confined VMM does to itself between fork and exec, still as root: join its
//! cgroups, open its TAP device (it will not have CAP_NET_ADMIN), keep its uid claim
//! open, set its resource limits, turn transparent huge pages off, then give up root for
//! good — bounding and ambient capabilities dropped, groups, gid and uid set to its own,
//! every capability set cleared and `no_new_privs` set, so that exec (and anything after
//! it) gains nothing back.
//!
//! Runs in the forked child of a multithreaded process: only system calls, no
//! allocation, no locks. Everything it needs is prepared before the fork.

use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;

/// The descriptor the VMM finds its TAP device at (`-netdev tap,fd=…`).
pub const TAP_FD: RawFd = 100;
/// The descriptor that keeps the VMM's uid claim locked for as long as it lives.
pub const CLAIM_FD: RawFd = 101;
use super::preload::{DELTA_FD, PRELOAD_FD};

/// `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`: what QEMU itself asks for when it opens a TAP
/// by name, so that the device (and a snapshot's virtio-net features) stay the same.
const TAP_FLAGS: libc::c_int = libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR;
/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit capability sets, two data structs.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Everything the child needs, made before the fork.
#[derive(Debug, Clone)]
pub struct ChildSetup {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the group of the files all VMMs share).
    pub groups: Vec<libc::gid_t>,
    /// `cgroup.procs` files to write "0" (this process) into.
    pub cgroup_procs: Vec<CString>,
    /// The TAP device to open, as `struct ifreq`'s name field.
    pub tap: Option<[libc::c_char; libc::IFNAMSIZ]>,
    /// The uid claim's lock file, to be kept open at [`CLAIM_FD`].
    pub claim_fd: RawFd,
    /// The preload library and what it is given, for a VMM that maps a shared memory file.
    pub preload: Option<super::preload::Preload>,
    pub rlimits: Vec<(libc::__rlimit_resource_t, libc::rlim_t)>,
    /// The highest capability number this kernel knows.
    pub last_cap: libc::c_ulong,
    /// Directories covered by an empty tmpfs in the VMM's own mount namespace
    /// ([`super::view`]).
    pub hide: Vec<CString>,
}

#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A TAP name as `struct ifreq` holds it; `None` when it does not fit.
pub fn ifreq_name(name: &str) -> Option<[libc::c_char; libc::IFNAMSIZ]> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return None;
    }
    let mut out = [0 as libc::c_char; libc::IFNAMSIZ];
    for (o, b) in out.iter_mut().zip(bytes) {
        *o = libc::c_char::from_ne_bytes([*b]);
    }
    Some(out)
}

/// The highest capability number of this kernel (`/proc/sys/kernel/cap_last_cap`).
pub fn last_cap() -> libc::c_ulong {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(63)
}

impl ChildSetup {
    /// Apply the setup to the calling process.
    ///
    /// # Safety
    /// Call only in a child between fork and exec (it changes the process's identity
    /// and descriptors for good).
    pub unsafe fn apply(&self) -> io::Result<()> {
        for procs in &self.cgroup_procs {
            // SAFETY: a NUL-terminated path made before the fork; open/write/close are
            // async-signal-safe.
            unsafe {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                check(fd)?;
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if written != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        // Each kept descriptor is first copied above the fixed numbers (close-on-exec), so
        // that placing one cannot overwrite another that happened to sit at its number.
        let above = |fd: RawFd| {
            // SAFETY: duplicates a descriptor this process has; integer arguments only.
            let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, DELTA_FD + 1) };
            check(copy).map(|()| copy)
        };
        // No allocation here: a fixed array of (copy, fixed number), unused slots -1.
        let mut kept = [(above(self.claim_fd)?, CLAIM_FD), (-1, PRELOAD_FD), (-1, DELTA_FD)];
        if let Some(preload) = &self.preload {
            kept[1].0 = above(preload.library_fd)?;
            if let Some(delta) = preload.delta_fd {
                kept[2].0 = above(delta)?;
            }
        }
        for (copy, fixed) in kept.into_iter().filter(|(copy, _)| *copy >= 0) {
            // SAFETY: dup2 onto a fixed number below the copy; the result is not close-on-exec.
            check(unsafe { libc::dup2(copy, fixed) })?;
        }
        if let Some(name) = self.tap {
            // SAFETY: a static NUL-terminated path; the descriptor is checked.
            let tun = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR) };
            check(tun)?;
            // TAP_FLAGS fits a c_short (0x4000 | 0x1000 | 0x0002), checked at compile time.
            #[allow(clippy::cast_possible_truncation)]
            const FLAGS: libc::c_short = {
                assert!(TAP_FLAGS <= libc::c_short::MAX as libc::c_int);
                TAP_FLAGS as libc::c_short
            };
            let req = IfReq { name, flags: FLAGS, _pad: [0; 22] };
            // SAFETY: TUNSETIFF reads a 40-byte struct ifreq, which IfReq is; it lives
            // across the call.
            check(unsafe { libc::ioctl(tun, libc::TUNSETIFF, &req) })?;
            if tun != TAP_FD {
                // SAFETY: moves the open TAP descriptor to its fixed number.
                check(unsafe { libc::dup2(tun, TAP_FD) })?;
                // SAFETY: closes the now duplicated original.
                unsafe { libc::close(tun) };
            }
        }
        if !self.hide.is_empty() {
            // SAFETY: plain system calls on static strings and paths made before the fork.
            unsafe {
                check(libc::unshare(libc::CLONE_NEWNS))?;
                // Nothing mounted here propagates back to the host's namespace.
                check(libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ))?;
                for dir in &self.hide {
                    let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
                    check(libc::mount(
                        c"lizard-hidden".as_ptr(),
                        dir.as_ptr(),
                        c"tmpfs".as_ptr(),
                        flags,
                        c"size=4k,mode=0555".as_ptr().cast(),
                    ))?;
                }
            }
        }
        // QEMU asks for transparent huge pages on every RAM block and on its translation
        // cache, so a ROM it touches a few bytes of, or the cache's last chunk, costs
        // 2 MiB. Idle VMMs are many: 4 KiB pages keep each one's memory to what it uses.
        // SAFETY: prctl with integer arguments only.
        check(unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) })?;
        for &(resource, value) in &self.rlimits {
            let limit = libc::rlimit { rlim_cur: value, rlim_max: value };
            // SAFETY: setrlimit reads the struct, which lives across the call.
            check(unsafe { libc::setrlimit(resource, &limit) })?;
        }
        for cap in 0..=self.last_cap {
            // SAFETY: prctl with integer arguments only. EINVAL: a number this kernel
            // does not know, nothing to drop.
            let ret = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
            if ret < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
                return Err(io::Error::last_os_error());
            }
        }
        // SAFETY: prctl with integer arguments only.
        check(unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) })?;
        // SAFETY: setgroups reads `groups.len()` gids from a vector made before the fork.
        check(unsafe { libc::setgroups(self.groups.len(), self.groups.as_ptr()) })?;
        // SAFETY: plain system calls with integer arguments.
        check(unsafe { libc::setresgid(self.gid, self.gid, self.gid) })?;
        // SAFETY: as above. Leaving uid 0 for good clears the permitted and effective sets.
        check(unsafe { libc::setresuid(self.uid, self.uid, self.uid) })?;
        let header = CapHeader { version: CAPABILITY_VERSION_3, pid: 0 };
        let data = [CapData { effective: 0, permitted: 0, inheritable: 0 }; 2];
        // SAFETY: capset reads a header and two data structs (version 3), which live
        // across the call; all sets empty, the inheritable one included.
        if unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: prctl with integer arguments only.
        check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tap_names_fit_an_ifreq_or_are_refused() {
        let n = ifreq_name("tap0").unwrap();
        assert_eq!(
            &n[..5],
            &[b't' as libc::c_char, b'a' as libc::c_char, b'p' as libc::c_char, b'0' as libc::c_char, 0]
        );
        assert!(ifreq_name("").is_none());
        assert!(ifreq_name("a-very-long-name").is_none());
        assert!(ifreq_name("a\0b").is_none());
    }
}
