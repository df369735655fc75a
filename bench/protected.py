#!/usr/bin/env python3
"""What the supervisor of protected places costs (docs/security.md,
"Protected places"): the same server with the places kept (the default) and
freed (--allow-write-protected all), in alternating turns so that a change
in the machine's speed weighs on both.

    cargo build --release && python3 bench/protected.py --bin target/release/ferrepl

Prints, for each: a new session's start (python_sessions create, then its
first `1`), the warm latency of `x = x + 1` (no filtered call), and a cell
that makes, writes, renames and removes 200 files in the workspace (every
call filtered). Only the standard library is used.
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

FILES_CELL = """
import os
for i in range(200):
    with open(f"f{i}.tmp", "w") as f:
        f.write("x")
    os.rename(f"f{i}.tmp", f"g{i}.tmp")
    os.remove(f"g{i}.tmp")
"""


class Server:
    def __init__(self, binary, freed):
        self.ws = tempfile.mkdtemp(prefix="ferrepl-bench-ws-")
        self.state = tempfile.mkdtemp(prefix="ferrepl-bench-state-")
        args = [binary, "--workdir", self.ws, "--state-dir", self.state, "--warm-pool", "0"]
        if freed:
            args += ["--allow-write-protected", "all"]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        self.next = 0
        self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "bench", "version": "1"}})
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
        self.proc.stdin.flush()

    def request(self, method, params):
        self.next += 1
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": self.next, "method": method,
                                          "params": params}) + "\n")
        self.proc.stdin.flush()
        while True:
            msg = json.loads(self.proc.stdout.readline())
            if msg.get("id") == self.next:
                if "error" in msg or msg.get("result", {}).get("isError"):
                    raise SystemExit(f"{method} failed: {msg}")
                return msg

    def call(self, tool, args):
        return self.request("tools/call", {"name": tool, "arguments": args})

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def timed(fn):
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="target/release/ferrepl")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--starts", type=int, default=5)
    opts = ap.parse_args()
    results = {False: {"start": [], "warm": [], "files": []},
               True: {"start": [], "warm": [], "files": []}}
    servers = {freed: Server(os.path.abspath(opts.bin), freed) for freed in (False, True)}
    session = 0
    for _ in range(opts.turns):
        for freed, server in servers.items():
            r = results[freed]
            for _ in range(opts.starts):
                session += 1
                name = f"s{session}"
                r["start"].append(timed(lambda: (
                    server.call("python_sessions", {"action": "create", "session": name}),
                    server.call("python_exec", {"code": "1", "session": name}))))
                server.call("python_sessions", {"action": "delete", "session": name})
            server.call("python_exec", {"code": "x = 0"})
            for _ in range(opts.calls):
                r["warm"].append(timed(lambda: server.call("python_exec", {"code": "x = x + 1"})))
            r["files"].append(timed(lambda: server.call("python_exec", {"code": FILES_CELL})))
    for server in servers.values():
        server.close()
    print(f"{'':28}{'kept (default)':>16}{'freed':>12}{'ratio':>8}")
    for key, label in [("start", "session start, median ms"), ("warm", "warm x=x+1, median ms"),
                       ("files", "200 files cell, median ms")]:
        kept, freed = statistics.median(results[False][key]), statistics.median(results[True][key])
        print(f"{label:28}{kept:16.3f}{freed:12.3f}{kept / freed:8.2f}")


if __name__ == "__main__":
    main()
