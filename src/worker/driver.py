# ferrepl worker driver, part 1: runs inside the session's own interpreter.
# introspect.py and display.py are appended to this file, then a call to main().
#
# Standard library only; CPython 3.9+. The server starts the interpreter with a
# tiny bootstrap that reads this file from the control socket (fd 3) and runs it
# in a private namespace, passing `_ferrepl_ctl = (socket, reader)`.
#
# The protocol is documented in docs/protocol.md. In short: JSON lines on fd 3;
# requests from the server, events from here. Output is never sent on fd 3: it
# flows through fds 1 and 2 (pipes read by the server). Events that close a
# span of output (cell done, input request) carry a fence number; before
# sending such an event the driver writes a marker with that number on both
# output pipes, so the server can attribute every byte to the right cell.

import ast
import builtins
import getpass
import io
import json
import linecache
import os
import queue
import signal
import sys
import threading
import time
import traceback
import types

DRIVER_FILE = "<ferrepl-driver>"
MAX_VALUE_CHARS = int(os.environ.pop("FERREPL_MAX_VALUE_CHARS", "200000") or 200000)
NONCE = os.environ.pop("FERREPL_NONCE", "0" * 32).encode("ascii")
TOP_LEVEL_AWAIT = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
CO_COROUTINE = 0x80  # inspect.CO_COROUTINE; inspect itself is imported lazily

_sock, _reader = _ferrepl_ctl  # noqa: F821  (injected by the bootstrap)
os.set_inheritable(_sock.fileno(), False)
# Private duplicates of the output pipes: markers still reach the server when
# user code redirects or closes fds 1 and 2.
_out_fd = os.dup(1)
_err_fd = os.dup(2)
_send_lock = threading.Lock()
_jobs = queue.SimpleQueue()
_input_replies = queue.SimpleQueue()


class _State:
    fence = 0
    in_user_code = False
    cell = 0
    value = None


state = _State()


def send(event):
    data = (json.dumps(event, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass")
    with _send_lock:
        _sock.sendall(data)


def flush_std():
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass


EVENT_FENCE = b"\x00"  # closes a span of output that an event owns
SYNC_FENCE = b"\x01"  # only orders the two pipes against each other
_fence_lock = threading.RLock()


def fence(kind=EVENT_FENCE):
    """Write a numbered marker on both output pipes; returns (number, streams marked)."""
    with _fence_lock:
        state.fence += 1
        number = state.fence
        marker = b"\x00FERREPL:" + NONCE + b":" + ("%016x" % number).encode("ascii") + kind
        marked = []
        for name, fd in (("stdout", _out_fd), ("stderr", _err_fd)):
            try:
                os.write(fd, marker)
                marked.append(name)
            except OSError:
                pass
    return number, marked


class _Order:
    last = None
    enabled = True


_order = _Order()


def _switch_to(which, streams):
    """Before Python code writes to one stream after the other, flush the other
    and put a sync marker on both pipes, so the server keeps their order."""
    last = _order.last
    if last is not None and last != which and _order.enabled:
        try:
            streams[last].flush()
        except Exception:
            pass
        _, marked = fence(SYNC_FENCE)
        if len(marked) != 2:
            _order.enabled = False
    _order.last = which


class OrderedStream:
    """sys.stdout / sys.stderr: the real text stream, plus ordering markers."""

    def __init__(self, inner, which, streams):
        self._inner = inner
        self._which = which
        self._streams = streams

    def write(self, text):
        _switch_to(self._which, self._streams)
        return self._inner.write(text)

    def writelines(self, lines):
        _switch_to(self._which, self._streams)
        return self._inner.writelines(lines)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __iter__(self):
        return iter(self._inner)

    def __repr__(self):
        return repr(self._inner)


def send_fenced(event):
    flush_std()
    number, marked = fence()
    event["fence"] = number
    event["fenced"] = marked
    send(event)


# ---------------------------------------------------------------- control reader


def _read_control():
    """Runs on a daemon thread: routes requests; the main thread runs cells."""
    while True:
        try:
            line = _reader.readline()
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
            _input_replies.put(msg)
        elif op in CONTROL_HANDLERS:
            # Answered here, on the control thread, so they work while a cell runs.
            try:
                reply = CONTROL_HANDLERS[op](msg)
            except Exception as exc:  # never let the reader die
                reply = {"ok": False, "message": "%s failed: %r" % (op, exc)}
            reply["ev"] = "reply"
            reply["id"] = msg.get("id")
            send(reply)


# ---------------------------------------------------------------- input


def request_input(prompt="", password=False):
    prompt = "" if prompt is None else str(prompt)
    send_fenced({"ev": "input_request", "cell": state.cell, "prompt": prompt, "password": password})
    reply = _input_replies.get()
    if reply.get("eof"):
        raise EOFError("input was closed by the agent")
    text = str(reply.get("text", ""))
    # Echo like a terminal, so the cell's transcript reads naturally.
    try:
        sys.stdout.write(prompt + ("" if password else text) + "\n")
    except Exception:
        pass
    return text


def _input(prompt=""):
    return request_input(prompt)


def _getpass(prompt="Password: ", stream=None):
    return request_input(prompt, password=True)


class AgentStdin(io.TextIOBase):
    """sys.stdin: each line read asks the agent (python_input)."""

    def __init__(self):
        self._pending = ""
        self._eof = False

    def readable(self):
        return True

    def isatty(self):
        return False

    @property
    def encoding(self):
        return "utf-8"

    def fileno(self):
        raise io.UnsupportedOperation("ferrepl's stdin is served by the agent and has no fd")

    def _fill(self):
        if self._eof:
            return False
        try:
            text = request_input("", password=False)
        except EOFError:
            self._eof = True
            return False
        self._pending += text + "\n"
        return True

    def readline(self, size=-1):
        if not self._pending and not self._fill():
            return ""
        line, sep, rest = self._pending.partition("\n")
        out = line + sep
        if size is not None and 0 <= size < len(out):
            out = out[:size]
            self._pending = self._pending[size:]
        else:
            self._pending = rest
        return out

    def read(self, size=-1):
        if size is None or size < 0:
            while self._fill():
                pass
            out, self._pending = self._pending, ""
            self._eof = False
            return out
        while len(self._pending) < size and self._fill():
            pass
        out, self._pending = self._pending[:size], self._pending[size:]
        return out

    def __iter__(self):
        return self

    def __next__(self):
        line = self.readline()
        if not line:
            self._eof = False
            raise StopIteration
        return line


# ---------------------------------------------------------------- display


def format_value(value):
    try:
        text = repr(value)
    except Exception as exc:
        text = "<repr failed: %s: %s>" % (type(exc).__name__, exc)
    if len(text) > MAX_VALUE_CHARS:
        cut = len(text) - MAX_VALUE_CHARS
        text = text[:MAX_VALUE_CHARS] + "... [%d more characters of repr]" % cut
    return text


# ---------------------------------------------------------------- errors


def _without_driver_frames(tb):
    frames = []
    while tb is not None:
        if tb.tb_frame.f_code.co_filename != DRIVER_FILE:
            frames.append(tb)
        tb = tb.tb_next
    for current, following in zip(frames, frames[1:] + [None]):
        current.tb_next = following
    return frames[0] if frames else None


def format_exception(exc):
    seen = set()
    link = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        link.__traceback__ = _without_driver_frames(link.__traceback__)
        link = link.__cause__ or link.__context__
    tb = exc.__traceback__
    try:
        lines = traceback.format_exception(type(exc), exc, tb)
        text = "".join(lines)
    except Exception:
        text = "%s: %s\n" % (type(exc).__name__, exc)
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable %s>" % type(exc).__name__
    return {"type": type(exc).__name__, "message": message, "traceback": text}


# ---------------------------------------------------------------- cells

_loop = None


def _run_code(code, namespace):
    global _loop
    if code.co_flags & CO_COROUTINE:
        import asyncio

        if _loop is None or _loop.is_closed():
            _loop = asyncio.new_event_loop()
        return _loop.run_until_complete(eval(code, namespace))
    return eval(code, namespace)


def run_cell(msg, namespace):
    cell = int(msg.get("cell", 0))
    code = str(msg.get("code", ""))
    path = msg.get("path")
    filename = "<cell %d>" % cell
    saved_argv = None
    if path:
        # python_run_file: the script runs in the session's namespace as
        # __main__, with its own file name in tracebacks and sys.argv set.
        filename = os.path.abspath(path)
        saved_argv = sys.argv
        sys.argv = [path] + [str(a) for a in (msg.get("argv") or [])]
        saved_file = namespace.get("__file__")
        namespace["__file__"] = filename
        try:
            with open(filename, "rb") as f:
                code = f.read().decode("utf-8", "replace")
        except OSError as exc:
            sys.argv = saved_argv
            send_fenced({"ev": "done", "cell": cell, "status": "error", "value": None,
                         "error": {"type": type(exc).__name__, "message": str(exc),
                                   "traceback": "%s: %s\n" % (type(exc).__name__, exc)},
                         "elapsed_ms": 0.0})
            return
    else:
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    state.cell = cell
    state.value = None
    # A handler left behind (pdb installs one on 'continue') would turn
    # python_interrupt into a debugger prompt; each cell starts with ours.
    if signal.getsignal(signal.SIGINT) is not _on_sigint:
        signal.signal(signal.SIGINT, _on_sigint)
    while not _input_replies.empty():
        _input_replies.get_nowait()
    status, error = "ok", None
    started = time.monotonic()
    try:
        try:
            state.in_user_code = True
            tree = compile(code, filename, "exec", ast.PyCF_ONLY_AST | TOP_LEVEL_AWAIT, dont_inherit=True)
            last = None
            if not path and tree.body and isinstance(tree.body[-1], ast.Expr):
                last = tree.body.pop()
            body = compile(tree, filename, "exec", TOP_LEVEL_AWAIT, dont_inherit=True)
            _run_code(body, namespace)
            if last is not None:
                expr = ast.Expression(last.value)
                value = _run_code(compile(expr, filename, "eval", TOP_LEVEL_AWAIT, dont_inherit=True), namespace)
                if value is not None:
                    sys.displayhook(value)
        finally:
            try:
                # Figures left open are part of the result, even after an error.
                flush_figures()
            finally:
                state.in_user_code = False
    except KeyboardInterrupt as exc:
        status, error = "interrupted", format_exception(exc)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            status, error = "error", format_exception(exc)
    except BaseException as exc:
        status, error = "error", format_exception(exc)
    elapsed_ms = (time.monotonic() - started) * 1000.0
    if saved_argv is not None:
        sys.argv = saved_argv
        # The script's __file__ must not stick to the session afterwards.
        if saved_file is None:
            namespace.pop("__file__", None)
        else:
            namespace["__file__"] = saved_file
    send_fenced(
        {
            "ev": "done",
            "cell": cell,
            "status": status,
            "value": state.value,
            "error": error,
            "elapsed_ms": elapsed_ms,
        }
    )
    state.value = None


# ---------------------------------------------------------------- main


def _on_sigint(signum, frame):
    if state.in_user_code:
        raise KeyboardInterrupt
    # Between cells a stray interrupt is ignored: it must not kill the driver.


def _prepare_namespace():
    main = sys.modules["__main__"]
    ns = main.__dict__
    for key in list(ns):
        if key not in ("__name__", "__builtins__", "__doc__", "__spec__", "__loader__", "__package__"):
            del ns[key]
    ns["__name__"] = "__main__"
    ns["__doc__"] = None
    return ns


def _configure_streams():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True, errors="backslashreplace")
        except Exception:
            pass
    real = {"stdout": sys.stdout, "stderr": sys.stderr}
    sys.stdout = OrderedStream(real["stdout"], "stdout", real)
    sys.stderr = OrderedStream(real["stderr"], "stderr", real)


_namespace = _prepare_namespace()


def main():
    _configure_streams()
    sys.argv = [""]
    sys.stdin = AgentStdin()
    builtins.input = _input
    getpass.getpass = _getpass
    install_display()
    signal.signal(signal.SIGINT, _on_sigint)
    threading.Thread(target=_read_control, name="ferrepl-control", daemon=True).start()
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
            run_cell(msg, _namespace)
        except KeyboardInterrupt:
            # An interrupt that landed in the driver's own bookkeeping.
            send_fenced({"ev": "done", "cell": state.cell, "status": "interrupted", "value": None,
                         "error": {"type": "KeyboardInterrupt", "message": "", "traceback": "KeyboardInterrupt\n"},
                         "elapsed_ms": 0.0})
