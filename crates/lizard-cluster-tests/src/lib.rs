//! The many-machines suite's harness: a [`fleet::Fleet`] of `lizard server` replicas on a
//! PostgreSQL database of its own and `lizard node join` agents, all real processes on this
//! host, with the host's own view of what each node left behind.
//!
//! Network rule: everything listens and connects on loopback; guests' packets stay in the
//! namespaces their nodes made.

pub mod balancer;
pub mod database;
pub mod fleet;
pub mod process;
