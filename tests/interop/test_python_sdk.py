"""Interoperability with the official MCP Python SDK (`mcp` from PyPI), over stdio and HTTP."""

import asyncio

import pytest
from mcp import Client, StdioServerParameters

pytestmark = [pytest.mark.timeout(90), pytest.mark.anyio]

EXPECTED_TOOLS = {
    "python_exec",
    "python_wait",
    "python_input",
    "python_interrupt",
    "python_reset",
    "python_inspect",
    "python_sessions",
    "python_output",
}


def stdio(ferrepl_bin, tmp_path):
    return StdioServerParameters(command=ferrepl_bin, args=["--workdir", str(tmp_path)])


async def check_basics(client):
    tools = (await client.list_tools()).tools
    names = {t.name for t in tools}
    assert EXPECTED_TOOLS <= names, names
    for tool in tools:
        assert tool.description and len(tool.description) > 40, tool.name
        assert tool.input_schema.get("type") == "object", tool.name
        assert tool.output_schema and tool.output_schema.get("type") == "object", tool.name

    r = await client.call_tool("python_exec", {"code": "x = 20\nprint('hello')\nx * 2 + 2"})
    assert not r.is_error
    assert r.structured_content["status"] == "ok"
    assert r.structured_content["value"] == "42"
    assert r.structured_content["stdout"] == "hello\n"
    assert "hello" in r.content[0].text and "42" in r.content[0].text

    r = await client.call_tool("python_exec", {"code": "x + 1"})
    assert r.structured_content["value"] == "21"

    r = await client.call_tool("python_exec", {"code": "def f():\n    raise ValueError('bad')\nf()"})
    assert r.is_error
    assert r.structured_content["status"] == "error"
    assert r.structured_content["error"]["type"] == "ValueError"
    assert "<cell" in r.structured_content["error"]["traceback"]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_stdio_basics(ferrepl_bin, tmp_path, mode):
    async with Client(stdio(ferrepl_bin, tmp_path), mode=mode) as client:
        await check_basics(client)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_http_basics(http_url, mode):
    async with Client(http_url, mode=mode) as client:
        await check_basics(client)


async def test_crash_and_recovery(ferrepl_bin, tmp_path):
    async with Client(stdio(ferrepl_bin, tmp_path), mode="legacy") as client:
        await client.call_tool("python_exec", {"code": "kept = 1"})
        r = await client.call_tool("python_exec", {"code": "import os; os._exit(3)"})
        assert r.is_error
        assert r.structured_content["status"] == "crashed"
        assert "exit code 3" in r.content[0].text
        r = await client.call_tool("python_exec", {"code": "'kept' in globals()"})
        assert not r.is_error
        assert r.structured_content["value"] == "False"
        assert "lost" in r.content[0].text


async def test_two_sessions_run_concurrently(ferrepl_bin, tmp_path):
    # Each cell waits for the other's flag file: both can only finish if they
    # run at the same time.
    code = (
        "import pathlib, time\n"
        "d = pathlib.Path({d!r})\n"
        "(d / {me!r}).touch()\n"
        "deadline = time.time() + 30\n"
        "while not (d / {other!r}).exists() and time.time() < deadline:\n"
        "    time.sleep(0.01)\n"
        "(d / {other!r}).exists()"
    )
    async with Client(stdio(ferrepl_bin, tmp_path), mode="legacy") as client:
        a, b = await asyncio.gather(
            client.call_tool("python_exec", {"session": "a", "code": code.format(d=str(tmp_path), me="a", other="b")}),
            client.call_tool("python_exec", {"session": "b", "code": code.format(d=str(tmp_path), me="b", other="a")}),
        )
        assert a.structured_content["value"] == "True"
        assert b.structured_content["value"] == "True"


async def test_wait_input_and_progress(ferrepl_bin, tmp_path):
    async with Client(stdio(ferrepl_bin, tmp_path), mode="legacy") as client:
        r = await client.call_tool("python_exec", {"code": "name = input('Name: ')\nprint('hi', name)"})
        assert r.structured_content["status"] == "waiting_input"
        assert r.structured_content["prompt"] == "Name: "
        r = await client.call_tool("python_input", {"text": "Ada"})
        assert r.structured_content["status"] == "ok"
        assert "hi Ada" in r.structured_content["stdout"]

        seen = []

        async def on_progress(progress, total, message):
            seen.append((progress, message))

        gate = tmp_path / "gate"
        code = (
            "import pathlib, time\n"
            f"gate = pathlib.Path({str(gate)!r})\n"
            "i = 0\n"
            "while not gate.exists():\n"
            "    print('step', i, flush=True); i += 1; time.sleep(0.2)\n"
            "'done'"
        )
        task = asyncio.create_task(
            client.call_tool("python_exec", {"code": code, "wait_s": 60}, progress_callback=on_progress)
        )
        while not any("step" in (m or "") for _, m in seen):
            assert not task.done(), "the cell ended before any progress notification"
            await asyncio.sleep(0.05)
        gate.touch()
        r = await task
        assert r.structured_content["value"] == "'done'"
        values = [p for p, _ in seen]
        assert values == sorted(values)


async def test_sessions_listing(ferrepl_bin, tmp_path):
    async with Client(stdio(ferrepl_bin, tmp_path), mode="legacy") as client:
        await client.call_tool("python_exec", {"session": "s1", "code": "1"})
        r = await client.call_tool("python_sessions", {})
        names = {s["name"]: s for s in r.structured_content["sessions"]}
        assert "default" in names and "s1" in names
        assert names["s1"]["state"] == "idle"
        assert names["s1"]["pid"] > 0
