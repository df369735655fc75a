#!/usr/bin/env bash
# The wheel as a user gets it: built by scripts/wheel.sh (from the debug
# build the tests use, unless FERREPL_WHEEL_PROFILE=release), installed into a
# fresh venv (pip) and run by uvx from the file, each launched by the
# official MCP Python SDK for a handshake and one python_exec
# (tests/interop/wheel_check.py); so is the entry `ferrepl install` writes
# when run each way (the venv's path; uvx --from the wheel), and install run
# by uvx from a copy of the wheel in a temporary directory must refuse.
# Called by scripts/test.sh; needs the test venv of scripts/test-env.sh
# (ENV_DIR as its first argument).
set -euo pipefail
cd "$(dirname "$0")/.."
ENV_DIR="$1"

# `ferrepl install` refuses to name a binary or wheel in a temporary
# directory (a client could not start it once that is cleaned): a checkout
# under one (mktemp -d) checks from a place that stays, removed afterwards.
place="$PWD/target"
case "$PWD/" in
    /tmp/* | /var/tmp/* | /dev/shm/* | "${TMPDIR:-/tmp}"/*)
        place="${XDG_DATA_HOME:-$HOME/.local/share}/ferrepl-wheel-check"
        mkdir -p "$place"
        trap 'rm -rf "$place"' EXIT
        export FERREPL_WHEEL_TOOLS="$place/wheel-tools"
        ;;
esac
wheel="$(FERREPL_WHEEL_PROFILE="${FERREPL_WHEEL_PROFILE:-dev}" bash scripts/wheel.sh)"
if [[ "$place" != "$PWD/target" ]]; then
    mkdir -p "$place/wheels"
    cp "$wheel" "$place/wheels/"
    wheel="$place/wheels/$(basename "$wheel")"
fi
check="$place/wheel-check"
rm -rf "$check"
python3 -m venv "$check/venv"
"$check/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-index "$wheel"
"$check/venv/bin/ferrepl" --version
tools="${FERREPL_WHEEL_TOOLS:-$PWD/target/wheel-tools}"
export UV_CACHE_DIR="$check/uv-cache" UV_NO_CONFIG=1
"$ENV_DIR/venv/bin/python" tests/interop/wheel_check.py \
    --install "$check/venv/bin/ferrepl" \
    --install "$tools/bin/uvx --offline --from $wheel ferrepl" \
    --temp-wheel-uvx "$tools/bin/uvx" --wheel "$wheel" \
    --command "$check/venv/bin/ferrepl" \
    --command "$tools/bin/uvx --offline --from $wheel ferrepl"
