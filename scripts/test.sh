#!/usr/bin/env bash
# The whole test suite (Debian 12, as root): unit tests, the integration tests that boot
# real microVMs or need root (each crate's `vm-tests` feature), the API fuzzer and the SDK
# suites. Plain `cargo test` runs only what needs neither root nor QEMU.
#
# Guest images are cached outside the checkout, keyed by content hash, in
# LIZARD_TEST_DATA_DIR (default /var/cache/lizard-test-data): a fresh clone reuses them.
#
#   scripts/test.sh [extra cargo nextest/test arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
phase() { printf '==> [%5ss] %s\n' "$((SECONDS - started))" "$*" >&2; }

phase "host packages (scripts/deps.sh)"
./scripts/deps.sh

# A real PostgreSQL for the store tests: every store test runs on SQLite and on it, and
# here none may skip it.
phase "PostgreSQL test cluster (scripts/postgres.sh)"
LIZARD_TEST_POSTGRES_URL="$(./scripts/postgres.sh)"
export LIZARD_TEST_POSTGRES_URL LIZARD_REQUIRE_POSTGRES=1

phase "static guest agent and in-guest CLI (scripts/build-agent.sh)"
LIZARD_AGENT_BIN="$(./scripts/build-agent.sh)"
export LIZARD_AGENT_BIN

export LIZARD_TEST_DATA_DIR="${LIZARD_TEST_DATA_DIR:-/var/cache/lizard-test-data}"
mkdir -p "$LIZARD_TEST_DATA_DIR"
phase "guest images into $LIZARD_TEST_DATA_DIR (built once, cached by content hash)"
cargo build -p lizard-cli
# CI keeps the cache between runs: images of older recipes go first, or its disk fills up
# (other clones on a developer's machine may still want theirs, so only when asked).
if [ "${LIZARD_TEST_PRUNE_IMAGES:-}" = 1 ]; then
  target/debug/lizard --data-dir "$LIZARD_TEST_DATA_DIR" images prune | tail -1
fi
target/debug/lizard --data-dir "$LIZARD_TEST_DATA_DIR" images build

# The API against its own OpenAPI document: no input may produce a 5xx.
phase "API fuzzing (scripts/fuzz-api.sh)"
./scripts/fuzz-api.sh

# Every workspace crate that declares a `vm-tests` feature gets it enabled.
features="$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
meta = json.load(sys.stdin)
print(",".join(sorted(p["name"] + "/vm-tests" for p in meta["packages"] if "vm-tests" in p["features"] and p["name"] not in ("lizard-attacks", "lizard-cluster-tests"))))
')"
phase "unit and integration tests (features: ${features:-none})"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --exclude lizard-attacks --exclude lizard-cluster-tests --features "$features" --no-fail-fast "$@"
else
  cargo test --workspace --exclude lizard-attacks --exclude lizard-cluster-tests --features "$features" --no-fail-fast "$@"
fi

# The attack suite (crates/lizard-attacks): a real `lizard server` attacked as a hostile
# guest, tenant and client would; every attack asserts that nothing got through.
phase "attack suite (crates/lizard-attacks)"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run -p lizard-attacks --features vm-tests --no-fail-fast
else
  cargo test -p lizard-attacks --features vm-tests --no-fail-fast
fi

# Many machines (crates/lizard-cluster-tests): two replicas on one PostgreSQL database,
# two node agents, real microVMs; nodes and replicas SIGKILLed; the reference's examples
# through either replica. One fleet at a time: each is four processes and their VMs.
phase "many-machines suite (crates/lizard-cluster-tests)"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run -p lizard-cluster-tests --features vm-tests --no-fail-fast --test-threads 1
else
  cargo test -p lizard-cluster-tests --features vm-tests --no-fail-fast -- --test-threads 1
fi

# The Python and TypeScript SDKs (every example of the reference) against a real server.
phase "SDK suites (scripts/test-sdk.sh)"
./scripts/test-sdk.sh

phase "all tests passed"
