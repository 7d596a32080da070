//! The shared object that lets QEMU 7.2 map a template's memory from a file it may only
//! read (`preload/readonly_memory.rs`, built by `build.rs`): QEMU opens even a private
//! mapping's file read-write, so without it every VMM would need write access to the
//! memory every other clone starts from.
//!
//! The node holds the library in a sealed memfd (no file on the host to plant or swap) and
//! each confined clone inherits it at [`super::child::PRELOAD_FD`]; the dynamic loader
//! opens it as `/proc/self/fd/102` before QEMU runs.

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::OnceLock;

/// The library, as `build.rs` made it.
static LIBRARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/readonly_memory.so"));

/// The environment variable naming the one file the library opens read-only.
pub const READONLY_MEMORY_VAR: &str = "LIZARD_READONLY_MEMORY";

/// The memfd holding the library, made on first use and kept for the process's life.
fn memfd() -> std::io::Result<RawFd> {
    static MEMFD: OnceLock<OwnedFd> = OnceLock::new();
    if let Some(fd) = MEMFD.get() {
        return Ok(fd.as_raw_fd());
    }
    let flags = MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING;
    let fd = memfd_create(c"lizard-readonly-memory", flags)?;
    let mut file = std::fs::File::from(fd);
    file.write_all(LIBRARY)?;
    let seals = SealFlag::F_SEAL_WRITE | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_SEAL;
    fcntl(file.as_raw_fd(), FcntlArg::F_ADD_SEALS(seals))?;
    // Another thread may have made one meanwhile: theirs is kept, this one closed.
    Ok(MEMFD.get_or_init(|| file.into()).as_raw_fd())
}

/// What a VMM that maps `memory` copy-on-write needs: the descriptor to inherit at
/// [`super::child::PRELOAD_FD`] and the environment that loads the library for `memory`
/// (as QEMU's command line names it).
pub fn for_memory(memory: &Path) -> std::io::Result<(RawFd, Vec<(String, String)>)> {
    let fd = memfd()?;
    let env = vec![
        ("LD_PRELOAD".to_string(), format!("/proc/self/fd/{}", super::child::PRELOAD_FD)),
        (READONLY_MEMORY_VAR.to_string(), memory.to_string_lossy().into_owned()),
    ];
    Ok((fd, env))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// Opens each path read-write and prints the access mode of the descriptor it got.
    const PROBE: &str = "import fcntl, os, sys\n\
        print(' '.join(str(fcntl.fcntl(os.open(p, os.O_RDWR), fcntl.F_GETFL) & 3) for p in sys.argv[1:]))";

    #[test]
    fn only_the_named_file_is_opened_read_only() {
        let dir = tempfile::tempdir().unwrap();
        let (memory, other) = (dir.path().join("memory"), dir.path().join("other"));
        std::fs::write(&memory, b"template").unwrap();
        std::fs::write(&other, b"disk").unwrap();
        let (fd, env) = for_memory(&memory).unwrap();
        let mut probe = std::process::Command::new("python3");
        probe.args(["-c", PROBE]).arg(&memory).arg(&other).envs(env);
        // SAFETY: dup2 and nothing else between fork and exec.
        unsafe {
            probe.pre_exec(move || {
                nix::unistd::dup2(fd, super::super::child::PRELOAD_FD)?;
                Ok(())
            });
        }
        let out = probe.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        // O_RDONLY (0) for the memory file, O_RDWR (2) as asked for the other.
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0 2");
    }

    #[test]
    fn the_library_cannot_be_changed_once_sealed() {
        let fd = memfd().unwrap();
        let seals = fcntl(fd, FcntlArg::F_GET_SEALS).unwrap();
        let all = SealFlag::F_SEAL_WRITE | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_SEAL;
        assert_eq!(SealFlag::from_bits_truncate(seals), all);
        let mut reopened = std::fs::OpenOptions::new().write(true).open(format!("/proc/self/fd/{fd}")).unwrap();
        let refused = reopened.write_all(b"\x7fELF").unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc::EPERM), "{refused}");
    }
}
