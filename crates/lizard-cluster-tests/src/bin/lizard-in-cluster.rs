//! The `lizard` binary, built in this crate so that its tests can start replicas and node
//! agents as separate processes.

fn main() {
    lizard_cli::main()
}
