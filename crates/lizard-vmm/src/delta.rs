//! Memory deltas: the guest pages a copy-on-write clone changed, saved over its base file.
//!
//! A clone maps its base memory file private (`share=off`), so every page its guest (or
//! its VMM) wrote is an anonymous page of that mapping, and every other page is still the
//! file's. The kernel's pagemap tells which is which; the changed pages are read out of
//! the stopped VMM with `process_vm_readv` and written packed, after an index of their
//! page numbers. Restoring maps the base again and writes those pages back with
//! `process_vm_writev` before the guest runs. A paused clone's files on disk are then
//! proportional to what it changed, not to its memory size.
//!
//! File layout (little-endian): [`MAGIC`], memory size in bytes (u64), page count (u64),
//! CRC-32 (u32) over the size, the count, the index and the page data, 4 zero bytes; the
//! index (one u64 page number per page, strictly increasing); the pages (4 KiB each, in
//! index order). A damaged, truncated or foreign file fails [`apply`] with a
//! [`DeltaError`]; it never yields a guest with wrong memory (the caller kills the VMM that
//! a failed apply wrote into before it ever runs).

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Page size of the host, which pagemap entries count in (x86-64: 4 KiB).
pub const PAGE_SIZE: u64 = 4096;
/// The same, as a length in memory.
const PAGE: usize = 4096;
/// The first bytes of every delta file (format 1).
pub const MAGIC: &[u8; 8] = b"LZDELTA1";
/// Bytes before the index.
const HEADER_LEN: u64 = 32;
/// The same, as an offset in memory.
const HEADER: usize = 32;
/// Pages moved per `process_vm_readv`/`process_vm_writev` call (1 MiB; well below the
/// kernel's IOV_MAX of 1024 regions, even when no two pages are adjacent).
const BATCH_PAGES: usize = 256;

/// pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst).
const PM_PRESENT: u64 = 1 << 63;
const PM_SWAPPED: u64 = 1 << 62;
const PM_FILE_OR_SHARED: u64 = 1 << 61;

/// Why a delta could not be made or applied.
#[derive(Debug, thiserror::Error)]
pub enum DeltaError {
    /// A file or /proc read or write failed.
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    /// The VMM has no mapping of that file of that size (not a copy-on-write clone of it).
    #[error("the VMM maps no {len}-byte region of {}", path.display())]
    NoMapping { path: PathBuf, len: u64 },
    /// Reading or writing the VMM's memory moved fewer bytes than asked.
    #[error("{what} moved {moved} of {asked} bytes")]
    Short { what: &'static str, moved: usize, asked: usize },
    /// Reading or writing the VMM's memory failed.
    #[error("{what}: {source}")]
    ProcessMemory { what: &'static str, source: nix::Error },
    /// The file does not start with [`MAGIC`].
    #[error("not a memory delta")]
    BadMagic,
    /// The delta is of a memory of another size.
    #[error("the delta is of {found} bytes of memory, the VM has {expected}")]
    SizeMismatch { expected: u64, found: u64 },
    /// The file is shorter or longer than its header says.
    #[error("the delta file is {found} bytes, its header says {expected}")]
    Length { expected: u64, found: u64 },
    /// The index names a page outside the memory or out of order.
    #[error("bad page index entry {0}")]
    BadIndex(u64),
    /// The contents do not match their checksum.
    #[error("the delta's checksum does not match")]
    Checksum,
}

type Result<T, E = DeltaError> = std::result::Result<T, E>;

fn io(context: impl Into<String>, source: std::io::Error) -> DeltaError {
    DeltaError::Io { context: context.into(), source }
}

/// Where a VMM maps a file: its start address in the VMM process and its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub len: u64,
}

/// What [`save`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaStats {
    /// Pages in the delta.
    pub pages: u64,
    /// Size of the delta file in bytes.
    pub bytes: u64,
}

/// The mapping of `path`, `len` bytes long, in process `pid` (from `/proc/<pid>/maps`).
pub fn find_mapping(pid: u32, path: &Path, len: u64) -> Result<Mapping> {
    let maps_path = format!("/proc/{pid}/maps");
    let maps = std::fs::read_to_string(&maps_path).map_err(|e| io(format!("read {maps_path}"), e))?;
    parse_mapping(&maps, path, len).ok_or_else(|| DeltaError::NoMapping { path: path.to_path_buf(), len })
}

fn parse_mapping(maps: &str, path: &Path, len: u64) -> Option<Mapping> {
    let wanted = path.to_str()?;
    maps.lines().find_map(|line| {
        // start-end perms offset dev inode path (the path may hold spaces: the rest).
        let mut fields = line.splitn(6, ' ');
        let range = fields.next()?;
        let mapped = fields.nth(4)?.trim_start();
        if mapped != wanted {
            return None;
        }
        let (start, end) = range.split_once('-')?;
        let start = u64::from_str_radix(start, 16).ok()?;
        let end = u64::from_str_radix(end, 16).ok()?;
        (end.checked_sub(start)? == len).then_some(Mapping { start, len })
    })
}

/// Page numbers (from the mapping's start) of the pages of `mapping` that are no longer
/// the file's: anonymous copies, present or swapped out.
pub fn dirty_pages(pid: u32, mapping: Mapping) -> Result<Vec<u64>> {
    let path = format!("/proc/{pid}/pagemap");
    let file = File::open(&path).map_err(|e| io(format!("open {path}"), e))?;
    let pages = mapping.len / PAGE_SIZE;
    let mut entries = vec![0u8; to_usize(pages * 8)?];
    file.read_exact_at(&mut entries, mapping.start / PAGE_SIZE * 8).map_err(|e| io(format!("read {path}"), e))?;
    Ok(dirty_in(&entries))
}

/// The page numbers of the anonymous pages among pagemap `entries`.
fn dirty_in(entries: &[u8]) -> Vec<u64> {
    (0u64..)
        .zip(entries.chunks_exact(8))
        .filter(|(_, e)| {
            let e = u64::from_le_bytes((*e).try_into().expect("chunks of 8"));
            let present_anon = e & PM_PRESENT != 0 && e & PM_FILE_OR_SHARED == 0;
            // A swapped-out page of a private file mapping is an anonymous one.
            present_anon || e & PM_SWAPPED != 0
        })
        .map(|(i, _)| i)
        .collect()
}

fn to_usize(n: u64) -> Result<usize> {
    usize::try_from(n).map_err(|_| DeltaError::BadIndex(n))
}

/// The remote regions of the `pages` (sorted) in `mapping`: adjacent pages in one region.
fn regions(mapping: Mapping, pages: &[u64]) -> Result<Vec<nix::sys::uio::RemoteIoVec>> {
    let mut out: Vec<nix::sys::uio::RemoteIoVec> = Vec::new();
    for &p in pages {
        let base = to_usize(mapping.start + p * PAGE_SIZE)?;
        match out.last_mut() {
            Some(last) if last.base + last.len == base => last.len += PAGE,
            _ => out.push(nix::sys::uio::RemoteIoVec { base, len: PAGE }),
        }
    }
    Ok(out)
}

/// Write the `pages` of `mapping` in process `pid` (stopped: nothing may change them
/// meanwhile) to a new delta file `out`.
pub fn save(pid: u32, mapping: Mapping, pages: &[u64], out: &Path) -> Result<DeltaStats> {
    let remote_pid = nix::unistd::Pid::from_raw(i32::try_from(pid).map_err(|_| DeltaError::BadIndex(pid.into()))?);
    let count = u64::try_from(pages.len()).map_err(|_| DeltaError::BadIndex(u64::MAX))?;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&mapping.len.to_le_bytes());
    crc.update(&count.to_le_bytes());
    let file = File::create(out).map_err(|e| io(format!("create {}", out.display()), e))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let werr = |e| io(format!("write {}", out.display()), e);
    w.write_all(&[0u8; 32]).map_err(werr)?;
    for p in pages {
        let b = p.to_le_bytes();
        crc.update(&b);
        w.write_all(&b).map_err(werr)?;
    }
    let mut buf = vec![0u8; BATCH_PAGES * PAGE];
    for chunk in pages.chunks(BATCH_PAGES) {
        let remote = regions(mapping, chunk)?;
        let data = &mut buf[..chunk.len() * PAGE];
        let moved = nix::sys::uio::process_vm_readv(remote_pid, &mut [std::io::IoSliceMut::new(data)], &remote)
            .map_err(|source| DeltaError::ProcessMemory { what: "process_vm_readv", source })?;
        if moved != data.len() {
            return Err(DeltaError::Short { what: "process_vm_readv", moved, asked: data.len() });
        }
        crc.update(data);
        w.write_all(data).map_err(werr)?;
    }
    let mut file = w.into_inner().map_err(|e| werr(e.into_error()))?;
    file.seek(SeekFrom::Start(0)).map_err(werr)?;
    file.write_all(&header(mapping.len, count, crc.finalize())).map_err(werr)?;
    Ok(DeltaStats { pages: count, bytes: HEADER_LEN + count * (8 + PAGE_SIZE) })
}

fn header(memory: u64, count: u64, crc: u32) -> [u8; 32] {
    let mut h = [0u8; 32];
    h[..8].copy_from_slice(MAGIC);
    h[8..16].copy_from_slice(&memory.to_le_bytes());
    h[16..24].copy_from_slice(&count.to_le_bytes());
    h[24..28].copy_from_slice(&crc.to_le_bytes());
    h
}

/// A delta file mapped read-only and checked: nothing of it reaches a VMM unless all of
/// it is intact.
#[derive(Debug)]
pub struct LoadedDelta {
    map: memmap2::Mmap,
    pages: Vec<u64>,
}

impl LoadedDelta {
    /// Pages in the delta.
    pub fn pages(&self) -> usize {
        self.pages.len()
    }

    /// The page data, in index order.
    fn data(&self) -> &[u8] {
        // In bounds: the file's length was checked against its page count.
        &self.map[HEADER + self.pages.len() * 8..]
    }

    /// Each batch of page numbers with their data.
    pub fn batches(&self) -> impl Iterator<Item = (&[u64], &[u8])> {
        self.pages.chunks(BATCH_PAGES).zip(self.data().chunks(BATCH_PAGES * PAGE))
    }
}

/// Map and check the delta file `delta` of a `memory`-byte memory: its header, its index
/// (in range, strictly increasing) and its checksum.
pub fn load(delta: &Path, memory: u64) -> Result<LoadedDelta> {
    let rerr = |e| io(format!("read {}", delta.display()), e);
    let file = File::open(delta).map_err(|e| io(format!("open {}", delta.display()), e))?;
    let len = file.metadata().map_err(rerr)?.len();
    if len < HEADER_LEN {
        return Err(DeltaError::Length { expected: HEADER_LEN, found: len });
    }
    // SAFETY: the file is a delta in a paused sandbox's directory (or a fork's save),
    // written once at save time; nothing writes or truncates it while a restore reads
    // it (the sandbox's transition lock is held, and no VMM of it runs).
    let map = unsafe { memmap2::MmapOptions::new().populate().map(&file) }.map_err(rerr)?;
    let field = |r: std::ops::Range<usize>| u64::from_le_bytes(map[r].try_into().expect("8 bytes"));
    if &map[..8] != MAGIC {
        return Err(DeltaError::BadMagic);
    }
    let (found, count) = (field(8..16), field(16..24));
    let want_crc = u32::from_le_bytes(map[24..28].try_into().expect("4 bytes"));
    if found != memory {
        return Err(DeltaError::SizeMismatch { expected: memory, found });
    }
    let expected = count
        .checked_mul(8 + PAGE_SIZE)
        .and_then(|b| b.checked_add(HEADER_LEN))
        .ok_or(DeltaError::Length { expected: u64::MAX, found: len })?;
    if expected != len {
        return Err(DeltaError::Length { expected, found: len });
    }
    let mut crc = crc32fast::Hasher::new();
    crc.update(&map[8..24]);
    crc.update(&map[32..]);
    if crc.finalize() != want_crc {
        return Err(DeltaError::Checksum);
    }
    let index = &map[32..32 + to_usize(count * 8)?];
    let pages: Vec<u64> = index.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))).collect();
    let total = memory / PAGE_SIZE;
    let mut prev = None;
    for &p in &pages {
        if p >= total || prev.is_some_and(|q| q >= p) {
            return Err(DeltaError::BadIndex(p));
        }
        prev = Some(p);
    }
    Ok(LoadedDelta { map, pages })
}

/// Threads that write one delta at most: the time goes into the VMM's copy-on-write
/// faults (a page allocated and copied from the base file's cache each), which run side
/// by side on separate CPUs.
const MAX_WRITERS: usize = 4;

/// Write the pages of `delta` into `mapping` of process `pid`, a VMM that has not run its
/// guest yet, on up to one thread per CPU. On an error some pages may have been written:
/// the VMM must not run the guest then.
pub fn write_into(pid: u32, mapping: Mapping, delta: &LoadedDelta) -> Result<()> {
    let remote_pid = nix::unistd::Pid::from_raw(i32::try_from(pid).map_err(|_| DeltaError::BadIndex(pid.into()))?);
    let batches: Vec<(&[u64], &[u8])> = delta.batches().collect();
    let writers = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, MAX_WRITERS);
    let share = batches.len().div_ceil(writers).max(1);
    std::thread::scope(|scope| {
        let parts: Vec<_> =
            batches.chunks(share).map(|part| scope.spawn(move || write_batches(remote_pid, mapping, part))).collect();
        parts.into_iter().try_for_each(|part| part.join().expect("a delta writer panicked"))
    })
}

/// One writer's share of [`write_into`].
fn write_batches(remote_pid: nix::unistd::Pid, mapping: Mapping, batches: &[(&[u64], &[u8])]) -> Result<()> {
    for &(chunk, data) in batches {
        let remote = regions(mapping, chunk)?;
        let moved = nix::sys::uio::process_vm_writev(remote_pid, &[std::io::IoSlice::new(data)], &remote)
            .map_err(|source| DeltaError::ProcessMemory { what: "process_vm_writev", source })?;
        if moved != data.len() {
            return Err(DeltaError::Short { what: "process_vm_writev", moved, asked: data.len() });
        }
    }
    Ok(())
}

/// [`load`] the delta file `delta` and [`write_into`] `mapping` of process `pid`.
pub fn apply(pid: u32, mapping: Mapping, delta: &Path) -> Result<()> {
    write_into(pid, mapping, &load(delta, mapping.len)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A "VMM" of our own: this process, with a buffer standing in for guest memory.
    fn memory(pages: usize) -> Vec<u8> {
        (0..pages * PAGE).map(|i| u8::try_from(i % 251).unwrap()).collect()
    }

    fn mapping_of(buf: &[u8]) -> Mapping {
        Mapping { start: buf.as_ptr() as u64, len: buf.len() as u64 }
    }

    #[test]
    fn the_mapping_is_found_by_path_and_size() {
        let maps = "7f00-7f10 r--p 00000000 08:01 12 /lib/x.so\n\
                    10000-20000 rw-p 00000000 00:2a 99 /run/s b/base-memory\n";
        let path = Path::new("/run/s b/base-memory");
        assert_eq!(parse_mapping(maps, path, 0x10000), Some(Mapping { start: 0x10000, len: 0x10000 }));
        assert_eq!(parse_mapping(maps, path, 0x20000), None, "a mapping of another size matched");
        assert_eq!(parse_mapping(maps, Path::new("/run/s"), 0x10000), None);
    }

    #[test]
    fn anonymous_pages_are_dirty_file_pages_are_not() {
        let entries: Vec<u8> = [
            PM_PRESENT | PM_FILE_OR_SHARED | 7, // the file's page
            PM_PRESENT | 9,                     // an anonymous copy
            0,                                  // never touched
            PM_SWAPPED | 3,                     // an anonymous copy, swapped out
        ]
        .iter()
        .flat_map(|e| e.to_le_bytes())
        .collect();
        assert_eq!(dirty_in(&entries), vec![1, 3]);
    }

    #[test]
    fn a_delta_round_trips_and_damage_is_refused() {
        let pid = std::process::id();
        let src = memory(600);
        let pages: Vec<u64> = vec![0, 1, 2, 7, 300, 301, 599];
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("delta");
        let stats = save(pid, mapping_of(&src), &pages, &file).unwrap();
        assert_eq!(stats, DeltaStats { pages: 7, bytes: 32 + 7 * (8 + 4096) });
        assert_eq!(std::fs::metadata(&file).unwrap().len(), stats.bytes);

        let dst = vec![0u8; src.len()];
        apply(pid, mapping_of(&dst), &file).unwrap();
        assert_eq!(load(&file, src.len() as u64).unwrap().pages(), 7);
        for p in 0..600 {
            let r = p * PAGE..(p + 1) * PAGE;
            if pages.contains(&(p as u64)) {
                assert_eq!(dst[r.clone()], src[r], "page {p} not restored");
            } else {
                assert!(dst[r].iter().all(|b| *b == 0), "page {p} written");
            }
        }

        let damaged = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut bytes = std::fs::read(&file).unwrap();
            f(&mut bytes);
            let path = dir.path().join("damaged");
            std::fs::write(&path, bytes).unwrap();
            load(&path, src.len() as u64).unwrap_err()
        };
        assert!(matches!(damaged(&|b| b[5000] ^= 1), DeltaError::Checksum));
        // Page 1 renamed page 0: named twice.
        assert!(matches!(damaged(&|b| b[40] ^= 1), DeltaError::Checksum));
        assert!(matches!(damaged(&|b| b.truncate(b.len() - 1)), DeltaError::Length { .. }));
        assert!(matches!(damaged(&|b| b.truncate(10)), DeltaError::Length { .. }));
        assert!(matches!(damaged(&|b| b[0] = b'X'), DeltaError::BadMagic));
        assert!(matches!(damaged(&|b| b[9] ^= 1), DeltaError::SizeMismatch { .. }));
        // The last page moved past the end of memory.
        assert!(matches!(damaged(&|b| b[32 + 8 * 6 + 2] = 0xff), DeltaError::Checksum));
        assert!(matches!(load(&dir.path().join("missing"), src.len() as u64), Err(DeltaError::Io { .. })));
        let other = vec![0u8; 2 * PAGE];
        assert!(matches!(apply(pid, mapping_of(&other), &file), Err(DeltaError::SizeMismatch { .. })));
    }

    #[test]
    fn an_index_out_of_order_is_refused_even_with_its_checksum_right() {
        let src = memory(8);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("delta");
        save(std::process::id(), mapping_of(&src), &[5, 3], &file).unwrap();
        assert!(matches!(load(&file, src.len() as u64), Err(DeltaError::BadIndex(3))));
        save(std::process::id(), mapping_of(&src), &[2, 2], &file).unwrap();
        assert!(matches!(load(&file, src.len() as u64), Err(DeltaError::BadIndex(2))));
    }

    #[test]
    fn a_delta_of_many_batches_is_written_by_several_writers_whole() {
        let pid = std::process::id();
        let count = 5 * BATCH_PAGES + 17;
        let src = memory(2 * count);
        // Every other page: no two adjacent, so every page is a region of its own.
        let pages: Vec<u64> = (0..count as u64).map(|p| 2 * p + 1).collect();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("delta");
        save(pid, mapping_of(&src), &pages, &file).unwrap();
        let dst = vec![0u8; src.len()];
        apply(pid, mapping_of(&dst), &file).unwrap();
        for p in 0..2 * count {
            let r = p * PAGE..(p + 1) * PAGE;
            if p % 2 == 1 {
                assert_eq!(dst[r.clone()], src[r], "page {p} not restored");
            } else {
                assert!(dst[r].iter().all(|b| *b == 0), "page {p} written");
            }
        }
    }

    #[test]
    fn an_empty_delta_is_valid() {
        let src = memory(4);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("delta");
        save(std::process::id(), mapping_of(&src), &[], &file).unwrap();
        assert_eq!(load(&file, src.len() as u64).unwrap().pages(), 0);
    }
}
