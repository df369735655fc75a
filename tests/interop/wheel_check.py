"""One handshake and one python_exec through each installed `ferrepl`
command given (a venv's console script, `uvx --from WHEEL ferrepl`), with the
official MCP Python SDK; with --install (a command line, repeatable), also
through the entry that command's `ferrepl install --client claude-code
--scope project` writes into a project's .mcp.json, exactly as written: run
by uvx from a wheel that stays, that entry must name uvx and the wheel, not
uv's cache. With --temp-wheel-uvx UVX --wheel WHEEL, install run by uvx from
a copy of the wheel in a temporary directory must refuse, writing nothing.
Used by scripts/wheel-check.sh; exits non-zero with the reason when a command
does not work."""

import argparse
import asyncio
import json
import os
import shutil
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
        [*shlex.split(command), "install", "--client", "claude-code", "--scope", "project", "--workdir", project],
        check=True,
        env=env,
    )
    with open(os.path.join(project, ".mcp.json")) as f:
        entry = json.load(f)["mcpServers"]["ferrepl"]
    return [entry["command"], *entry["args"]]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--command", action="append", required=True)
    parser.add_argument("--install", action="append", default=[],
                        help="a ferrepl command line whose `install` output is checked too")
    parser.add_argument("--temp-wheel-uvx", help="uvx, to check install refuses a wheel in a temporary directory")
    parser.add_argument("--wheel", help="the wheel, for --temp-wheel-uvx")
    args = parser.parse_args()
    for command in args.install:
        with tempfile.TemporaryDirectory() as home, tempfile.TemporaryDirectory() as project:
            argv = installed_entry(command, home, project)
            if "/archive-v" in " ".join(argv):
                sys.exit(f"wheel check: `{command} install` wrote a path into uv's cache: {argv}")
            try:
                asyncio.run(check(argv))
            except Exception as e:
                sys.exit(f"wheel check: the entry `{command} install` wrote, {argv}, failed: {e!r}")
            print(f"wheel check: the entry `{command} install` wrote ({shlex.join(argv)}) answered python_exec")
    if args.temp_wheel_uvx:
        with tempfile.TemporaryDirectory() as tmp:
            wheel = shutil.copy(args.wheel, tmp)
            home, project = os.path.join(tmp, "home"), os.path.join(tmp, "project")
            os.mkdir(home)
            os.mkdir(project)
            run = subprocess.run(
                [args.temp_wheel_uvx, "--offline", "--from", wheel, "ferrepl", "install", "--client",
                 "claude-code", "--scope", "project", "--workdir", project],
                env=dict(os.environ, HOME=home), capture_output=True, text=True,
            )
            if run.returncode == 0 or "temporary directory" not in run.stderr or os.listdir(project):
                sys.exit(f"wheel check: install from a wheel in {tmp} was not refused: {run.stdout}{run.stderr}")
            print("wheel check: install run by uvx from a wheel in a temporary directory refused, writing nothing")
    for command in args.command:
        with tempfile.TemporaryDirectory() as workdir:
            try:
                asyncio.run(check(shlex.split(command), workdir))
            except Exception as e:  # report which command failed, and how
                sys.exit(f"wheel check: `{command}` failed: {e!r}")
        print(f"wheel check: `{command}` answered python_exec")


if __name__ == "__main__":
    main()
