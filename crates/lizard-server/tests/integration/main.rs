//! The control plane without microVMs: HTTP, listeners, replicas on one database, the
//! route table against the OpenAPI document, key scopes (property tests) and the start
//! order.
//!
//! One test binary for all of them: each file is a module, so the crate links once.

#[path = "../common/mod.rs"]
mod common;

mod http;
mod listeners;
mod replicas;
mod routes;
mod scope_props;
mod startup;
