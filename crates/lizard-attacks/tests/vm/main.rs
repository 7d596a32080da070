//! The attack suite: a real `lizard server` with real microVMs, attacked as a hostile
//! tenant, guest and client would; every attack asserts that nothing got through.
//!
//! One test binary for all of them: each file is a module, so the crate links once.

mod builds;
mod confinement;
mod control_plane;
mod e2b;
mod full_disk;
mod guest_reach;
mod network;
mod proxy;
mod server_crash;
mod tenancy;
