#!/usr/bin/env bash
# The whole test suite: unit tests and integration tests that boot real microVMs.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
./scripts/build-agent.sh >/dev/null
# Guest images are shared by every test of the run (built once, cached by content hash).
export LIZARD_TEST_DATA_DIR="${LIZARD_TEST_DATA_DIR:-$PWD/target/lizard-test-data}"
export LIZARD_AGENT_BIN="$PWD/target/x86_64-unknown-linux-gnu/release/lizard-agent"
cargo build -p lizard-cli
target/debug/lizard --data-dir "$LIZARD_TEST_DATA_DIR" images build
# The API against its own OpenAPI document: no input may produce a 5xx.
./scripts/fuzz-api.sh
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast "$@"
else
  cargo test --workspace --no-fail-fast "$@"
fi
# The Python and TypeScript SDKs (every example of the reference) against a real server.
./scripts/test-sdk.sh
