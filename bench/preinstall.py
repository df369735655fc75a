#!/usr/bin/env python3
"""The first `import pandas` of a new environment, with and without
`--preinstall` and `--preimport` (README, "Ready-made environments").

    cargo build --release && python3 bench/preinstall.py --bin target/release/ferrepl

Four servers over stdio; the ones marked "restart" reuse the workspace and
state directory of the one before them, so the kept venv has the package
and its stamp (a new session there is taken from the warm pool, given
`--pool-wait` seconds to refill):

* none: the agent's way without the flags: python_install, then the import;
* preinstall (first start): spawn to the first import's result, the
  background install included;
* preinstall (restart): the first import in a new session;
* preinstall + preimport (restart): the same, the module imported already.

Each line gives the wall time of the calls and the import's own time inside
the cell. Needs the package index (PyPI or the machine's mirror). Only the
standard library is used.
"""

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time

IMPORT = (
    "import time as _t\n_s = _t.perf_counter()\nimport {m}\n"
    "_d = _t.perf_counter() - _s\nround(_d * 1000, 1)"
)


class Server:
    def __init__(self, binary, workdir, state, python, extra):
        args = [binary, "--workdir", workdir, "--state-dir", state, "--python", python, *extra]
        env = dict(os.environ, FERREPL_TOOLS="all", FERREPL_STRUCTURED_CONTENT="true")
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env, text=True)
        self.next = 0
        self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "bench", "version": "1"}})
        self.notify("notifications/initialized")

    def notify(self, method):
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": method}) + "\n")
        self.proc.stdin.flush()

    def request(self, method, params):
        self.next += 1
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": self.next, "method": method,
                                          "params": params}) + "\n")
        self.proc.stdin.flush()
        while True:
            msg = json.loads(self.proc.stdout.readline())
            if msg.get("id") == self.next:
                return msg

    def call(self, tool, args):
        msg = self.request("tools/call", {"name": tool, "arguments": args})
        result = msg.get("result") or {}
        text = "".join(c.get("text", "") for c in result.get("content", []))
        return result, text

    def run(self, code, session="default"):
        """python_exec, then python_wait until the cell's result is in."""
        result, text = self.call("python_exec", {"code": code, "session": session, "wait_s": 45})
        while '"running"' in json.dumps(result.get("structuredContent", {})) or "status: running" in text:
            result, text = self.call("python_wait", {"session": session, "wait_s": 45})
        return result, text

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def value(result):
    return (result.get("structuredContent") or {}).get("value")


def measure(args, label, extra, state, install_first=False, session="default"):
    # The kept venv is the workspace's: a restart names the same one.
    workdir = state + "-ws"
    os.makedirs(workdir, exist_ok=True)
    started = time.perf_counter()
    server = Server(args.bin, workdir, state, args.python, extra)
    handshake = time.perf_counter() - started
    if session != "default":
        server.run("1", "default")
        # The warm pool refills once the default session is up: a new
        # session then takes a ready (and preimported) interpreter.
        time.sleep(args.pool_wait)
    t0 = time.perf_counter()
    if install_first:
        result, text = server.call("python_install", {"packages": [args.package], "wait_s": 45})
        while "running" in json.dumps(result.get("structuredContent", {})):
            result, text = server.call("python_install", {"packages": [args.package], "wait_s": 45})
    result, text = server.run(IMPORT.format(m=args.module), session)
    wall = time.perf_counter() - t0
    server.close()
    print(f"{label:<36} handshake {handshake * 1000:7.0f} ms   first import call {wall * 1000:8.0f} ms"
          f"   import inside the cell {value(result)} ms   (since spawn {(time.perf_counter() - started) * 1000:.0f} ms)")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", default="target/release/ferrepl")
    p.add_argument("--python", default=shutil.which("python3"))
    p.add_argument("--package", default="pandas")
    p.add_argument("--module", default="pandas")
    p.add_argument("--pool-wait", type=float, default=3.0,
                   help="seconds given the warm pool to refill before a new session (default 3)")
    a = p.parse_args()
    root = tempfile.mkdtemp(prefix="ferrepl-bench-state-")
    try:
        measure(a, "none (python_install, then import)", [], os.path.join(root, "none"), install_first=True)
        state = os.path.join(root, "pre")
        pre = ["--preinstall", a.package]
        measure(a, "preinstall (first start)", pre, state)
        measure(a, "preinstall (restart, new session)", pre, state, session="fresh")
        measure(a, "preinstall + preimport (restart)", pre + ["--preimport", a.module], state, session="fresh")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
