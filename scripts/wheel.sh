#!/usr/bin/env bash
# Builds the Python wheel that carries the ferrepl binary (pyproject.toml:
# maturin, bindings = "bin"), so that `pip install ferrepl`, `pipx run
# ferrepl` and `uvx ferrepl` give a working `ferrepl` command. The version is
# Cargo.toml's. Linked with zig for manylinux_2_17 (glibc 2.17 and later),
# for this machine's architecture; a release machine builds the others with
# `scripts/wheel.sh --target aarch64-unknown-linux-gnu` (after `rustup target
# add` of it) and, on macOS, `scripts/wheel.sh` there (no zig needed).
# Wheels go to target/wheels, named ferrepl-VERSION-py3-none-PLATFORM.whl
# (here ferrepl-VERSION-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl);
# the last line printed is the wheel's path. The release workflow
# (.github/workflows/release.yml) runs this for each platform. Tools (maturin, ziglang from PyPI) are kept in
# target/wheel-tools; a second run reuses them.
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLS="${FERREPL_WHEEL_TOOLS:-$PWD/target/wheel-tools}"
REQS="maturin==1.9.4 ziglang==0.13.0 uv==0.13.9"
if [[ ! -f "$TOOLS/.ferrepl-stamp" || "$(cat "$TOOLS/.ferrepl-stamp")" != "$REQS" ]]; then
    echo "wheel: installing $REQS into $TOOLS" >&2
    rm -rf "$TOOLS"
    python3 -m venv "$TOOLS"
    "$TOOLS/bin/python" -m pip install --quiet --disable-pip-version-check $REQS
    echo "$REQS" > "$TOOLS/.ferrepl-stamp"
fi

zig=(--zig --compatibility manylinux_2_17)
if [[ "$(uname -s)" != Linux ]]; then
    zig=()
fi
build=(--release)
# FERREPL_WHEEL_PROFILE=dev (scripts/wheel-check.sh): the debug build the
# tests use, linked natively, so CI packages what it built already instead
# of a second, release build (~6 min on 2 cores); what is checked there is
# the packaging. Releases are built the default way.
if [[ "${FERREPL_WHEEL_PROFILE:-release}" == dev ]]; then
    build=(--profile dev)
    zig=()
fi
# maturin finds zig as `python -m ziglang`: the tools' python first on PATH.
# (${zig[@]+...}: an empty array under `set -u` in macOS's bash 3.2.)
PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/maturin" build "${build[@]}" ${zig[@]+"${zig[@]}"} --out target/wheels "$@" >&2
ls -t target/wheels/ferrepl-*.whl | head -1
