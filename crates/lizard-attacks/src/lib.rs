//! The attack suite's harness. Each test under `tests/` attacks a real `lizard server`
//! process ([`system::System`]: its own data directory, loopback ports and network
//! prefix, the suite's cached guest images) the way a hostile guest, tenant or client
//! would, and asserts that nothing got through — and, after faults, that nothing was
//! left behind ([`leftovers`]).
//!
//! Network rule: attacks send packets only to loopback and to namespaces a test creates.

pub mod confine;
pub mod control;
pub mod leftovers;
pub mod net;
pub mod system;
