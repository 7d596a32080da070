//! Many machines, server side: who may join and how a node proves who it is
//! ([`credentials`]), what joins, heartbeats and events write ([`membership`]), what the
//! operator sees and changes ([`operator`]), the expiry of nodes that stop answering
//! ([`expiry`]), and the leases that make one replica run each background job
//! ([`leader`]).
//!
//! State lives in the store ([`lizard_store::ClusterStore`]), so any replica answers any
//! node and any operator; nothing here is kept per process but the cluster key, read
//! from the store at start.

pub mod credentials;
pub mod expiry;
pub mod leader;
pub mod membership;
pub mod operator;

#[cfg(test)]
mod tests;
