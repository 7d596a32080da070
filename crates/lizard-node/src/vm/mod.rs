//! The VM layer: everything between "this VM should run" and a VMM process with an
//! authenticated agent on the other end of its channel — the run directory and its files,
//! the VM's shape and kernel command line, disk overlays, spawning, restoring and saving
//! VMs, and the agent handshake.
//!
//! Both [`crate::sandbox`] and [`crate::snapshot`] build on this layer, and it knows
//! neither of them: a template VM and a sandbox's VM are started the same way.

mod agent;
mod config;
mod disk;
mod launch;
mod qcow2;
mod run_dir;
mod saved;

pub(crate) use agent::{connect_agent, give_identity, RESTORED_HANDSHAKE};
pub(crate) use config::{probe_vm, sandbox_vm, Machine};
pub(crate) use disk::{create_overlay, create_overlay_naming, virtual_size};
pub(crate) use launch::{
    clone_template, cold_boot, delta_copy, identify, load_copy, restore_clone, resume_in_place, save_in_place, sigkill,
    spawn_clone, Launched,
};
pub(crate) use qcow2::backing_file;
pub(crate) use run_dir::{vmm_pid_of, write_secret, PLACEHOLDER_DISK, STAGING_DISK};
pub(crate) use saved::{discard_saved, link_base, saved_form, BASE_MEMORY};

pub use crate::error::{BootCause, BootError};
