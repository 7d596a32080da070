//! The `lizard` binary, built in this crate so that the attack tests can start it as
//! `CARGO_BIN_EXE_lizard-under-attack` (Cargo offers a binary only to its own crate's tests).

fn main() {
    lizard_cli::main()
}
