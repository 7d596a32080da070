#!/usr/bin/env bash
# Set up Lizard on this machine (as root) and start it:
# host packages, release build, guest images, then the node daemon.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
./scripts/build-agent.sh >/dev/null
cargo build --release -p lizard-cli
install -m 0755 target/release/lizard /usr/local/bin/lizard
install -m 0755 target/x86_64-unknown-linux-gnu/release/lizard-agent /usr/local/bin/lizard-agent
lizard images build
if ! lizard sandbox list >/dev/null 2>&1; then
  echo "lizard: could not reach the local node; see /var/lib/lizard/node.log" >&2
  exit 1
fi
echo "Lizard is running. Try: id=\$(lizard sandbox create base) && lizard sandbox exec \$id -- uname -a"
