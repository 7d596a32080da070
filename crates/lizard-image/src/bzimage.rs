//! Unpacking a Linux bzImage into the uncompressed ELF `vmlinux`.
//!
//! QEMU's `microvm` machine (and Firecracker) boot an uncompressed ELF kernel through its
//! PVH entry point, but distributions ship a compressed bzImage. A bzImage is:
//!
//! 1. the real-mode setup code: `setup_sects` sectors (byte at 0x1f1, 0 means 4) plus the
//!    boot sector itself, i.e. the protected-mode code starts at `(setup_sects + 1) * 512`;
//! 2. the protected-mode decompressor, in which `payload_offset` / `payload_length`
//!    (u32 LE at 0x248 / 0x24c, boot protocol >= 2.08, relative to the protected-mode start)
//!    locate the compressed `vmlinux`.
//!
//! Debian's cloud kernel compresses the payload with LZ4 in the *legacy* frame format, which
//! [`decode_lz4_legacy`] decodes with `lz4_flex`'s block decoder.

use crate::ImageError;

/// `HdrS`: marks a boot-protocol header at 0x202.
const HEADER_MAGIC: &[u8; 4] = b"HdrS";
/// The first boot-protocol version with `payload_offset` / `payload_length`.
const MIN_PROTOCOL: u16 = 0x0208;
const ELF_MAGIC: &[u8; 4] = b"\x7fELF";

/// Magic number of an LZ4 legacy frame (stored little-endian).
pub const LZ4_LEGACY_MAGIC: u32 = 0x184C_2102;
/// Every block of a legacy frame decompresses to at most this much.
pub const LZ4_LEGACY_BLOCK_MAX: usize = 8 << 20;
/// `LZ4_compressBound(8 MiB)`: no valid block is larger, so a bigger length ends the stream
/// (the kernel's build appends the uncompressed size as a u32, which lands here).
const LZ4_LEGACY_BLOCK_BOUND: usize = LZ4_LEGACY_BLOCK_MAX + LZ4_LEGACY_BLOCK_MAX / 255 + 16;

/// Where the compressed kernel sits inside a bzImage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BzImageLayout {
    pub setup_sects: u8,
    /// Absolute file offset of the protected-mode code.
    pub protected_mode_start: usize,
    /// Absolute file offset of the compressed payload.
    pub payload_start: usize,
    pub payload_len: usize,
}

/// Parses the boot-protocol header of a bzImage.
pub fn parse_header(image: &[u8]) -> Result<BzImageLayout, ImageError> {
    let err = |m: String| ImageError::BzImage(m);
    if image.len() < 0x250 {
        return Err(err(format!("file too short ({} bytes)", image.len())));
    }
    if &image[0x202..0x206] != HEADER_MAGIC {
        return Err(err("no `HdrS` boot-protocol header at 0x202".into()));
    }
    let protocol = u16::from_le_bytes([image[0x206], image[0x207]]);
    if protocol < MIN_PROTOCOL {
        return Err(err(format!(
            "boot protocol {}.{:02} has no payload fields (needs 2.08)",
            protocol >> 8,
            protocol & 0xff
        )));
    }
    let setup_sects = image[0x1f1];
    let protected_mode_start = (usize::from(if setup_sects == 0 { 4 } else { setup_sects }) + 1) * 512;
    let payload_offset = read_u32(image, 0x248) as usize;
    let payload_len = read_u32(image, 0x24c) as usize;
    let payload_start = protected_mode_start + payload_offset;
    if payload_start.checked_add(payload_len).is_none_or(|end| end > image.len()) {
        return Err(err(format!(
            "payload {payload_start:#x}+{payload_len:#x} lies outside the {}-byte file",
            image.len()
        )));
    }
    Ok(BzImageLayout { setup_sects, protected_mode_start, payload_start, payload_len })
}

/// Extracts the uncompressed ELF `vmlinux` from a bzImage.
pub fn extract_vmlinux(image: &[u8]) -> Result<Vec<u8>, ImageError> {
    let layout = parse_header(image)?;
    let payload = &image[layout.payload_start..layout.payload_start + layout.payload_len];
    let vmlinux = match payload {
        [0x02, 0x21, 0x4c, 0x18, ..] => decode_lz4_legacy(payload)?,
        _ => {
            return Err(ImageError::BzImage(format!(
                "payload is not LZ4 legacy ({}); only LZ4 kernels are supported",
                compression_name(payload)
            )))
        }
    };
    if !vmlinux.starts_with(ELF_MAGIC) {
        return Err(ImageError::BzImage("decompressed payload is not an ELF file".into()));
    }
    Ok(vmlinux)
}

/// Names the compression of a payload we cannot decode, for the error message.
fn compression_name(payload: &[u8]) -> &'static str {
    match payload {
        [0x1f, 0x8b, ..] => "gzip",
        [0xfd, b'7', b'z', b'X', b'Z', 0, ..] => "xz",
        [0x28, 0xb5, 0x2f, 0xfd, ..] => "zstd",
        [b'B', b'Z', b'h', ..] => "bzip2",
        [0x89, b'L', b'Z', b'O', ..] => "lzo",
        [0x5d, 0, 0, ..] => "lzma",
        _ => "unknown format",
    }
}

/// Decodes an LZ4 legacy frame: the magic, then blocks of `u32 LE compressed size` + an LZ4
/// block that decompresses to at most 8 MiB. A length that cannot be a block (too large or
/// past the end of the input) ends the stream; a repeated magic starts a concatenated frame.
pub fn decode_lz4_legacy(input: &[u8]) -> Result<Vec<u8>, ImageError> {
    if input.len() < 4 || read_u32(input, 0) != LZ4_LEGACY_MAGIC {
        return Err(ImageError::Lz4("missing legacy frame magic 0x184C2102".into()));
    }
    let mut out = Vec::new();
    let mut pos = 4;
    while pos + 4 <= input.len() {
        let raw_len = read_u32(input, pos);
        if raw_len == LZ4_LEGACY_MAGIC {
            pos += 4;
            continue;
        }
        let block_len = raw_len as usize;
        let data_start = pos + 4;
        if block_len == 0 || block_len > LZ4_LEGACY_BLOCK_BOUND || block_len > input.len() - data_start {
            break;
        }
        let block = &input[data_start..data_start + block_len];
        let start = out.len();
        out.resize(start + LZ4_LEGACY_BLOCK_MAX, 0);
        let n = lz4_flex::block::decompress_into(block, &mut out[start..])
            .map_err(|e| ImageError::Lz4(format!("block at offset {pos:#x}: {e}")))?;
        out.truncate(start + n);
        pos = data_start + block_len;
    }
    if out.is_empty() {
        return Err(ImageError::Lz4("stream holds no blocks".into()));
    }
    Ok(out)
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames `data` the way `lz4 -l` does: magic, then 8 MiB chunks as size-prefixed blocks.
    fn legacy_frame(data: &[u8], chunk: usize) -> Vec<u8> {
        let mut out = LZ4_LEGACY_MAGIC.to_le_bytes().to_vec();
        for piece in data.chunks(chunk) {
            let block = lz4_flex::block::compress(piece);
            out.extend_from_slice(&u32::try_from(block.len()).unwrap().to_le_bytes());
            out.extend_from_slice(&block);
        }
        out
    }

    /// Compressible but not trivial test data.
    fn sample(len: usize) -> Vec<u8> {
        let mut x: u32 = 12345;
        (0..len)
            .map(|i| {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                if i % 7 == 0 {
                    (x >> 24).to_le_bytes()[0]
                } else {
                    (i / 64).to_le_bytes()[0] // the low byte
                }
            })
            .collect()
    }

    #[test]
    fn decodes_multi_block_legacy_frame_with_size_trailer() {
        // Three blocks, the last one short, followed by the kernel's appended size.
        let data = sample(2 * LZ4_LEGACY_BLOCK_MAX + 12_345);
        let mut framed = legacy_frame(&data, LZ4_LEGACY_BLOCK_MAX);
        framed.extend_from_slice(&u32::try_from(data.len()).unwrap().to_le_bytes());
        assert_eq!(decode_lz4_legacy(&framed).unwrap(), data);
    }

    #[test]
    fn decodes_concatenated_frames() {
        let a = sample(100_000);
        let b = sample(50_000);
        let mut framed = legacy_frame(&a, LZ4_LEGACY_BLOCK_MAX);
        framed.extend(legacy_frame(&b, LZ4_LEGACY_BLOCK_MAX));
        assert_eq!(decode_lz4_legacy(&framed).unwrap(), [a, b].concat());
    }

    #[test]
    fn rejects_bad_magic_and_corrupt_blocks() {
        assert!(matches!(decode_lz4_legacy(b"\x04\x22\x4d\x18rest"), Err(ImageError::Lz4(_))));
        let mut framed = legacy_frame(&sample(10_000), LZ4_LEGACY_BLOCK_MAX);
        // Claim the block is longer than the data that follows: the stream ends before it.
        framed[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_lz4_legacy(&framed).is_err());
        // A block whose first sequence copies from before the start of the output.
        let mut framed = LZ4_LEGACY_MAGIC.to_le_bytes().to_vec();
        framed.extend_from_slice(&3u32.to_le_bytes());
        framed.extend_from_slice(&[0x0f, 0x01, 0x00]);
        assert!(matches!(decode_lz4_legacy(&framed), Err(ImageError::Lz4(_))));
    }

    /// Builds a minimal synthetic bzImage around `payload`.
    fn fake_bzimage(setup_sects: u8, payload_offset: u32, payload: &[u8]) -> Vec<u8> {
        let pm_start = (usize::from(if setup_sects == 0 { 4 } else { setup_sects }) + 1) * 512;
        let mut img = vec![0u8; pm_start + payload_offset as usize];
        img[0x1f1] = setup_sects;
        img[0x202..0x206].copy_from_slice(b"HdrS");
        img[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
        img[0x248..0x24c].copy_from_slice(&payload_offset.to_le_bytes());
        img[0x24c..0x250].copy_from_slice(&u32::try_from(payload.len()).unwrap().to_le_bytes());
        img.extend_from_slice(payload);
        img.extend_from_slice(b"trailing decompressor code");
        img
    }

    #[test]
    fn parses_header_fields() {
        let img = fake_bzimage(39, 0x2cc, b"payload!");
        let layout = parse_header(&img).unwrap();
        assert_eq!(layout.protected_mode_start, 40 * 512);
        assert_eq!(layout.payload_start, 40 * 512 + 0x2cc);
        assert_eq!(layout.payload_len, 8);
        // setup_sects == 0 means 4.
        let img = fake_bzimage(0, 16, b"x");
        assert_eq!(parse_header(&img).unwrap().protected_mode_start, 5 * 512);
    }

    #[test]
    fn extracts_elf_payload_and_rejects_others() {
        let mut elf = b"\x7fELF".to_vec();
        elf.extend(sample(300_000));
        let mut payload = legacy_frame(&elf, LZ4_LEGACY_BLOCK_MAX);
        payload.extend_from_slice(&u32::try_from(elf.len()).unwrap().to_le_bytes());
        let img = fake_bzimage(30, 100, &payload);
        assert_eq!(extract_vmlinux(&img).unwrap(), elf);

        let img = fake_bzimage(30, 100, &legacy_frame(b"not an elf file", 1 << 20));
        assert!(matches!(extract_vmlinux(&img), Err(ImageError::BzImage(_))));
        let img = fake_bzimage(30, 100, b"\x1f\x8b\x08gzipdata");
        let e = extract_vmlinux(&img).unwrap_err().to_string();
        assert!(e.contains("gzip"), "{e}");
        assert!(parse_header(&[0u8; 0x300]).is_err());
    }
}
