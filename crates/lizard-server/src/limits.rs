//! Bounds on every buffer whose size a client or a guest decides, checked before the
//! server holds it.
//!
//! - **Create**: `env` and `metadata` entries are counted and sized. The sandbox's `env`
//!   travels with every exec in one frame of at most [`lizard_agent_proto::frame::MAX_FRAME`]
//!   bytes (1 MiB) of JSON, where escaping can make a byte six; with [`MAX_ENV_BYTES`] for
//!   the sandbox's and [`MAX_EXEC_REQUEST_BYTES`] for an exec's own fields, that frame
//!   stays under 6 × 128 KiB = 768 KiB.
//! - **Exec**: a non-streamed exec buffers the command's output; past
//!   [`MAX_EXEC_OUTPUT_BYTES`] (stdout and stderr together) it answers `OUTPUT_TOO_LARGE`
//!   and the client should stream (`?stream=true`), which holds no output in the server.
//! - Request bodies are bounded by axum's default limit (2 MB; pushes have their own);
//!   file reads and writes stream without buffering.

use crate::error::{ApiResult, AppError};
use lizard_api::ExecRequest;
use std::collections::BTreeMap;

/// Most `env` entries at create.
pub const MAX_ENV_ENTRIES: usize = 256;
/// Most bytes of `env` names and values together, at create.
pub const MAX_ENV_BYTES: usize = 64 * 1024;
/// Longest `env` or `metadata` name.
pub const MAX_KEY_BYTES: usize = 256;
/// Most `metadata` entries.
pub const MAX_METADATA_ENTRIES: usize = 64;
/// Longest `metadata` value.
pub const MAX_METADATA_VALUE_BYTES: usize = 4096;
/// Most bytes of an exec's `cmd`, `argv`, `cwd`, `user` and `env` together (its `stdin`
/// is sent in frames of its own).
pub const MAX_EXEC_REQUEST_BYTES: usize = 64 * 1024;
/// Most output (stdout + stderr) a non-streamed exec collects: 16 MiB.
pub const MAX_EXEC_OUTPUT_BYTES: usize = 16 * 1024 * 1024;

// The worst-case exec start frame (every byte escaped as \uXXXX: six bytes of JSON each)
// fits one agent frame.
const _: () = assert!(6 * (MAX_ENV_BYTES + MAX_EXEC_REQUEST_BYTES) < lizard_agent_proto::frame::MAX_FRAME);

/// 422 unless `env` fits the create bounds.
pub fn check_env(env: &BTreeMap<String, String>) -> ApiResult<()> {
    if env.len() > MAX_ENV_ENTRIES {
        return Err(AppError::invalid(format!("env has {} entries; at most {MAX_ENV_ENTRIES}", env.len())));
    }
    check_keys("env", env.keys())?;
    let total: usize = env.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > MAX_ENV_BYTES {
        return Err(AppError::invalid(format!("env names and values total {total} bytes; at most {MAX_ENV_BYTES}")));
    }
    Ok(())
}

/// 422 unless `metadata` fits its bounds.
pub fn check_metadata(metadata: &BTreeMap<String, String>) -> ApiResult<()> {
    if metadata.len() > MAX_METADATA_ENTRIES {
        return Err(AppError::invalid(format!(
            "metadata has {} entries; at most {MAX_METADATA_ENTRIES}",
            metadata.len()
        )));
    }
    check_keys("metadata", metadata.keys())?;
    if let Some((k, v)) = metadata.iter().find(|(_, v)| v.len() > MAX_METADATA_VALUE_BYTES) {
        return Err(AppError::invalid(format!(
            "metadata value of {k:?} has {} bytes; at most {MAX_METADATA_VALUE_BYTES}",
            v.len()
        )));
    }
    Ok(())
}

/// 422 unless an exec's own fields fit [`MAX_EXEC_REQUEST_BYTES`].
pub fn check_exec(req: &ExecRequest) -> ApiResult<()> {
    check_keys("env", req.env.keys())?;
    let len = |s: &Option<String>| s.as_ref().map_or(0, String::len);
    let total = len(&req.cmd)
        + req.argv.iter().flatten().map(String::len).sum::<usize>()
        + len(&req.cwd)
        + len(&req.user)
        + req.env.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
    if total > MAX_EXEC_REQUEST_BYTES {
        return Err(AppError::invalid(format!(
            "the command, its arguments and env total {total} bytes; at most {MAX_EXEC_REQUEST_BYTES} \
             (pass large input as stdin or a file)"
        )));
    }
    Ok(())
}

fn check_keys<'a>(what: &str, mut keys: impl Iterator<Item = &'a String>) -> ApiResult<()> {
    match keys.find(|k| k.is_empty() || k.len() > MAX_KEY_BYTES) {
        Some(k) if k.is_empty() => Err(AppError::invalid(format!("{what} names must not be empty"))),
        Some(k) => Err(AppError::invalid(format!("{what} name of {} bytes; at most {MAX_KEY_BYTES}", k.len()))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lizard_api::ErrorCode;

    fn map(entries: &[(&str, String)]) -> BTreeMap<String, String> {
        entries.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    }

    #[test]
    fn env_and_metadata_are_bounded() {
        assert!(check_env(&map(&[("A", "x".repeat(1000))])).is_ok());
        let big = check_env(&map(&[("A", "x".repeat(1_500_000))])).unwrap_err();
        assert_eq!(big.code(), ErrorCode::InvalidArgument);
        let many: BTreeMap<String, String> = (0..=MAX_ENV_ENTRIES).map(|i| (format!("K{i}"), String::new())).collect();
        assert!(check_env(&many).is_err());
        assert!(check_env(&map(&[("", "x".into())])).is_err());
        assert!(check_env(&map(&[(&"K".repeat(MAX_KEY_BYTES + 1), "x".into())])).is_err());
        assert!(check_metadata(&map(&[("owner", "me".into())])).is_ok());
        assert!(check_metadata(&map(&[("owner", "x".repeat(MAX_METADATA_VALUE_BYTES + 1))])).is_err());
        let many: BTreeMap<String, String> =
            (0..=MAX_METADATA_ENTRIES).map(|i| (format!("K{i}"), String::new())).collect();
        assert!(check_metadata(&many).is_err());
    }

    #[test]
    fn an_execs_own_fields_are_bounded_but_not_its_stdin() {
        let ok = ExecRequest { cmd: Some("echo".into()), stdin: Some("x".repeat(1_000_000)), ..Default::default() };
        assert!(check_exec(&ok).is_ok());
        let big = ExecRequest { cmd: Some("x".repeat(MAX_EXEC_REQUEST_BYTES + 1)), ..Default::default() };
        assert_eq!(check_exec(&big).unwrap_err().code(), ErrorCode::InvalidArgument);
    }
}
