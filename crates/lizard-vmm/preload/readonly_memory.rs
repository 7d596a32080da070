//! Loaded into every confined QEMU that maps a template's memory copy-on-write
//! (`LD_PRELOAD`, see `jail::preload`): opens the one file named by
//! `LIZARD_READONLY_MEMORY` read-only, whatever access QEMU asks for; and when QEMU maps
//! that file private and `LIZARD_MEMORY_DELTA_FD` names a memory delta (format 2, see
//! `lizard_vmm::delta`), maps the delta's pages over it from that descriptor, copy-on-write,
//! so that a restore copies nothing.
//!
//! QEMU 7.2 opens a `memory-backend-file` read-write even when it maps it private
//! (`share=off`); 8.2 added `readonly=on,rom=off` for exactly this. A private writable
//! mapping of a read-only descriptor is what the kernel allows, so the file can be
//! root's and read-only to every VMM: one that is taken over cannot change what other
//! clones start from. Everything else QEMU opens is passed through unchanged.
//!
//! The delta's index is checked here (every page inside the mapping, strictly increasing,
//! the file as long as its header says) before anything is mapped; the node checks its
//! checksum and every mapped page from outside before the guest runs, and writes the
//! pages not mapped here. So this maps at most [`MAX_RUNS`] runs of adjacent pages (the
//! longest ones; the kernel allows 65530 mappings a process), and on any error maps
//! nothing more and leaves the rest to the node: it never fails QEMU's own mapping.
//!
//! Built by `build.rs` on its own (`no_std`, linked against libc only), not by Cargo:
//! it must be a shared object the node can hand to a process it does not build.

#![no_std]

use core::ffi::{c_char, c_int, c_long, c_uint, c_void, CStr};
use core::sync::atomic::{AtomicI32, Ordering};

const O_ACCMODE: c_int = 0o3;
const O_RDONLY: c_int = 0o0;
const O_CREAT: c_int = 0o100;
const O_EXCL: c_int = 0o200;
const O_TRUNC: c_int = 0o1000;
const AT_FDCWD: c_int = -100;
const SEEK_END: c_int = 2;
const PROT_READ: c_int = 1;
const MAP_PRIVATE: c_int = 0x02;
const MAP_FIXED: c_int = 0x10;
const MAP_NORESERVE: c_int = 0x4000;
const SYS_MMAP: c_long = 9;
const SYS_MUNMAP: c_long = 11;

/// `lizard_vmm::delta`'s format 2: its magic, header length and page size.
const MAGIC: &[u8; 8] = b"LZDELTA2";
const HEADER: usize = 32;
const PAGE: usize = 4096;
/// The most runs of pages mapped from one delta (each splits the base's mapping: two
/// mappings a run at most).
const MAX_RUNS: usize = 16384;

/// The descriptor QEMU opened the shared memory file at, until its mapping is made.
static MEMORY_FD: AtomicI32 = AtomicI32::new(-1);

#[link(name = "c")]
extern "C" {
    fn getenv(name: *const c_char) -> *const c_char;
    fn openat(dirfd: c_int, path: *const c_char, flags: c_int, ...) -> c_int;
    fn syscall(number: c_long, ...) -> c_long;
    fn pread64(fd: c_int, buf: *mut c_void, count: usize, offset: i64) -> isize;
    fn lseek64(fd: c_int, offset: i64, whence: c_int) -> i64;
    fn close(fd: c_int) -> c_int;
}

/// Whether `path` is the shared memory file.
///
/// # Safety
/// `path` is a NUL-terminated string (as `open` requires of its caller).
unsafe fn is_memory(path: *const c_char) -> bool {
    // SAFETY: a static NUL-terminated name; getenv returns NULL or a C string.
    let wanted = unsafe { getenv(c"LIZARD_READONLY_MEMORY".as_ptr()) };
    if path.is_null() || wanted.is_null() {
        return false;
    }
    // SAFETY: both are NUL-terminated (the caller's path, the environment's value).
    unsafe { CStr::from_ptr(path) == CStr::from_ptr(wanted) }
}

/// `open` and its aliases: the shared memory file read-only, and its descriptor noted.
/// The mode is read as a third argument: on the x86-64 and AArch64 Linux calling
/// conventions a variadic integer is passed where a fixed one is.
///
/// # Safety
/// As `open(2)`: `path` is NUL-terminated.
unsafe fn open_at_cwd(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: the caller's path, NUL-terminated.
    if !unsafe { is_memory(path) } {
        // SAFETY: forwarded as the caller gave them.
        return unsafe { openat(AT_FDCWD, path, flags, mode) };
    }
    let read_only = (flags & !(O_ACCMODE | O_CREAT | O_EXCL | O_TRUNC)) | O_RDONLY;
    // SAFETY: as above, the flags narrowed.
    let fd = unsafe { openat(AT_FDCWD, path, read_only, mode) };
    if fd >= 0 {
        MEMORY_FD.store(fd, Ordering::Relaxed);
    }
    fd
}

/// `mmap(2)` itself, past this library.
///
/// # Safety
/// As `mmap(2)`.
unsafe fn raw_mmap(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, offset: i64) -> *mut c_void {
    // SAFETY: the system call's own arguments; on failure it returns -1 (MAP_FAILED) and
    // sets errno, as mmap does.
    unsafe {
        syscall(SYS_MMAP, addr, len, c_long::from(prot), c_long::from(flags), c_long::from(fd), offset) as *mut c_void
    }
}

/// As asked; when it is the shared memory file's private mapping and a delta was handed
/// over, the delta's pages mapped over it (once, for the first such mapping).
///
/// # Safety
/// As `mmap(2)`.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: i64,
) -> *mut c_void {
    // SAFETY: forwarded as the caller gave them.
    let mapped = unsafe { raw_mmap(addr, len, prot, flags, fd, offset) };
    if mapped as isize == -1 || fd < 0 || flags & MAP_PRIVATE == 0 || offset != 0 {
        return mapped;
    }
    if MEMORY_FD.compare_exchange(fd, -1, Ordering::Relaxed, Ordering::Relaxed).is_err() {
        return mapped;
    }
    // SAFETY: a static NUL-terminated name; getenv returns NULL or a C string.
    let var = unsafe { getenv(c"LIZARD_MEMORY_DELTA_FD".as_ptr()) };
    if var.is_null() {
        return mapped;
    }
    // SAFETY: the environment's value, NUL-terminated.
    let Some(delta) = parse_fd(unsafe { CStr::from_ptr(var) }.to_bytes()) else { return mapped };
    let extra = flags & MAP_NORESERVE;
    // SAFETY: `mapped` is the `len`-byte mapping just made, private; the delta is the
    // descriptor the node handed over, only read or mapped.
    unsafe {
        map_delta(mapped.cast(), len, prot, extra, delta);
        close(delta);
    }
    mapped
}

fn parse_fd(digits: &[u8]) -> Option<c_int> {
    if digits.is_empty() || digits.len() > 6 {
        return None;
    }
    digits.iter().try_fold(0, |n: c_int, d| d.is_ascii_digit().then(|| n * 10 + c_int::from(d - b'0')))
}

/// A delta's index, mapped read-only.
struct Index {
    map: *mut c_void,
    map_len: usize,
    count: usize,
}

impl Index {
    /// The `i`th page number (`i < count`).
    ///
    /// # Safety
    /// The mapping is alive and holds the index.
    unsafe fn page(&self, i: usize) -> u64 {
        let mut b = [0u8; 8];
        // SAFETY: in bounds (`HEADER + 8 * count <= map_len`, checked when mapped).
        unsafe { core::ptr::copy_nonoverlapping(self.map.cast::<u8>().add(HEADER + 8 * i), b.as_mut_ptr(), 8) };
        u64::from_le_bytes(b)
    }

    /// Calls `f(first index, first page, length)` for each run of adjacent pages; false
    /// if a page is past `pages` or out of order (after calls for the runs before it).
    ///
    /// # Safety
    /// As [`Index::page`].
    unsafe fn runs(&self, pages: usize, mut f: impl FnMut(usize, usize, usize)) -> bool {
        let mut run: Option<(usize, usize, usize)> = None;
        let mut prev: Option<usize> = None;
        for i in 0..self.count {
            // SAFETY: i < count.
            let Ok(p) = usize::try_from(unsafe { self.page(i) }) else { return false };
            if p >= pages || prev.is_some_and(|q| q >= p) {
                return false;
            }
            run = match run {
                Some((first, start, n)) if prev.is_some_and(|q| q + 1 == p) => Some((first, start, n + 1)),
                Some(done) => {
                    f(done.0, done.1, done.2);
                    Some((i, p, 1))
                }
                None => Some((i, p, 1)),
            };
            prev = Some(p);
        }
        if let Some(done) = run {
            f(done.0, done.1, done.2);
        }
        true
    }
}

/// Map the pages of the delta at descriptor `delta` over `base`, a private mapping of
/// `len` bytes of guest memory: its runs of at least the length that keeps them within
/// [`MAX_RUNS`]. Gives up (mapping nothing more) on anything unexpected.
///
/// # Safety
/// `base` is a private mapping of `len` bytes, `delta` an open descriptor.
unsafe fn map_delta(base: *mut u8, len: usize, prot: c_int, extra: c_int, delta: c_int) {
    let mut header = [0u8; HEADER];
    // SAFETY: reads at most HEADER bytes into a buffer of that size.
    if unsafe { pread64(delta, header.as_mut_ptr().cast(), HEADER, 0) } != HEADER as isize {
        return;
    }
    let field = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&header[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let (memory, count) = (field(8), field(16));
    let pages = len / PAGE;
    let Ok(count) = usize::try_from(count) else { return };
    if &header[..8] != MAGIC || memory != len as u64 || count > pages {
        return;
    }
    let data_at = (HEADER + 8 * count).next_multiple_of(PAGE);
    // SAFETY: a plain query of the descriptor's size.
    let size = unsafe { lseek64(delta, 0, SEEK_END) };
    if size < 0 || size as u64 != (data_at + count * PAGE) as u64 {
        return;
    }
    // SAFETY: a new read-only mapping of the index, unmapped below.
    let map = unsafe { raw_mmap(core::ptr::null_mut(), data_at, PROT_READ, MAP_PRIVATE, delta, 0) };
    if map as isize == -1 {
        return;
    }
    let index = Index { map, map_len: data_at, count };
    // The shortest run mapped: doubled until at most MAX_RUNS runs are that long.
    let mut shortest = 1;
    loop {
        let mut runs = 0;
        // SAFETY: the index mapping is alive.
        if !unsafe { index.runs(pages, |_, _, n| runs += usize::from(n >= shortest)) } {
            shortest = usize::MAX;
            break;
        }
        if runs <= MAX_RUNS {
            break;
        }
        shortest *= 2;
    }
    let mut failed = false;
    // SAFETY: every run lies inside `base` (its pages were checked to be below len /
    // PAGE) and inside the file (its length was checked); the index mapping is alive.
    unsafe {
        index.runs(pages, |first, page, n| {
            if failed || n < shortest {
                return;
            }
            let at = base.add(page * PAGE).cast();
            let from = (data_at + first * PAGE) as i64;
            let flags = MAP_PRIVATE | MAP_FIXED | extra;
            failed = raw_mmap(at, n * PAGE, prot, flags, delta, from) as isize == -1;
        });
        syscall(SYS_MUNMAP, index.map, index.map_len);
    }
}

/// [`mmap`] under its large-file name (the same call on 64-bit).
///
/// # Safety
/// As `mmap(2)`.
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: i64,
) -> *mut c_void {
    // SAFETY: as the caller's.
    unsafe { mmap(addr, len, prot, flags, fd, offset) }
}

/// # Safety
/// As `open(2)`.
#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: as the caller's.
    unsafe { open_at_cwd(path, flags, mode) }
}

/// # Safety
/// As `open(2)`.
#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: as the caller's.
    unsafe { open_at_cwd(path, flags, mode) }
}

/// What `_FORTIFY_SOURCE` turns an `open` without a mode into (QEMU's memory file).
///
/// # Safety
/// As `open(2)`.
#[no_mangle]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: as the caller's; no mode, as the caller passed none.
    unsafe { open_at_cwd(path, flags, 0) }
}

/// # Safety
/// As `open(2)`.
#[no_mangle]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: as the caller's.
    unsafe { open_at_cwd(path, flags, 0) }
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    loop {}
}
