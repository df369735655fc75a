"""The `ferrepl` module a session imports (`import ferrepl`, nothing to
install): its code calls the operator's upstream MCP servers through the
server, and only what it prints and its last expression's value reach the
model.

main.main() registers `module()` as sys.modules["ferrepl"] (which wins over
a workspace file `ferrepl.py`). Each request is an `upstream` event on the
control socket with an id unique to it; the server's `upstream_reply` comes
on the side socket, and the control thread hands it to `deliver`, which
wakes the caller waiting on that id (a thread, or an asyncio future). The
exchange is in docs/protocol.md ("Tool calls").
"""

import base64
import itertools
import json
import os
import signal
import sys
import threading
import types

from .channel import send
from .signatures import doc_of, signature_of

# Only the server's reader refuses longer lines (src/worker/readers.rs): a
# call that large would be dropped unanswered.
MAX_EVENT_BYTES = 16 * 1024 * 1024 - 4096
# A blocking call wakes up this often even if no signal reaches its wait.
_POLL_SECONDS = 1.0


class Error(Exception):
    """A tool call did not give a result (base class of the three below)."""


class ToolError(Error):
    """The tool ran and answered with an error (MCP `isError`): its message."""


class CallRefused(Error):
    """Nothing was called: unknown server or tool, tool not allowed, a limit
    reached, or no servers configured."""


class UpstreamError(Error):
    """The upstream server failed: it crashed, timed out or could not be reached."""


_ERRORS = {"tool_error": ToolError, "refused": CallRefused, "failed": UpstreamError}


class Image:
    """An image a tool returned: `.data` (bytes), `.mime_type` (str).
    display(img), or an image as a cell's value, shows it (PNG and JPEG)."""

    def __init__(self, data, mime_type="image/png"):
        self.data = bytes(data)
        self.mime_type = str(mime_type)

    def _repr_png_(self):
        return self.data if self.mime_type == "image/png" else None

    def _repr_jpeg_(self):
        return self.data if self.mime_type in ("image/jpeg", "image/jpg") else None

    def __repr__(self):
        return "<ferrepl.Image %s, %d bytes>" % (self.mime_type, len(self.data))


# ---------------------------------------------------------------- requests

# id -> waiter of each request sent and not answered yet. Single dict
# operations (set, pop) are atomic: no lock, so none can be held by the
# control thread when the main thread forks a checkpoint.
_pending = {}
_ids = {"pid": None, "count": None}
_ids_lock = threading.Lock()
_served = {"pid": None}


def _next_id():
    """A positive int unique within this process, and across the processes
    of a session: a checkpoint resumed in place of the live interpreter
    goes on with other ids than that one had in flight."""
    with _ids_lock:
        pid = os.getpid()
        if _ids["pid"] != pid:
            _ids["pid"] = pid
            _ids["count"] = itertools.count((pid << 32) + 1)
        return next(_ids["count"])


def _check_process():
    """Replies come to the control thread, which runs only in the session's
    own process: a forked child (multiprocessing) would wait forever."""
    pid = os.getpid()
    if _served["pid"] == pid:
        return
    # The thread's name is set in control.py (ControlReader).
    if any(t.name == "ferrepl-control" and t.is_alive() for t in threading.enumerate()):
        _served["pid"] = pid
        return
    raise CallRefused(
        "ferrepl calls work only in the session's own process, not in a forked child "
        "(multiprocessing): use threads, or ferrepl.acall with asyncio.gather, to call "
        "tools concurrently"
    )


def _send_whole(event):
    """send(); on the main thread an interrupt that lands meanwhile waits
    until the line is out (sendall cut short would garble the channel) and
    is raised then."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        send(event)
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        send(event)
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        signal.raise_signal(signal.SIGINT)


def _abandon(rid):
    """The caller stopped waiting (interrupt, cancellation): the server is
    told to cancel the request, unless its reply already came."""
    if _pending.pop(rid, None) is None:
        return
    try:
        _send_whole({"ev": "upstream", "id": rid, "op": "cancel"})
    except Exception:
        pass


def abandon_loop(loop):
    """An interrupt ends the async cell: every call its loop waits on is
    given up at once, newest first. Slots go out oldest first, so the calls
    still waiting for one are gone from the server before a call in flight,
    cancelled, frees its slot (else a waiting one would take it and go
    out)."""
    rids = [
        rid
        for rid, waiter in list(_pending.items())
        if isinstance(waiter, _AsyncWaiter) and waiter._loop is loop
    ]
    for rid in sorted(rids, reverse=True):
        _abandon(rid)


class _Waiter:
    """A blocking caller's wait, on any thread."""

    def __init__(self):
        self._event = threading.Event()
        self.reply = None

    def settle(self, reply):
        self.reply = reply
        self._event.set()

    def wait(self):
        # Lock waits are interruptible by signals on POSIX CPython (3.9 to
        # 3.14): SIGINT raises KeyboardInterrupt here at once. The timeout
        # only bounds the wait where that would not hold.
        while not self._event.wait(_POLL_SECONDS):
            pass
        return self.reply


def _settle_future(future, reply):
    if not future.done():
        future.set_result(reply)


class _AsyncWaiter:
    """An acall's wait: its future, resolved on the loop's own thread."""

    def __init__(self, loop, future):
        self._loop = loop
        self._future = future

    def settle(self, reply):
        if self._future.done():
            return
        try:
            self._loop.call_soon_threadsafe(_settle_future, self._future, reply)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass


def deliver(msg):
    """On the control thread: an `upstream_reply` for the caller waiting on
    its id; one for a request given up (or unknown) is dropped."""
    try:
        waiter = _pending.pop(msg.get("id"), None)
        if waiter is not None:
            waiter.settle(msg)
    except Exception:  # never let the control thread die
        pass


def _outcome(reply):
    """The result of a reply, or its error raised."""
    if not isinstance(reply, dict):
        raise UpstreamError("the server's reply to a tool call was not understood")
    if reply.get("ok") is True:
        return reply.get("result")
    kind = reply.get("kind")
    cls = _ERRORS.get(kind, UpstreamError) if isinstance(kind, str) else UpstreamError
    message = reply.get("error")
    raise cls(str(message) if message not in (None, "") else "the call failed (no message)")


def _start(op, fields):
    """The event of a request, its id; checks what can be checked here."""
    _check_process()
    event = {"ev": "upstream", "id": _next_id(), "op": op}
    event.update(fields)
    return event


def _request(event):
    """Sends a request and blocks until its reply; its result, or raises."""
    rid = event["id"]
    waiter = _Waiter()
    try:
        _pending[rid] = waiter
        _send_whole(event)
        reply = waiter.wait()
    except KeyboardInterrupt:
        _abandon(rid)
        reply = None
    except BaseException:
        _abandon(rid)
        raise
    if reply is None:
        # Raised afresh, out of the handler: the traceback shows the cell's
        # line, not threading's wait.
        raise KeyboardInterrupt
    return _outcome(reply)


async def _arequest(event):
    import asyncio

    rid = event["id"]
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    try:
        _pending[rid] = _AsyncWaiter(loop, future)
        _send_whole(event)
        reply = await future
    except KeyboardInterrupt:  # the whole cell stops: all its calls with it
        abandon_loop(loop)
        _abandon(rid)
        raise
    except BaseException:  # CancelledError (a timeout, a cancelled gather)
        _abandon(rid)
        raise
    return _outcome(reply)


# ---------------------------------------------------------------- arguments


def _name(value, what):
    if not isinstance(value, str):
        raise TypeError(
            "%s must be a str (see ferrepl.servers() and ferrepl.tools(server)), not %s"
            % (what, type(value).__name__)
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("%s %r is not valid text (a lone surrogate)" % (what, value)) from None
    return value


def _plain(obj):
    """json's default: NumPy and pandas values, dates, sets as JSON."""
    tolist = getattr(obj, "tolist", None)
    if callable(tolist) and not isinstance(obj, type):
        return tolist()
    isoformat = getattr(obj, "isoformat", None)
    if callable(isoformat) and not isinstance(obj, type):
        return isoformat()
    if isinstance(obj, (set, frozenset)):
        return list(obj)
    raise TypeError("a %s is not JSON (pass str, int, float, bool, None, list or dict)" % type(obj).__name__)


def _encode_one(value):
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, default=_plain)
    text.encode("utf-8")  # a lone surrogate: not valid JSON text for the server
    return text


def _json_arguments(arguments):
    """The arguments as plain JSON values, or TypeError/ValueError naming the
    argument that cannot be sent (the server would drop the whole line)."""
    problem = None
    try:
        text = _encode_one(arguments)
    except (TypeError, ValueError, UnicodeEncodeError, RecursionError):
        for key, value in arguments.items():
            try:
                _encode_one(value)
            except (TypeError, ValueError, UnicodeEncodeError, RecursionError) as exc:
                problem = (key, exc)
                break
        else:
            problem = ("?", "cannot be encoded")
    if problem is not None:
        key, exc = problem
        cls = ValueError if isinstance(exc, ValueError) else TypeError
        raise cls("argument %r of the tool call cannot be sent as JSON: %s" % (key, exc))
    if len(text.encode("utf-8")) > MAX_EVENT_BYTES:
        raise CallRefused(
            "the arguments are %d bytes of JSON, over the %d a call can carry: pass a path "
            "or a smaller piece instead" % (len(text.encode("utf-8")), MAX_EVENT_BYTES)
        )
    return json.loads(text)


# ---------------------------------------------------------------- results


def _block(block):
    if not isinstance(block, dict):
        return block
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text") or "")
    if kind == "image":
        try:
            data = base64.b64decode(str(block.get("data") or ""), validate=True)
        except (ValueError, TypeError):
            return block
        return Image(data, block.get("mime") or "application/octet-stream")
    if kind == "other":
        return block.get("value")
    return block


def _call_result(result):
    """structured content (as is); else all-text content as one str; else
    the blocks in order: str, Image, or the raw block (dict)."""
    if isinstance(result, dict):
        if "structured" in result:
            return result["structured"]
        if isinstance(result.get("content"), list):
            blocks = [_block(b) for b in result["content"]]
            if all(isinstance(b, str) for b in blocks):
                return "\n".join(blocks)
            return blocks
    return result


# ---------------------------------------------------------------- the API


def servers():
    """The names of the upstream MCP servers this session may call ([] when none)."""
    result = _request(_start("servers", {}))
    return [str(s) for s in result] if isinstance(result, list) else []


def tools(server):
    """The tools of `server` this session may call: a list of dicts with
    name, description and inputSchema (the JSON Schema of its arguments);
    "unavailable" says why one cannot be called (it runs only as a task)."""
    result = _request(_start("tools", {"server": _name(server, "server")}))
    return list(result) if isinstance(result, list) else []


def _call_event(server, tool, arguments):
    fields = {
        "server": _name(server, "server"),
        "tool": _name(tool, "tool"),
        "arguments": _json_arguments(arguments),
    }
    return _start("call", fields)


def call(server, tool, /, **arguments):
    """Calls `tool` of `server` with `arguments` and waits for its result:
    the tool's structured content (usually a dict) when it gives one; else
    its text when it answered only text; else a list of its content blocks
    in order (str for text, ferrepl.Image for images, a dict for others).
    Raises ferrepl.ToolError, ferrepl.CallRefused or ferrepl.UpstreamError.
    An interrupt cancels the call."""
    return _call_result(_request(_call_event(server, tool, arguments)))


async def acall(server, tool, /, **arguments):
    """call() as a coroutine, to run calls at once:
    `await asyncio.gather(*(ferrepl.acall(s, t, q=q) for q in queries))`.
    Cancelling it (asyncio.wait_for's timeout...) cancels the call."""
    return _call_result(await _arequest(_call_event(server, tool, arguments)))


# ---------------------------------------------------------------- tool()

def tool(server, name):
    """A function calling tool `name` of `server`: its signature and help
    come from the tool's input schema (help(ferrepl.tool(s, n))); calling it
    is ferrepl.call(server, name, **arguments); `.acall(**arguments)` is the
    coroutine form."""
    _name(server, "server")
    _name(name, "tool")
    listed = tools(server)
    info = None
    for entry in listed:
        if isinstance(entry, dict) and entry.get("name") == name:
            info = entry
            break
    if info is None:
        names = [str(e.get("name")) for e in listed if isinstance(e, dict)]
        if names:
            raise CallRefused("server %r has no tool %r this session may call; its tools: %s"
                              % (server, name, ", ".join(names)))
        raise CallRefused("server %r has no tool %r: it offers this session no tools" % (server, name))

    def bound(**arguments):
        return call(server, name, **arguments)

    async def bound_acall(**arguments):
        return await acall(server, name, **arguments)

    bound.__name__ = bound.__qualname__ = name
    bound.__module__ = "ferrepl"
    bound.__doc__ = doc_of(server, info)
    bound.__signature__ = signature_of(info.get("inputSchema"))
    bound_acall.__name__ = bound_acall.__qualname__ = name + ".acall"
    bound_acall.__module__ = "ferrepl"
    bound_acall.__doc__ = bound.__doc__
    bound_acall.__signature__ = bound.__signature__
    bound.acall = bound_acall
    bound.server = server
    bound.schema = info.get("inputSchema")
    return bound


# ---------------------------------------------------------------- the module

MODULE_DOC = """Calls the operator's MCP tools from this session's code.

    ferrepl.servers()                 names of the servers this session may call
    ferrepl.tools(server)             their tools: name, description, inputSchema
    ferrepl.call(server, tool, **arguments)
                                      the result: structured content (dict), text,
                                      or a list of blocks (str, ferrepl.Image, dict)
    await ferrepl.acall(server, tool, **arguments)
                                      the same as a coroutine: many at once with
                                      asyncio.gather
    f = ferrepl.tool(server, tool)    a function with the tool's signature and
                                      help: help(f), f(**arguments), f.acall(...)

Errors: ferrepl.ToolError (the tool answered with an error), ferrepl.CallRefused
(unknown server or tool, not allowed, a limit), ferrepl.UpstreamError (the server
failed or timed out); all are ferrepl.Error. The servers run outside the sandbox;
only what the code prints (or its value) is shown.
"""

__all__ = [
    "servers", "tools", "call", "acall", "tool", "Image",
    "Error", "ToolError", "CallRefused", "UpstreamError",
]


def _short_help(mod):
    """help(ferrepl) in one screen: pydoc's page is 12,000 characters, most
    of it what the exception classes inherit."""
    return "\n".join(
        [
            "Help on module ferrepl:",
            "",
            (mod.__doc__ or "").rstrip(),
            "",
            "help(ferrepl.call), help(ferrepl.CallRefused), help(ferrepl.tool(server, tool))"
            " and the like show one in full.",
        ]
    )


class _Help:
    """builtins.help, but help(ferrepl) is one screen."""

    def __init__(self, inner, mod):
        self._inner = inner
        self._mod = mod

    def __repr__(self):
        return repr(self._inner)

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and (args[0] is self._mod or args[0] == "ferrepl"):
            print(_short_help(self._mod))
            return None
        return self._inner(*args, **kwargs)


def install_help(mod):
    import builtins

    builtins.help = _Help(builtins.help, mod)


def module():
    """The `ferrepl` module: the API above and nothing else."""
    import importlib.machinery

    mod = types.ModuleType("ferrepl", MODULE_DOC)
    mod.__spec__ = importlib.machinery.ModuleSpec("ferrepl", None, origin="ferrepl")
    mod.__all__ = list(__all__)
    this = sys.modules[__name__].__dict__
    for name in __all__:
        obj = this[name]
        try:
            obj.__module__ = "ferrepl"
        except (AttributeError, TypeError):
            pass
        setattr(mod, name, obj)
    return mod
