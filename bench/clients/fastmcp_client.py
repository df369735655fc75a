#!/usr/bin/env python3
"""Bench driver on fastmcp's Client (StdioTransport or StreamableHttpTransport),
with its defaults, protocol negotiation included. Run it with
target/bench-env/bin/python (bench/setup-fastmcp.sh makes it).

    fastmcp_client.py [--calls N] [--warmup W] (--url URL | -- CMD ARGS...)
"""

import asyncio
import os
import time

from _common import fail, parse_args, report, time_calls
from fastmcp import Client
from fastmcp.client.transports import StdioTransport, StreamableHttpTransport


async def call(client, code):
    # raise_on_error=False: a tool error must fail the driver with our message,
    # not as fastmcp's ToolError from inside its task group.
    result = await client.call_tool("python_exec", {"code": code}, raise_on_error=False)
    if result.is_error:
        fail(f"python_exec {code!r}: {result.content}")


async def run(args):
    start = time.perf_counter()
    if args.url:
        transport = StreamableHttpTransport(args.url)
    else:
        transport = StdioTransport(command=args.cmd[0], args=args.cmd[1:], env=dict(os.environ))
    async with Client(transport) as client:
        connect, times = await time_calls(lambda code: call(client, code), args, start)
    report("fastmcp", args, connect, times)


if __name__ == "__main__":
    asyncio.run(run(parse_args(__doc__)))
