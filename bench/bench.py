#!/usr/bin/env python3
"""ferrepl benchmark: cold start, warm call latency against a raw-pipe floor,
and large output (time to result, peak server memory).

Speaks newline-delimited JSON-RPC to `ferrepl` over stdio; needs only the
standard library. Usage: python3 bench/bench.py --bin target/release/ferrepl
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

FLOOR_WORKER = r"""
import sys, json
ns = {}
for line in sys.stdin:
    msg = json.loads(line)
    exec(msg["code"], ns)
    sys.stdout.write('{"ok": true}\n')
    sys.stdout.flush()
"""


class Server:
    def __init__(self, binary, python=None):
        args = [binary] + (["--python", python] if python else [])
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.next_id = 0

    def send(self, msg):
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def request(self, method, params):
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("ferrepl closed its stdout")
            msg = json.loads(line)
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                return msg["result"]

    def initialize(self):
        self.request(
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}},
        )
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def exec(self, code):
        return self.request("tools/call", {"name": "python_exec", "arguments": {"code": code}})

    def peak_rss_kb(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM"):
                    return int(line.split()[1])
        return 0

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(10)


def percentile(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def cold_start(binary, runs):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        server = Server(binary)
        server.initialize()
        result = server.exec("print(1)")
        times.append((time.perf_counter() - start) * 1000)
        assert result["structuredContent"]["stdout"] == "1\n", result
        server.close()
    return statistics.median(times)


def warm_latency(binary, calls):
    server = Server(binary)
    server.initialize()
    server.exec("x = 0")
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        server.exec("x = x + 1")
        times.append((time.perf_counter() - start) * 1000)
    final = server.exec("x")["structuredContent"]["value"]
    assert final == str(calls), final
    server.close()
    times.sort()
    return statistics.median(times), percentile(times, 0.99)


def floor_latency(calls):
    proc = subprocess.Popen([sys.executable, "-c", FLOOR_WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def call(code):
        proc.stdin.write((json.dumps({"code": code}) + "\n").encode())
        proc.stdin.flush()
        proc.stdout.readline()

    call("x = 0")
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call("x = x + 1")
        times.append((time.perf_counter() - start) * 1000)
    proc.stdin.close()
    proc.wait(10)
    times.sort()
    return statistics.median(times), percentile(times, 0.99)


def large_output(binary):
    rows = []
    for label, code in (
        ("10 MB as 100,000 lines", "for i in range(100000): print('x' * 99)"),
        ("10 MB as one line", "print('x' * 10_000_000)"),
    ):
        server = Server(binary)
        server.initialize()
        server.exec("1")
        before = server.peak_rss_kb()
        start = time.perf_counter()
        result = server.exec(code)
        elapsed = (time.perf_counter() - start) * 1000
        assert result["structuredContent"]["status"] == "ok", result
        rows.append((label, elapsed, before, server.peak_rss_kb(), result["structuredContent"]["output_bytes"]))
        server.close()
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", default="target/release/ferrepl", help="ferrepl binary (a release build)")
    parser.add_argument("--calls", type=int, default=1000, help="calls in the warm loops")
    parser.add_argument("--cold-runs", type=int, default=5, help="server starts for the cold-start median")
    args = parser.parse_args()

    cold = cold_start(args.bin, args.cold_runs)
    warm_med, warm_p99 = warm_latency(args.bin, args.calls)
    floor_med, floor_p99 = floor_latency(args.calls)
    print(f"cold start (spawn -> result of print(1)), median of {args.cold_runs}: {cold:.1f} ms   [target < 100 ms]")
    print(f"warm python_exec 'x = x + 1' over MCP stdio: median {warm_med:.3f} ms, p99 {warm_p99:.3f} ms ({args.calls} calls)")
    print(f"floor (raw pipe to a bare Python exec loop): median {floor_med:.3f} ms, p99 {floor_p99:.3f} ms")
    print(
        f"overhead over the floor: {warm_med - floor_med:+.3f} ms (ratio {warm_med / floor_med:.2f}x)   [target within 0.3 ms]"
    )
    for label, elapsed, before, peak, size in large_output(args.bin):
        print(
            f"{label}: result in {elapsed:.0f} ms ({size} bytes); server peak RSS {peak / 1024:.1f} MiB "
            f"(+{(peak - before) / 1024:.1f} MiB)   [target < 1000 ms, bounded memory]"
        )


if __name__ == "__main__":
    main()
