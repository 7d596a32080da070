#!/usr/bin/env bash
# Set up Lizard on this machine (as root) and start it: host packages, release build,
# guest images, then `lizard server` (API on 127.0.0.1:7171, sandbox URLs on :7172).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
./scripts/build-agent.sh >/dev/null
cargo build --release -p lizard-cli
install -m 0755 target/release/lizard /usr/local/bin/lizard
install -m 0755 target/x86_64-unknown-linux-gnu/release/lizard-agent /usr/local/bin/lizard-agent
# The static API-client `lizard` every guest gets (found next to the agent).
install -m 0755 target/x86_64-unknown-linux-gnu/release/lizard /usr/local/bin/lizard-guest
# Every built-in by default; LIZARD_TEMPLATES="base code-interpreter-v1" builds only those
# (the others are then built by `lizard images build NAME`, while the server runs or not).
# shellcheck disable=SC2086
lizard images build ${LIZARD_TEMPLATES:-}

data=/var/lib/lizard
api=http://127.0.0.1:7171
if curl -fsS "$api/health" >/dev/null 2>&1; then
  echo "Lizard is already running at $api"
  exit 0
fi
# The first start prints the owner's key on stdout, once: catch it in a private file,
# show it, and delete the file (only the key's hash is kept by the server).
first=$(mktemp)
setsid lizard --data-dir "$data" server >"$first" 2>>"$data/server.log" </dev/null &
for _ in $(seq 1 300); do
  curl -fsS "$api/health" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS "$api/health" >/dev/null || { echo "lizard server did not start; see $data/server.log" >&2; rm -f "$first"; exit 1; }
key=$(grep -m1 '^LIZARD_API_KEY=' "$first" || true)
rm -f "$first"
echo "Lizard is running: API $api, sandbox URLs http://<id>-<port>.sandbox.local.lizard.localhost:7172"
if [ -n "$key" ]; then
  echo "Owner key (shown once, store it now):"
  echo "  export LIZARD_API_URL=$api $key"
fi
