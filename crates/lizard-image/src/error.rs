//! The one error type of this crate.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong while building or loading a guest artefact.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The template name is not one of [`crate::ImageStore::template_names`].
    #[error("unknown template {0:?} (known templates: {known})", known = crate::ImageStore::template_names().join(", "))]
    UnknownTemplate(String),

    /// A built-in recipe is malformed, or a Debian base names a bad suite or package.
    #[error("template recipe {name:?}: {reason}")]
    Recipe { name: String, reason: String },

    /// A file-system operation failed.
    #[error("{action} {path}: {cause}")]
    Io { action: &'static str, path: PathBuf, cause: io::Error },

    /// A host tool this crate shells out to is not installed.
    #[error("`{tool}` not found on this host; install it with `{install}`")]
    ToolMissing { tool: String, install: String },

    /// The operation needs root privileges this process lacks.
    #[error("{0} needs root privileges")]
    NeedsRoot(String),

    /// A host tool ran but failed.
    #[error("`{command}` failed ({status}): {output}")]
    Command {
        command: String,
        status: String,
        /// The tail of its stderr (or stdout when stderr is empty).
        output: String,
    },

    /// apt could not resolve or download the kernel package.
    #[error("apt: {0}")]
    Apt(String),

    /// The kernel image is not a bzImage we can unpack.
    #[error("cannot unpack the kernel image: {0}")]
    BzImage(String),

    /// The LZ4 payload of the kernel image is corrupt.
    #[error("LZ4 legacy stream: {0}")]
    Lz4(String),

    /// A kernel module is missing or its metadata is unreadable.
    #[error("kernel module: {0}")]
    Module(String),

    /// A cached artefact's metadata file is unreadable.
    #[error("cache metadata {path}: {reason}")]
    Metadata { path: PathBuf, reason: String },
}

impl ImageError {
    /// Wraps an [`io::Error`] with what we were doing and where.
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |cause| ImageError::Io { action, path, cause }
    }
}
