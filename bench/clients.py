#!/usr/bin/env python3
"""The client matrix: each MCP client (raw, Python SDK, TypeScript SDK, fastmcp)
over each transport (stdio, HTTP), against ferrepl and against a trivial server
that runs nothing (bench/trivial_server.py), the floor for that client.

    python3 bench/clients.py --bin target/release/ferrepl [--calls 300] [--warmup 30] [--json out.json]

Each driver (bench/clients/) makes one untimed `x = 0` call, then --warmup
untimed and --calls timed calls of `x = x + 1`, and prints one JSON line.
Goal: ferrepl's median within 1.2x of the trivial server's, per client and
transport. Standard library only; bench/bench.py imports run_matrix.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DRIVERS = ROOT / "bench" / "clients"
TRIVIAL = [sys.executable, str(ROOT / "bench" / "trivial_server.py")]
TEST_ENV = Path(os.environ.get("FERREPL_TEST_ENV", ROOT / "target" / "test-env"))
GOAL_RATIO = 1.2
TRANSPORTS = ("stdio", "http")


class DriverError(RuntimeError):
    pass


def clients():
    """(name, argv that runs its driver, why it cannot run or None)."""
    venv = TEST_ENV / "venv" / "bin" / "python"
    node = TEST_ENV / "node" / "node_modules" / ".bin" / "node"
    ts_sdk = TEST_ENV / "node" / "node_modules" / "@modelcontextprotocol" / "sdk" / "package.json"
    fastmcp = ROOT / "target" / "bench-env" / "bin" / "python"
    return [
        ("raw", [sys.executable, str(DRIVERS / "raw.py")], None),
        ("py_sdk", [str(venv), str(DRIVERS / "py_sdk.py")],
         None if venv.exists() else f"no {venv}: run scripts/test-env.sh"),
        ("ts_sdk", [str(node), str(DRIVERS / "ts_sdk.mjs")],
         None if node.exists() and ts_sdk.exists() else f"no node or SDK under {TEST_ENV}: run scripts/test-env.sh"),
        ("fastmcp", [str(fastmcp), str(DRIVERS / "fastmcp_client.py")],
         None if fastmcp.exists() else "no target/bench-env: run bench/setup-fastmcp.sh"),
    ]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def wait_for_port(port, proc, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DriverError(f"HTTP server exited with status {proc.returncode} before listening")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.01)
    raise DriverError(f"HTTP server not listening on port {port} after {timeout:.0f} s")


def tail(f):
    f.seek(0)
    return f.read().decode(errors="replace").strip()[-600:]


def run_one(driver, transport, server, env, calls, warmup):
    """A fresh server, one driver run against it: the driver's JSON report.
    `server` is (stdio argv, function of a port -> HTTP argv)."""
    argv = driver + ["--calls", str(calls), "--warmup", str(warmup)]
    budget = 60 + 0.2 * (calls + warmup)  # seconds; a call takes milliseconds
    with tempfile.TemporaryFile() as err:
        proc = None
        try:
            if transport == "stdio":
                argv += ["--", *server[0]]  # the driver spawns it: the spawn is part of connect_ms
            else:
                port = free_port()
                proc = subprocess.Popen(server[1](port), env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=err)
                wait_for_port(port, proc)
                argv += ["--url", f"http://127.0.0.1:{port}/mcp"]
            try:
                done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=err, timeout=budget)
            except subprocess.TimeoutExpired:
                raise DriverError(f"no report after {budget:.0f} s; stderr: {tail(err)}") from None
            if done.returncode != 0:
                raise DriverError(f"exit status {done.returncode}; stderr: {tail(err)}")
            return json.loads(done.stdout.decode().strip().splitlines()[-1])
        finally:
            if proc is not None:
                stop(proc)


def trivial(sse=False):
    return TRIVIAL, lambda port: TRIVIAL + ["--http", str(port)] + (["--sse"] if sse else [])


def run_matrix(ferrepl_cmd, env, calls, warmup, sse=False):
    """Rows {client, transport, trivial, ferrepl, ratio} (ratio of the medians),
    or {client, transport, skipped: reason} for a client that cannot run or
    failed (then `error` too). With sse, HTTP rows also get `trivial_sse`: the
    trivial server with its replies framed as event streams."""
    ferrepl = (ferrepl_cmd, lambda port: ferrepl_cmd + ["--http", f"127.0.0.1:{port}"])
    trivial_env = dict(os.environ)
    rows = []
    for name, driver, missing in clients():
        for transport in TRANSPORTS:
            row = {"client": name, "transport": transport}
            rows.append(row)
            if missing:
                row["skipped"] = missing
                continue
            # ferrepl rebuilds the sessions it finds in its state dir: a fresh one per server.
            if env.get("FERREPL_STATE_DIR"):
                os.makedirs(env["FERREPL_STATE_DIR"], exist_ok=True)
            state = tempfile.mkdtemp(prefix="clients-", dir=env.get("FERREPL_STATE_DIR"))
            try:
                row["trivial"] = run_one(driver, transport, trivial(), trivial_env, calls, warmup)
                if sse and transport == "http":
                    row["trivial_sse"] = run_one(driver, transport, trivial(True), trivial_env, calls, warmup)
                row["ferrepl"] = run_one(driver, transport, ferrepl, dict(env, FERREPL_STATE_DIR=state),
                                         calls, warmup)
                row["ratio"] = row["ferrepl"]["median_ms"] / row["trivial"]["median_ms"]
            except (DriverError, OSError, ValueError, IndexError) as e:
                # bench.py prints `skipped` rows and reads numbers from the others.
                row = {"client": name, "transport": transport, "skipped": f"FAILED: {e}", "error": str(e)}
                rows[-1] = row
            finally:
                shutil.rmtree(state, ignore_errors=True)
    return rows


def print_table(rows):
    sse = any("trivial_sse" in r for r in rows)
    print(f"{'client':<8} {'transport':<9} {'trivial med / p99':>17} {'ferrepl med / p99':>17} {'ratio':>7}  goal  "
          + (f" {'trivial-sse med / p99':>21}" if sse else "") + "  connect trivial / ferrepl")
    for r in rows:
        label = f"{r['client']:<8} {r['transport']:<9}"
        if "skipped" in r:
            print(f"{label} skipped: {r['skipped']}")
            continue
        t, f = r["trivial"], r["ferrepl"]
        verdict = "MET" if r["ratio"] <= GOAL_RATIO else "MISSED"
        line = (f"{label} {t['median_ms']:7.3f} / {t['p99_ms']:7.3f} {f['median_ms']:7.3f} / {f['p99_ms']:7.3f}"
                f" {r['ratio']:6.3f}x  {verdict:<6}")
        if sse:
            s = r.get("trivial_sse")
            line += f"     {s['median_ms']:7.3f} / {s['p99_ms']:7.3f}" if s else " " * 22
        print(line + f"  {t['connect_ms']:7.1f} / {f['connect_ms']:.1f}")
    print(f"times in ms; goal: ferrepl's median <= {GOAL_RATIO}x the trivial server's, per client and transport")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default="target/release/ferrepl", help="ferrepl binary")
    p.add_argument("--python", help="session interpreter (ferrepl --python)")
    p.add_argument("--calls", type=int, default=300, help="timed calls per run (default 300)")
    p.add_argument("--warmup", type=int, default=30, help="untimed calls before them (default 30)")
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--sse", action="store_true", help=argparse.SUPPRESS)  # floor with event-stream replies
    args = p.parse_args()
    if not os.path.exists(args.bin):
        p.error(f"no ferrepl binary at {args.bin}: cargo build --release")
    with tempfile.TemporaryDirectory(prefix="ferrepl-clients-") as tmp:
        workdir, state = os.path.join(tmp, "work"), os.path.join(tmp, "state")
        os.mkdir(workdir), os.mkdir(state)
        cmd = [os.path.abspath(args.bin), "--workdir", workdir] + (["--python", args.python] if args.python else [])
        rows = run_matrix(cmd, dict(os.environ, FERREPL_STATE_DIR=state), args.calls, args.warmup, sse=args.sse)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
