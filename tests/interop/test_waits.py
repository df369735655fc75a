"""Waits never outlive the client, and results survive a lost response, with
the official Python SDK over stdio and HTTP.

* Every wait is capped by --max-wait (here 2 s, so the test is quick; the
  default 50 s is under the TypeScript SDK's 60 s timeout): a cell asked to
  wait 90 s returns `running` and keeps going; python_wait collects it.
* A client killed in the middle of a call (HTTP): a new client finds the
  session and collects the result, sent again if the orphaned call took
  it first. In the legacy era the cell runs on to its end; in the modern
  era (2026-07-28) the closed response stream is the request's cancellation,
  so the cell is interrupted, and the session keeps its variables.

Cells wait on a gate file in the workspace, never on a timer. Every test
runs in both protocol eras (`mode`, see conftest.py).
"""

import os
import signal
import subprocess
import sys
import textwrap

import anyio
import pytest
from mcp import StdioServerParameters

import conftest

GATED = "import time, pathlib\nwhile not pathlib.Path('go').exists(): time.sleep(0.02)\n'finished'"
KEPT = "kept = 'before the gate'\n"


def text(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def footer(result) -> str:
    return text(result).rstrip("\n").rsplit("\n", 1)[-1]


async def collect(client, session=None):
    """python_wait until the cell is no longer running."""
    args = {"wait_s": 5} if session is None else {"wait_s": 5, "session": session}
    for _ in range(40):
        result = await client.call_tool("python_wait", args)
        if not footer(result).startswith("-- running |"):
            return result
    pytest.fail(f"the cell kept running: {text(result)}")


@pytest.fixture(params=["stdio", "http"])
def capped(request, ferrepl_bin, workdir):
    args = ["--max-wait", "2"]
    if request.param == "stdio":
        yield StdioServerParameters(
            command=ferrepl_bin, args=["--workdir", str(workdir), *args], env=conftest.state_env(workdir)
        )
        return
    server = conftest.HttpServer(ferrepl_bin, workdir, args)
    server.wait_ready()
    yield server.url
    server.stop()


@pytest.mark.timeout(120)
def test_no_wait_outlives_max_wait(capped, workdir, mode):
    async def run():
        async with conftest.connect(capped, mode) as client:
            first = await client.call_tool("python_exec", {"code": GATED, "wait_s": 90})
            assert footer(first).startswith("-- running | cell 1 |"), text(first)
            assert not first.is_error, text(first)
            (workdir / "go").touch()
            done = await collect(client)
            assert footer(done).startswith("-- ok | cell 1 |"), text(done)
            assert "'finished'" in text(done)

    anyio.run(run)


CLIENT_A = textwrap.dedent(
    """
    import sys, anyio
    from mcp import Client

    async def main():
        async with Client(sys.argv[1], mode=sys.argv[3]) as c:
            await c.call_tool("python_exec", {"code": sys.argv[2], "wait_s": 40})

    anyio.run(main)
    """
)


@pytest.mark.timeout(120)
def test_a_killed_clients_result_reaches_the_next_client(http_url_plain, workdir, mode):
    holder = subprocess.Popen([sys.executable, "-c", CLIENT_A, http_url_plain, KEPT + GATED, conftest.MODES[mode]])

    async def run():
        async with conftest.connect(http_url_plain, mode) as client:
            for _ in range(1000):
                listing = text(await client.call_tool("python_sessions", {}))
                if "busy" in listing:
                    break
                if holder.poll() is not None:
                    pytest.fail(f"client A exited ({holder.returncode}) before its cell ran")
                await anyio.sleep(0.02)
            else:
                pytest.fail(f"client A's cell never ran: {listing}")
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(10)
            if mode == "legacy":
                (workdir / "go").touch()

        # A new connection: the same principal, the same sessions.
        async with conftest.connect(http_url_plain, mode) as client:
            done = await collect(client)
            if mode == "legacy":
                # A dropped connection is not a cancellation there: the cell ran on.
                assert footer(done).startswith("-- ok | cell 1 |"), text(done)
                assert "'finished'" in text(done)
            else:
                # 2026-07-28 (basic/patterns/cancellation): over HTTP, closing the
                # response stream cancels the request, and a cancelled
                # python_exec interrupts its cell.
                assert footer(done).startswith("-- interrupted | cell 1 |"), text(done)
                assert "KeyboardInterrupt" in text(done), text(done)
            kept = await client.call_tool("python_exec", {"code": "kept"})
            assert footer(kept).startswith("-- ok | cell 2 |"), text(kept)
            assert "'before the gate'" in text(kept), text(kept)

    try:
        anyio.run(run)
    finally:
        if holder.poll() is None:
            holder.kill()
