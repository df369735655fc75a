"""Fixtures for the interoperability tests: the ferrepl binary and an HTTP server."""

import os
import pathlib
import re
import socket
import subprocess
import threading

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="session")
def ferrepl_bin() -> str:
    path = os.environ.get("FERREPL_BIN", str(ROOT / "target" / "debug" / "ferrepl"))
    if not os.access(path, os.X_OK):
        pytest.fail(f"ferrepl binary not found at {path}: run `cargo build` (or bash scripts/test.sh)")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def http_url(ferrepl_bin, tmp_path):
    """Starts `ferrepl --http` on a free port; yields its /mcp URL; kills it after."""
    port = _free_port()
    proc = subprocess.Popen(
        [ferrepl_bin, "--http", f"127.0.0.1:{port}", "--workdir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    ready = threading.Event()
    lines = []

    def pump():
        for line in proc.stderr:
            lines.append(line)
            if re.search(r"listening on http://", line):
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(30):
        proc.kill()
        pytest.fail("ferrepl --http did not start listening:\n" + "".join(lines))
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("ferrepl did not exit within 10 s of SIGTERM")
