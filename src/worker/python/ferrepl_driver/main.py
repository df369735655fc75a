"""Start-up and the main loop: the session's streams and hooks, the control
reader thread, then cells one after another on the main thread."""

import builtins
import getpass
import json
import os
import queue
import signal
import sys
import threading

from .cells import _on_sigint, namespace, prepare_namespace, run_cell
from .channel import OrderedStream, connect, send, send_fenced, state
from .display import install_display
from .introspect import CONTROL_HANDLERS
from .stdin import AgentStdin, _getpass, _input, input_replies

_jobs = queue.SimpleQueue()


def _read_control(reader):
    """Runs on a daemon thread: routes requests; the main thread runs cells."""
    while True:
        try:
            line = reader.readline()
        except Exception:
            line = b""
        if not line:
            # The server is gone: end this worker and everything it started.
            try:
                os.killpg(0, signal.SIGKILL)
            finally:
                os._exit(1)
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        op = msg.get("op")
        if op == "exec":
            _jobs.put(msg)
        elif op == "input":
            input_replies.put(msg)
        elif op in CONTROL_HANDLERS:
            # Answered here, on the control thread, so they work while a cell runs.
            try:
                reply = CONTROL_HANDLERS[op](msg)
            except Exception as exc:  # never let the reader die
                reply = {"ok": False, "message": "%s failed: %r" % (op, exc)}
            reply["ev"] = "reply"
            reply["id"] = msg.get("id")
            send(reply)


def _configure_streams():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True, errors="backslashreplace")
        except Exception:
            pass
    real = {"stdout": sys.stdout, "stderr": sys.stderr}
    sys.stdout = OrderedStream(real["stdout"], "stdout", real)
    sys.stderr = OrderedStream(real["stderr"], "stderr", real)


def main(ctl):
    """Runs the worker until the server goes away; ctl is (socket, reader) on fd 3."""
    sock, reader = ctl
    connect(sock)
    prepare_namespace()
    _configure_streams()
    sys.argv = [""]
    sys.stdin = AgentStdin()
    builtins.input = _input
    getpass.getpass = _getpass
    install_display()
    signal.signal(signal.SIGINT, _on_sigint)
    threading.Thread(target=_read_control, args=(reader,), name="ferrepl-control", daemon=True).start()
    send(
        {
            "ev": "ready",
            "pid": os.getpid(),
            "python": "%d.%d.%d" % sys.version_info[:3],
            "executable": sys.executable,
        }
    )
    while True:
        try:
            msg = _jobs.get()
        except KeyboardInterrupt:
            continue
        try:
            run_cell(msg, namespace)
        except KeyboardInterrupt:
            # An interrupt that landed in the driver's own bookkeeping.
            send_fenced({"ev": "done", "cell": state.cell, "status": "interrupted", "value": None,
                         "error": {"type": "KeyboardInterrupt", "message": "", "traceback": "KeyboardInterrupt\n"},
                         "elapsed_ms": 0.0})
