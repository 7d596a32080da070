//! The `lizard` command with real microVMs: the local node end to end, billing, restarts,
//! templates, services, the shell, observability and `lizard node join`.
//!
//! One test binary for all of them: each file is a module, so the crate links once.

#[path = "../common/cluster.rs"]
mod cluster;
#[path = "../common/mod.rs"]
mod common;

mod billing;
mod cli;
mod node_join;
mod observability;
mod server_restart;
mod services;
mod shell;
mod templates;
