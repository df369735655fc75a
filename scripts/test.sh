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

echo "== build" >&2
cargo build --quiet
export FERREPL_BIN="$PWD/target/debug/ferrepl"

echo "== rust unit and integration tests (rmcp client, stdio and HTTP)" >&2
cargo test --quiet
bash scripts/escape-unprivileged.sh

echo "== interop tests (official Python SDK)" >&2
"$ENV_DIR/venv/bin/python" -m pytest tests/interop -q -p no:cacheprovider
FERREPL_TEST_ENV="$ENV_DIR" bash scripts/ts-interop.sh

echo "== MCP conformance suite (HTTP)" >&2
FERREPL_TEST_ENV="$ENV_DIR" bash scripts/conformance.sh
