#!/usr/bin/env bash
# Debian packages Lizard needs on the host: QEMU (the VMM; see below), qemu-img (disk overlays),
# mmdebstrap + e2fsprogs (template images), apt's download of the guest kernel; Node.js and
# python3-venv for the SDK test suites (scripts/test-sdk.sh); iproute2 + nftables (sandbox
# networks: namespaces, veth/TAP links, NAT and firewall); chromium for the desktop
# template's live-view test and the web console's browser tests (a real headless browser
# on the host); npm (beside Node.js) to build the web console (crates/lizard-console);
# tmux for the test of `lizard sandbox shell` (a real terminal it drives with send-keys and
# reads with capture-pane).
set -euo pipefail
need=(mmdebstrap e2fsprogs cpio ca-certificates curl python3-venv nodejs iproute2 nftables chromium tmux)
# Debian's nodejs comes without npm (its own package); other builds of nodejs carry it.
command -v npm >/dev/null || need+=(npm)
export DEBIAN_FRONTEND=noninteractive

# QEMU on Debian 12 comes from its backports (QEMU 10; bookworm's own is 7.2): its TCG
# finds translated guest code by physical address, so a process whose libraries land at
# new addresses (ASLR) reuses the code translated for the one before, and every command
# after a VMM's first one spawns in about half the time (docs/performance.md). The suite
# is added on the mirror apt already uses for bookworm; other releases take their own.
# shellcheck disable=SC1091
. /etc/os-release
qemu_from=
if [ "${VERSION_CODENAME:-}" = bookworm ]; then
  qemu_from=bookworm-backports
  sources="$(apt-cache policy)"
  if ! grep -q " $qemu_from/main " <<<"$sources"; then
    mirror="$(awk '$3 == "bookworm/main" { print $2; exit }' <<<"$sources")"
    [ -n "$mirror" ] || { echo "apt has no bookworm mirror to add $qemu_from (QEMU) from" >&2; exit 1; }
    echo "deb $mirror $qemu_from main" >"/etc/apt/sources.list.d/lizard-$qemu_from.list"
    echo "==> adding $qemu_from to apt's sources, for QEMU"
    apt-get update -q
  fi
fi

missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The kernel download needs apt's package lists even when nothing is missing.
if [ ${#missing[@]} -gt 0 ] || ! apt-cache show linux-image-cloud-amd64 >/dev/null 2>&1; then
  apt-get update -q
fi
if [ ${#missing[@]} -gt 0 ]; then
  # The whole list, not only what is missing: apt resolves the list as a whole.
  apt-get install -y -q --no-install-recommends "${need[@]}"
fi

# QEMU and qemu-utils of one version, the one wanted (backports' where it is used): a
# qemu-utils of another version breaks qemu-system-common, and apt never downgrades by
# itself.
if [ -n "$qemu_from" ]; then
  qemu="$(apt-cache madison qemu-system-x86 | awk -v from="$qemu_from/" 'index($6, from) == 1 { print $3; exit }')"
else
  qemu="$(apt-cache policy qemu-system-x86 | awk '/Candidate:/ { print $2 }')"
fi
[ -n "$qemu" ] && [ "$qemu" != "(none)" ] || { echo "apt offers no qemu-system-x86" >&2; exit 1; }
for p in qemu-system-x86 qemu-utils; do
  if [ "$(dpkg-query -W -f='${Status} ${Version}' "$p" 2>/dev/null)" != "install ok installed $qemu" ]; then
    echo "==> installing QEMU $qemu"
    if [ -n "$qemu_from" ]; then
      # The suite as the target release, not `pkg/suite`: that form takes only the named
      # packages from it, and their dependencies (qemu-system-common, -data, seabios) must
      # come from it too.
      apt-get install -y -q --no-install-recommends --allow-downgrades -t "$qemu_from" qemu-system-x86 qemu-utils
    else
      apt-get install -y -q --no-install-recommends --allow-downgrades qemu-system-x86 "qemu-utils=$qemu"
    fi
    break
  fi
done
command -v cargo >/dev/null || { echo "cargo (Rust >= 1.85) is required: https://rustup.rs" >&2; exit 1; }
# cargo-nextest runs the tests: scripts/test.sh compiles the workspace once and picks each
# phase's tests from that build with nextest's filter expressions.
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "==> installing cargo-nextest (compiled from crates.io, a few minutes)"
  cargo install --locked cargo-nextest
fi
