"""One handshake and one python_exec through each installed `ferrepl`
command given (a venv's console script, `uvx --from WHEEL ferrepl`), with the
official MCP Python SDK. Used by scripts/wheel-check.sh; exits non-zero with
the reason when a command does not work."""

import argparse
import asyncio
import shlex
import sys
import tempfile

from mcp import Client, StdioServerParameters


async def check(argv, workdir):
    params = StdioServerParameters(command=argv[0], args=[*argv[1:], "--workdir", workdir, "--resume", "off"])
    async with Client(params) as client:
        tools = {t.name for t in (await client.list_tools()).tools}
        assert "python_exec" in tools, tools
        result = await client.call_tool("python_exec", {"code": "6 * 7"})
        text = "".join(getattr(b, "text", "") for b in result.content)
        assert not result.is_error and "42" in text, text


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--command", action="append", required=True)
    args = parser.parse_args()
    for command in args.command:
        with tempfile.TemporaryDirectory() as workdir:
            try:
                asyncio.run(check(shlex.split(command), workdir))
            except Exception as e:  # report which command failed, and how
                sys.exit(f"wheel check: `{command}` failed: {e!r}")
        print(f"wheel check: `{command}` answered python_exec")


if __name__ == "__main__":
    main()
