//! Loaded into every confined QEMU that maps a template's memory copy-on-write
//! (`LD_PRELOAD`, see `jail::preload`): opens the one file named by
//! `LIZARD_READONLY_MEMORY` read-only, whatever access QEMU asks for.
//!
//! QEMU 7.2 opens a `memory-backend-file` read-write even when it maps it private
//! (`share=off`); 8.2 added `readonly=on,rom=off` for exactly this. A private writable
//! mapping of a read-only descriptor is what the kernel allows, so the file can be
//! root's and read-only to every VMM: one that is taken over cannot change what other
//! clones start from. Everything else QEMU opens is passed through unchanged.
//!
//! Built by `build.rs` on its own (`no_std`, linked against libc only), not by Cargo:
//! it must be a shared object the node can hand to a process it does not build.

#![no_std]

use core::ffi::{c_char, c_int, c_uint, CStr};

const O_ACCMODE: c_int = 0o3;
const O_RDONLY: c_int = 0o0;
const O_CREAT: c_int = 0o100;
const O_EXCL: c_int = 0o200;
const O_TRUNC: c_int = 0o1000;
const AT_FDCWD: c_int = -100;

#[link(name = "c")]
extern "C" {
    fn getenv(name: *const c_char) -> *const c_char;
    fn openat(dirfd: c_int, path: *const c_char, flags: c_int, ...) -> c_int;
}

/// `flags` for opening `path`: read-only when it is the shared memory file.
///
/// # Safety
/// `path` is a NUL-terminated string (as `open` requires of its caller).
unsafe fn flags_for(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: a static NUL-terminated name; getenv returns NULL or a C string.
    let wanted = unsafe { getenv(c"LIZARD_READONLY_MEMORY".as_ptr()) };
    if path.is_null() || wanted.is_null() {
        return flags;
    }
    // SAFETY: both are NUL-terminated (the caller's path, the environment's value).
    if unsafe { CStr::from_ptr(path) != CStr::from_ptr(wanted) } {
        return flags;
    }
    (flags & !(O_ACCMODE | O_CREAT | O_EXCL | O_TRUNC)) | O_RDONLY
}

/// `open` and its aliases. The mode is read as a third argument: on the x86-64 and
/// AArch64 Linux calling conventions a variadic integer is passed where a fixed one is.
///
/// # Safety
/// As `open(2)`: `path` is NUL-terminated.
unsafe fn open_at_cwd(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: forwarded as the caller gave them, the flags maybe narrowed.
    unsafe { openat(AT_FDCWD, path, flags_for(path, flags), mode) }
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
