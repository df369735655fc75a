#!/usr/bin/env bash
# Runs every check and test of ferrepl. Installs what the tests need first
# (see scripts/test-env.sh); safe to run again and again.
set -euo pipefail
cd "$(dirname "$0")/.."

ENV_DIR="$(bash scripts/test-env.sh)"

# Every test server keeps its sessions in a state directory of its test's
# own (tests/suite/support/launch.rs, tests/interop/conftest.py and
# ts/harness.mjs, --state-dir in the scripts). Checked at the end: the run's
# XDG_STATE_HOME is a fresh directory in which no state directory may
# appear, and the user's own must gain no store of a workspace of this run
# (the SDKs pass a server HOME but not XDG_STATE_HOME).
run_tmp="$(mktemp -d)"

# Stages run beside the others: `background NAME COMMAND...` starts one with
# its output in a file; `collect NAME` waits for it, shows its output, and
# fails the script if it failed. Whatever is still running at exit is
# stopped.
declare -A bg_pid=() bg_log=()
background() {
    local name=$1
    shift
    bg_log[$name]="$run_tmp/$name.log"
    "$@" >"${bg_log[$name]}" 2>&1 &
    bg_pid[$name]=$!
}
collect() {
    local name=$1 status=0
    wait "${bg_pid[$name]}" || status=$?
    unset "bg_pid[$name]"
    cat "${bg_log[$name]}"
    if (( status != 0 )); then
        echo "$name failed (exit $status)" >&2
        exit "$status"
    fi
}
cleanup() {
    local pid
    for pid in "${bg_pid[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    rm -rf "$run_tmp"
}
trap cleanup EXIT
user_state="${XDG_STATE_HOME:-$HOME/.local/state}/ferrepl"
python3 scripts/state-leaks.py list "$user_state" >"$run_tmp/stores-before"
export XDG_STATE_HOME="$run_tmp/state"

# Each stage's header says when it starts (seconds since the script began),
# so a slow stage shows in the log.
stage() { echo "== [${SECONDS}s] $*" >&2; }

stage "format and lint"
cargo fmt --check
cargo clippy --all-targets --quiet -- -D warnings
"$ENV_DIR/venv/bin/python" -m pyflakes src/worker/python
# The layers docs/architecture.md states: no circle between top-level
# modules, no use a layer rule forbids.
python3 scripts/module-graph.py >/dev/null || python3 scripts/module-graph.py
python3 scripts/module-graph.py session >/dev/null || python3 scripts/module-graph.py session
# The release workflow cannot run here: actionlint (test-env.sh says which)
# checks it (syntax, the actions' inputs, expressions, and its scripts, the
# latter with shellcheck's rules).
"$ENV_DIR/actions-venv/bin/actionlint" -shellcheck "$ENV_DIR/actions-venv/bin/shellcheck" \
    -pyflakes "$ENV_DIR/venv/bin/pyflakes" .github/workflows/*.yml
stage "build"
cargo build --quiet
export FERREPL_BIN="$PWD/target/debug/ferrepl"

# The TypeScript SDK tests spend most of their ~75 s waiting on a 70 s cell
# (the client-timeout case): run them beside everything else.
stage "interop tests (official TypeScript SDK, Inspector CLI), in the background"
background typescript-interop env FERREPL_TEST_ENV="$ENV_DIR" bash scripts/ts-interop.sh

# The viewer in a real browser (chromium through Selenium; ~25 s, mostly
# waiting on cells), beside the stages below.
viewer_checks() {
    FERREPL_RICH_PYTHON="$ENV_DIR/rich/bin/python" FERREPL_KERNELS_VENV="$ENV_DIR/kernels" \
        "$ENV_DIR/viewer-venv/bin/python" tests/viewer/browser_check.py &&
        "$ENV_DIR/viewer-venv/bin/python" tests/viewer/r_check.py
}
stage "viewer in a browser (tests/viewer/browser_check.py, then r_check.py), in the background"
background viewer-browser-check viewer_checks

stage "R driver scenarios (a real R behind the worker's pipes)"
python3 scripts/r-driver-harness.py

stage "rust unit and integration tests (rmcp client, stdio and HTTP)"
cargo test --quiet
stage "escape tests as an unprivileged user"
bash scripts/escape-unprivileged.sh

# A check for another target, CPU-bound, beside the stages that mostly wait
# on processes (no other cargo runs until the wheel, so nothing waits on
# cargo's lock): ~2.5 min of a clean run's wall time saved. Its output is
# shown after them.
stage "macOS: the crate still compiles there (Linux-only code behind cfg), in the background"
background macos-check bash scripts/macos-check.sh

# Each test in both protocol eras (tests/interop/conftest.py): the legacy
# one here, the modern one (2026-07-28) beside it; its output follows.
stage "interop tests (official Python SDK), legacy and modern protocol eras side by side"
py_interop() {
    FERREPL_NB_PYTHON="$ENV_DIR/nb/bin/python" "$ENV_DIR/venv/bin/python" -m pytest tests/interop -q -p no:cacheprovider \
        --basetemp "$run_tmp/pytest-$1" --mcp-mode "$1"
}
background python-interop-modern-era py_interop modern
legacy_status=0
py_interop legacy || legacy_status=$?
stage "interop tests (official Python SDK), modern era: results"
collect python-interop-modern-era
if (( legacy_status != 0 )); then
    echo "Python SDK interop tests failed in the legacy era (exit $legacy_status)" >&2
    exit 1
fi

stage "deployment: manifests, nginx config, the pod's security context emulated"
FERREPL_TEST_ENV="$ENV_DIR" bash scripts/deploy-check.sh

stage "three instances behind nginx: tenants, SIGKILL, restart, drain (scripts/cluster-sim.py)"
python3 scripts/cluster-sim.py

stage "MCP conformance suite (HTTP), both protocol eras, each scenario by name"
FERREPL_TEST_ENV="$ENV_DIR" bash scripts/conformance.sh

stage "macOS: results"
collect macos-check

stage "the Python wheel: built, installed with pip and run by uvx"
bash scripts/wheel-check.sh "$ENV_DIR"

stage "interop tests (official TypeScript SDK, Inspector CLI): results"
collect typescript-interop

stage "viewer in a browser: results"
collect viewer-browser-check

stage "no test server kept its sessions outside its own state directory"
if [[ -e "$XDG_STATE_HOME/ferrepl" ]]; then
    echo "a test server used the run's XDG_STATE_HOME (it would have used the user's own):" >&2
    ls -la "$XDG_STATE_HOME/ferrepl" >&2
    python3 scripts/state-leaks.py check /dev/null "$XDG_STATE_HOME/ferrepl" >&2 || true
    exit 1
fi
if ! python3 scripts/state-leaks.py check "$run_tmp/stores-before" "$user_state" \
        "$run_tmp/" "${TMPDIR:-/tmp}/ferrepl-ts-" >&2; then
    echo "test servers left these stores in $user_state: give them a state directory of their test's own" >&2
    exit 1
fi
stage "done"
