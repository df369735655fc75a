"""One handshake and one python_exec through each installed `ferrepl`
command given (a venv's console script, `uvx --from WHEEL ferrepl`), with the
official MCP Python SDK; with --install, also through the entry that
command's `ferrepl install --client claude-code --scope project` writes into
a project's .mcp.json. Used by scripts/wheel-check.sh; exits non-zero with
the reason when a command does not work."""

import argparse
import asyncio
import json
import os
import subprocess
import shlex
import sys
import tempfile

from mcp import Client, StdioServerParameters


async def check(argv, workdir=None):
    extra = ["--workdir", workdir] if workdir else []
    params = StdioServerParameters(command=argv[0], args=[*argv[1:], *extra, "--resume", "off"])
    async with Client(params) as client:
        tools = {t.name for t in (await client.list_tools()).tools}
        assert "python_exec" in tools, tools
        result = await client.call_tool("python_exec", {"code": "6 * 7"})
        text = "".join(getattr(b, "text", "") for b in result.content)
        assert not result.is_error and "42" in text, text


def installed_entry(command, home, project):
    """The command line `ferrepl install` writes for Claude Code in `project`."""
    env = dict(os.environ, HOME=home)
    subprocess.run(
        [command, "install", "--client", "claude-code", "--scope", "project", "--workdir", project],
        check=True,
        env=env,
    )
    with open(os.path.join(project, ".mcp.json")) as f:
        entry = json.load(f)["mcpServers"]["ferrepl"]
    return [entry["command"], *entry["args"]]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--command", action="append", required=True)
    parser.add_argument("--install", help="a ferrepl command whose `install` output is checked too")
    args = parser.parse_args()
    if args.install:
        with tempfile.TemporaryDirectory() as home, tempfile.TemporaryDirectory() as project:
            argv = installed_entry(args.install, home, project)
            try:
                asyncio.run(check(argv))
            except Exception as e:
                sys.exit(f"wheel check: the installed entry {argv} failed: {e!r}")
            print(f"wheel check: the entry `ferrepl install` wrote ({argv[0]}) answered python_exec")
    for command in args.command:
        with tempfile.TemporaryDirectory() as workdir:
            try:
                asyncio.run(check(shlex.split(command), workdir))
            except Exception as e:  # report which command failed, and how
                sys.exit(f"wheel check: `{command}` failed: {e!r}")
        print(f"wheel check: `{command}` answered python_exec")


if __name__ == "__main__":
    main()
