#!/usr/bin/env python3
"""Saved states (docs/tools.md, "Saved states"): how long a save and a load
take for NumPy/pandas state of 10 MB, 100 MB and 1 GB, against re-running
the cell that built it, the file's size, and the interpreter's peak memory
(VmHWM) after the save, under --memory-limit.

    cargo build && python3 bench/saved_state.py --bin target/debug/ferrepl \\
        --python target/test-env/rich/bin/python

The save is the idle one (10 s after the last cell); its time is the
driver's (pickling and sending), from the state's NAME.json; peak memory is
the interpreter's VmHWM before and after it. A 1 GB state needs
`-- --state-max-mb 2048` (the default budget is 512 MiB). The load is `python_sessions resume` in a new server.
Only the standard library is used here (NumPy and pandas in the session).
"""

import argparse
import glob
import json
import os
import subprocess
import tempfile
import time

BUILD = """
import numpy as np, pandas as pd
n = {n}
arr = np.random.default_rng(1).random(n // 2)
df = pd.DataFrame({{"a": np.arange(n // 4), "b": np.random.default_rng(2).random(n // 4)}})
"""
CHECK = "print(float(arr.sum()).__round__(3), df.shape, float(df.b.mean()).__round__(4))"
PEAK = "print([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1])"


class Server:
    def __init__(self, args, ws, state):
        self.p = subprocess.Popen(
            [args.bin, "--python", args.python, "--workdir", ws, "--state-dir", state,
             "--memory-limit", args.memory_limit, "--max-wait", "900", *args.extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.n = 0
        self.rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                "clientInfo": {"name": "bench", "version": "1"}})
        self.p.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
        self.p.stdin.flush()

    def rpc(self, method, params):
        self.n += 1
        self.p.stdin.write(json.dumps({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params}) + "\n")
        self.p.stdin.flush()
        while True:
            m = json.loads(self.p.stdout.readline())
            if m.get("id") == self.n:
                return m["result"]

    def call(self, tool, args):
        started = time.monotonic()
        r = self.rpc("tools/call", {"name": tool, "arguments": args})
        return time.monotonic() - started, r["content"][0]["text"]

    def stop(self):
        started = time.monotonic()
        self.p.stdin.close()
        self.p.wait(timeout=900)
        return time.monotonic() - started


def mib(text):
    first = text.split()[0] if text.split() else ""
    return round(int(first) / 1024) if first.isdigit() else None


def one(args, mb):
    with tempfile.TemporaryDirectory() as tmp:
        ws, state = os.path.join(tmp, "ws"), os.path.join(tmp, "state")
        os.mkdir(ws)
        s = Server(args, ws, state)
        n = mb * (1 << 20) // 8
        build_s, out = s.call("python_exec", {"code": BUILD.format(n=n), "session": "b", "wait_s": 900})
        assert "-- ok" in out, out
        _, before = s.call("python_exec", {"code": CHECK, "session": "b"})
        _, peak_built = s.call("python_exec", {"code": PEAK, "session": "b"})
        # The idle save (10 s after the last cell), then the peak again.
        time.sleep(16)
        _, peak_saved = s.call("python_exec", {"code": PEAK, "session": "b"})
        stop_s = s.stop()
        meta_path = glob.glob(os.path.join(state, "*.states", "b.json"))
        if not meta_path:
            return {"mb": mb, "error": "no state saved"}
        meta = json.load(open(meta_path[0]))
        s = Server(args, ws, state)
        load_s, note = s.call("python_sessions", {"action": "resume", "session": "b"})
        _, after = s.call("python_exec", {"code": CHECK, "session": "b"})
        _, peak = s.call("python_exec", {"code": PEAK, "session": "b"})
        s.stop()
        same = before.splitlines()[0] == after.splitlines()[0]
        return {
            "mb": mb,
            "build_s": round(build_s, 2),
            "save_s": meta["seconds"],
            "shutdown_s": round(stop_s, 2),
            "file_mb": round(meta["bytes"] / (1 << 20), 1),
            "load_s": round(load_s, 2),
            "same": same,
            "peak_before_save_mb": mib(peak_built),
            "peak_after_save_mb": mib(peak_saved),
            "peak_after_load_mb": round(int(peak.split()[0]) / 1024) if peak.split()[0].isdigit() else None,
        }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/debug/ferrepl")
    ap.add_argument("--python", default="target/test-env/rich/bin/python")
    ap.add_argument("--sizes", default="10,100,1024")
    ap.add_argument("--memory-limit", default="4G")
    ap.add_argument("extra", nargs="*", help="more server flags, after --")
    args = ap.parse_args()
    for mb in [int(x) for x in args.sizes.split(",")]:
        print(json.dumps(one(args, mb)), flush=True)


if __name__ == "__main__":
    main()
