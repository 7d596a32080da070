//! A Template SDK `COPY` step's upload: a tar (gzipped or not) of its files, saved
//! bounded and read into a manifest of the build context (under the step's directory,
//! [`crate::template_steps::files_dir`]), each file's content copied out and hashed, as a
//! push's files are. Nothing in it runs: paths out of the archive, hard links and devices
//! are refused.

use crate::{E2bError, E2bResult};
use axum::body::Body;
use futures_util::TryStreamExt;
use lizard_api::templates::{ContextEntry, ContextEntryKind};
use lizard_server::error::AppError;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{Read, Write};

/// The largest upload: a push's whole directory, and its archive's headers.
pub const MAX_UPLOAD: u64 = lizard_server::ops::templates::MAX_BLOB_BYTES + (64 << 20);

/// Write the upload to `path`, ungzipped if it is gzip, at most [`MAX_UPLOAD`] bytes.
pub async fn save_archive(body: Body, path: &std::path::Path) -> E2bResult<()> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let stream = body.into_data_stream().map_err(std::io::Error::other);
    let mut reader = tokio::io::BufReader::new(tokio_util::io::StreamReader::new(stream));
    let gzip = reader.fill_buf().await.map(|b| b.starts_with(&[0x1f, 0x8b])).unwrap_or(false);
    let mut source: Box<dyn tokio::io::AsyncRead + Unpin + Send> =
        if gzip { Box::new(async_compression::tokio::bufread::GzipDecoder::new(reader)) } else { Box::new(reader) };
    let mut file = tokio::fs::File::create(path).await.map_err(|e| E2bError(AppError::internal(e)))?;
    let copied = tokio::io::copy(&mut (&mut source).take(MAX_UPLOAD + 1), &mut file).await;
    let copied = copied.map_err(|e| E2bError(AppError::invalid(format!("the upload could not be read: {e}"))))?;
    if copied > MAX_UPLOAD {
        return Err(E2bError(AppError::invalid(format!("an upload holds at most {} MiB", MAX_UPLOAD >> 20))));
    }
    Ok(())
}

/// The entries of the tar at `archive`, their paths under `prefix` (every directory above
/// a path listed too), each file's content copied to a file of `dir` while its SHA-256
/// is taken. Paths must stay inside; hard links and devices are refused.
pub fn unpack(
    archive: &std::path::Path,
    dir: &std::path::Path,
    prefix: &str,
) -> Result<Vec<(ContextEntry, Option<std::path::PathBuf>)>, String> {
    let file = std::fs::File::open(archive).map_err(|e| e.to_string())?;
    let mut tar = tar::Archive::new(file);
    let mut out: BTreeMap<String, (ContextEntry, Option<std::path::PathBuf>)> = BTreeMap::new();
    let dir_entry = |path: &str, mode: u32| ContextEntry {
        path: path.to_owned(),
        mode,
        kind: ContextEntryKind::Dir,
        sha256: None,
        size: None,
        target: None,
    };
    out.insert(prefix.to_owned(), (dir_entry(prefix, 0o755), None));
    for (n, entry) in tar.entries().map_err(|e| e.to_string())?.enumerate() {
        let mut entry = entry.map_err(|e| e.to_string())?;
        let raw = entry.path().map_err(|e| e.to_string())?.to_string_lossy().into_owned();
        let relative = lizard_recipe::context::normalize(&raw).map_err(|e| format!("{raw:?}: {e}"))?;
        if relative.is_empty() {
            continue;
        }
        let path = format!("{prefix}/{relative}");
        let mode = entry.header().mode().map_err(|e| e.to_string())? & 0o7777;
        let kind = entry.header().entry_type();
        let listed = if kind.is_dir() {
            (dir_entry(&path, mode), None)
        } else if kind.is_symlink() {
            let target = entry.link_name().map_err(|e| e.to_string())?.ok_or("a link without a target")?;
            let target = Some(target.to_string_lossy().into_owned());
            (ContextEntry { kind: ContextEntryKind::Symlink, target, ..dir_entry(&path, mode) }, None)
        } else if kind.is_file() {
            let content = dir.join(format!("f{n}"));
            let mut to = std::fs::File::create(&content).map_err(|e| e.to_string())?;
            let mut hasher = Sha256::new();
            let mut buf = vec![0u8; 256 * 1024];
            let mut size = 0u64;
            loop {
                let read = entry.read(&mut buf).map_err(|e| e.to_string())?;
                if read == 0 {
                    break;
                }
                hasher.update(&buf[..read]);
                to.write_all(&buf[..read]).map_err(|e| e.to_string())?;
                size += read as u64;
            }
            let sha256 = Some(hex::encode(hasher.finalize()));
            let file =
                ContextEntry { kind: ContextEntryKind::File, sha256, size: Some(size), ..dir_entry(&path, mode) };
            (file, Some(content))
        } else {
            return Err(format!("{raw:?}: only files, directories and symbolic links can be copied"));
        };
        let mut parent = path.as_str();
        while let Some((up, _)) = parent.rsplit_once('/') {
            out.entry(up.to_owned()).or_insert_with(|| (dir_entry(up, 0o755), None));
            parent = up;
        }
        out.insert(path, listed);
    }
    Ok(out.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(dir: &std::path::Path, build: impl FnOnce(&mut tar::Builder<std::fs::File>)) -> std::path::PathBuf {
        let path = dir.join("a.tar");
        let mut b = tar::Builder::new(std::fs::File::create(&path).unwrap());
        build(&mut b);
        b.finish().unwrap();
        path
    }

    fn header(kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(mode);
        h
    }

    #[test]
    fn an_upload_unpacks_into_a_manifest_under_its_hash_and_nothing_leaves_it() {
        let dir = tempfile::tempdir().unwrap();
        let tar = archive(dir.path(), |b| {
            b.append_data(&mut header(tar::EntryType::Regular, 2, 0o640), "app/sub/a.txt", &b"hi"[..]).unwrap();
            let mut link = header(tar::EntryType::Symlink, 0, 0o777);
            b.append_link(&mut link, "app/l", "sub/a.txt").unwrap();
        });
        let got = unpack(&tar, dir.path(), "e2b-ab").unwrap();
        let paths: Vec<&str> = got.iter().map(|(e, _)| e.path.as_str()).collect();
        assert_eq!(paths, ["e2b-ab", "e2b-ab/app", "e2b-ab/app/l", "e2b-ab/app/sub", "e2b-ab/app/sub/a.txt"]);
        let (file, content) = &got[4];
        assert_eq!((file.kind, file.mode, file.size), (ContextEntryKind::File, 0o640, Some(2)));
        assert_eq!(file.sha256.as_deref(), Some(hex::encode(Sha256::digest(b"hi")).as_str()));
        assert_eq!(std::fs::read(content.as_ref().unwrap()).unwrap(), b"hi");
        assert_eq!(got[2].0.target.as_deref(), Some("sub/a.txt"));

        // A path out of the archive's root, and a hard link, are refused.
        let out = archive(dir.path(), |b| {
            let mut h = header(tar::EntryType::Regular, 1, 0o644);
            h.as_gnu_mut().unwrap().name[..7].copy_from_slice(b"../evil");
            h.set_cksum();
            b.append(&h, &b"x"[..]).unwrap();
        });
        assert!(unpack(&out, dir.path(), "e2b-ab").is_err());
        let hard = archive(dir.path(), |b| {
            b.append_link(&mut header(tar::EntryType::Link, 0, 0o644), "h", "app/sub/a.txt").unwrap();
        });
        assert!(unpack(&hard, dir.path(), "e2b-ab").unwrap_err().contains("only files, directories"));
    }
}
