//! The `lizard` command without microVMs: its arguments, the control plane in-process and as
//! `lizard server`, and the operator's `lizard node` commands against real node agents.
//!
//! One test binary for all of them: each file is a module, so the crate links once.

#[path = "../common/cluster.rs"]
mod cluster;
#[path = "../common/mod.rs"]
mod common;

mod args;
mod node_ops;
mod server_mode;
