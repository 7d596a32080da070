//! Builds (or finds in the cache) the guest artefacts and prints where they are.
//!
//! ```text
//! cargo run -p lizard-image --example build-images -- <data_dir> <agent_binary> [template...]
//! ```
//!
//! For each built-in named, this builds the Debian root at its bottom (its steps run in
//! build VMs: `lizard images build` does the whole template).
//!
//! ```text
//! ```
//!
//! Logs each build step with its duration (`RUST_LOG=debug` shows the tools it runs).

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args_os().skip(1);
    let (Some(data), Some(agent)) = (args.next(), args.next()) else {
        eprintln!("usage: build-images <data_dir> <agent_binary> [template...]");
        std::process::exit(2);
    };
    let store = lizard_image::ImageStore::new(PathBuf::from(data));
    let kernel = store.kernel()?;
    println!("kernel     {} ({}) {}", kernel.version, kernel.package_version, kernel.vmlinux.display());
    let initramfs = store.initramfs(&kernel, &PathBuf::from(agent))?;
    println!("initramfs  {}", initramfs.path.display());
    for name in args {
        let mut recipe = lizard_image::ImageStore::builtin_recipe(&name.to_string_lossy())?;
        while let lizard_recipe::Base::Template(parent) = &recipe.from {
            recipe = lizard_image::ImageStore::builtin_recipe(parent)?;
        }
        if let lizard_recipe::Base::Debian(debian) = &recipe.from {
            let image = store.debian_base(debian, recipe.build.disk_gb)?;
            println!("debian     {} {}", debian.debian, image.rootfs.display());
        }
    }
    Ok(())
}
