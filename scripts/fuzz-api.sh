#!/usr/bin/env bash
# Property-based fuzzing of the HTTP API from its own OpenAPI document (schemathesis):
# a real `lizard server` on loopback with a fresh database; no answer may be a 5xx.
# Needs the images in $LIZARD_TEST_DATA_DIR and a built debug `lizard`.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/schemathesis-venv
if [ ! -x "$venv/bin/schemathesis" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q schemathesis
fi
data=$(mktemp -d)
ln -s "$(realpath "$LIZARD_TEST_DATA_DIR")/images" "$data/images"
# A free loopback port: nothing else on the machine may decide whether this runs.
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
target/debug/lizard --data-dir "$data" server --listen 127.0.0.1:$port --no-proxy >"$data/out" 2>"$data/err" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 1 100); do
  grep -q '^LIZARD_API_KEY=' "$data/out" 2>/dev/null && curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  sleep 0.2
done
key=$(sed -n 's/^LIZARD_API_KEY=//p' "$data/out")
[ -n "$key" ] || { echo "fuzz-api: the server did not start:" >&2; cat "$data/err" >&2; exit 1; }
# Hooks: scripts/fuzz_hooks.py (no endless log streams).
PYTHONPATH=scripts SCHEMATHESIS_HOOKS=fuzz_hooks "$venv/bin/schemathesis" run "http://127.0.0.1:$port/openapi.json" \
  -H "X-API-Key: $key" --checks not_a_server_error --max-examples 25 --request-timeout 120 \
  --seed 1 --no-color
