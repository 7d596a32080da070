#!/usr/bin/env bash
# The test suite (Debian 12, as root), in two tiers:
#
#   scripts/test.sh [nextest arguments]         # the whole suite: what CI and the README run
#   scripts/test.sh quick [nextest arguments]   # formatting, lints, every test that needs no
#                                               # microVM, a VM smoke set on `base`, and the
#                                               # Python SDK's quick start
#
# The whole suite: unit tests, the integration tests that boot real microVMs or need root
# (each crate's `vm-tests` feature), the API fuzzer, the attack suite, the many-machines
# suite and the SDK suites. Plain `cargo test` runs only what needs neither root nor QEMU.
#
# One compilation serves every phase: the workspace is built once, for its tests, with all
# features (`cargo nextest run --workspace --all-features`, the feature set clippy checks
# too), and the phases select tests from that build with filter expressions; the `lizard`
# binary of that build makes the images and serves the fuzzer and the SDK suites.
#
# Guest images live in the machine's one image store (the installed server's data
# directory, /var/lib/lizard; LIZARD_TEST_DATA_DIR moves it), keyed by content hash: the
# install, every clone and every run share them, and each tier builds only what it uses.
set -euo pipefail
cd "$(dirname "$0")/.."
tier=full
if [ "${1:-}" = quick ]; then
  tier=quick
  shift
fi
started=$SECONDS
phase() { printf '==> [%5ss] %s\n' "$((SECONDS - started))" "$*" >&2; }

# The quick tier's microVM tests, all on `base`: create, exec, files and processes on a
# node; through the API a scoped key's refusals, a sandbox URL, pause, resume and fork, a
# volume; the CLI's local mode end to end.
smoke='binary(vm) & (
  (package(lizard-node) & test(=sandbox::base_template_boots_a_real_vm_with_files_and_processes))
  | (package(lizard-server) & (test(/^sandboxes::/) | test(=volumes::volume_data_outlives_its_sandboxes)))
  | (package(lizard-cli) & test(=cli::local_mode_end_to_end))
)'

phase "host packages (scripts/deps.sh)"
./scripts/deps.sh

if [ "$tier" = quick ]; then
  phase "formatting (cargo fmt --check)"
  cargo fmt --all -- --check
  phase "lints (cargo clippy, all targets and features, warnings are errors)"
  cargo clippy --workspace --all-targets --all-features -- -D warnings
  phase "no import circles (scripts/check-module-cycles.py)"
  python3 scripts/check-module-cycles.py
  phase "error messages that repeat their source (scripts/check-error-chains.py)"
  python3 scripts/check-error-chains.py
fi

# A real PostgreSQL for the store tests: every store test runs on SQLite and on it, and
# here none may skip it.
phase "PostgreSQL test cluster (scripts/postgres.sh)"
LIZARD_TEST_POSTGRES_URL="$(./scripts/postgres.sh)"
export LIZARD_TEST_POSTGRES_URL LIZARD_REQUIRE_POSTGRES=1

phase "static guest agent and in-guest CLI (scripts/build-agent.sh)"
LIZARD_AGENT_BIN="$(./scripts/build-agent.sh)"
export LIZARD_AGENT_BIN

build=(cargo nextest run --workspace --all-features)
nextest=("${build[@]}" --no-fail-fast)
phase "the workspace and every test binary, compiled once (all features)"
"${build[@]}" --no-run
export LIZARD_BIN="$PWD/target/debug/lizard"

export LIZARD_TEST_DATA_DIR="${LIZARD_TEST_DATA_DIR:-${LIZARD_DATA_DIR:-/var/lib/lizard}}"
mkdir -p "$LIZARD_TEST_DATA_DIR"
if [ "$tier" = quick ]; then
  # `base` for the smoke set, `code-interpreter-v1` (a layer over it) for the quick start.
  templates=(base code-interpreter-v1)
else
  templates=()
fi
phase "guest images into $LIZARD_TEST_DATA_DIR/images (${templates[*]:-every built-in}; built once per machine)"
# CI keeps the store between runs: images of older recipes go first, or its disk fills up
# (other clones on a developer's machine may still want theirs, so only when asked; an
# image a running server holds is never removed).
if [ "${LIZARD_TEST_PRUNE_IMAGES:-}" = 1 ]; then
  "$LIZARD_BIN" --data-dir "$LIZARD_TEST_DATA_DIR" images prune | tail -1
fi
"$LIZARD_BIN" --data-dir "$LIZARD_TEST_DATA_DIR" images build "${templates[@]}"

if [ "$tier" = quick ]; then
  phase "unit and plain integration tests, and the microVM smoke set"
  "${nextest[@]}" -E "not binary(vm) | ($smoke)" "$@"
  phase "the Python SDK's quick start (scripts/test-sdk.sh quickstart)"
  LIZARD_TEMPLATES="${templates[*]}" ./scripts/test-sdk.sh quickstart
  phase "quick tier passed"
  exit 0
fi

# The API against its own OpenAPI document: no input may produce a 5xx.
phase "API fuzzing (scripts/fuzz-api.sh)"
./scripts/fuzz-api.sh

# Every Rust test in one run (.config/nextest.toml: the longest first, those
# that measure CPU or start a fleet alone): unit and integration tests, microVM tests
# included; the attack suite (crates/lizard-attacks: a real `lizard server` attacked as a
# hostile guest, tenant and client would; every attack asserts that nothing got through);
# the many-machines suite (crates/lizard-cluster-tests: two replicas on one PostgreSQL
# database, two node agents, real microVMs; nodes and replicas SIGKILLed; the reference's
# examples through either replica).
phase "unit, integration, attack and many-machines tests"
"${nextest[@]}" "$@"

# The Python and TypeScript SDKs (every example of the reference) against a real server.
phase "SDK suites (scripts/test-sdk.sh)"
./scripts/test-sdk.sh

phase "all tests passed"
