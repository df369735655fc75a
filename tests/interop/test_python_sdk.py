"""Interoperability with the official MCP Python SDK (`mcp` from PyPI).

Every test that takes `target` runs over stdio (the SDK spawns `ferrepl`) and
over streamable HTTP (a fresh `ferrepl --http` on a free port), and every one
that takes `mode` in both protocol eras: legacy (`initialize`) and modern
(2026-07-28: `server/discover`, stateless requests); see conftest.py.
Results are checked against the contract of the python_* tools and, for every
structured result, against the output schema the server itself lists. These
servers run with `--structured-content`; one test checks the default
(text-only results) without it.
"""

import asyncio
import logging
import re

import jsonschema
import pytest
from mcp.client import advertise
from mcp.shared.exceptions import MCPError

import conftest

pytestmark = pytest.mark.timeout(60)

CONTRACT_TOOLS = {"python_exec", "python_wait", "python_inspect", "python_sessions"}
# Always in a python_exec result's structured content.
EXEC_FIELDS = {"status", "session", "cell", "elapsed_ms"}
# In the output schema, but left out of a result when empty, null or 0.
EXEC_OPTIONAL_FIELDS = {"stdout", "stderr", "value", "error", "prompt"}
EXEC_OTHER_FIELDS = {"output_bytes", "omitted_bytes", "background_output", "notes", "display"}
STATUSES = {"ok", "error", "running", "waiting_input", "interrupted", "crashed"}


# --------------------------------------------------------------------------
# helpers


def run(coro):
    """Tests are plain functions driving their coroutine here, so they need no
    async pytest plugin (without one, pytest would skip async tests)."""
    return asyncio.run(coro)


class SdkComplaints(logging.Handler):
    """Collects WARNING-or-worse records from the SDK's loggers ("mcp.*"),
    which is where it reports e.g. results it cannot validate."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record)

    def messages(self):
        return [f"{r.name}: {r.getMessage()}" for r in self.records]


@pytest.fixture(autouse=True)
def sdk_complaints():
    handler = SdkComplaints()
    logger = logging.getLogger("mcp")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


class Tools(conftest.SchemaCheckedTools):
    """The schema-checked client with python_exec's checks."""

    async def exec(self, code, session=None, **extra):
        args = {"code": code, **extra}
        if session is not None:
            args["session"] = session
        result = await self.call("python_exec", args)
        sc = result.structured_content
        assert isinstance(sc, dict), f"python_exec returned no structured content: {result!r}"
        missing = EXEC_FIELDS - set(sc)
        assert not missing, f"python_exec structured content lacks {sorted(missing)}: {sc}"
        unknown = set(sc) - EXEC_FIELDS - EXEC_OPTIONAL_FIELDS - EXEC_OTHER_FIELDS
        assert not unknown, f"python_exec structured content has unexpected {sorted(unknown)}: {sc}"
        for key in (EXEC_OPTIONAL_FIELDS | EXEC_OTHER_FIELDS) & set(sc):
            assert sc[key] not in (None, "", [], 0), f"an empty {key!r} must be left out: {sc}"
        assert sc["status"] in STATUSES, sc
        return result


def text_of(result) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def footer(result) -> str:
    lines = [line for line in text_of(result).splitlines() if line.strip()]
    assert lines, f"empty text content: {result!r}"
    return lines[-1]


def assert_footer(result, status, cell, session):
    last = footer(result)
    assert re.search(rf"\b{re.escape(status)}\b", last), f"footer lacks status {status!r}: {last!r}"
    assert re.search(rf"\bcell {cell}\b", last), f"footer lacks 'cell {cell}': {last!r}"
    assert re.search(rf"\b{re.escape(session)}\b", last), f"footer lacks session {session!r}: {last!r}"


def assert_ok(result):
    sc = result.structured_content
    assert not result.is_error and sc["status"] == "ok" and "error" not in sc, result


def assert_raised(result, exc_type):
    sc = result.structured_content
    assert result.is_error, f"a Python exception must set is_error: {result!r}"
    assert sc["status"] == "error", sc
    assert sc["error"] and sc["error"]["type"] == exc_type, sc


# How the SDK reports a non-200/204 answer to its HTTP DELETE (session
# termination). test_http_session_termination_is_clean checks exactly that;
# the other tests leave it to that one test so each defect fails one test.
TERMINATION_COMPLAINT = "Session termination failed"


def assert_quiet(complaints):
    """No warning from the SDK: in particular none about validating structured
    output against the listed output schemas, or about unlisted tools."""
    messages = [m for m in complaints.messages() if TERMINATION_COMPLAINT not in m]
    assert not messages, "the SDK complained:\n" + "\n".join(messages)


async def session_info(tools, name):
    r = await tools.call("python_sessions", {})
    assert not r.is_error, r
    sessions = {s["name"]: s for s in r.structured_content["sessions"]}
    assert name in sessions, f"session {name!r} not listed: {r.structured_content}"
    return sessions[name]


# --------------------------------------------------------------------------
# tests


def test_list_tools(target, mode, sdk_complaints):
    async def go():
        async with conftest.connect(target, mode) as client:
            tools = (await client.list_tools()).tools
            names = {t.name for t in tools}
            assert CONTRACT_TOOLS <= names, f"missing tools: {sorted(CONTRACT_TOOLS - names)}"
            assert len(names) == len(tools), "duplicate tool names"
            for tool in tools:
                assert tool.description and tool.description.strip(), f"{tool.name}: no description"
                assert tool.input_schema.get("type") == "object", f"{tool.name}: input schema {tool.input_schema}"
                assert tool.output_schema, f"{tool.name}: no output schema"
                assert tool.output_schema.get("type") == "object", f"{tool.name}: output schema {tool.output_schema}"
                for schema in (tool.input_schema, tool.output_schema):
                    jsonschema.validators.validator_for(schema).check_schema(schema)
            by_name = {t.name: t for t in tools}
            exec_in = by_name["python_exec"].input_schema
            assert {"code", "session", "wait_s"} <= set(exec_in.get("properties", {})), exec_in
            assert "code" in exec_in.get("required", []), exec_in
            exec_out = by_name["python_exec"].output_schema.get("properties", {})
            assert EXEC_FIELDS | EXEC_OPTIONAL_FIELDS | EXEC_OTHER_FIELDS <= set(exec_out), exec_out
            # Calling every contract tool once makes the SDK validate each
            # result against the schema it just listed (python_wait gives
            # the last result again).
            t = await Tools(client).load()
            await t.exec("probe = 1")
            for name, args in (
                ("python_inspect", {}),
                ("python_wait", {}),
                ("python_sessions", {}),
                ("python_sessions", {"action": "reset"}),
            ):
                r = await t.call(name, args)
                assert not r.is_error, r
        assert_quiet(sdk_complaints)

    run(go())


def test_variables_persist_and_print_output(target, mode, sdk_complaints):
    async def go():
        async with conftest.connect(target, mode) as client:
            t = await Tools(client).load()
            r = await t.exec("x = 20\nprint('hello', 'world')\nx * 2 + 2")
            assert_ok(r)
            sc = r.structured_content
            assert sc["value"] == "42", sc
            assert sc["stdout"] == "hello world\n", sc
            assert "stderr" not in sc, sc
            assert sc["session"] == "default", sc
            assert "prompt" not in sc, sc
            assert isinstance(sc["elapsed_ms"], (int, float)) and sc["elapsed_ms"] >= 0, sc
            first_cell = sc["cell"]
            text = text_of(r)
            assert "hello world" in text and "42" in text, text
            assert text.index("hello world") < text.index("42"), f"output must come before the value: {text!r}"
            assert_footer(r, "ok", first_cell, "default")

            r = await t.exec("x += 1\nimport sys\nprint('to stderr', file=sys.stderr)\nx")
            assert_ok(r)
            assert r.structured_content["value"] == "21", r.structured_content
            assert "to stderr" in r.structured_content["stderr"], r.structured_content
            assert r.structured_content["cell"] == first_cell + 1, r.structured_content
            assert_footer(r, "ok", first_cell + 1, "default")

            # A statement has no value; definitions persist like variables.
            r = await t.exec("def double(v):\n    return v * 2")
            assert_ok(r)
            assert "value" not in r.structured_content, r.structured_content
            r = await t.exec("double(x)")
            assert r.structured_content["value"] == "42", r.structured_content
            r = await t.exec("'text'")
            assert r.structured_content["value"] == "'text'", "value must be the repr"
        assert_quiet(sdk_complaints)

    run(go())


def test_exception_is_error_with_type(target, mode, sdk_complaints):
    async def go():
        async with conftest.connect(target, mode) as client:
            t = await Tools(client).load()
            r = await t.exec("def f():\n    raise ValueError('bad input')\nprint('before')\nf()")
            assert_raised(r, "ValueError")
            err = r.structured_content["error"]
            assert err["message"] == "bad input", err
            assert "ValueError: bad input" in err["traceback"], err
            assert "line 2" in err["traceback"] and "in f" in err["traceback"], err
            assert r.structured_content["stdout"] == "before\n", r.structured_content
            assert "value" not in r.structured_content, r.structured_content
            text = text_of(r)
            assert "before" in text and "ValueError: bad input" in text, text
            assert_footer(r, "error", r.structured_content["cell"], "default")

            r = await t.exec("undefined_name")
            assert_raised(r, "NameError")
            r = await t.exec("1/0")
            assert_raised(r, "ZeroDivisionError")
            r = await t.exec("def broken(:\n    pass")
            assert_raised(r, "SyntaxError")

            # The session survives its exceptions.
            r = await t.exec("'still here'")
            assert_ok(r)
            assert r.structured_content["value"] == "'still here'"
        assert_quiet(sdk_complaints)

    run(go())


def test_crash_and_recovery(target, mode, sdk_complaints):
    async def go():
        async with conftest.connect(target, mode) as client:
            t = await Tools(client).load()
            assert_ok(await t.exec("kept = 'value'"))
            old_pid = (await session_info(t, "default"))["pid"]

            r = await t.exec("import os; os._exit(3)")
            assert r.is_error, f"a crash must set is_error: {r!r}"
            assert r.structured_content["status"] == "crashed", r.structured_content
            assert_footer(r, "crashed", r.structured_content["cell"], "default")

            r = await t.exec("'kept' in globals()")
            assert_ok(r)
            assert r.structured_content["value"] == "False", r.structured_content
            assert "lost" in text_of(r).lower(), f"the first call after a crash must say the state was lost: {text_of(r)!r}"

            r = await t.exec("kept = 2\nkept * 21")
            assert_ok(r)
            assert r.structured_content["value"] == "42"
            assert "lost" not in text_of(r).lower(), "the lost-state note must be given once"
            info = await session_info(t, "default")
            assert info["pid"] > 0 and info["pid"] != old_pid, (old_pid, info)
        assert_quiet(sdk_complaints)

    run(go())


def test_both_eras_describe_the_same_server(target, sdk_complaints):
    """The SDK's default mode (the modern era's client) probes `server/discover`;
    its answer offers 2026-07-28 beside the handshake versions, and tells the
    same server as `initialize` does: name, tools, instructions."""

    async def go():
        async with conftest.connect(target, "modern") as client:
            found = client.session.discover_result
            assert found is not None, "the modern client did not use server/discover"
            assert "2026-07-28" in found.supported_versions, found.supported_versions
            handshake = set(found.supported_versions) & set(conftest.HANDSHAKE_PROTOCOL_VERSIONS)
            assert handshake, f"discover offers no handshake-era version: {found.supported_versions}"
            modern = (client.server_info.name, found.capabilities.tools is not None, found.instructions)
            modern_tools = {t.name for t in (await client.list_tools()).tools}
        async with conftest.connect(target, "legacy") as client:
            init = client.session.initialize_result
            legacy = (client.server_info.name, init.capabilities.tools is not None, init.instructions)
            legacy_tools = {t.name for t in (await client.list_tools()).tools}
        assert modern == legacy, f"discover says {modern}, initialize says {legacy}"
        assert modern[0] == "ferrepl" and modern[1] and modern[2], modern
        assert modern_tools == legacy_tools, (modern_tools, legacy_tools)
        assert_quiet(sdk_complaints)

    run(go())


def test_an_unknown_resource_or_prompt_is_invalid_params(target, mode):
    """The server lists no resources and no prompts; a name from elsewhere is
    refused as invalid params naming it (SEP-2164), in both eras."""

    async def go():
        async with conftest.connect(target, mode) as client:
            assert (await client.list_resources()).resources == []
            assert (await client.list_prompts()).prompts == []
            with pytest.raises(MCPError) as refused:
                await client.read_resource("file:///no/such/resource")
            assert refused.value.code == -32602, refused.value
            assert refused.value.data == {"uri": "file:///no/such/resource"}, refused.value
            assert "file:///no/such/resource" in refused.value.message, refused.value
            with pytest.raises(MCPError) as refused:
                await client.get_prompt("no_such_prompt")
            assert refused.value.code == -32602, refused.value
            assert "no_such_prompt" in refused.value.message, refused.value

    run(go())


RENDEZVOUS = """\
import pathlib, time
d = pathlib.Path({d!r})
(d / {me!r}).touch()
deadline = time.time() + 30
while not (d / {other!r}).exists() and time.time() < deadline:
    time.sleep(0.01)
print({me!r}, 'saw', {other!r})
(d / {other!r}).exists()
"""


def test_two_sessions_run_concurrently(target, workdir, mode, sdk_complaints):
    """Each cell waits for a file the other one writes: both finish only if
    the two sessions really run at the same time."""

    async def go():
        async with conftest.connect(target, mode) as client:
            t = await Tools(client).load()
            assert_ok(await t.exec("mine = 'a'", session="a"))
            assert_ok(await t.exec("mine = 'b'", session="b"))

            rendezvous = workdir / "rendezvous"
            rendezvous.mkdir()
            a, b = await asyncio.gather(
                t.exec(RENDEZVOUS.format(d=str(rendezvous), me="a-flag", other="b-flag"), session="a"),
                t.exec(RENDEZVOUS.format(d=str(rendezvous), me="b-flag", other="a-flag"), session="b"),
            )
            for r, name in ((a, "a"), (b, "b")):
                assert_ok(r)
                assert r.structured_content["session"] == name, r.structured_content
                assert r.structured_content["value"] == "True", f"session {name} did not see the other: {r!r}"
                assert_footer(r, "ok", r.structured_content["cell"], name)
            assert a.structured_content["stdout"] == "a-flag saw b-flag\n"
            assert b.structured_content["stdout"] == "b-flag saw a-flag\n"

            # Namespaces are separate.
            ra, rb = await asyncio.gather(t.exec("mine", session="a"), t.exec("mine", session="b"))
            assert (ra.structured_content["value"], rb.structured_content["value"]) == ("'a'", "'b'")

            listed = {s["name"]: s for s in (await t.call("python_sessions", {})).structured_content["sessions"]}
            assert {"a", "b"} <= set(listed), listed
            assert listed["a"]["pid"] != listed["b"]["pid"], listed
            for name in ("a", "b"):
                assert listed[name]["state"] == "idle", listed[name]
                assert listed[name]["cells"] >= 3, listed[name]
        assert_quiet(sdk_complaints)

    run(go())


def test_reset_and_inspect(target, mode, sdk_complaints):
    async def go():
        async with conftest.connect(target, mode) as client:
            t = await Tools(client).load()
            assert_ok(await t.exec("count = 41\nitems = [1, 2, 3]", session="insp"))

            r = await t.call("python_inspect", {"session": "insp"})
            assert not r.is_error, r
            names = {v["name"]: v for v in r.structured_content["variables"]}
            assert {"count", "items"} <= set(names), r.structured_content
            assert names["count"]["type"] == "int" and names["count"]["repr"] == "41", names["count"]

            r = await t.call("python_inspect", {"session": "insp", "name": "items"})
            assert not r.is_error, r
            assert "[1, 2, 3]" in text_of(r), text_of(r)

            r = await t.call("python_sessions", {"action": "reset", "session": "insp"})
            assert not r.is_error, r
            assert "insp" in r.structured_content["message"], r.structured_content
            r = await t.exec("'count' in globals()", session="insp")
            assert_ok(r)
            assert r.structured_content["value"] == "False", "a reset must clear the variables"
        assert_quiet(sdk_complaints)

    run(go())


def test_progress_notifications_while_a_cell_runs(stdio_params, workdir, mode, sdk_complaints):
    async def go():
        async with conftest.connect(stdio_params, mode) as client:
            seen = []

            async def on_progress(progress, total, message):
                seen.append((progress, message))

            gate = workdir / "gate"
            code = (
                "import pathlib, time\n"
                f"gate = pathlib.Path({str(gate)!r})\n"
                "i = 0\n"
                "while not gate.exists():\n"
                "    print('step', i, flush=True); i += 1; time.sleep(0.2)\n"
                "'done'"
            )
            task = asyncio.create_task(
                client.call_tool("python_exec", {"code": code, "wait_s": 50}, progress_callback=on_progress)
            )
            while not any("step" in (m or "") for _, m in seen):
                assert not task.done(), f"the cell ended before any progress notification: {task.result()!r}"
                await asyncio.sleep(0.05)
            gate.touch()
            r = await task
            assert not r.is_error, r
            assert r.structured_content["value"] == "'done'", r.structured_content
            values = [p for p, _ in seen]
            assert values == sorted(values), f"progress must not go backwards: {values}"
        assert_quiet(sdk_complaints)

    run(go())


# Legacy only: the DELETE ends an Mcp-Session-Id, which a modern client never has.
@pytest.mark.parametrize("mode", ["legacy"])
def test_http_session_termination_is_clean(http_url, mode, sdk_complaints):
    """On leaving, the SDK ends its HTTP session with a DELETE and accepts 200
    or 204 (405 if termination is not supported); anything else it logs as
    "Session termination failed: <status>"."""

    async def go():
        async with conftest.connect(http_url, mode) as client:
            r = await client.call_tool("python_exec", {"code": "1 + 1"})
            assert r.structured_content["value"] == "2", r

    run(go())
    complaints = [m for m in sdk_complaints.messages() if TERMINATION_COMPLAINT in m]
    assert not complaints, "the SDK rejected the answer to its DELETE /mcp:\n" + "\n".join(complaints)


def test_input_prompt_and_answer(target, mode, sdk_complaints):
    """A cell blocked in input() comes back as waiting_input with its prompt;
    python_wait with input answers it and the cell finishes."""

    async def go():
        async with conftest.connect(target, mode) as client:
            t = await Tools(client).load()
            r = await t.exec("name = input('Name: ')\nprint('hi', name)")
            assert r.structured_content["status"] == "waiting_input", r.structured_content
            assert r.structured_content["prompt"] == "Name: ", r.structured_content
            r = await t.call("python_wait", {"input": "Ada"})
            assert not r.is_error, r
            assert r.structured_content["status"] == "ok", r.structured_content
            assert "hi Ada" in r.structured_content["stdout"], r.structured_content
            r = await t.exec("name")
            assert r.structured_content["value"] == "'Ada'", r.structured_content
        assert_quiet(sdk_complaints)

    run(go())


def test_results_are_text_only_without_structured_content(target_plain, mode, sdk_complaints):
    """By default (no `--structured-content`) tools list no output schema and
    a result is text only: the value and the status footer are in the text."""

    async def go():
        async with conftest.connect(target_plain, mode) as client:
            tools = (await client.list_tools()).tools
            with_schema = [t.name for t in tools if t.output_schema]
            assert not with_schema, f"output schemas listed without --structured-content: {with_schema}"
            r = await client.call_tool("python_exec", {"code": "print('hi')\n6 * 7"})
            assert not r.is_error, r
            assert r.structured_content is None, f"structured content without --structured-content: {r!r}"
            text = text_of(r)
            assert "hi" in text and "42" in text, text
            assert any(line.startswith("-- ok |") for line in text.splitlines()), f"no '-- ok |' footer: {text!r}"
            assert_footer(r, "ok", 1, "default")
        assert_quiet(sdk_complaints)

    run(go())


@pytest.mark.parametrize("mode", ["legacy"])
def test_a_legacy_client_declaring_tasks_gets_running_not_a_task(target, mode, sdk_complaints):
    """The SDK in legacy mode, declaring the tasks extension at initialize
    (its requests carry no capabilities of their own, and it has no client
    side for tasks): a cell longer than its wait_s is a whole `running`
    result it validates (content and structured content), never a task
    (which it failed to validate: `content` required), and python_wait
    follows the cell to its end."""

    async def go():
        tasks = [advertise("io.modelcontextprotocol/tasks")]
        async with conftest.connect(target, mode, extensions=tasks) as client:
            t = await Tools(client).load()
            code = "import time\nprint('begun')\ntime.sleep(3)\nprint('over')\n'legacy done'"
            r = await t.exec(code, wait_s=1)
            assert not r.is_error, r
            assert r.content, f"a running result without content: {r!r}"
            assert r.structured_content["status"] == "running", r.structured_content
            assert_footer(r, "running", 1, "default")
            assert "python_wait" in text_of(r), text_of(r)
            for _ in range(5):
                r = await t.call("python_wait", {"wait_s": 10})
                if r.structured_content["status"] != "running":
                    break
            assert_ok(r)
            assert r.structured_content["value"] == "'legacy done'", r.structured_content
            assert r.structured_content["stdout"].endswith("over\n"), r.structured_content
        assert_quiet(sdk_complaints)

    run(go())
