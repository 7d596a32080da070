#!/usr/bin/env bash
# Debian packages Lizard needs on the host: QEMU (the VMM), qemu-img (disk overlays),
# mmdebstrap + e2fsprogs (template images), apt's download of the guest kernel; Node.js and
# python3-venv for the SDK test suites (scripts/test-sdk.sh); iproute2 + nftables (sandbox
# networks: namespaces, veth/TAP links, NAT and firewall); chromium for the desktop
# template's live-view test and the web console's browser tests (a real headless browser
# on the host); npm (beside Node.js) to build the web console (crates/lizard-console);
# tmux for the test of `lizard sandbox shell` (a real terminal it drives with send-keys and
# reads with capture-pane).
set -euo pipefail
need=(qemu-system-x86 qemu-utils mmdebstrap e2fsprogs cpio ca-certificates curl python3-venv nodejs iproute2 nftables chromium tmux)
# Debian's nodejs comes without npm (its own package); other builds of nodejs carry it.
command -v npm >/dev/null || need+=(npm)
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The kernel download needs apt's package lists even when nothing is missing.
if [ ${#missing[@]} -gt 0 ] || ! apt-cache show linux-image-cloud-amd64 >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
fi
if [ ${#missing[@]} -gt 0 ]; then
  # The whole list, not only what is missing: apt resolves the list as a whole. qemu-utils
  # is pinned to the version of the QEMU being installed: a newer one already there (from
  # backports, whose source may be gone) breaks qemu-system-common, and apt never
  # downgrades by itself.
  qemu="$(apt-cache policy qemu-system-x86 | awk '/Candidate:/ { print $2 }')"
  pinned=()
  for p in "${need[@]}"; do
    if [ "$p" = qemu-utils ] && [ -n "$qemu" ] && [ "$qemu" != "(none)" ]; then
      pinned+=("qemu-utils=$qemu")
    else
      pinned+=("$p")
    fi
  done
  apt-get install -y -q --no-install-recommends --allow-downgrades "${pinned[@]}"
fi
command -v cargo >/dev/null || { echo "cargo (Rust >= 1.85) is required: https://rustup.rs" >&2; exit 1; }
