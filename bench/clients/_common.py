"""What the Python drivers share: their command line and their one-line report."""

import argparse
import json
import math
import statistics
import sys
import time

FIRST, LOOP = "x = 0", "x = x + 1"


def parse_args(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--calls", type=int, default=300, help="timed calls (default 300)")
    p.add_argument("--warmup", type=int, default=30, help="untimed calls before them (default 30)")
    p.add_argument("--url", help="streamable HTTP endpoint; without it, spawn CMD over stdio")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- server command line (stdio)")
    args = p.parse_args()
    if args.cmd[:1] == ["--"]:
        args.cmd = args.cmd[1:]
    if bool(args.url) == bool(args.cmd):
        p.error("give exactly one of --url URL or -- CMD...")
    return args


def fail(message):
    print(f"driver failed: {message}", file=sys.stderr)
    sys.exit(1)


def report(client, args, connect_s, times_s):
    ms = sorted(t * 1000 for t in times_s)
    print(json.dumps({
        "client": client,
        "transport": "http" if args.url else "stdio",
        "median_ms": round(statistics.median(ms), 4),
        "p99_ms": round(ms[math.ceil(0.99 * len(ms)) - 1], 4),
        "calls": len(ms),
        "connect_ms": round(connect_s * 1000, 3),
    }), flush=True)


async def time_calls(call, args, start):
    """The first call (its end is the connect time, from `start`), the
    warm-up, then the timed calls: (connect_s, [seconds per call])."""
    await call(FIRST)
    connect = time.perf_counter() - start
    for _ in range(args.warmup):
        await call(LOOP)
    times = []
    for _ in range(args.calls):
        t = time.perf_counter()
        await call(LOOP)
        times.append(time.perf_counter() - t)
    return connect, times
