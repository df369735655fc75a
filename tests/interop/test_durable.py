"""Sessions across a restart, and branching, through the official MCP Python
SDK over stdio: the first server runs cells, a second one on the same
workspace and state directory lists the session as dormant and resumes it
from its saved state on first use (no cell re-run); `parent` runs a cell on
an earlier state, re-running the path to it as asked. Every structured
result is checked against the output schema the server lists.
"""

import asyncio

import pytest
from mcp import StdioServerParameters

import conftest

pytestmark = pytest.mark.timeout(120)


def run(coro):
    return asyncio.run(coro)


def params(ferrepl_bin, workdir, state):
    args = ["--workdir", str(workdir), "--state-dir", str(state), "--tools", "all", *conftest.STRUCTURED]
    return StdioServerParameters(command=ferrepl_bin, args=args)


async def exec_(tools, code, **extra):
    result = await tools.call("python_exec", {"code": code, "session": "data", "wait_s": 30, **extra})
    assert not result.is_error, result
    return result.structured_content


def test_a_session_survives_a_restart_and_branches(ferrepl_bin, workdir, tmp_path, mode):
    state = tmp_path / "state"

    async def first():
        async with conftest.connect(params(ferrepl_bin, workdir, state), mode) as client:
            tools = await conftest.SchemaCheckedTools(client).load()
            await exec_(tools, "rows = [1, 2, 3]")
            await exec_(tools, "rows.append(4)")
            await exec_(tools, "total = sum(rows)")

    async def second():
        async with conftest.connect(params(ferrepl_bin, workdir, state), mode) as client:
            tools = await conftest.SchemaCheckedTools(client).load()
            listing = (await tools.call("python_sessions", {})).structured_content
            data = [s for s in listing["sessions"] if s["name"] == "data"]
            assert data and data[0]["state"] == "dormant", listing
            out = await exec_(tools, "total")
            assert out["value"] == "10", out
            assert any("resumed from its state saved after cell 3" in n and "no cell was re-run" in n
                       for n in out["notes"]), out
            branch = await exec_(tools, "rows", parent=1)
            assert branch["value"] == "[1, 2, 3]", branch
            history = (await tools.call("python_history", {"session": "data"})).structured_content
            parents = [c.get("parent") for c in history["cells"]]
            assert parents == [None, 1, 2, 3, 1], history

    run(first())
    run(second())
