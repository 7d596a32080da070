//! A Lizard node: the machinery on one host that turns "create a sandbox from template T"
//! into a running microVM with its own kernel, root disk and authenticated agent channel.
//!
//! The node owns `<data_dir>/sandboxes/<id>/` for each sandbox (root disk overlay, VMM
//! sockets, console log, memory file) and deletes it when the sandbox ends, whichever way
//! it ends: killed, VMM crash (noticed by a monitor task), failed boot, or a node restart
//! (the next start sweeps what the previous process left).
//!
//! The HTTP face of a node is in [`http`]; the control plane embeds a [`Node`] directly.
//!
//! Modules, from the top down (each uses only those below it):
//!
//! - [`http`]: the node's HTTP API over a [`Node`].
//! - `node`: [`Node`] — create, pause, resume, fork, kill, volumes, restart recovery.
//! - `sandbox`: [`Sandbox`] — one sandbox's identity and state, and operations inside
//!   its guest (exec, files, tunnels).
//! - [`snapshot`]: template snapshots (one cold boot, then every create restores).
//! - `vm`: the VM layer — run directory, VM shape and kernel command line, disk
//!   overlays, boot/restore/load/save, the agent handshake.
//! - [`network`]: per-sandbox network namespaces (links, firewall, DNS relay).
//! - [`volumes`]: volume disk images. [`assets`]: kernel, initramfs and template images.
//! - `forward`: guest → control-plane API connections.
//! - `config`: [`NodeConfig`] and its defaults.
//! - `error`: [`NodeError`] and the typed errors it wraps, with their API codes.

pub mod assets;
mod config;
mod error;
mod forward;
pub mod http;
pub mod network;
mod node;
mod sandbox;
pub mod snapshot;
mod vm;
pub mod volumes;

pub use config::{default_agent_bin, default_data_dir, default_guest_cli, NodeConfig};
pub use error::{BootCause, BootError, EndReason, NodeError, Result, SnapshotError};
pub use lizard_vmm::Accel;
pub use node::{Node, MAX_FORKS};
pub use sandbox::{Live, Sandbox};
