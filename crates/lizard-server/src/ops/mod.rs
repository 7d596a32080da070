//! The control plane's operations on sandboxes and volumes, below HTTP: what a request,
//! the timeout reaper and the billing pauser all call. Each takes the
//! [`crate::state::AppState`] and records already authorized by the caller (the routes
//! check keys and scopes in [`crate::api`]), keeps the store and the node in step, and
//! answers [`crate::error::AppError`]s with stable codes.
//!
//! Nodes are reached only through [`lizard_node_client::NodeClient`], found by
//! [`crate::placement`].

pub mod code;
pub mod exec;
pub mod hooks;
pub mod lifecycle;
pub mod node_events;
pub mod sandboxes;
pub mod services;
pub mod snapshots;
pub mod templates;
pub mod timeouts;
pub mod volumes;

#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tests_shared_blobs;
#[cfg(test)]
mod tests_templates;
