"""Fixtures for the interoperability tests with the official MCP Python SDK.

* `ferrepl_bin`: the server binary, from $FERREPL_BIN or target/debug/ferrepl.
  A missing binary fails every test (never skips).
* `http_url`: a `ferrepl --http` server on a free loopback port, started fresh
  for the test and killed after it; yields its /mcp URL.
* `target`: parametrized over both transports; gives what `mcp.Client` takes
  (StdioServerParameters for stdio, the URL string for HTTP).
* `mode`: parametrized over both protocol eras, "legacy" (the `initialize`
  handshake, an Mcp-Session-Id over HTTP) and "modern" (2026-07-28: the SDK's
  default `auto` mode probes `server/discover`, then every request stands
  alone). `connect(target, mode)` opens the client and fails the test if it
  did not end up in that era (so a broken discover cannot fall back to legacy
  unnoticed). `--mcp-mode legacy|modern` runs one era's tests only (tests
  without an era run with legacy), so CI runs the two eras side by side.

Every server keeps its sessions in a state directory of its test's own
(`state_env(workdir)`: XDG_STATE_HOME beside the workspace), never in the
user's ~/.local/state/ferrepl; a test that builds its own
StdioServerParameters passes `env=state_env(workdir)` (or `--state-dir`).

These servers run with `--structured-content` (structuredContent in results,
outputSchema on tools), which the contract checks read. The `*_plain`
fixtures (`stdio_params_plain`, `http_url_plain`, `target_plain`) start the
server as a user does, without it: text-only results.

Nothing here skips: a missing binary or a server that does not start fails
the test with the reason and the server's stderr.
"""

import contextlib
import os
import pathlib
import re
import subprocess
import threading

import jsonschema
import pytest
from mcp import Client, StdioServerParameters
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_BIN = ROOT / "target" / "debug" / "ferrepl"
START_TIMEOUT_S = 30
# The flag that adds structuredContent and outputSchema (off by default).
STRUCTURED = ["--structured-content"]


# The protocol eras, as test ids show them, and the SDK mode that reaches each:
# "auto" is the SDK's default (server/discover, falling back to initialize).
MODES = {"legacy": "legacy", "modern": "auto"}


def pytest_addoption(parser):
    parser.addoption(
        "--mcp-mode",
        choices=sorted(MODES),
        help="run only the tests in this protocol era (tests without one count as legacy)",
    )


def pytest_collection_modifyitems(config, items):
    only = config.getoption("--mcp-mode")
    if not only:
        return
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        era = callspec.params.get("mode", "legacy") if callspec else "legacy"
        (keep if era == only else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


@pytest.fixture(params=sorted(MODES))
def mode(request) -> str:
    """The protocol era, once per era. A test that needs the legacy era
    overrides it with `@pytest.mark.parametrize("mode", ["legacy"])`."""
    return request.param


@contextlib.asynccontextmanager
async def connect(target, mode, **kw):
    """`mcp.Client(target)` in the protocol era `mode`; fails unless the
    connection really is in that era."""
    async with Client(target, mode=MODES[mode], **kw) as client:
        versions = MODERN_PROTOCOL_VERSIONS if mode == "modern" else HANDSHAKE_PROTOCOL_VERSIONS
        if client.protocol_version not in versions:
            pytest.fail(f"a {mode} client negotiated protocol {client.protocol_version!r}, not one of {list(versions)}")
        yield client


@pytest.fixture(scope="session")
def ferrepl_bin() -> str:
    path = os.environ.get("FERREPL_BIN") or str(DEFAULT_BIN)
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        pytest.fail(
            f"ferrepl binary not found or not executable at {path!r}: "
            "run `cargo build` in the crate (or set FERREPL_BIN)",
            pytrace=False,
        )
    return path


@pytest.fixture
def workdir(tmp_path) -> pathlib.Path:
    d = tmp_path / "work"
    d.mkdir()
    return d


def state_env(workdir: pathlib.Path) -> dict[str, str]:
    """The environment that gives a server of the workspace `workdir` a state
    directory of its test's own (beside the workspace, removed with it). The
    SDK passes a server only a few variables (HOME, PATH...) besides these."""
    return {"XDG_STATE_HOME": str(workdir.parent / f"{workdir.name}-state")}


@pytest.fixture
def stdio_params(ferrepl_bin, workdir) -> StdioServerParameters:
    return StdioServerParameters(
        command=ferrepl_bin, args=["--workdir", str(workdir), *STRUCTURED], env=state_env(workdir)
    )


@pytest.fixture
def stdio_params_plain(ferrepl_bin, workdir) -> StdioServerParameters:
    """Like `stdio_params`, without `--structured-content`."""
    return StdioServerParameters(command=ferrepl_bin, args=["--workdir", str(workdir)], env=state_env(workdir))


LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:(\d+)/mcp)")


class HttpServer:
    """`ferrepl --http 127.0.0.1:0` as a child process. The kernel picks the
    port (so no other process can take it first); `url` and `port` are read
    from the server's "listening on" log line by `wait_ready`.

    Its stderr is drained by a thread for the whole run (so a chatty server
    never blocks on a full pipe) and kept for failure messages.
    """

    def __init__(self, binary: str, workdir: pathlib.Path, extra_args=()):
        self.port: int | None = None
        self.url: str | None = None
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.proc = subprocess.Popen(
            [binary, "--http", "127.0.0.1:0", "--workdir", str(workdir), *extra_args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            env={**os.environ, **state_env(workdir)},
        )
        self._pump = threading.Thread(target=self._drain, daemon=True)
        self._pump.start()

    def _drain(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            found = self.url is None and LISTENING.search(line)
            if found:
                self.url, self.port = found.group(1), int(found.group(2))
                self._ready.set()
        self._ready.set()  # stderr closed: wake the waiter, which checks why

    def log(self) -> str:
        return "".join(self.lines[-200:])

    def wait_ready(self):
        self._ready.wait(START_TIMEOUT_S)
        if self.url is None:
            code = self.proc.poll()
            self.stop()
            state = f"exited with {code}" if code is not None else f"no such line within {START_TIMEOUT_S} s"
            pytest.fail(f"`ferrepl --http` never logged 'listening on' ({state}); stderr:\n{self.log()}")

    def stop(self) -> int | None:
        """Stops the server: SIGTERM, then SIGKILL after 10 s. Returns the exit code,
        or None if it had to be killed."""
        if self.proc.poll() is not None:
            return self.proc.returncode
        self.proc.terminate()
        try:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return None
        finally:
            self._pump.join(5)


def _serve_http(binary, workdir, extra_args):
    server = HttpServer(binary, workdir, extra_args)
    server.wait_ready()
    yield server
    if server.stop() is None:
        pytest.fail(f"ferrepl --http did not exit within 10 s of SIGTERM; stderr:\n{server.log()}")


@pytest.fixture
def http_server(ferrepl_bin, workdir):
    yield from _serve_http(ferrepl_bin, workdir, STRUCTURED)


@pytest.fixture
def http_server_plain(ferrepl_bin, workdir):
    """Like `http_server`, without `--structured-content`."""
    yield from _serve_http(ferrepl_bin, workdir, ())


@pytest.fixture
def http_url(http_server) -> str:
    return http_server.url


@pytest.fixture
def http_url_plain(http_server_plain) -> str:
    return http_server_plain.url


@pytest.fixture(params=["stdio", "http"])
def target(request, workdir):
    """What `mcp.Client(...)` connects to, once per transport."""
    if request.param == "stdio":
        return request.getfixturevalue("stdio_params")
    return request.getfixturevalue("http_url")


@pytest.fixture(params=["stdio", "http"])
def target_plain(request, workdir):
    """Like `target`, for a server without `--structured-content`."""
    if request.param == "stdio":
        return request.getfixturevalue("stdio_params_plain")
    return request.getfixturevalue("http_url_plain")


class SchemaCheckedTools:
    """A connected client plus the output schemas it listed, so each result can
    be validated independently of the SDK (which skips is_error results)."""

    def __init__(self, client):
        self.client = client
        self.schemas = {}

    async def load(self):
        for tool in (await self.client.list_tools()).tools:
            self.schemas[tool.name] = tool.output_schema
        return self

    async def call(self, name, args=None, **kw):
        result = await self.client.call_tool(name, args or {}, **kw)
        schema = self.schemas.get(name)
        if schema is not None and result.structured_content is not None:
            try:
                jsonschema.validate(result.structured_content, schema)
            except jsonschema.ValidationError as e:
                pytest.fail(
                    f"{name} returned structured content that does not match its own output schema: "
                    f"{e.message}\nresult: {result!r}"
                )
        return result
