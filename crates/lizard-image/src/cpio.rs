//! A minimal writer for the `newc` cpio format the kernel unpacks as an initramfs.
//!
//! Each entry is a 110-byte ASCII header (`070701` then 13 fields of 8 hex digits), the
//! NUL-terminated path, padding to a multiple of 4, the file data, padding to a multiple
//! of 4. The archive ends with an entry named `TRAILER!!!`. Owner, group and mtime are
//! always 0 so that equal inputs give byte-identical archives.

use std::io::{self, Write};

const MAGIC: &[u8; 6] = b"070701";
const TRAILER: &str = "TRAILER!!!";

const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;
const S_IFCHR: u32 = 0o020_000;

/// Writes a `newc` archive entry by entry.
pub struct CpioWriter<W: Write> {
    out: W,
    written: u64,
    next_ino: u32,
}

/// The header fields that differ between entries.
struct Header {
    mode: u32,
    nlink: u32,
    size: u32,
    rdev_major: u32,
    rdev_minor: u32,
}

impl<W: Write> CpioWriter<W> {
    pub fn new(out: W) -> Self {
        CpioWriter { out, written: 0, next_ino: 1 }
    }

    /// Adds a directory; `path` is relative to the archive root (no leading `/`).
    pub fn dir(&mut self, path: &str, perm: u32) -> io::Result<()> {
        self.entry(path, Header { mode: S_IFDIR | perm, nlink: 2, size: 0, rdev_major: 0, rdev_minor: 0 }, &[])
    }

    /// Adds a regular file.
    pub fn file(&mut self, path: &str, perm: u32, data: &[u8]) -> io::Result<()> {
        let size = u32::try_from(data.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{path}: larger than 4 GiB")))?;
        self.entry(path, Header { mode: S_IFREG | perm, nlink: 1, size, rdev_major: 0, rdev_minor: 0 }, data)
    }

    /// Adds a character device node.
    pub fn char_device(&mut self, path: &str, perm: u32, major: u32, minor: u32) -> io::Result<()> {
        self.entry(path, Header { mode: S_IFCHR | perm, nlink: 1, size: 0, rdev_major: major, rdev_minor: minor }, &[])
    }

    /// Writes the trailer and returns the underlying writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.next_ino = 0;
        self.entry(TRAILER, Header { mode: 0, nlink: 1, size: 0, rdev_major: 0, rdev_minor: 0 }, &[])?;
        self.out.flush()?;
        Ok(self.out)
    }

    fn entry(&mut self, path: &str, h: Header, data: &[u8]) -> io::Result<()> {
        let path = path.trim_start_matches('/');
        if path.is_empty() || path.contains('\0') {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bad cpio path {path:?}")));
        }
        let name_size = u32::try_from(path.len() + 1)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("cpio path too long: {path:?}")))?;
        let ino = self.next_ino;
        self.next_ino += 1;
        let fields = [
            ino,
            h.mode,
            0, // uid
            0, // gid
            h.nlink,
            0, // mtime
            h.size,
            0, // dev major
            0, // dev minor
            h.rdev_major,
            h.rdev_minor,
            name_size, // including the NUL
            0,         // checksum (unused by newc)
        ];
        let mut header = Vec::with_capacity(110 + path.len() + 4);
        header.extend_from_slice(MAGIC);
        for field in fields {
            header.extend_from_slice(format!("{field:08X}").as_bytes());
        }
        header.extend_from_slice(path.as_bytes());
        header.push(0);
        self.write(&header)?;
        self.pad()?;
        self.write(data)?;
        self.pad()
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> io::Result<()> {
        let pad = (4 - (self.written % 4) as usize) % 4;
        self.write(&[0u8; 3][..pad])
    }
}

/// One entry read back from a `newc` archive (used by tests and for inspection).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpioEntry {
    pub path: String,
    pub mode: u32,
    pub rdev: (u32, u32),
    pub data: Vec<u8>,
}

/// Parses a `newc` archive up to its trailer.
pub fn read_newc(mut bytes: &[u8]) -> io::Result<Vec<CpioEntry>> {
    let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_owned());
    let align = |n: usize| (n + 3) & !3;
    let mut entries = Vec::new();
    loop {
        if bytes.len() < 110 || &bytes[..6] != MAGIC {
            return Err(bad("missing newc header"));
        }
        let field = |i: usize| -> io::Result<u32> {
            let s = std::str::from_utf8(&bytes[6 + i * 8..14 + i * 8]).map_err(|_| bad("non-ASCII header"))?;
            u32::from_str_radix(s, 16).map_err(|_| bad("non-hex header field"))
        };
        let (mode, size, rmaj, rmin, namesize) =
            (field(1)?, field(6)? as usize, field(9)?, field(10)?, field(11)? as usize);
        let name_end = 110 + namesize;
        let data_start = align(name_end);
        let data_end = data_start + size;
        if namesize == 0 || bytes.len() < data_end {
            return Err(bad("truncated entry"));
        }
        let path = std::str::from_utf8(&bytes[110..name_end - 1]).map_err(|_| bad("non-UTF-8 name"))?.to_owned();
        if path == TRAILER {
            return Ok(entries);
        }
        entries.push(CpioEntry { path, mode, rdev: (rmaj, rmin), data: bytes[data_start..data_end].to_vec() });
        bytes = &bytes[align(data_end).min(bytes.len())..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn sample_archive() -> Vec<u8> {
        let mut w = CpioWriter::new(Vec::new());
        w.dir("dev", 0o755).unwrap();
        w.char_device("dev/console", 0o600, 5, 1).unwrap();
        w.file("/init", 0o755, b"#!/bin/sh\necho hi\n").unwrap();
        w.dir("etc", 0o755).unwrap();
        w.file("etc/empty", 0o644, b"").unwrap();
        w.file("etc/odd-length-name.txt", 0o644, b"abcde").unwrap();
        w.finish().unwrap()
    }

    #[test]
    fn round_trips_through_own_reader() {
        let bytes = sample_archive();
        assert_eq!(bytes.len() % 4, 0);
        let entries = read_newc(&bytes).unwrap();
        let paths: Vec<_> = entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["dev", "dev/console", "init", "etc", "etc/empty", "etc/odd-length-name.txt"]);
        assert_eq!(entries[0].mode, 0o040_755);
        assert_eq!((entries[1].mode, entries[1].rdev), (0o020_600, (5, 1)));
        assert_eq!(entries[2].mode, 0o100_755);
        assert_eq!(entries[2].data, b"#!/bin/sh\necho hi\n");
        assert_eq!(entries[5].data, b"abcde");
    }

    #[test]
    fn is_reproducible() {
        assert_eq!(sample_archive(), sample_archive());
    }

    #[test]
    fn system_cpio_lists_and_extracts_it() {
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path().join("a.cpio");
        std::fs::write(&archive, sample_archive()).unwrap();
        // scripts/deps.sh installs cpio: its absence is a failure, not a reason to skip.
        let out = Command::new("cpio")
            .arg("-itv")
            .arg("-F")
            .arg(&archive)
            .output()
            .unwrap_or_else(|e| panic!("cannot run cpio ({e}); install it (scripts/deps.sh does)"));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let listing = String::from_utf8(out.stdout).unwrap();
        let names: Vec<_> = listing.lines().map(|l| l.rsplit(' ').next().unwrap()).collect();
        assert_eq!(names, ["dev", "dev/console", "init", "etc", "etc/empty", "etc/odd-length-name.txt"]);
        assert!(listing.lines().nth(2).unwrap().starts_with("-rwxr-xr-x"), "{listing}");

        // Extract the regular files (no device nodes) and compare contents.
        let dest = dir.path().join("x");
        std::fs::create_dir(&dest).unwrap();
        let status = Command::new("cpio")
            .args(["-id", "--quiet", "-F"])
            .arg(&archive)
            .args(["init", "etc/*"])
            .current_dir(&dest)
            .status()
            .unwrap();
        assert!(status.success());
        assert_eq!(std::fs::read(dest.join("init")).unwrap(), b"#!/bin/sh\necho hi\n");
        assert_eq!(std::fs::read(dest.join("etc/odd-length-name.txt")).unwrap(), b"abcde");
    }
}
