//! One node with real microVMs: sandboxes, transfers, lifecycle, processes, snapshots,
//! faults, ports, volumes, a full disk, the warm pool, networks, builds and built-ins.
//!
//! One test binary for all of them: each file is a module, so the crate links once.

#[path = "../common/mod.rs"]
mod common;

mod build;
mod builtins;
mod faults;
mod full_disk;
mod lifecycle;
mod network;
mod pool;
mod ports;
mod processes;
mod sandbox;
mod snapshots;
mod transfer;
mod volumes;
