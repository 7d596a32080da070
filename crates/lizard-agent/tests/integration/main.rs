//! The agent in dev mode on the host, over its real protocol: exec, files, the forwarder,
//! processes, staged transfers and tunnels (no root, no QEMU).
//!
//! One test binary for all of them: each file is a module, so the crate links once.

#[path = "../common/mod.rs"]
mod common;

mod exec;
mod files;
mod forward;
mod large_file;
mod processes;
mod staged;
mod tunnel;
