"""`ferrepl install` end to end with the official MCP Python SDK: the entry
it writes into a project's .mcp.json (Claude Code's project file) is what the
SDK launches, and that server answers python_exec."""

import asyncio
import json
import os
import subprocess

import pytest
from mcp import StdioServerParameters

import conftest

pytestmark = pytest.mark.timeout(60)


def test_the_installed_entry_runs(ferrepl_bin, workdir, tmp_path, mode):
    home = tmp_path / "home"
    home.mkdir()
    # The server's own state directory too: HOME alone does not place it
    # when XDG_STATE_HOME is set.
    env = dict(os.environ, HOME=str(home), **conftest.state_env(workdir))
    out = subprocess.run(
        [ferrepl_bin, "install", "--client", "claude-code", "--scope", "project", "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    entry = json.loads((workdir / ".mcp.json").read_text())["mcpServers"]["ferrepl"]
    assert os.path.isabs(entry["command"]), entry

    async def call():
        params = StdioServerParameters(command=entry["command"], args=entry["args"], env=env)
        async with conftest.connect(params, mode) as client:
            result = await client.call_tool("python_exec", {"code": "import os\n(os.getcwd(), 6 * 7)"})
            assert not result.is_error, result
            return "".join(getattr(b, "text", "") for b in result.content)

    text = asyncio.run(call())
    assert "42" in text and str(workdir) in text, text
