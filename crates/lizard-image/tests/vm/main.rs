//! Real guest images: the kernel and initramfs, and template root filesystems (root,
//! mmdebstrap, apt).
//!
//! One test binary for all of them: each file is a module, so the crate links once.

mod kernel_initramfs;
mod template_rootfs;
