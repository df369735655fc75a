"""Start-up and the main loop: the session's streams and hooks, the control
reader thread (fd 4), then cells and checkpoints one after another on the
main thread, read by it from fd 3 between cells."""

import builtins
import contextlib
import getpass
import importlib
import io
import json
import os
import signal
import socket
import sys

from . import checkpoint, state as saved_state, tools
from .cells import _on_sigint, namespace, prepare_namespace, run_cell
from .channel import OrderedStream, connect, send, send_fenced, state
from .control import CellRequests, ControlReader, drain
from .display import install_display
from .introspect import CONTROL_HANDLERS
from .stdin import AgentStdin, _getpass, _input, input_replies

# Run on the main thread between cells, like cells: fork only happens there.
CHECKPOINT_OPS = ("checkpoint", "switch", "drop")
# Also between cells: the namespace is still, and the bytes of a state
# follow a load request on fd 3.
STATE_OPS = ("save_state", "load_state")
# The side socket: requests answered while a cell runs.
SIDE_FD = 4

_control = {"reader": None}
_cells = {"reader": None}


def _serve(sock, pending):
    _control["reader"] = ControlReader(sock, pending, _route)


def _stop_serving():
    return _control["reader"].stop()


def _checkpoint_op(msg):
    op = msg.get("op")
    try:
        cell = int(msg.get("cell"))
    except (TypeError, ValueError):
        cell = -1
    if op == "checkpoint":
        result = checkpoint.take(cell)
    elif op == "switch":
        result = checkpoint.switch(dict(msg, cell=cell), _cells["reader"], _stop_serving, _serve)
    else:
        result = checkpoint.drop(cell)
    if isinstance(result, tuple):
        # This is a copy's ready child, resumed as the live interpreter (the
        # copy keeps the state to come back to). What was queued when it was
        # forked belongs to the interpreter it was copied from (a reply read
        # ahead of the fork): drop it. Then serve.
        resumed = result[1]
        while not input_replies.empty():
            input_replies.get_nowait()
        _cells["reader"] = CellRequests(resumed["sock"], resumed["pending"])
        _serve(resumed["side"], resumed["side_pending"])
        send({"ev": "reply", "id": resumed["id"], "ok": True, "pid": os.getpid()})
        return
    result["ev"] = "reply"
    result["id"] = msg.get("id")
    send(result)


def _route(line):
    """On the control thread: requests answered here, so they work while a
    cell runs (cells and checkpoints come on fd 3, to the main thread)."""
    try:
        msg = json.loads(line)
    except ValueError:
        return
    if not isinstance(msg, dict):
        return
    op = msg.get("op")
    if op == "input":
        input_replies.put(msg)
    elif op == "upstream_reply":
        tools.deliver(msg)
    elif op in CONTROL_HANDLERS:
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


def _preimport():
    """Imports the modules of --preimport (FERREPL_PREIMPORT, dotted names the
    server checked) before the first cell, so its first import costs nothing;
    what they print is dropped (no cell owns it). Returns "module: error" for
    each that failed: reported, never fatal."""
    names = [n for n in os.environ.pop("FERREPL_PREIMPORT", "").split(",") if n]
    failed = []
    for name in names:
        sink = io.StringIO()
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                importlib.import_module(name)
        except BaseException as e:  # a module may raise anything, SystemExit too
            failed.append("%s: %s: %s" % (name, type(e).__name__, str(e)[:200]))
    return failed


def main(ctl):
    """Runs the worker until the server goes away; ctl is (socket, reader) on fd 3."""
    sock, reader = ctl
    side = socket.socket(fileno=SIDE_FD)
    connect(sock, side)
    checkpoint.start_anchor()
    prepare_namespace()
    _configure_streams()
    sys.argv = [""]
    sys.stdin = AgentStdin()
    builtins.input = _input
    getpass.getpass = _getpass
    install_display()
    # `import ferrepl`: sys.modules wins over a workspace file of that name.
    sys.modules["ferrepl"] = tools.module()
    tools.install_help(sys.modules["ferrepl"])
    signal.signal(signal.SIGINT, _on_sigint)
    _cells["reader"] = CellRequests(sock, drain(reader, sock))
    _serve(side, b"")
    failed = _preimport()
    send(
        {
            "ev": "ready",
            "pid": os.getpid(),
            "python": "%d.%d.%d" % sys.version_info[:3],
            "executable": sys.executable,
            "preimport_failed": failed,
        }
    )
    while True:
        try:
            msg = _cells["reader"].next()
        except KeyboardInterrupt:
            continue
        if msg.get("op") in CHECKPOINT_OPS:
            try:
                _checkpoint_op(msg)
            except KeyboardInterrupt:
                send({"ev": "reply", "id": msg.get("id"), "ok": False, "message": "interrupted"})
            continue
        if msg.get("op") in STATE_OPS:
            saved_state.handle(msg, _cells["reader"])
            continue
        if msg.get("op") != "exec":
            continue
        try:
            run_cell(msg, namespace)
        except KeyboardInterrupt:
            # An interrupt that landed in the driver's own bookkeeping.
            send_fenced({"ev": "done", "cell": state.cell, "status": "interrupted", "value": None,
                         "error": {"type": "KeyboardInterrupt", "message": "", "traceback": "KeyboardInterrupt\n"},
                         "elapsed_ms": 0.0})
