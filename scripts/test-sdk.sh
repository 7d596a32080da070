#!/usr/bin/env bash
# The Python and TypeScript SDK suites and the web console's browser tests against one
# real `lizard server` (real microVMs): builds the CLI and the guest agent, starts the
# server on free loopback ports with a throw-away data directory (guest images shared from
# the machine's image store), runs the suites, and stops the server (which kills its
# sandboxes).
#
#   scripts/test-sdk.sh [python|js|console|quickstart|e2b]...   # default: python js console e2b
#
# `quickstart` is the Python SDK's quick start alone (the quick tier of scripts/test.sh);
# `e2b` is E2B's own published SDKs against the same server: the Python package
# (compat/e2b/python; E2B_SDK_VERSIONS: the versions, each in its own venv), its code
# interpreter add-on (E2B_CODE_INTERPRETER_VERSIONS, on the interpreter template), its
# desktop add-on (E2B_DESKTOP_VERSIONS, on the desktop template) and the npm packages
# (compat/e2b/js; E2B_JS_SDK_VERSIONS, E2B_JS_CODE_INTERPRETER_VERSIONS and
# E2B_JS_DESKTOP_VERSIONS, each installed in turn).
# LIZARD_BIN: the `lizard` to serve (default: this checkout's debug build, built here with
# the workspace's one feature set); LIZARD_TEMPLATES: the images to build (default: all).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
suites=("$@")
[ ${#suites[@]} -eq 0 ] && suites=(python js console e2b)
has() { [[ " ${suites[*]} " == *" $1 "* ]]; }

export LIZARD_TEST_DATA_DIR="${LIZARD_TEST_DATA_DIR:-${LIZARD_DATA_DIR:-/var/lib/lizard}}"
if [ -z "${LIZARD_AGENT_BIN:-}" ]; then
  export LIZARD_AGENT_BIN="$(scripts/build-agent.sh)"
fi
if [ -z "${LIZARD_BIN:-}" ]; then
  cargo build --workspace --all-features >&2
fi
lizard="${LIZARD_BIN:-$root/target/debug/lizard}"
# Every built-in unless told: the suites use them all (the reference's examples run on `codex`).
# shellcheck disable=SC2086
"$lizard" --data-dir "$LIZARD_TEST_DATA_DIR" images build ${LIZARD_TEMPLATES:-} >&2

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
data="$(mktemp -d /tmp/lizard-sdk-test.XXXXXX)"
records="$data/requests"
mkdir -p "$data/server" "$records"
ln -s "$LIZARD_TEST_DATA_DIR/images" "$data/server/images"
[ -f "$LIZARD_TEST_DATA_DIR/accel.json" ] && cp "$LIZARD_TEST_DATA_DIR/accel.json" "$data/server/"
api_port="$(free_port)"
proxy_port="$(free_port)"
tls_port="$(free_port)"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid"
    for _ in $(seq 1 600); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$data"
}
trap cleanup EXIT

# Sandbox URLs over HTTPS too (E2B's desktop streams on https://6080-<id>.<domain>), under
# a local CA minted for this run.
"$lizard" --data-dir "$data/server" tls init >&2
env -u LIZARD_API_URL -u LIZARD_API_KEY "$lizard" --data-dir "$data/server" server \
  --listen "127.0.0.1:$api_port" --proxy-listen "127.0.0.1:$proxy_port" \
  --proxy-tls-listen "127.0.0.1:$tls_port" \
  > "$data/server.out" 2> "$data/server.log" &
server_pid=$!
key=""
for _ in $(seq 1 300); do
  key="$(sed -n 's/^LIZARD_API_KEY=//p' "$data/server.out" 2>/dev/null | head -1)"
  [ -n "$key" ] && curl -fsS "http://127.0.0.1:$api_port/health" >/dev/null 2>&1 && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$data/server.log" >&2; echo "lizard server exited" >&2; exit 1; }
  sleep 0.2
done
[ -n "$key" ] || { echo "lizard server did not start" >&2; exit 1; }
export LIZARD_SDK_TEST_API_URL="http://127.0.0.1:$api_port"
export LIZARD_SDK_TEST_API_KEY="$key"
export LIZARD_SDK_TEST_PROXY="127.0.0.1:$proxy_port"
export LIZARD_SDK_TEST_TLS_PROXY="127.0.0.1:$tls_port" LIZARD_SDK_TEST_CA="$data/server/tls/ca.pem"
export LIZARD_SDK_TEST_RECORD_DIR="$records"

status=0
venv="$root/target/sdk-venv"
for suite in "${suites[@]}"; do
  case "$suite" in
    python | quickstart)
      [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
      "$venv/bin/pip" install -q "./sdk/python[test]" >&2
      # Type hints throughout: the package passes mypy --strict.
      (cd sdk/python && "$venv/bin/mypy" --strict --cache-dir "$data/mypy" lizard) || status=1
      ;;
    js)
      # The type declarations against the reference's TypeScript examples.
      (cd sdk/js && npm install --no-audit --no-fund --silent && npm run --silent typecheck) || status=1
      ;;
    console)
      # Playwright (playwright-core, from the lockfile) drives Debian's chromium (deps.sh).
      (cd crates/lizard-console/web && npm ci --no-audit --no-fund --silent) || status=1
      ;;
    e2b)
      for version in ${E2B_SDK_VERSIONS:-2.27.0 2.63.0}; do
        e2b_venv="$root/target/e2b-venv-$version"
        [ -x "$e2b_venv/bin/python" ] || python3 -m venv "$e2b_venv"
        "$e2b_venv/bin/pip" install -q "e2b==$version" pytest httpx >&2 || status=1
      done
      for version in ${E2B_CODE_INTERPRETER_VERSIONS:-2.11.5}; do
        ci_venv="$root/target/e2b-ci-venv-$version"
        [ -x "$ci_venv/bin/python" ] || python3 -m venv "$ci_venv"
        "$ci_venv/bin/pip" install -q "e2b-code-interpreter==$version" pytest httpx >&2 || status=1
      done
      for version in ${E2B_DESKTOP_VERSIONS:-2.7.2}; do
        desktop_venv="$root/target/e2b-desktop-venv-$version"
        [ -x "$desktop_venv/bin/python" ] || python3 -m venv "$desktop_venv"
        "$desktop_venv/bin/pip" install -q "e2b-desktop==$version" pytest httpx pillow >&2 || status=1
      done
      ;;
    *) echo "unknown suite $suite (python|js|console|quickstart|e2b)" >&2; exit 2 ;;
  esac
done

# Test files, Python run from the tests directory against the installed package, as a user
# would have it; JS one file at a time (Node 18 has no --test-concurrency). The contract
# tests (test_zz_openapi_contract.py, zz_contract.test.js) come last in each run and check
# what the files before them sent.
run_files() {
  local suite=$1; shift
  case "$suite" in
    python)
      (cd sdk/python/tests && "$venv/bin/python" -m pytest -q -p no:cacheprovider -o testpaths=. --rootdir=. \
        --durations=5 "$@" test_zz_openapi_contract.py) || status=1
      ;;
    js)
      for f in "$@" zz_contract.test.js; do
        (cd sdk/js && node --test "test/$f") || status=1
      done
      ;;
  esac
}
others() { # $1: directory, $2: glob; the files not run before the rest
  (cd "$1" && for f in $2; do case "$f" in test_examples.py | examples.test.js | *desktop* | *zz*) ;; *) echo "$f" ;; esac; done)
}
# The reference's examples of both SDKs share its project and volume names, so they run
# one after the other: the Python ones first, alone, the TypeScript ones at the head of
# the third lane. Their volume asks for 10 GiB, which a node admits only with 11 GiB
# free: they run before the workload templates' sandboxes and snapshots take their share
# of the disk.
if has python; then run_files python test_examples.py; fi
# E2B's desktop add-on (Python, then npm): its SDK starts Xvfb and XFCE and waits at most
# 60 s for them; the stream opens in the host's Chromium.
run_e2b_desktop() {
  local version
  if [[ -n "${LIZARD_TEMPLATES:-}" && " $LIZARD_TEMPLATES " != *" desktop "* ]]; then
    echo "--- e2b-desktop: not run (LIZARD_TEMPLATES has no desktop) ---"
    return
  fi
  for version in ${E2B_DESKTOP_VERSIONS:-2.7.2}; do
    echo "--- e2b-desktop $version ---"
    (cd compat/e2b/python && "$root/target/e2b-desktop-venv-$version/bin/python" -m pytest -q -p no:cacheprovider \
      -o testpaths=. --rootdir=. test_desktop.py) || status=1
  done
  for version in ${E2B_JS_DESKTOP_VERSIONS:-2.4.0}; do
    echo "--- @e2b/desktop (npm) $version ---"
    (cd compat/e2b/js && npm install --no-save --no-audit --no-fund --silent "@e2b/desktop@$version" \
      && node --test desktop.test.mjs) || status=1
  done
}
# The desktop tests drive Chromium in a TCG guest, whose page takes minutes to show when
# another suite's guests share the two cores: they run alone, one suite after the other.
desktops_started=$SECONDS
for suite in "${suites[@]}"; do
  case "$suite" in
    python) run_files python test_desktop.py test_desktop_actions.py ;;
    js) run_files js desktop.test.js ;;
    e2b) run_e2b_desktop ;;
  esac
done
# The rest side by side, against the one server, in three lanes of about equal length (each
# suite mostly waits on one guest vCPU at a time under TCG, so on two cores three lanes
# finish well before one suite after the other would; CONTRIBUTING.md): the Python files in
# two lanes (each pytest run ends with the contract test over what it sent), each followed
# by one of E2B's Python packages; the TypeScript files (the reference's examples first),
# then E2B's code interpreter add-on and npm packages, in the third. Each line is prefixed
# with its lane; the console's browser tests follow once all are done.
first_python_lane="test_push.py test_templates.py test_code.py test_code_events.py test_model_standin.py
  test_services.py"
lane() { # $1: label; the rest: a command run in the background, its output prefixed
  local label=$1 lane_started=$SECONDS
  shift
  (
    set -o pipefail
    {
      "$@"
      echo "--- lane $label ended after $((SECONDS - lane_started)) s ---"
      exit "$status"
    } 2>&1 | sed -u "s/^/[$label] /"
  ) &
  lanes+=("$!")
}
second_python_lane() { # the Python files not in the first lane
  local f
  for f in $(others sdk/python/tests 'test_*.py'); do
    [[ " ${first_python_lane//$'\n'/ } " == *" $f "* ]] || echo "$f"
  done
}
e2b_python_versions() { # $1: 1 or 2, the lane: E2B_SDK_VERSIONS taken in turn
  local i=0 version
  for version in ${E2B_SDK_VERSIONS:-2.27.0 2.63.0}; do
    i=$((i + 1))
    if [ $(((i - 1) % 2 + 1)) -eq "$1" ]; then echo "$version"; fi
  done
}
first_lane() {
  # shellcheck disable=SC2086
  if has python; then run_files python $first_python_lane; fi
  if has e2b; then run_e2b_python $(e2b_python_versions 1); fi
}
second_lane() {
  # shellcheck disable=SC2046
  if has python; then run_files python $(second_python_lane); fi
  if has e2b; then run_e2b_python $(e2b_python_versions 2); fi
}
third_lane() {
  if has js; then
    # shellcheck disable=SC2046
    run_files js examples.test.js $(others sdk/js/test '*.test.js')
  fi
  if has e2b; then run_e2b_add_ons_and_npm; fi
}
run_e2b_python() { # $@: versions of E2B's Python package
  local version
  for version in "$@"; do
    echo "--- e2b $version ---"
    (cd compat/e2b/python && "$root/target/e2b-venv-$version/bin/python" -m pytest -q -p no:cacheprovider \
      -o testpaths=. --rootdir=. --durations=5 --ignore=test_code_interpreter.py --ignore=test_desktop.py) || status=1
  done
}
run_e2b_add_ons_and_npm() {
  local version
  # The code interpreter add-on needs the interpreter template: a run that builds only
  # some templates (LIZARD_TEMPLATES) without it says so and leaves it out.
  if [[ -z "${LIZARD_TEMPLATES:-}" || " $LIZARD_TEMPLATES " == *" interpreter "* ]]; then
    for version in ${E2B_CODE_INTERPRETER_VERSIONS:-2.11.5}; do
      echo "--- e2b-code-interpreter $version ---"
      (cd compat/e2b/python && "$root/target/e2b-ci-venv-$version/bin/python" -m pytest -q -p no:cacheprovider \
        -o testpaths=. --rootdir=. test_code_interpreter.py) || status=1
    done
  else
    echo "--- e2b-code-interpreter: not run (LIZARD_TEMPLATES has no interpreter) ---"
  fi
  for version in ${E2B_JS_SDK_VERSIONS:-2.15.0 2.51.0}; do
    echo "--- e2b (npm) $version ---"
    (cd compat/e2b/js && npm install --no-save --no-audit --no-fund --silent "e2b@$version" \
      && node --test core.test.mjs && node --test templates.test.mjs) || status=1
  done
  if [[ -z "${LIZARD_TEMPLATES:-}" || " $LIZARD_TEMPLATES " == *" interpreter "* ]]; then
    for version in ${E2B_JS_CODE_INTERPRETER_VERSIONS:-2.8.0}; do
      echo "--- @e2b/code-interpreter (npm) $version ---"
      (cd compat/e2b/js && npm install --no-save --no-audit --no-fund --silent "@e2b/code-interpreter@$version" \
        && node --test code-interpreter.test.mjs) || status=1
    done
  fi
}
echo "--- the desktop tests ended after $((SECONDS - desktops_started)) s ---"
lanes=()
if has python || has e2b; then
  lane py+e2b:1 first_lane
  lane py+e2b:2 second_lane
fi
if has js || has e2b; then
  lane js+e2b third_lane
fi
for lane_pid in "${lanes[@]}"; do
  wait "$lane_pid" || status=1
done
for suite in "${suites[@]}"; do
  case "$suite" in
    console) (cd crates/lizard-console/web && node --test test/) || status=1 ;;
    quickstart)
      (cd sdk/python/tests && "$venv/bin/python" -m pytest -q -p no:cacheprovider -o testpaths=. --rootdir=. \
        test_examples.py::test_quickstart_python_http_server) || status=1
      ;;
  esac
done
if [ "$status" -ne 0 ]; then
  echo "--- server log (last 40 lines) ---" >&2
  tail -40 "$data/server.log" >&2
fi
exit "$status"
