//! Builds the real kernel and an initramfs from Debian's package (needs apt and the network
//! to the Debian mirror; takes a few seconds cold).

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

use std::path::Path;
use std::time::{Duration, Instant};

use lizard_image::{read_newc, ImageStore, MODULES_ORDER_PATH};

#[test]
fn builds_kernel_and_initramfs_then_hits_the_cache() {
    let data = tempfile::tempdir().unwrap();

    // Two concurrent callers: the lock makes one build and the other reuse it.
    let started = Instant::now();
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| ImageStore::new(data.path()).kernel());
        let b = s.spawn(|| ImageStore::new(data.path()).kernel());
        (a.join().unwrap().unwrap(), b.join().unwrap().unwrap())
    });
    eprintln!("cold kernel build: {:?}", started.elapsed());
    assert_eq!(a, b);
    let kernel = a;

    let vmlinux = std::fs::read(&kernel.vmlinux).unwrap();
    assert!(vmlinux.starts_with(b"\x7fELF"), "vmlinux is an ELF file");
    assert!(kernel.version.ends_with("-cloud-amd64"), "{}", kernel.version);
    assert_eq!(kernel.vmlinux, data.path().join("images/kernel").join(&kernel.package_version).join("vmlinux"));
    let names: Vec<_> = kernel.modules.iter().map(|m| m.name.as_str()).collect();
    for wanted in lizard_image::WANTED_MODULES {
        assert!(names.contains(wanted), "{wanted} missing from {names:?}");
    }

    let store = ImageStore::new(data.path());
    let started = Instant::now();
    let agent = Path::new("/bin/true");
    let initramfs = store.initramfs(&kernel, agent).unwrap();
    eprintln!("cold initramfs build: {:?}", started.elapsed());

    let entries = read_newc(&std::fs::read(&initramfs.path).unwrap()).unwrap();
    let init = entries.iter().find(|e| e.path == "init").expect("/init");
    assert_eq!(init.mode, 0o100_755);
    assert_eq!(init.data, std::fs::read(agent).unwrap());
    let order = entries.iter().find(|e| e.path == MODULES_ORDER_PATH.trim_start_matches('/')).expect("modules.order");
    let order = String::from_utf8(order.data.clone()).unwrap();
    let pos = |m: &str| {
        order.lines().position(|l| l == format!("/lib/modules/{m}.ko")).unwrap_or_else(|| panic!("{m} not in {order}"))
    };
    assert!(pos("virtio_ring") < pos("virtio"), "{order}");
    assert!(pos("virtio") < pos("virtio_mmio"), "{order}");
    assert!(pos("vsock") < pos("vmw_vsock_virtio_transport"), "{order}");
    for line in order.lines() {
        let file = line.trim_start_matches('/');
        assert!(entries.iter().any(|e| e.path == file), "{line} is listed but not in the archive");
    }

    // Unchanged inputs: cache hits with the same hashes. A fresh store asks apt once
    // (about half a second on hosts with apt's binary cache disabled) ...
    let started = Instant::now();
    assert_eq!(store.kernel().unwrap(), kernel);
    eprintln!("warm kernel, fresh store: {:?}", started.elapsed());
    assert!(started.elapsed() < Duration::from_secs(10));

    // ... and then reuses the answer, so a hit costs milliseconds.
    let started = Instant::now();
    let kernel2 = store.kernel().unwrap();
    let initramfs2 = store.initramfs(&kernel2, agent).unwrap();
    let warm = started.elapsed();
    eprintln!("warm kernel + initramfs: {warm:?}");
    assert_eq!(kernel2, kernel);
    assert_eq!(initramfs2, initramfs);
    assert!(warm < Duration::from_millis(500), "cache hit took {warm:?}");
}
