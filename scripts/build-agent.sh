#!/usr/bin/env bash
# Build the guest agent as a static (static-pie) x86_64 binary and print its path.
# The same build makes the static API-client `lizard` (no node, no server) next to it, which
# every guest gets at /usr/local/bin/lizard (the initramfs carries it; see lizard-node).
# glibc's crt-static is used because the musl target is not available on our machines;
# the agent avoids NSS/dlopen, so the static binary runs on a bare initramfs.
#
# The two binaries are kept per machine (LIZARD_BUILD_CACHE, default /var/cache/lizard),
# keyed by everything the build reads: the toolchain, the lockfile and workspace manifest,
# this script, the compiler flags from the environment and every file of the workspace
# crates the two are made of. A clean clone whose agent and CLI sources are unchanged
# takes them from there instead of compiling for two minutes; any change builds again.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
target=x86_64-unknown-linux-gnu
flags="-C target-feature=+crt-static"
out="${CARGO_TARGET_DIR:-$root/target}/$target/release"
binaries=(lizard-agent lizard)
cache="${LIZARD_BUILD_CACHE:-/var/cache/lizard}/agent"

# The workspace crates the agent and the in-guest CLI are built from (their directories).
crate_dirs() {
  cargo tree -p lizard-agent -p lizard-cli --no-default-features --target "$target" \
    -e normal,build --prefix none --format '{p}' 2>/dev/null |
    sed -n "s|^[^ ]* v[^ ]* (\(${root}/[^)]*\)).*|\1|p" | sort -u
}
build_key() {
  local dirs
  dirs="$(crate_dirs)"
  [ -n "$dirs" ] || return 1
  {
    rustc -vV
    cargo -V
    echo "$flags"
    env | grep -E '^(RUSTFLAGS|CARGO_ENCODED_RUSTFLAGS|CARGO_BUILD_|CARGO_PROFILE_)' | sort || true
    sha256sum scripts/build-agent.sh Cargo.lock Cargo.toml
    find .cargo rust-toolchain rust-toolchain.toml -maxdepth 1 -type f 2>/dev/null | sort | xargs -r sha256sum
    # Paths relative to the checkout: a clone elsewhere (CI's) with the same sources has the same key.
    for dir in $dirs; do
      (cd "$dir" && find . -type f -not -path './target/*' -print0 | sort -z | xargs -0 -r sha256sum | sed "s|^|${dir#"$root"/} |")
    done
  } | sha256sum | cut -c1-32
}

key="$(build_key || true)"
if [ -n "$key" ] && [ -x "$cache/$key/lizard-agent" ] && [ -x "$cache/$key/lizard" ]; then
  echo "static agent and in-guest CLI: kept build $cache/$key (sources unchanged)" >&2
  mkdir -p "$out"
  for bin in "${binaries[@]}"; do
    # Renamed into place: a running copy of the old file is not disturbed.
    cp "$cache/$key/$bin" "$out/.$bin.tmp" && mv -f "$out/.$bin.tmp" "$out/$bin"
  done
  touch "$cache/$key"
else
  CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="$flags" \
    cargo build -p lizard-agent -p lizard-cli --no-default-features --release --target "$target" >&2
  if [ -n "$key" ] && mkdir -p "$cache" 2>/dev/null; then
    staging="$(mktemp -d "$cache/.new.XXXXXX")"
    chmod 755 "$staging"
    for bin in "${binaries[@]}"; do cp "$out/$bin" "$staging/"; done
    rm -rf "${cache:?}/$key"
    mv "$staging" "$cache/$key"
    # The four most recent builds stay (≈ 30 MB each).
    find "$cache" -mindepth 1 -maxdepth 1 -type d -not -name '.*' -printf '%T@ %p\n' | sort -rn | tail -n +5 | cut -d' ' -f2- |
      xargs -r rm -rf
  fi
fi
echo "$out/lizard-agent"
