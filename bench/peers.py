#!/usr/bin/env python3
"""Peer bench: a warm `x = x + 1` through ferrepl and through Datalayer's
jupyter-mcp-server, one client (the official Python SDK) for all, in one run.

    bash bench/setup-peers.sh        # target/peer-env/jupyter-mcp, pinned
    target/peer-env/jupyter-mcp/bin/python bench/peers.py --bin target/debug/ferrepl

Paths timed, each over stdio from a fresh server, after a warm-up:
* ferrepl, built-in driver: python_exec.
* ferrepl, ipykernel session: python_sessions create {"kernel": "python3"},
  then python_exec in it. The kernel is the peer env's own ipykernel, so both
  servers run the same kernel.
* jupyter-mcp-server execute_code: code straight to the notebook's kernel
  (through a JupyterLab this script starts on loopback with a random token),
  with its defaults and with progress_interval 1 (its wait polls every
  progress_interval / 5 seconds, at most 1 s: 1 is its fastest).
* jupyter-mcp-server insert_execute_code_cell: the notebook path (each call
  adds a cell to the notebook), fewer calls, since the notebook grows.

It prints the median and p99 per path; --json FILE writes them.
"""

import argparse
import asyncio
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

ENV = Path(sys.prefix)
LOOP = "x = x + 1"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def text_of(result):
    return " ".join(getattr(c, "text", "") for c in result.content)


async def timed(session, tool, args_of, calls, warmup):
    for _ in range(warmup):
        await session.call_tool(tool, args_of(LOOP))
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        result = await session.call_tool(tool, args_of(LOOP))
        times.append(time.perf_counter() - t)
        if result.is_error:
            sys.exit(f"{tool}: {text_of(result)}")
    return times


async def check_value(session, tool, args_of, want):
    """The loop really ran: x holds the count of calls (a server that
    answered without running would fail here)."""
    result = await session.call_tool(tool, args_of("x"))
    if want not in text_of(result):
        sys.exit(f"{tool}: x is not {want}: {text_of(result)[:200]}")


async def ferrepl(bin_path, kernel, calls, warmup):
    work = tempfile.mkdtemp(prefix="peers-")
    env = dict(os.environ, FERREPL_STATE_DIR=os.path.join(work, ".state"))
    os.makedirs(os.path.join(work, "ws"))
    args = ["--workdir", os.path.join(work, "ws")]
    if kernel:
        env["JUPYTER_PATH"] = str(ENV / "share" / "jupyter")
        args += ["--kernels", "python3"]
    params = StdioServerParameters(command=bin_path, args=args, env=env)
    try:
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            session = "default"
            if kernel:
                session = "k"
                made = await s.call_tool(
                    "python_sessions", {"action": "create", "session": "k", "kernel": "python3"}
                )
                if made.is_error:
                    sys.exit(f"create: {text_of(made)}")

            def args_of(code):
                return {"code": code, "session": session}

            await s.call_tool("python_exec", args_of("x = 0"))
            times = await timed(s, "python_exec", args_of, calls, warmup)
            await check_value(s, "python_exec", args_of, str(calls + warmup))
            return times
    finally:
        shutil.rmtree(work, ignore_errors=True)


class JupyterLab:
    """A JupyterLab on loopback with a random token, in a temporary root."""

    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="peers-lab-")
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.proc = subprocess.Popen(
            [str(ENV / "bin" / "jupyter"), "lab", "--allow-root", "--no-browser",
             f"--port={self.port}", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.token={self.token}", f"--ServerApp.root_dir={self.root}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd=self.root,
            stderr=open(os.path.join(self.root, "lab.log"), "wb"),
        )
        url = f"{self.url}/api/status?token={self.token}"
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).read()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    sys.exit("JupyterLab did not start; see its log")
                time.sleep(0.2)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.root, ignore_errors=True)


async def jupyter_mcp(lab, tool, calls, warmup, extra=None):
    env = dict(os.environ, JUPYTER_URL=lab.url, JUPYTER_TOKEN=lab.token,
               DOCUMENT_ID=f"bench-{tool}.ipynb")
    params = StdioServerParameters(
        command=str(ENV / "bin" / "jupyter-mcp-server"), args=["start", "--transport", "stdio"], env=env
    )
    async with stdio_client(params, errlog=open(os.devnull, "w")) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        if tool == "execute_code":
            def args_of(code):
                return {"code": code, **(extra or {})}
        else:
            made = await s.call_tool(
                "use_notebook",
                {"notebook_name": "bench", "notebook_path": f"bench-{tool}.ipynb", "mode": "create"},
            )
            if made.is_error:
                sys.exit(f"use_notebook: {text_of(made)}")

            def args_of(code):
                return {"cell_index": -1, "cell_source": code}
        await s.call_tool(tool, args_of("x = 0"))
        times = await timed(s, tool, args_of, calls, warmup)
        await check_value(s, tool, args_of, str(calls + warmup))
        return times


def summary(times):
    ms = sorted(t * 1000 for t in times)
    return {"median_ms": round(statistics.median(ms), 2),
            "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2), "calls": len(ms)}


async def main(args):
    rows = {}
    rows["ferrepl built-in (python_exec)"] = summary(await ferrepl(args.bin, False, args.calls, args.warmup))
    rows["ferrepl ipykernel session (python_exec)"] = summary(
        await ferrepl(args.bin, True, args.calls, args.warmup))
    lab = JupyterLab()
    try:
        rows["jupyter-mcp-server execute_code"] = summary(
            await jupyter_mcp(lab, "execute_code", args.peer_calls, args.warmup))
        # Its wait polls every progress_interval / 5 seconds (at most 1 s,
        # at least 50 ms): 1, the smallest whole value, is its fastest.
        rows["jupyter-mcp-server execute_code, progress_interval 1"] = summary(
            await jupyter_mcp(lab, "execute_code", args.peer_calls, args.warmup, {"progress_interval": 1}))
        rows["jupyter-mcp-server insert_execute_code_cell"] = summary(
            await jupyter_mcp(lab, "insert_execute_code_cell", args.notebook_calls, args.warmup))
    finally:
        lab.close()
    width = max(map(len, rows))
    print(f"{'path':<{width}}  median     p99   calls")
    for name, row in rows.items():
        print(f"{name:<{width}}  {row['median_ms']:>6.2f}  {row['p99_ms']:>6.2f}  {row['calls']:>6}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True, help="the ferrepl binary")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--peer-calls", type=int, default=50, help="calls per jupyter-mcp-server path")
    p.add_argument("--notebook-calls", type=int, default=30)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--json", help="write the numbers here")
    asyncio.run(main(p.parse_args()))
