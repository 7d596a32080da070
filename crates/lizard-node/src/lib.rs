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
//! - [`http`]: the node's HTTP API over a [`Node`] (a Unix socket in local mode; TCP
//!   behind the node's credential for a cluster's node agent).
//! - `node`: [`Node`] — create, pause, resume, fork, kill, volumes, restart recovery.
//! - `sandbox`: [`Sandbox`] — one sandbox's identity and state, and operations inside
//!   its guest (exec, files, tunnels).
//! - [`snapshot`]: template snapshots (one cold boot, then every create restores).
//! - `start`: a template's start command in a guest, and its readiness check.
//! - [`templates`]: node templates (built-in or built) and the registry of built ones.
//! - `layer_store`: built templates' disk layers, their locks and their collection.
//! - `vm`: the VM layer — run directory, VM shape and kernel command line, disk
//!   overlays, boot/restore/load/save, the agent handshake.
//! - [`network`]: per-sandbox network namespaces (links, firewall, DNS relay).
//! - [`volumes`]: volume disk images. [`assets`]: kernel, initramfs and template images.
//! - `guest_steps`: a build step inside the build VM (commands, copies, sync).
//! - `forward`: guest → control-plane API connections.
//! - `sealed`: the node's key for what it keeps on disk but never in plain text.
//! - [`confine`]: whether VMMs run jailed, admission by CPUs and memory, sandbox sizes.
//! - `config`: [`NodeConfig`] and its defaults.
//! - `error`: [`NodeError`] and the typed errors it wraps, with their API codes.

pub mod assets;
mod config;
pub mod confine;
mod error;
pub mod forward;
mod guest_steps;
pub mod http;
mod layer_store;
mod lock_file;
pub mod network;
mod node;
mod sandbox;
mod sealed;
pub mod snapshot;
mod start;
pub mod templates;
mod vm;
pub mod volumes;

pub use config::{
    default_agent_bin, default_data_dir, default_guest_cli, shared_image_root, NodeConfig, DEFAULT_DISK_HEADROOM,
};
pub use error::{BootCause, BootError, BuildError, EndReason, NodeError, Result, SnapshotError, StartError};
pub use lizard_agent_client::WriteOptions;
pub use lizard_vmm::Accel;
pub use node::{BuildTemplate, BuiltTemplate, Node, MAX_FORKS};
pub use sandbox::{Live, ProcessFrameStream, Sandbox, TransferStats};
pub use start::START_LOG;
