#!/usr/bin/env python3
"""ferrepl benchmark: going back to an earlier cell (python_exec `parent`),
with fork checkpoints and without (a fresh interpreter re-runs the cells),
for states of several sizes; and what the copies cost in memory.

    cargo build --release && python3 bench/branching.py --bin target/release/ferrepl

For each size: cell 1 builds the state (`big = b'x' * SIZE`), cell 2 changes
something small; then `python_exec {parent: 1, code: "0"}` is timed again and
again, --pause seconds apart as an agent's calls are (each call starts from a
new head: the live state is kept as a copy, the copy of cell 1's ready child
takes over; copies fork their ready child a moment after they are made, so
with --pause 0 that fork is on the switch's path). Without checkpoints the
same call starts a fresh interpreter and re-runs cell 1. Memory: the session's PSS (what
python_sessions reports for a session with copies) with its copies, next to
the state's size. Target: a switch with a checkpoint within 20 ms up to 500 MB.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import Ferrepl, ms_since, verdict  # noqa: E402

SWITCH_TARGET_MS = 20.0


def call(server, code, parent=None):
    args = {"code": code, "session": "b", "wait_s": 50}
    if parent is not None:
        args["parent"] = parent
    result = server.request("tools/call", {"name": "python_exec", "arguments": args})
    text = "".join(c.get("text", "") for c in result.get("content", []) if c.get("type") == "text")
    if result.get("isError") or "-- ok |" not in text:
        raise RuntimeError(f"python_exec {code!r} (parent {parent}) failed: {text[:500]}")
    return text


def session_memory(server):
    result = server.request("tools/call", {"name": "python_sessions", "arguments": {}})
    for s in result.get("structuredContent", {}).get("sessions", []):
        if s["name"] == "b":
            return s.get("memory_bytes") or 0
    return 0


def switch_times(args, workdir, mib, checkpoints, runs):
    extra = ("--resume", "off", "--checkpoint-min-ms", "0", "--checkpoints", str(checkpoints),
             "--structured-content", "--memory-limit", "8G")
    server = Ferrepl(args.bin, args.python, workdir, extra).initialize()
    try:
        call(server, f"big = b'x' * ({mib} << 20)")
        call(server, "small = 1")
        times, notes = [], []
        for _ in range(runs):
            # An agent's calls come seconds apart: the copies' forks ahead of
            # time happen in between.
            time.sleep(args.pause)
            start = time.perf_counter()
            text = call(server, "0", parent=1)
            times.append(ms_since(start))
            notes.append("resuming its checkpoint" in text)
        time.sleep(1.0)  # dropped copies finish exiting
        memory = session_memory(server)
        return times, all(notes), memory
    finally:
        server.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", default="target/release/ferrepl")
    parser.add_argument("--python")
    parser.add_argument("--sizes", default="10,100,500", help="state sizes in MiB (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--pause", type=float, default=0.5, help="seconds between switches (default: %(default)s)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="ferrepl-bench-") as workdir:
        for mib in sizes:
            with_ckpt, resumed, memory = switch_times(args, workdir, mib, 4, args.runs)
            without, _, _ = switch_times(args, workdir, mib, 0, max(3, args.runs // 3))
            rows.append((mib, statistics.median(with_ckpt), max(with_ckpt), resumed, statistics.median(without), memory))
    print("going back to cell 1 (python_exec parent=1), median (max) of the call:")
    for mib, med, worst, resumed, replay, memory in rows:
        print(
            f"  state {mib:4d} MiB: with a checkpoint {med:7.1f} ms (max {worst:.1f}){'' if resumed else ' [not resumed]'}"
            f"   re-running instead {replay:8.1f} ms"
            f"   session PSS with its copies {memory / 2**20:7.1f} MiB"
            f"   target <= {SWITCH_TARGET_MS:.0f} ms: {verdict(resumed and med <= SWITCH_TARGET_MS)}"
        )
    print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
