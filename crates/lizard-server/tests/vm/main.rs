//! The control plane with real microVMs: billing, processes, a remote node over TCP,
//! sandboxes and volumes.
//!
//! One test binary for all of them: each file is a module, so the crate links once.

#[path = "../common/mod.rs"]
mod common;

mod billing;
mod processes;
mod remote_node;
mod sandboxes;
mod volumes;
