//! The wire of E2B's published SDKs, as Lizard's E2B face speaks it: plain data and the
//! framing of the Connect protocol, no machinery. The server translates these to its own
//! operations (`lizard-server`'s `e2b` module); nothing here knows a sandbox.
//!
//! - [`rest`]: the control plane's JSON (`/v2/sandboxes`, `/sandboxes/{id}`…) and its
//!   `{"code": <int>, "message"}` error body;
//! - [`connect`]: Connect's envelopes and errors (JSON codec, unary and server streams);
//! - [`files`]: the signatures of `/files` URLs that need no header;
//! - [`process`], [`filesystem`]: envd's messages in proto3 JSON form (lowerCamelCase
//!   names, `int64` as strings, enums by name, bytes as base64);
//! - [`templates`]: the Template SDK's build requests, file uploads and build status.

pub mod connect;
pub mod files;
pub mod filesystem;
pub mod process;
pub mod rest;
pub mod templates;

/// The envd version Lizard reports: the highest whose feature gates the SDKs check are
/// all served (`stdin` on Start, the default user, `CloseStdin`, raw and gzip uploads,
/// file metadata; 0.6.3's entries in watch events are not).
pub const ENVD_VERSION: &str = "0.6.2";
/// The guest port E2B's SDKs address envd at.
pub const ENVD_PORT: u16 = 49983;
