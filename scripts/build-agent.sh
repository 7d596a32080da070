#!/usr/bin/env bash
# Build the guest agent as a static (static-pie) x86_64 binary and print its path.
# The same build makes the static API-client `lizard` (no node, no server) next to it, which
# every guest gets at /usr/local/bin/lizard (the initramfs carries it; see lizard-node).
# glibc's crt-static is used because the musl target is not available on our machines;
# the agent avoids NSS/dlopen, so the static binary runs on a bare initramfs.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build -p lizard-agent -p lizard-cli --no-default-features --release --target x86_64-unknown-linux-gnu >&2
target_dir="${CARGO_TARGET_DIR:-$root/target}"
echo "$target_dir/x86_64-unknown-linux-gnu/release/lizard-agent"
