"""An upstream MCP server for the tests of code calling tools (`--mcp-servers`).

Written with the official Python SDK (`mcp`, the test venv's), it serves over
stdio by default, or streamable HTTP at http://127.0.0.1:PORT/mcp:

    target/test-env/venv/bin/python tests/upstream/test_upstream.py
    target/test-env/venv/bin/python tests/upstream/test_upstream.py --http PORT [--port-file F]
        [--json-response] [--require-header 'NAME: VALUE']

`--http 0` takes a free port; `--port-file F` then names it (written once the
socket listens, so a test waits for F rather than racing for a port).
`--json-response` answers POSTs with plain JSON instead of an SSE stream.
`--require-header 'NAME: VALUE'` answers 401 to any request without that
header (exact value), to prove a server's configured `headers` are sent.

Tools:
  echo(text)          the text back (a text block, no structured content)
  add(a, b)           structuredContent {"sum": a+b}, with an output schema
  fail(message)       a result with isError true and the message
  slow(seconds)       sleeps, then "slept"; a cancellation is logged
  peak()              the most slow calls that ran at once so far
  huge(n)             a text of n bytes ('x' * n)
  crash()             exits at once (code 3) without answering
  image()             a 2x2 PNG image block, then a text block
  env(name)           the variable's value in this process's environment, or ""
  progress(steps)     a progress notification per step, then "done"
  children(seconds)   starts `sleep SECONDS` in a session of its own (not in
                      this process's group) and returns its pid

With UPSTREAM_LOG set, lines are appended to that file (one write each, so
several upstreams may share it):
  started pid=PID [http port=PORT]
  refused METHOD without NAME             (--require-header, a request without it)
  called TOOL
  cancelled REQUEST_ID seconds=SECONDS    (slow, on notifications/cancelled)
  child pid=PID                           (children; the pid also goes to $UPSTREAM_LOG.child)
  stopped pid=PID                         (stdin closed, SIGTERM, or the HTTP server ended)
"""

from __future__ import annotations

import argparse
import base64
import os
import signal
import socket
import struct
import subprocess
import sys
import zlib
from typing import TypedDict

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, ImageContent, TextContent

LOG = os.environ.get("UPSTREAM_LOG")


def log(line: str) -> None:
    if LOG:
        fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


def tiny_png() -> bytes:
    """A valid 2x2 RGB PNG (red, green / blue, white), made without PIL."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"\x00\xff\x00\x00\x00\xff\x00" + b"\x00\x00\x00\xff\xff\xff\xff"
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


server = MCPServer("ferrepl-test-upstream", version="1.0.0", log_level="WARNING")


class Sum(TypedDict):
    sum: int


@server.tool(structured_output=False)
def echo(text: str) -> str:
    """Returns the text."""
    log("called echo")
    return text


@server.tool()
def add(a: int, b: int) -> Sum:
    """Adds two integers; the sum is structured content."""
    log("called add")
    return {"sum": a + b}


@server.tool()
def fail(message: str) -> CallToolResult:
    """Returns an error result (isError) carrying the message."""
    log("called fail")
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


# Slow calls running now and the most at once (one event loop: no lock).
SLOW = {"running": 0, "peak": 0}


@server.tool(structured_output=False)
async def slow(seconds: float, ctx: Context) -> str:
    """Sleeps for the given seconds, then returns "slept"."""
    log("called slow")
    SLOW["running"] += 1
    SLOW["peak"] = max(SLOW["peak"], SLOW["running"])
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        log(f"cancelled {ctx.request_id} seconds={seconds:g}")
        raise
    finally:
        SLOW["running"] -= 1
    return "slept"


@server.tool(structured_output=False)
def peak() -> str:
    """The most slow calls that ran at once in this process so far."""
    log("called peak")
    return str(SLOW["peak"])


@server.tool(structured_output=False)
def huge(n: int) -> str:
    """Returns a text of n bytes."""
    log("called huge")
    return "x" * n


@server.tool(structured_output=False)
def crash() -> str:
    """Ends this server's process at once, without an answer."""
    log("called crash")
    os._exit(3)


@server.tool()
def image() -> CallToolResult:
    """Returns a tiny PNG image and a text block."""
    log("called image")
    data = base64.b64encode(tiny_png()).decode()
    return CallToolResult(
        content=[
            ImageContent(type="image", data=data, mime_type="image/png"),
            TextContent(type="text", text="a 2x2 png"),
        ]
    )


@server.tool(structured_output=False)
def env(name: str) -> str:
    """The value of an environment variable of this server, or ""."""
    log("called env")
    return os.environ.get(name, "")


@server.tool(structured_output=False)
async def progress(steps: int, ctx: Context) -> str:
    """Sends one progress notification per step, then returns "done"."""
    log("called progress")
    for i in range(1, steps + 1):
        await ctx.report_progress(i, steps, f"step {i}")
        await anyio.sleep(0.05)
    return "done"


@server.tool(structured_output=False)
def children(seconds: float) -> str:
    """Starts `sleep SECONDS` in a session of its own and returns its pid."""
    log("called children")
    child = subprocess.Popen(
        ["sleep", f"{seconds:g}"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    log(f"child pid={child.pid}")
    if LOG:
        with open(LOG + ".child", "w") as f:
            f.write(f"{child.pid}\n")
    return str(child.pid)


def require_header(app, header: str):
    """`app` answering 401 to a request without the header `NAME: VALUE`."""
    name, _, value = header.partition(":")
    name, value = name.strip().lower().encode(), value.strip().encode()

    async def guarded(scope, receive, send):
        if scope["type"] == "http" and dict(scope["headers"]).get(name) != value:
            log(f"refused {scope['method']} without {name.decode()}")
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"missing or wrong header\n"})
            return
        await app(scope, receive, send)

    return guarded


def serve_http(port: int, port_file: str | None, json_response: bool, header: str | None) -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    port = sock.getsockname()[1]
    app = server.streamable_http_app(json_response=json_response)
    if header:
        app = require_header(app, header)
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    log(f"started pid={os.getpid()} http port={port}")
    print(f"test_upstream: listening on http://127.0.0.1:{port}/mcp", file=sys.stderr, flush=True)
    if port_file:
        tmp = port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{port}\n")
        os.replace(tmp, port_file)
    anyio.run(lambda: uv.serve(sockets=[sock]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on 127.0.0.1:PORT/mcp (0: any free port)")
    parser.add_argument("--port-file", help="with --http, write the port listened on to this file")
    parser.add_argument("--json-response", action="store_true", help="with --http, answer with JSON rather than SSE")
    parser.add_argument("--require-header", metavar="'NAME: VALUE'", help="with --http, answer 401 to requests without it")
    args = parser.parse_args()

    def terminated(signum: int, frame: object) -> None:
        log(f"stopped pid={os.getpid()}")
        os._exit(0)

    # Over HTTP, uvicorn takes SIGTERM for a graceful end, then restores this
    # handler and raises it again.
    signal.signal(signal.SIGTERM, terminated)
    try:
        if args.http is not None:
            serve_http(args.http, args.port_file, args.json_response, args.require_header)
        else:
            log(f"started pid={os.getpid()}")
            server.run("stdio")
    finally:
        log(f"stopped pid={os.getpid()}")


if __name__ == "__main__":
    main()
