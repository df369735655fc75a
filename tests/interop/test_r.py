"""R sessions through the official MCP Python SDK (`mcp` from PyPI).

The servers run with `--languages python,r --structured-content`; every test
that takes `r_target` runs over stdio (the SDK spawns `ferrepl`) and over
streamable HTTP (a fresh `ferrepl --http` on a free port), each in both
protocol eras (`mode`, see conftest.py). Each
structured result is checked against the output schema the server lists.
Nothing here sleeps: long cells are followed through the server's statuses.
"""

import asyncio
import base64
import re
import struct

import pytest
from mcp import StdioServerParameters
from mcp.types import ImageContent

import conftest

pytestmark = pytest.mark.timeout(120)

R_ARGS = ["--languages", "python,r", *conftest.STRUCTURED]
R_TOOLS = {"r_exec", "r_wait", "r_output", "r_inspect", "r_install"}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run(coro):
    """Plain test functions drive their coroutine here (no async plugin)."""
    return asyncio.run(coro)


@pytest.fixture(params=["stdio", "http"])
def r_target(request, ferrepl_bin, workdir):
    """What `mcp.Client(...)` connects to: a server with R sessions enabled."""
    if request.param == "stdio":
        yield StdioServerParameters(
            command=ferrepl_bin, args=["--workdir", str(workdir), *R_ARGS], env=conftest.state_env(workdir)
        )
        return
    server = conftest.HttpServer(ferrepl_bin, workdir, R_ARGS)
    server.wait_ready()
    yield server.url
    if server.stop() is None:
        pytest.fail(f"ferrepl --http did not exit within 10 s of SIGTERM; stderr:\n{server.log()}")


class Tools(conftest.SchemaCheckedTools):
    """The schema-checked client, with r_exec."""

    async def r_exec(self, code, **extra):
        return await self.call("r_exec", {"code": code, "wait_s": 30, **extra})


def text_of(result) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def assert_status(result, status, session="r"):
    sc = result.structured_content
    assert isinstance(sc, dict), f"no structured content: {result!r}"
    assert sc["status"] == status, f"expected {status}, got {sc}\n{text_of(result)}"
    assert sc["session"] == session, sc
    assert result.is_error == (status in ("error", "interrupted", "crashed")), result
    lines = [line for line in text_of(result).splitlines() if line.strip()]
    head = f"-- {status} | cell {sc['cell']} | session {session} |"
    assert lines and lines[-1].startswith(head), f"status line {lines[-1:]!r}, expected {head!r}"


def png_size(data: bytes):
    assert data.startswith(PNG_SIGNATURE), f"not a PNG: {data[:8]!r}"
    assert data[12:16] == b"IHDR", data[:24]
    return struct.unpack(">II", data[16:24])


# --------------------------------------------------------------------------
# tests


def test_r_tools_are_listed_and_a_value_prints_as_in_the_console(r_target, mode):
    async def go():
        async with conftest.connect(r_target, mode) as client:
            t = await Tools(client).load()
            assert R_TOOLS <= set(t.schemas), sorted(t.schemas)
            r = await t.r_exec("1+1")
            assert_status(r, "ok")
            assert "[1] 2" in text_of(r), text_of(r)
            assert r.structured_content["stdout"] == "[1] 2\n", r.structured_content

            r = await t.r_exec("x <- 5")
            assert_status(r, "ok")
            assert "stdout" not in r.structured_content, r.structured_content
            r = await t.r_exec("x * 2")
            assert "[1] 10" in text_of(r), text_of(r)

    run(go())


def test_r_error_is_error_with_a_backtrace(r_target, mode):
    async def go():
        async with conftest.connect(r_target, mode) as client:
            t = await Tools(client).load()
            r = await t.r_exec("g <- function(x) stop('boom'); f <- function() g(2); f()")
            assert_status(r, "error")
            err = r.structured_content["error"]
            assert err["type"] == "simpleError" and err["message"] == "boom", err
            text = text_of(r)
            assert "Error in g(2) : boom" in text and "Backtrace:" in text, text
            trace = text[text.index("Backtrace:") :]
            assert 0 <= trace.find("f()") < trace.find("g(2)"), trace

            r = await t.r_exec("'alive'")
            assert_status(r, "ok")
            assert '[1] "alive"' in text_of(r), text_of(r)

    run(go())


def test_r_readline_is_answered_through_r_wait(r_target, mode):
    async def go():
        async with conftest.connect(r_target, mode) as client:
            t = await Tools(client).load()
            r = await t.r_exec("x <- readline('name? '); cat('hello', x, '\\n')")
            assert_status(r, "waiting_input")
            assert r.structured_content["prompt"] == "name? ", r.structured_content
            cell = r.structured_content["cell"]

            r = await t.call("r_wait", {"input": "Ada", "wait_s": 30})
            assert_status(r, "ok")
            assert r.structured_content["cell"] == cell, r.structured_content
            assert "hello Ada" in r.structured_content["stdout"], r.structured_content

    run(go())


def test_r_plot_is_image_content(r_target, mode):
    async def go():
        async with conftest.connect(r_target, mode) as client:
            t = await Tools(client).load()
            r = await t.r_exec("plot(1:10)")
            assert_status(r, "ok")
            images = [b for b in r.content if isinstance(b, ImageContent)]
            assert len(images) == 1, f"content: {[type(b).__name__ for b in r.content]}\n{text_of(r)}"
            assert images[0].mime_type == "image/png", images[0].mime_type
            width, height = png_size(base64.b64decode(images[0].data, validate=True))
            assert 665 <= width <= 735 and 475 <= height <= 525, (width, height)
            display = r.structured_content["display"]
            assert [(d["mime"], d["width"], d["height"]) for d in display] == [("image/png", width, height)], display
            assert re.search(r"\[image 1: image/png", text_of(r)), text_of(r)

    run(go())


def test_tools_refuse_a_session_of_the_other_language(r_target, mode):
    async def go():
        async with conftest.connect(r_target, mode) as client:
            t = await Tools(client).load()
            py = await t.call("python_exec", {"code": "1 + 1"})
            assert not py.is_error and py.structured_content["value"] == "2", py
            assert_status(await t.r_exec("1 + 1"), "ok")

            r = await t.call("r_exec", {"code": "1", "session": "default"})
            assert r.is_error, r
            text = text_of(r)
            assert "'default'" in text and "Python session" in text and "R tools cannot use it" in text, text

            r = await t.call("python_exec", {"code": "1", "session": "r"})
            assert r.is_error, r
            text = text_of(r)
            assert "'r'" in text and "R session" in text and "Python tools cannot use it" in text, text

            listed = {s["name"]: s for s in (await t.call("python_sessions", {})).structured_content["sessions"]}
            assert listed["default"]["language"] == "python", listed
            assert listed["r"]["language"] == "r", listed

    run(go())


def test_r_tools_are_absent_without_languages_r(stdio_params, mode):
    async def go():
        async with conftest.connect(stdio_params, mode) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert "python_exec" in names, names
            assert not (R_TOOLS | {"r_complete"}) & names, names

    run(go())
