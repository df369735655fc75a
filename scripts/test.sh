#!/usr/bin/env bash
# Runs every check and test of ferrepl. Installs what the tests need first
# (see scripts/test-env.sh); safe to run again and again.
set -euo pipefail
cd "$(dirname "$0")/.."

ENV_DIR="$(bash scripts/test-env.sh)"

echo "== format and lint" >&2
cargo fmt --check
cargo clippy --all-targets --quiet -- -D warnings
"$ENV_DIR/venv/bin/python" -m pyflakes src/worker/python
echo "== macOS: the crate still compiles there (Linux-only code behind cfg)" >&2
bash scripts/macos-check.sh

echo "== build" >&2
cargo build --quiet
export FERREPL_BIN="$PWD/target/debug/ferrepl"

# The TypeScript SDK tests spend most of their ~75 s waiting on a 70 s cell
# (the client-timeout case): run them beside everything else. Their output
# goes to a file shown at the end; a failure fails the script.
ts_log="$(mktemp)"
echo "== interop tests (official TypeScript SDK, Inspector CLI), in the background" >&2
FERREPL_TEST_ENV="$ENV_DIR" bash scripts/ts-interop.sh >"$ts_log" 2>&1 &
ts_pid=$!
trap 'kill "$ts_pid" 2>/dev/null || true; rm -f "$ts_log"' EXIT

echo "== R driver scenarios (a real R behind the worker's pipes)" >&2
python3 scripts/r-driver-harness.py

echo "== rust unit and integration tests (rmcp client, stdio and HTTP)" >&2
cargo test --quiet
bash scripts/escape-unprivileged.sh

echo "== interop tests (official Python SDK)" >&2
FERREPL_NB_PYTHON="$ENV_DIR/nb/bin/python" "$ENV_DIR/venv/bin/python" -m pytest tests/interop -q -p no:cacheprovider

echo "== deployment: manifests, nginx config, the pod's security context emulated" >&2
FERREPL_TEST_ENV="$ENV_DIR" bash scripts/deploy-check.sh

echo "== three instances behind nginx: tenants, SIGKILL, restart, drain (scripts/cluster-sim.py)" >&2
python3 scripts/cluster-sim.py

echo "== MCP conformance suite (HTTP)" >&2
FERREPL_TEST_ENV="$ENV_DIR" bash scripts/conformance.sh

echo "== the Python wheel: built, installed with pip and run by uvx" >&2
bash scripts/wheel-check.sh "$ENV_DIR"

echo "== interop tests (official TypeScript SDK, Inspector CLI): results" >&2
ts_status=0
wait "$ts_pid" || ts_status=$?
cat "$ts_log"
if (( ts_status != 0 )); then
    echo "TypeScript interop tests failed (exit $ts_status)" >&2
    exit "$ts_status"
fi
