//! Builds `preload/readonly_memory.rs` into the shared object `jail::preload` embeds: a
//! `no_std` cdylib that QEMU loads (Cargo cannot build a cdylib for a crate's own use).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let source = "preload/readonly_memory.rs";
    println!("cargo:rerun-if-changed={source}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    let status = Command::new(rustc)
        .args(["--edition=2021", "--crate-type=cdylib", "--crate-name=lizard_readonly_memory"])
        .args(["-Copt-level=2", "-Cpanic=abort", "-Cdebuginfo=0", "--target", &target, "-o"])
        .arg(out.join("readonly_memory.so"))
        .arg(source)
        .status()
        .expect("run rustc for the QEMU preload library");
    assert!(status.success(), "rustc failed to build {source}");
}
