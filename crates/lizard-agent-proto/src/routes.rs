//! The agent's HTTP/2 routes. Paths take the file path as the `path` query parameter.
//!
//! | method | path                | request body                | response body            |
//! |--------|---------------------|-----------------------------|--------------------------|
//! | GET    | [`HEALTH`]          | –                           | [`crate::types::Health`] |
//! | POST   | [`EXEC`]            | frames: Start, Stdin*, Eof  | frames: Stdout/Stderr*, Exit or Error |
//! | PUT    | [`FILES`]`?path=&mode=` | raw bytes (streamed)    | [`crate::types::WriteResult`] |
//! | GET    | [`FILES`]`?path=`   | –                           | raw bytes (streamed)     |
//! | DELETE | [`FILES`]`?path=`   | –                           | – (204), recursive       |
//! | GET    | [`FILES_LIST`]`?path=` | –                        | `[FileEntry]`            |
//! | POST   | [`FILES_MKDIR`]`?path=` | –                       | – (204), with parents    |
//!
//! Every failure answers with a 4xx/5xx status and a JSON [`crate::types::AgentError`].

pub const HEALTH: &str = "/v1/health";
pub const EXEC: &str = "/v1/exec";
pub const FILES: &str = "/v1/files";
pub const FILES_LIST: &str = "/v1/files/list";
pub const FILES_MKDIR: &str = "/v1/files/mkdir";

/// Content type of a framed exec stream.
pub const FRAMES_CONTENT_TYPE: &str = "application/vnd.lizard.frames";
