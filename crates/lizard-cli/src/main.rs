//! The `lizard` binary; everything is in the `lizard_cli` library (so tests can reach the
//! argument → request mapping).

fn main() {
    lizard_cli::main()
}
