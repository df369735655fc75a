#!/usr/bin/env python3
"""Bench driver on the official Python SDK (`mcp`): ClientSession over
stdio_client or streamable_http_client. Run it with a Python that has `mcp`.

    py_sdk.py [--calls N] [--warmup W] (--url URL | -- CMD ARGS...)
"""

import asyncio
import os
import time

from _common import fail, parse_args, report, time_calls
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client


async def call(session, code):
    result = await session.call_tool("python_exec", {"code": code})
    if result.is_error:
        fail(f"python_exec {code!r}: {result.content}")


async def run(args):
    start = time.perf_counter()
    if args.url:
        transport = streamable_http_client(args.url)
    else:
        # The SDK passes the child only a few variables unless told; the server
        # needs ours (FERREPL_STATE_DIR and the like).
        params = StdioServerParameters(command=args.cmd[0], args=args.cmd[1:], env=dict(os.environ))
        transport = stdio_client(params)
    async with transport as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        connect, times = await time_calls(lambda code: call(session, code), args, start)
    report("py_sdk", args, connect, times)


if __name__ == "__main__":
    asyncio.run(run(parse_args(__doc__)))
