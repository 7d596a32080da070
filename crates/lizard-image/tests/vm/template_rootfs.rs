//! Builds real template root filesystems with mmdebstrap (about a minute each, needs root
//! and the Debian mirror). Set `LIZARD_TEST_DATA_DIR` to share one build across the test
//! suite; otherwise each run builds into a temporary directory.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use lizard_image::{ImageStore, HOST_CA_BUNDLE};

/// The shared data directory, or a temporary one kept alive by the returned guard.
fn data_dir() -> (PathBuf, Option<tempfile::TempDir>) {
    match std::env::var_os("LIZARD_TEST_DATA_DIR") {
        Some(dir) => (PathBuf::from(dir), None),
        None => {
            let tmp = tempfile::tempdir().unwrap();
            (tmp.path().to_owned(), Some(tmp))
        }
    }
}

/// Reads a file out of an ext4 image without mounting it.
fn debugfs(image: &Path, request: &str) -> String {
    let out = Command::new("debugfs").arg("-R").arg(request).arg(image).output().expect("debugfs (e2fsprogs)");
    assert!(out.status.success(), "debugfs {request}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Builds the Debian root at the bottom of the built-in `base` and checks what every
/// template's root must hold, and the cache hit. (The built-ins' steps run in build VMs:
/// lizard-node's tests check the finished templates.)
#[test]
fn builds_the_debian_root_of_base() {
    let (data, _guard) = data_dir();
    let store = ImageStore::new(&data);
    let recipe = ImageStore::builtin_recipe("base").unwrap();
    let lizard_recipe::Base::Debian(debian) = &recipe.from else { panic!("base starts from Debian") };
    let started = Instant::now();
    let image = store.debian_base(debian, recipe.build.disk_gb).unwrap();
    eprintln!("debian {}: {:?} (cold unless cached in {})", debian.debian, started.elapsed(), data.display());

    assert_eq!(image.rootfs, data.join("images/debian").join(&image.hash).join("rootfs.ext4"));
    assert_eq!(std::fs::metadata(&image.rootfs).unwrap().len(), u64::from(recipe.build.disk_gb) << 30);
    assert_eq!(debugfs(&image.rootfs, "cat /etc/hostname"), "lizard\n");
    assert_eq!(debugfs(&image.rootfs, "cat /etc/machine-id"), "");
    assert!(debugfs(&image.rootfs, "cat /etc/hosts").contains("localhost"));
    let guest_bundle = debugfs(&image.rootfs, "cat /etc/ssl/certs/ca-certificates.crt");
    assert_eq!(guest_bundle, std::fs::read_to_string(HOST_CA_BUNDLE).unwrap(), "host CA bundle installed");
    let lists = debugfs(&image.rootfs, "ls /var/lib/apt/lists");
    assert!(!lists.contains("InRelease") && !lists.contains("Packages"), "apt lists left: {lists}");
    let bin = debugfs(&image.rootfs, "ls /usr/bin");
    for tool in ["bash", "node", "npm", "curl", "git", "ps", "ip", "python3.14"] {
        assert!(bin.split_whitespace().any(|f| f == tool), "/usr/bin/{tool} missing");
    }
    // apt inside a build VM follows the options mmdebstrap was given.
    assert!(debugfs(&image.rootfs, "cat /etc/apt/apt.conf.d/99mmdebstrap").contains("Check-Valid-Until"));
    assert!(!debugfs(&image.rootfs, "ls /usr/lib/python3.14").contains("EXTERNALLY-MANAGED"), "pip may install");

    let started = Instant::now();
    assert_eq!(store.debian_base(debian, recipe.build.disk_gb).unwrap(), image);
    assert!(started.elapsed() < Duration::from_secs(1), "cache hit took {:?}", started.elapsed());
}
