//! The shared object that lets QEMU 7.2 map a template's memory from a file it may only
//! read (`preload/readonly_memory.rs`, built by `build.rs`): QEMU opens even a private
//! mapping's file read-write, so without it every VMM would need write access to the
//! memory every other clone starts from. A restore's VMM also maps its memory delta over
//! that memory through it ([`crate::delta`]), from a descriptor it can only read.
//!
//! The node holds the library in a sealed memfd (no file on the host to plant or swap) and
//! each confined clone inherits it at [`PRELOAD_FD`]; the dynamic loader
//! opens it as `/proc/self/fd/102` before QEMU runs.

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::OnceLock;

/// The library, as `build.rs` made it.
static LIBRARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/readonly_memory.so"));

/// The descriptor the library is inherited at, which the dynamic loader opens as
/// `/proc/self/fd/102`.
pub const PRELOAD_FD: RawFd = 102;
/// The descriptor of the memory delta a restore's VMM maps over its base, read-only
/// ([`crate::delta`]); the library closes it once mapped.
pub const DELTA_FD: RawFd = 103;

/// The environment variable naming the one file the library opens read-only.
pub const READONLY_MEMORY_VAR: &str = "LIZARD_READONLY_MEMORY";
/// The environment variable naming the descriptor of the delta the library maps over
/// that file's mapping.
pub const MEMORY_DELTA_FD_VAR: &str = "LIZARD_MEMORY_DELTA_FD";

/// What a VMM that maps a shared memory file is given: the library's descriptor, to be
/// inherited at [`PRELOAD_FD`], maybe a delta's at
/// [`DELTA_FD`], and the environment that loads the library for them.
#[derive(Debug, Clone)]
pub struct Preload {
    pub library_fd: RawFd,
    pub delta_fd: Option<RawFd>,
    pub env: Vec<(String, String)>,
}

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

/// What a VMM that maps `memory` (as QEMU's command line names it) copy-on-write needs,
/// and with `delta` (an open delta file, read-only) maps over it.
pub fn for_memory(memory: &Path, delta: Option<RawFd>) -> std::io::Result<Preload> {
    let library_fd = memfd()?;
    let mut env = vec![
        ("LD_PRELOAD".to_string(), format!("/proc/self/fd/{}", PRELOAD_FD)),
        (READONLY_MEMORY_VAR.to_string(), memory.to_string_lossy().into_owned()),
    ];
    if delta.is_some() {
        env.push((MEMORY_DELTA_FD_VAR.to_string(), DELTA_FD.to_string()));
    }
    Ok(Preload { library_fd, delta_fd: delta, env })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// Opens each path read-write and prints the access mode of the descriptor it got.
    const PROBE: &str = "import fcntl, os, sys\n\
        print(' '.join(str(fcntl.fcntl(os.open(p, os.O_RDWR), fcntl.F_GETFL) & 3) for p in sys.argv[1:]))";

    /// Maps argv[1] private, `argv[2]` bytes, as QEMU maps guest memory; prints the first
    /// byte of each page, how many mappings of a file named `delta` it has, and whether
    /// descriptor 103 (the delta's) is still open.
    const MAP_PROBE: &str = "import mmap, os, sys\n\
        fd = os.open(sys.argv[1], os.O_RDWR)\n\
        m = mmap.mmap(fd, int(sys.argv[2]), flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)\n\
        print(' '.join(str(m[i]) for i in range(0, len(m), 4096)))\n\
        print(sum(1 for l in open('/proc/self/maps') if l.rstrip().endswith('/delta')))\n\
        try:\n    os.fstat(103); print('open')\n\
        except OSError:\n    print('closed')";

    /// Runs python3 with `script` and `args`, the library loaded for `memory` (and `delta`).
    fn probe(script: &str, args: &[&std::ffi::OsStr], memory: &Path, delta: Option<&std::fs::File>) -> String {
        use std::os::fd::AsRawFd;
        let preload = for_memory(memory, delta.map(AsRawFd::as_raw_fd)).unwrap();
        let mut probe = std::process::Command::new("python3");
        probe.args(["-c", script]).args(args).envs(preload.env);
        let (library, delta) = (preload.library_fd, preload.delta_fd);
        // SAFETY: dup2 and nothing else between fork and exec.
        unsafe {
            probe.pre_exec(move || {
                nix::unistd::dup2(library, super::PRELOAD_FD)?;
                if let Some(delta) = delta {
                    nix::unistd::dup2(delta, super::DELTA_FD)?;
                }
                Ok(())
            });
        }
        let out = probe.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    #[test]
    fn only_the_named_file_is_opened_read_only() {
        let dir = tempfile::tempdir().unwrap();
        let (memory, other) = (dir.path().join("memory"), dir.path().join("other"));
        std::fs::write(&memory, b"template").unwrap();
        std::fs::write(&other, b"disk").unwrap();
        let out = probe(PROBE, &[memory.as_os_str(), other.as_os_str()], &memory, None);
        // O_RDONLY (0) for the memory file, O_RDWR (2) as asked for the other.
        assert_eq!(out.trim(), "0 2");
    }

    /// A memory file of `pages` pages whose bytes are all 1, and a delta over it (made from
    /// a buffer of this process whose every page `p` is filled with `p % 200 + 2`) of
    /// `delta_pages`.
    fn memory_and_delta(dir: &Path, pages: usize, delta_pages: &[u64]) -> (std::path::PathBuf, std::fs::File) {
        let memory = dir.join("memory");
        std::fs::write(&memory, vec![1u8; pages * 4096]).unwrap();
        let src: Vec<u8> = (0..pages * 4096).map(|i| u8::try_from(i / 4096 % 200 + 2).unwrap()).collect();
        let mapping = crate::delta::Mapping { start: src.as_ptr() as u64, len: src.len() as u64 };
        let delta = dir.join("delta");
        crate::delta::save(std::process::id(), mapping, delta_pages, &delta).unwrap();
        (memory, std::fs::File::open(&delta).unwrap())
    }

    /// The first byte of each page as [`MAP_PROBE`] should see it.
    fn expected(pages: usize, mapped: &[u64]) -> String {
        let firsts: Vec<String> = (0..pages as u64)
            .map(|p| if mapped.contains(&p) { (p % 200 + 2).to_string() } else { "1".to_string() })
            .collect();
        firsts.join(" ")
    }

    #[test]
    fn a_delta_is_mapped_over_the_memory_and_its_descriptor_closed() {
        let dir = tempfile::tempdir().unwrap();
        let delta_pages = [0, 1, 2, 9, 15];
        let (memory, delta) = memory_and_delta(dir.path(), 16, &delta_pages);
        let len = std::ffi::OsString::from((16 * 4096).to_string());
        let out = probe(MAP_PROBE, &[memory.as_os_str(), &len], &memory, Some(&delta));
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], expected(16, &delta_pages), "the pages seen are not base + delta");
        assert_eq!(lines[1], "3", "three runs of pages are mapped from the delta");
        assert_eq!(lines[2], "closed", "the delta's descriptor was left open");

        // Without a delta: the base alone, nothing mapped.
        let out = probe(MAP_PROBE, &[memory.as_os_str(), &len], &memory, None);
        assert_eq!(out.lines().next(), Some(expected(16, &[]).as_str()));
    }

    #[test]
    fn a_delta_that_does_not_fit_is_not_mapped_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let (memory, delta) = memory_and_delta(dir.path(), 16, &[3, 4]);
        // A memory of another size than the delta's: nothing of it mapped, QEMU unharmed.
        let len = std::ffi::OsString::from((8 * 4096).to_string());
        let out = probe(MAP_PROBE, &[memory.as_os_str(), &len], &memory, Some(&delta));
        assert_eq!(out.lines().nth(1), Some("0"), "{out}");
        // An index out of order (its checksum is the node's to check): nothing mapped.
        let path = dir.path().join("delta");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[32..40].copy_from_slice(&5u64.to_le_bytes());
        std::fs::write(&path, bytes).unwrap();
        let delta = std::fs::File::open(&path).unwrap();
        let len = std::ffi::OsString::from((16 * 4096).to_string());
        let out = probe(MAP_PROBE, &[memory.as_os_str(), &len], &memory, Some(&delta));
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!((lines[0], lines[1]), (expected(16, &[]).as_str(), "0"), "{out}");
    }

    #[test]
    fn only_the_longest_runs_are_mapped_when_there_are_too_many() {
        // 16384 runs of one page and 3 of two: only the runs of two fit the limit.
        let singles = 16384u64;
        let mut delta_pages: Vec<u64> = (0..singles).map(|i| 2 * i).collect();
        let doubles = [2 * singles + 10, 2 * singles + 20, 2 * singles + 30];
        for d in doubles {
            delta_pages.extend([d, d + 1]);
        }
        let pages = usize::try_from(2 * singles + 40).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (memory, delta) = memory_and_delta(dir.path(), pages, &delta_pages);
        let len = std::ffi::OsString::from((pages * 4096).to_string());
        let out = probe(MAP_PROBE, &[memory.as_os_str(), &len], &memory, Some(&delta));
        let lines: Vec<&str> = out.lines().collect();
        let mapped: Vec<u64> = doubles.iter().flat_map(|&d| [d, d + 1]).collect();
        assert_eq!(lines[0], expected(pages, &mapped));
        assert_eq!(lines[1], "3");
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
