//! The many-machines suite: a real PostgreSQL, two `lizard server` replicas and two
//! `lizard node` processes on one host, driven over HTTP and faulted with SIGKILL.
//!
//! One test binary for all of them: each file is a module, so the crate links once.

mod fleet;
mod pushed_files;
mod sdk_examples;
