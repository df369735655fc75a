"""Running a cell: parse, run (top-level await too), its value, errors and
interrupts; and the session's namespace."""

import ast
import linecache
import os
import signal
import sys
import time
import traceback

from .channel import send_fenced, state

try:
    # signal.getsignal maps the handler through an enum on every call.
    from _signal import getsignal as _getsignal
except ImportError:  # not CPython
    _getsignal = signal.getsignal
from .display import MAX_VALUE_CHARS, flush_figures
from .stdin import input_replies

# boot.py compiles every driver module with a file name that starts with this;
# tracebacks shown to the agent leave such frames out.
DRIVER_FILE_PREFIX = "<ferrepl-driver"
TOP_LEVEL_AWAIT = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
CO_COROUTINE = 0x80  # inspect.CO_COROUTINE; inspect itself is imported lazily
# An error's texts are capped like a value, and never past this many
# characters, so that its done event stays under the 16 MiB line the server
# reads (a longer one is dropped, and the cell would never end). The kernel
# bridge caps a kernel's errors the same (worker/kernel/media.rs).
MAX_EVENT_TEXT_CHARS = 600000
MAX_ERROR_KIND_CHARS = 200

# The session's variables live in the real __main__ module's dictionary (so
# pickle finds classes defined in cells).
namespace = sys.modules["__main__"].__dict__


def prepare_namespace():
    """Removes what the bootstrap left in __main__ (it ran as `python -c`)."""
    for key in list(namespace):
        if key not in ("__name__", "__builtins__", "__doc__", "__spec__", "__loader__", "__package__"):
            del namespace[key]
    namespace["__name__"] = "__main__"
    namespace["__doc__"] = None


# ---------------------------------------------------------------- errors


def _without_driver_frames(tb):
    frames = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(DRIVER_FILE_PREFIX):
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
    most = min(MAX_VALUE_CHARS, MAX_EVENT_TEXT_CHARS)
    return {"type": _capped(type(exc).__name__, MAX_ERROR_KIND_CHARS),
            "message": _capped(message, most), "traceback": _capped(text, most)}


def _capped(text, most):
    if len(text) <= most:
        return text
    return "%s... [%d more characters]" % (text[:most], len(text) - most)


# ---------------------------------------------------------------- cells

_loop = None


def _run_code(code, namespace):
    global _loop
    if code.co_flags & CO_COROUTINE:
        import asyncio

        if _loop is None or _loop.is_closed():
            _loop = asyncio.new_event_loop()
        try:
            return _loop.run_until_complete(eval(code, namespace))
        except KeyboardInterrupt:
            _cancel_left_tasks(_loop)
            raise
    return eval(code, namespace)


def _cancel_left_tasks(loop):
    """An interrupt leaves the cell's tasks pending in the loop the next
    async cell reuses: cancel them (as asyncio.run does), so that they stop
    there and what they wait on is cancelled too (a tool call upstream)."""
    import asyncio

    from .tools import abandon_loop

    abandon_loop(loop)
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        try:
            loop.run_until_complete(asyncio.wait(tasks, timeout=5))
        except BaseException:
            pass


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
    if _getsignal(signal.SIGINT) is not _on_sigint:
        signal.signal(signal.SIGINT, _on_sigint)
    while not input_replies.empty():
        input_replies.get_nowait()
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


def _on_sigint(signum, frame):
    if state.in_user_code:
        raise KeyboardInterrupt
    # Between cells a stray interrupt is ignored: it must not kill the driver.
