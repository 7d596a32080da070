//! Memory deltas: the guest pages a copy-on-write clone changed, saved over its base file.
//!
//! A clone maps its base memory file private (`share=off`), so every page its guest (or
//! its VMM) wrote is an anonymous page of that mapping, and every other page is still the
//! file's. The kernel's pagemap tells which is which; the changed pages are read out of
//! the stopped VMM with `process_vm_readv` and written packed, after an index of their
//! page numbers. A paused clone's files on disk are then proportional to what it changed,
//! not to its memory size.
//!
//! Restoring maps the base again and puts the delta's pages in front of it before the
//! guest runs. A confined VMM maps them straight from the delta file, copy-on-write, as
//! QEMU maps its memory (the preload library, [`crate::jail::preload`]): nothing is
//! copied, and the guest reads a page from the file when it first touches it. The node
//! then checks, from `/proc/<pid>/maps`, that every page mapped over the base is the
//! delta's own page at its own place, and writes what was not mapped (everything, for an
//! unconfined VMM or an old delta) with `process_vm_writev`. A later save of such a VM
//! takes the pages still mapped from a delta too ([`Layout::overlays`]).
//!
//! File layout (format 2, little-endian): [`MAGIC`], memory size in bytes (u64), page
//! count (u64), CRC-32 (u32) over the size, the count and everything after the header,
//! 4 zero bytes; the index (one u64 page number per page, strictly increasing); zeros up
//! to the next 4 KiB boundary ([`data_offset`]); the pages (4 KiB each, in index order),
//! each where it can be mapped from. Format 1 ([`MAGIC_V1`]: no padding) is still read,
//! and its pages are always written. A damaged, truncated or foreign file fails [`load`]
//! with a [`DeltaError`]; it never yields a guest with wrong memory (the caller kills the
//! VMM that a failed restore mapped or wrote into before it ever runs).

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Page size of the host, which pagemap entries count in (x86-64: 4 KiB).
pub const PAGE_SIZE: u64 = 4096;
/// The same, as a length in memory.
const PAGE: usize = 4096;
/// The first bytes of every delta file this version writes (format 2).
pub const MAGIC: &[u8; 8] = b"LZDELTA2";
/// The first bytes of a delta of format 1 (pages right after the index).
pub const MAGIC_V1: &[u8; 8] = b"LZDELTA1";
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
    #[error("{context}: {cause}")]
    Io { context: String, cause: std::io::Error },
    /// The VMM has no mapping of that file of that size (not a copy-on-write clone of it).
    #[error("the VMM maps no {len}-byte region of {}", path.display())]
    NoMapping { path: PathBuf, len: u64 },
    /// Reading or writing the VMM's memory moved fewer bytes than asked.
    #[error("{what} moved {moved} of {asked} bytes")]
    Short { what: &'static str, moved: usize, asked: usize },
    /// Reading or writing the VMM's memory failed.
    #[error("{what}: {cause}")]
    ProcessMemory { what: &'static str, cause: nix::Error },
    /// The file does not start with [`MAGIC`] or [`MAGIC_V1`].
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
    /// Guest page `page` maps something over the base that is not the delta's copy of it.
    #[error("guest page {page} maps something other than the delta's copy of it")]
    WrongOverlay { page: u64 },
}

type Result<T, E = DeltaError> = std::result::Result<T, E>;

fn io(context: impl Into<String>, source: std::io::Error) -> DeltaError {
    DeltaError::Io { context: context.into(), cause: source }
}

/// Where a VMM maps a file: its start address in the VMM process and its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub len: u64,
}

/// A file as `/proc/<pid>/maps` names it: device numbers and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    pub major: u64,
    pub minor: u64,
    pub inode: u64,
}

impl FileId {
    /// The identity of a file from its metadata.
    pub fn of(meta: &std::fs::Metadata) -> FileId {
        use std::os::unix::fs::MetadataExt;
        FileId { major: nix::sys::stat::major(meta.dev()), minor: nix::sys::stat::minor(meta.dev()), inode: meta.ino() }
    }
}

/// Pages of guest memory that a VMM maps from another file than the base: pages a
/// restore mapped from a delta ([`Layout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overlay {
    /// The first page (from the start of guest memory).
    pub first_page: u64,
    pub pages: u64,
    /// Where in the file the first page is mapped from.
    pub offset: u64,
    pub file: FileId,
}

/// A VMM's guest memory as its address space holds it: the base file's mapping, and the
/// ranges in it mapped from other files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub mapping: Mapping,
    pub overlays: Vec<Overlay>,
}

/// What [`save`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaStats {
    /// Pages in the delta.
    pub pages: u64,
    /// Size of the delta file in bytes.
    pub bytes: u64,
}

/// Where a delta of `count` pages keeps its first page: after the header and the index,
/// at a page boundary.
pub const fn data_offset(count: u64) -> u64 {
    (HEADER_LEN + 8 * count).next_multiple_of(PAGE_SIZE)
}

/// The guest memory of process `pid`: `len` bytes mapped from `path`, maybe with ranges
/// of other files over it (from `/proc/<pid>/maps`).
pub fn layout(pid: u32, path: &Path, len: u64) -> Result<Layout> {
    let maps_path = format!("/proc/{pid}/maps");
    let maps = std::fs::read_to_string(&maps_path).map_err(|e| io(format!("read {maps_path}"), e))?;
    parse_layout(&maps, path, len).ok_or_else(|| DeltaError::NoMapping { path: path.to_path_buf(), len })
}

/// One line of `/proc/<pid>/maps`.
struct Vma<'a> {
    start: u64,
    end: u64,
    offset: u64,
    file: FileId,
    path: &'a str,
}

fn parse_vma(line: &str) -> Option<Vma<'_>> {
    // start-end perms offset major:minor inode path (the path may hold spaces: the rest).
    let mut fields = line.splitn(6, ' ');
    let (start, end) = fields.next()?.split_once('-')?;
    let offset = fields.nth(1)?;
    let (major, minor) = fields.next()?.split_once(':')?;
    let inode = fields.next()?;
    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    Some(Vma {
        start: hex(start)?,
        end: hex(end)?,
        offset: hex(offset)?,
        file: FileId { major: hex(major)?, minor: hex(minor)?, inode: inode.parse().ok()? },
        path: fields.next().map_or("", str::trim_start),
    })
}

fn parse_layout(maps: &str, path: &Path, len: u64) -> Option<Layout> {
    let wanted = path.to_str()?;
    let vmas: Vec<Vma<'_>> = maps.lines().filter_map(parse_vma).collect();
    // The base's first mapping tells where all of memory starts (its own first page may
    // be mapped from a delta).
    let first = vmas.iter().find(|v| v.path == wanted)?;
    let start = first.start.checked_sub(first.offset)?;
    let end = start.checked_add(len)?;
    let mut overlays = Vec::new();
    let mut at = start;
    for v in vmas.iter().skip_while(|v| v.end <= start).take_while(|v| v.start < end) {
        if v.start != at || v.end > end || v.path.is_empty() {
            return None;
        }
        if v.path == wanted {
            if v.offset != v.start - start {
                return None;
            }
        } else {
            let first_page = (v.start - start) / PAGE_SIZE;
            overlays.push(Overlay { first_page, pages: (v.end - v.start) / PAGE_SIZE, offset: v.offset, file: v.file });
        }
        at = v.end;
    }
    (at == end).then_some(Layout { mapping: Mapping { start, len }, overlays })
}

/// Page numbers (from the start of guest memory) of the pages of `layout` that are no
/// longer the base file's: anonymous copies, present or swapped out, and every page
/// mapped from another file (a delta's, which may not even be read yet).
pub fn dirty_pages(pid: u32, layout: &Layout) -> Result<Vec<u64>> {
    let path = format!("/proc/{pid}/pagemap");
    let file = File::open(&path).map_err(|e| io(format!("open {path}"), e))?;
    let pages = layout.mapping.len / PAGE_SIZE;
    let mut entries = vec![0u8; to_usize(pages * 8)?];
    file.read_exact_at(&mut entries, layout.mapping.start / PAGE_SIZE * 8)
        .map_err(|e| io(format!("read {path}"), e))?;
    Ok(dirty_in(&entries, &layout.overlays))
}

/// The page numbers of the anonymous pages among pagemap `entries`, and of every page in
/// `overlays`.
fn dirty_in(entries: &[u8], overlays: &[Overlay]) -> Vec<u64> {
    let mut dirty: Vec<bool> = entries
        .chunks_exact(8)
        .map(|e| {
            let e = u64::from_le_bytes(e.try_into().expect("chunks of 8"));
            let present_anon = e & PM_PRESENT != 0 && e & PM_FILE_OR_SHARED == 0;
            // A swapped-out page of a private file mapping is an anonymous one.
            present_anon || e & PM_SWAPPED != 0
        })
        .collect();
    for o in overlays {
        for p in o.first_page..o.first_page + o.pages {
            if let Some(d) = usize::try_from(p).ok().and_then(|p| dirty.get_mut(p)) {
                *d = true;
            }
        }
    }
    (0u64..).zip(dirty).filter(|(_, d)| *d).map(|(p, _)| p).collect()
}

fn to_usize(n: u64) -> Result<usize> {
    usize::try_from(n).map_err(|_| DeltaError::BadIndex(n))
}

/// Adds the remote region of guest page `page` of `mapping` to `out`, joined to the last
/// one when adjacent.
fn push_region(out: &mut Vec<nix::sys::uio::RemoteIoVec>, mapping: Mapping, page: u64) -> Result<()> {
    let base = to_usize(mapping.start + page * PAGE_SIZE)?;
    match out.last_mut() {
        Some(last) if last.base + last.len == base => last.len += PAGE,
        _ => out.push(nix::sys::uio::RemoteIoVec { base, len: PAGE }),
    }
    Ok(())
}

fn remote_pid(pid: u32) -> Result<nix::unistd::Pid> {
    Ok(nix::unistd::Pid::from_raw(i32::try_from(pid).map_err(|_| DeltaError::BadIndex(pid.into()))?))
}

/// Write the `pages` of `mapping` in process `pid` (stopped: nothing may change them
/// meanwhile) to a new delta file `out`. The file is written beside it and renamed into
/// place: a file of that name that a VMM still maps is never changed, and a failed save
/// leaves nothing behind.
pub fn save(pid: u32, mapping: Mapping, pages: &[u64], out: &Path) -> Result<DeltaStats> {
    let mut partial = out.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let written = write_delta(pid, mapping, pages, &partial).and_then(|stats| {
        std::fs::rename(&partial, out).map_err(|e| io(format!("rename {} into place", partial.display()), e))?;
        Ok(stats)
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written
}

/// [`save`] into `path`, a new file.
fn write_delta(pid: u32, mapping: Mapping, pages: &[u64], path: &Path) -> Result<DeltaStats> {
    let remote_pid = remote_pid(pid)?;
    let count = u64::try_from(pages.len()).map_err(|_| DeltaError::BadIndex(u64::MAX))?;
    let data_at = data_offset(count);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&mapping.len.to_le_bytes());
    crc.update(&count.to_le_bytes());
    // Root's alone: a VMM that maps it gets a descriptor, never the path.
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| io(format!("create {}", path.display()), e))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let werr = |e| io(format!("write {}", path.display()), e);
    w.write_all(&[0u8; HEADER]).map_err(werr)?;
    for p in pages {
        let b = p.to_le_bytes();
        crc.update(&b);
        w.write_all(&b).map_err(werr)?;
    }
    let padding = vec![0u8; to_usize(data_at - HEADER_LEN - 8 * count)?];
    crc.update(&padding);
    w.write_all(&padding).map_err(werr)?;
    let mut buf = vec![0u8; BATCH_PAGES * PAGE];
    for chunk in pages.chunks(BATCH_PAGES) {
        let mut remote = Vec::new();
        for &p in chunk {
            push_region(&mut remote, mapping, p)?;
        }
        let data = &mut buf[..chunk.len() * PAGE];
        let moved = nix::sys::uio::process_vm_readv(remote_pid, &mut [std::io::IoSliceMut::new(data)], &remote)
            .map_err(|cause| DeltaError::ProcessMemory { what: "process_vm_readv", cause })?;
        if moved != data.len() {
            return Err(DeltaError::Short { what: "process_vm_readv", moved, asked: data.len() });
        }
        crc.update(data);
        w.write_all(data).map_err(werr)?;
    }
    let mut file = w.into_inner().map_err(|e| werr(e.into_error()))?;
    file.seek(SeekFrom::Start(0)).map_err(werr)?;
    file.write_all(&header(mapping.len, count, crc.finalize())).map_err(werr)?;
    Ok(DeltaStats { pages: count, bytes: data_at + count * PAGE_SIZE })
}

fn header(memory: u64, count: u64, crc: u32) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
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
    /// Where the first page's data starts in the file (format 1: right after the index).
    data_at: usize,
    /// Whether a VMM may map its pages from the file (format 2: page-aligned).
    mappable: bool,
    /// The file, as a VMM's maps name it.
    file: FileId,
}

impl LoadedDelta {
    /// Pages in the delta.
    pub fn pages(&self) -> usize {
        self.pages.len()
    }

    /// The page data, in index order.
    fn data(&self) -> &[u8] {
        // In bounds: the file's length was checked against its page count.
        &self.map[self.data_at..]
    }

    /// The data of the `i`th page of the index.
    fn page(&self, i: usize) -> &[u8] {
        &self.data()[i * PAGE..(i + 1) * PAGE]
    }

    /// Each batch of page numbers with their data.
    pub fn batches(&self) -> impl Iterator<Item = (&[u64], &[u8])> {
        self.pages.chunks(BATCH_PAGES).zip(self.data().chunks(BATCH_PAGES * PAGE))
    }

    /// Which of the delta's pages `layout` maps from this very file, each at its own
    /// place in it (`true` at its index position). Anything else mapped over the base —
    /// another file, a page at the wrong place — is an error: that guest must not run.
    pub fn mapped_in(&self, layout: &Layout) -> Result<Vec<bool>> {
        let mut mapped = vec![false; self.pages.len()];
        for o in &layout.overlays {
            for k in 0..o.pages {
                let page = o.first_page + k;
                let wrong = DeltaError::WrongOverlay { page };
                let at = o.offset + k * PAGE_SIZE;
                let i = match at.checked_sub(self.data_at as u64) {
                    Some(d) if self.mappable && o.file == self.file && d % PAGE_SIZE == 0 => to_usize(d / PAGE_SIZE)?,
                    _ => return Err(wrong),
                };
                match self.pages.get(i) {
                    Some(&p) if p == page => mapped[i] = true,
                    _ => return Err(wrong),
                }
            }
        }
        Ok(mapped)
    }
}

/// Map and check the delta file `delta` of a `memory`-byte memory: its header, its index
/// (in range, strictly increasing) and its checksum.
pub fn load(delta: &Path, memory: u64) -> Result<LoadedDelta> {
    let file = File::open(delta).map_err(|e| io(format!("open {}", delta.display()), e))?;
    load_from(&file, delta, memory)
}

/// [`load`] the delta file `delta` that `file` has open.
pub fn load_from(file: &File, delta: &Path, memory: u64) -> Result<LoadedDelta> {
    let rerr = |e| io(format!("read {}", delta.display()), e);
    let meta = file.metadata().map_err(rerr)?;
    let (len, id) = (meta.len(), FileId::of(&meta));
    if len < HEADER_LEN {
        return Err(DeltaError::Length { expected: HEADER_LEN, found: len });
    }
    // SAFETY: the file is a delta in a paused sandbox's directory (or a fork's save),
    // written once at save time and renamed into place; nothing writes or truncates it
    // while a restore reads it (the sandbox's transition lock is held, and a VMM maps it
    // read-only at most).
    let map = unsafe { memmap2::MmapOptions::new().populate().map(file) }.map_err(rerr)?;
    let field = |r: std::ops::Range<usize>| u64::from_le_bytes(map[r].try_into().expect("8 bytes"));
    let mappable = match &map[..8] {
        m if m == MAGIC => true,
        m if m == MAGIC_V1 => false,
        _ => return Err(DeltaError::BadMagic),
    };
    let (found, count) = (field(8..16), field(16..24));
    let want_crc = u32::from_le_bytes(map[24..28].try_into().expect("4 bytes"));
    if found != memory {
        return Err(DeltaError::SizeMismatch { expected: memory, found });
    }
    let too_long = DeltaError::Length { expected: u64::MAX, found: len };
    let data_at = if mappable {
        count.checked_mul(8).and_then(|b| b.checked_add(HEADER_LEN)).and_then(|b| b.checked_next_multiple_of(PAGE_SIZE))
    } else {
        count.checked_mul(8).and_then(|b| b.checked_add(HEADER_LEN))
    };
    let Some(data_at) = data_at else { return Err(too_long) };
    let Some(expected) = count.checked_mul(PAGE_SIZE).and_then(|b| b.checked_add(data_at)) else {
        return Err(too_long);
    };
    if expected != len {
        return Err(DeltaError::Length { expected, found: len });
    }
    let mut crc = crc32fast::Hasher::new();
    crc.update(&map[8..24]);
    crc.update(&map[HEADER..]);
    if crc.finalize() != want_crc {
        return Err(DeltaError::Checksum);
    }
    let index = &map[HEADER..HEADER + to_usize(count * 8)?];
    let pages: Vec<u64> = index.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))).collect();
    let total = memory / PAGE_SIZE;
    let mut prev = None;
    for &p in &pages {
        if p >= total || prev.is_some_and(|q| q >= p) {
            return Err(DeltaError::BadIndex(p));
        }
        prev = Some(p);
    }
    Ok(LoadedDelta { map, pages, data_at: to_usize(data_at)?, mappable, file: id })
}

/// Threads that write one delta at most: the time goes into the VMM's copy-on-write
/// faults (a page allocated and copied from the base file's cache each), which run side
/// by side on separate CPUs.
const MAX_WRITERS: usize = 4;

/// Write the pages of `delta` that are not `mapped` already ([`LoadedDelta::mapped_in`];
/// `None`: all of them) into `mapping` of process `pid`, a VMM that has not run its guest
/// yet, on up to one thread per CPU. Returns how many it wrote. On an error some pages
/// may have been written: the VMM must not run the guest then.
pub fn write_into(pid: u32, mapping: Mapping, delta: &LoadedDelta, mapped: Option<&[bool]>) -> Result<usize> {
    let remote_pid = remote_pid(pid)?;
    let todo: Vec<usize> =
        (0..delta.pages()).filter(|&i| !mapped.is_some_and(|m| m.get(i).copied().unwrap_or(false))).collect();
    let batches: Vec<&[usize]> = todo.chunks(BATCH_PAGES).collect();
    let writers = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, MAX_WRITERS);
    let share = batches.len().div_ceil(writers).max(1);
    std::thread::scope(|scope| {
        let parts: Vec<_> = batches
            .chunks(share)
            .map(|part| scope.spawn(move || write_batches(remote_pid, mapping, delta, part)))
            .collect();
        parts.into_iter().try_for_each(|part| part.join().expect("a delta writer panicked"))
    })?;
    Ok(todo.len())
}

/// One writer's share of [`write_into`]: batches of index positions.
fn write_batches(
    remote_pid: nix::unistd::Pid,
    mapping: Mapping,
    delta: &LoadedDelta,
    batches: &[&[usize]],
) -> Result<()> {
    for batch in batches {
        let mut remote = Vec::new();
        let mut local: Vec<std::io::IoSlice<'_>> = Vec::with_capacity(batch.len());
        for &i in *batch {
            push_region(&mut remote, mapping, delta.pages[i])?;
            local.push(std::io::IoSlice::new(delta.page(i)));
        }
        let asked = batch.len() * PAGE;
        let moved = nix::sys::uio::process_vm_writev(remote_pid, &local, &remote)
            .map_err(|cause| DeltaError::ProcessMemory { what: "process_vm_writev", cause })?;
        if moved != asked {
            return Err(DeltaError::Short { what: "process_vm_writev", moved, asked });
        }
    }
    Ok(())
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

    fn apply(pid: u32, mapping: Mapping, delta: &Path) -> Result<usize> {
        write_into(pid, mapping, &load(delta, mapping.len)?, None)
    }

    const DELTA: FileId = FileId { major: 8, minor: 1, inode: 7 };

    #[test]
    fn the_layout_is_the_base_and_what_is_mapped_over_it() {
        let maps = "7f00-7f10 r--p 00000000 08:01 12 /lib/x.so\n\
                    10000-20000 rw-p 00000000 08:01 99 /run/s b/base-memory\n";
        let path = Path::new("/run/s b/base-memory");
        let whole = Layout { mapping: Mapping { start: 0x10000, len: 0x10000 }, overlays: vec![] };
        assert_eq!(parse_layout(maps, path, 0x10000), Some(whole));
        assert_eq!(parse_layout(maps, path, 0x20000), None, "a mapping of another size matched");
        assert_eq!(parse_layout(maps, Path::new("/run/s"), 0x10000), None);

        // Pages 0-1 and 5 mapped from a delta (deleted since), the base around them.
        let split = "12000-15000 rw-p 00002000 08:01 99 /run/base-memory\n\
                     10000-12000 rw-p 00001000 08:01 7 /run/memory.delta (deleted)\n\
                     15000-16000 rw-p 00003000 08:01 7 /run/memory.delta (deleted)\n\
                     16000-20000 rw-p 00006000 08:01 99 /run/base-memory\n\
                     20000-21000 rw-p 00000000 00:00 0 \n";
        let mut lines: Vec<&str> = split.lines().collect();
        lines.sort_by_key(|l| u64::from_str_radix(l.split('-').next().unwrap(), 16).unwrap());
        let sorted = lines.join("\n");
        let layout = parse_layout(&sorted, Path::new("/run/base-memory"), 0x10000).unwrap();
        assert_eq!(layout.mapping, Mapping { start: 0x10000, len: 0x10000 });
        assert_eq!(
            layout.overlays,
            vec![
                Overlay { first_page: 0, pages: 2, offset: 0x1000, file: DELTA },
                Overlay { first_page: 5, pages: 1, offset: 0x3000, file: DELTA },
            ]
        );

        // A hole, an anonymous range or a base page out of place: no layout.
        let hole = sorted.replace("15000-16000 rw-p 00003000 08:01 7 /run/memory.delta (deleted)\n", "");
        assert_eq!(parse_layout(&hole, Path::new("/run/base-memory"), 0x10000), None);
        let anonymous = sorted.replace("08:01 7 /run/memory.delta (deleted)", "00:00 0 ");
        assert_eq!(parse_layout(&anonymous, Path::new("/run/base-memory"), 0x10000), None);
        let shifted = sorted.replace("16000-20000 rw-p 00006000", "16000-20000 rw-p 00007000");
        assert_eq!(parse_layout(&shifted, Path::new("/run/base-memory"), 0x10000), None);
    }

    #[test]
    fn anonymous_pages_and_pages_mapped_from_a_delta_are_dirty_file_pages_are_not() {
        let entries: Vec<u8> = [
            PM_PRESENT | PM_FILE_OR_SHARED | 7, // the file's page
            PM_PRESENT | 9,                     // an anonymous copy
            0,                                  // never touched
            PM_SWAPPED | 3,                     // an anonymous copy, swapped out
            0,                                  // mapped from a delta, not read yet
            PM_PRESENT | PM_FILE_OR_SHARED | 8, // mapped from a delta, read
        ]
        .iter()
        .flat_map(|e| e.to_le_bytes())
        .collect();
        assert_eq!(dirty_in(&entries, &[]), vec![1, 3]);
        let overlay = Overlay { first_page: 4, pages: 2, offset: 0x1000, file: DELTA };
        assert_eq!(dirty_in(&entries, &[overlay]), vec![1, 3, 4, 5]);
    }

    #[test]
    fn a_delta_round_trips_and_damage_is_refused() {
        let pid = std::process::id();
        let src = memory(600);
        let pages: Vec<u64> = vec![0, 1, 2, 7, 300, 301, 599];
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("delta");
        let stats = save(pid, mapping_of(&src), &pages, &file).unwrap();
        assert_eq!(stats, DeltaStats { pages: 7, bytes: 4096 + 7 * 4096 });
        assert_eq!(std::fs::metadata(&file).unwrap().len(), stats.bytes);
        assert!(!dir.path().join("delta.partial").exists());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "a delta readable beyond its owner");

        let dst = vec![0u8; src.len()];
        assert_eq!(apply(pid, mapping_of(&dst), &file).unwrap(), 7);
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
        // The padding before the pages is checked too.
        assert!(matches!(damaged(&|b| b[4000] = 1), DeltaError::Checksum));
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
    fn a_delta_of_format_1_still_loads_and_is_written_not_mapped() {
        let src = memory(8);
        let pages = [1usize, 6];
        let mut bytes = Vec::new();
        bytes.extend_from_slice(MAGIC_V1);
        bytes.extend_from_slice(&(src.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&2u64.to_le_bytes());
        let mut body = Vec::new();
        for p in pages {
            body.extend_from_slice(&(p as u64).to_le_bytes());
        }
        for p in pages {
            body.extend_from_slice(&src[p * PAGE..(p + 1) * PAGE]);
        }
        let mut crc = crc32fast::Hasher::new();
        crc.update(&bytes[8..24]);
        crc.update(&body);
        bytes.extend_from_slice(&crc.finalize().to_le_bytes());
        bytes.extend_from_slice(&[0; 4]);
        bytes.extend_from_slice(&body);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("delta");
        std::fs::write(&file, bytes).unwrap();

        let delta = load(&file, src.len() as u64).unwrap();
        let dst = vec![0u8; src.len()];
        assert_eq!(write_into(std::process::id(), mapping_of(&dst), &delta, None).unwrap(), 2);
        assert_eq!(dst[PAGE..2 * PAGE], src[PAGE..2 * PAGE]);
        assert_eq!(dst[6 * PAGE..7 * PAGE], src[6 * PAGE..7 * PAGE]);
        // Its pages are not page-aligned in the file: nothing of it may be mapped.
        let this_file = FileId::of(&std::fs::metadata(&file).unwrap());
        let layout = Layout {
            mapping: mapping_of(&dst),
            overlays: vec![Overlay { first_page: 1, pages: 1, offset: 48, file: this_file }],
        };
        assert!(matches!(delta.mapped_in(&layout), Err(DeltaError::WrongOverlay { page: 1 })));
    }

    #[test]
    fn a_save_that_fails_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("delta");
        // Page 0 of a "memory" at an address this process does not map.
        let nowhere = Mapping { start: 4096, len: 8 * PAGE_SIZE };
        assert!(matches!(save(std::process::id(), nowhere, &[0], &file), Err(DeltaError::ProcessMemory { .. })));
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert!(left.is_empty(), "left behind: {left:?}");
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
        assert_eq!(apply(pid, mapping_of(&dst), &file).unwrap(), count);
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
        assert_eq!(std::fs::metadata(&file).unwrap().len(), 4096);
    }

    /// What the preload library does in a VMM, done here to this process: the base file
    /// mapped private, some of the delta's runs mapped over it from the delta file. The
    /// layout from this process's own maps tells which pages are mapped, a save takes them
    /// all, and the rest is written.
    #[test]
    fn pages_mapped_from_the_delta_are_found_checked_written_around_and_saved_again() {
        use std::os::fd::AsFd;
        let pid = std::process::id();
        let dir = tempfile::tempdir().unwrap();
        let src = memory(64);
        let base_path = dir.path().join("base");
        std::fs::write(&base_path, vec![0u8; src.len()]).unwrap();
        let pages: Vec<u64> = vec![0, 1, 2, 10, 11, 40, 63];
        let delta_path = dir.path().join("delta");
        save(pid, mapping_of(&src), &pages, &delta_path).unwrap();
        let delta = load(&delta_path, src.len() as u64).unwrap();
        let delta_file = File::open(&delta_path).unwrap();
        let base_file = File::open(&base_path).unwrap();
        let len = std::num::NonZeroUsize::new(src.len()).unwrap();
        let private = nix::sys::mman::MapFlags::MAP_PRIVATE;
        let rw = nix::sys::mman::ProtFlags::PROT_READ | nix::sys::mman::ProtFlags::PROT_WRITE;
        // SAFETY: a new private mapping of a file this test owns; unmapped at the end.
        let guest = unsafe { nix::sys::mman::mmap(None, len, rw, private, base_file.as_fd(), 0) }.unwrap();
        let start = guest.as_ptr() as u64;
        // Runs 0-2 (index 0..3) and 40 (index 5): 10-11 and 63 are left to be written.
        let data_at = data_offset(pages.len() as u64);
        for (first, count, index) in [(0u64, 3usize, 0u64), (40, 1, 5)] {
            let at = std::ptr::NonNull::new((start + first * PAGE_SIZE) as *mut std::ffi::c_void).unwrap();
            let fixed = private | nix::sys::mman::MapFlags::MAP_FIXED;
            let n = std::num::NonZeroUsize::new(count * PAGE).unwrap();
            let from = i64::try_from(data_at + index * PAGE_SIZE).unwrap();
            // SAFETY: replaces pages inside the mapping made above, nothing else.
            unsafe { nix::sys::mman::mmap(Some(at.addr()), n, rw, fixed, delta_file.as_fd(), from) }.unwrap();
        }
        let layout = layout(pid, &base_path, src.len() as u64).unwrap();
        assert_eq!(layout.mapping, Mapping { start, len: src.len() as u64 });
        assert_eq!(layout.overlays.len(), 2, "{:?}", layout.overlays);
        let mapped = delta.mapped_in(&layout).unwrap();
        assert_eq!(mapped, vec![true, true, true, false, false, true, false]);
        assert_eq!(write_into(pid, layout.mapping, &delta, Some(&mapped)).unwrap(), 3);
        // SAFETY: the mapping made above, `src.len()` bytes, alive until the unmap below.
        let guest_bytes = unsafe { std::slice::from_raw_parts(guest.as_ptr().cast::<u8>(), src.len()) };
        for p in 0..64 {
            let r = p * PAGE..(p + 1) * PAGE;
            if pages.contains(&(p as u64)) {
                assert_eq!(guest_bytes[r.clone()], src[r], "page {p} not restored");
            } else {
                assert!(guest_bytes[r].iter().all(|b| *b == 0), "page {p} changed");
            }
        }
        // Mapped from another file, or from the right file at the wrong place: refused.
        let mut foreign = layout.clone();
        foreign.overlays[0].file.inode += 1;
        assert!(matches!(delta.mapped_in(&foreign), Err(DeltaError::WrongOverlay { page: 0 })));
        let mut shifted = layout.clone();
        shifted.overlays[1].offset += PAGE_SIZE;
        assert!(matches!(delta.mapped_in(&shifted), Err(DeltaError::WrongOverlay { page: 40 })));

        // Saved again: every page of the delta, those only mapped (never read) included.
        let dirty = dirty_pages(pid, &layout).unwrap();
        assert_eq!(dirty, pages, "a save would lose pages still mapped from the delta");
        let again = dir.path().join("again");
        save(pid, layout.mapping, &dirty, &again).unwrap();
        let dst = vec![0u8; src.len()];
        write_into(pid, mapping_of(&dst), &load(&again, src.len() as u64).unwrap(), None).unwrap();
        assert_eq!(dst, guest_bytes, "the second save is not the memory");
        // SAFETY: the mapping made above; nothing refers to it any more.
        unsafe { nix::sys::mman::munmap(guest, src.len()) }.unwrap();
    }
}
