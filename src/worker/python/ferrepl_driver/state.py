"""A session's state saved by the server and loaded into a fresh
interpreter (docs/protocol.md, "Saved state"), so that a session comes back
after a restart without re-running a cell.

What is saved: every variable of `__main__`, pickled in one go (one memo:
two names for one object stay one object), with the vendored cloudpickle so
that functions, classes and lambdas defined in cells go by value and
modules by name (loading imports them again, which runs a workspace
module's top-level code). Large buffers (NumPy arrays, pandas columns) go
out of band (pickle protocol 5): they are written as they are, never copied
into the pickle. A variable that cannot be pickled (an open file, a socket,
a thread, a generator...) is left out and named, with why.

Both run on the main thread between cells. `save` sends one `state_data`
event followed by the bytes of the state, then its reply; `load` reads the
bytes that follow the request. The bytes: one JSON line (format, Python
version, pickle and buffer sizes), the pickle, the buffers in order.
"""

import io
import json
import os
import pickle
import sys
import time

from .cells import namespace
from .channel import send, send_with_payload
from .channel import state as channel_state

FORMAT = 1
# Names of __main__ that belong to the interpreter, not to the agent.
_OWN = {"__name__", "__builtins__", "__doc__", "__spec__", "__loader__", "__package__"}
_VERSION = "%d.%d.%d" % sys.version_info[:3]
# The functions of cells read and write `__main__`'s globals: saved as this
# name, and loaded as the live namespace (not a copy), so a resumed function
# sees later assignments as before.
_MAIN = "ferrepl:__main__"
# Modules the interpreter had before any cell (site, .pth files): their
# packages say nothing about the session's state.
_AT_START = set(sys.modules)


def _saved_name(name):
    """The agent's names: not the interpreter's own, nor dunder names that
    modules leave in `__main__` (`__warningregistry__`)."""
    return isinstance(name, str) and name not in _OWN and not (name.startswith("__") and name.endswith("__"))


def _cloudpickle():
    return sys.modules["ferrepl_driver._vendor"].load("ferrepl_driver._vendor.cloudpickle")


class _Null:
    def write(self, data):
        return len(data)


def _saver(cloudpickle, file, buffer_callback):
    """cloudpickle's pickler, with the globals of `__main__`'s functions
    saved by name (cloudpickle would save a copy of the names they use)."""
    marker = {"__name__": "__main__"}

    class Saver(cloudpickle.CloudPickler):
        def persistent_id(self, obj):
            return _MAIN if obj is marker else None

    saver = Saver(file, protocol=5, buffer_callback=buffer_callback)
    # cloudpickle takes a function's future globals from this map, by the
    # id of the globals it has now.
    saver.globals_ref[id(namespace)] = marker
    return saver


class _Loader(pickle.Unpickler):
    def persistent_load(self, pid):
        if pid == _MAIN:
            return namespace
        raise pickle.UnpicklingError("unknown persistent id %r" % (pid,))


def _why(exc):
    text = "%s: %s" % (type(exc).__name__, exc)
    return text if len(text) <= 200 else text[:197] + "..."


def _culprits(cloudpickle, values):
    """The variables that cannot be pickled alone, with why."""
    bad = {}
    for name, value in values.items():
        try:
            _saver(cloudpickle, _Null(), lambda b: None).dump(value)
        except Exception as exc:  # noqa: BLE001 - any failure leaves it out
            bad[name] = _why(exc)
    return bad


def _distributions():
    """{distribution: version} of the packages whose modules are imported."""
    try:
        import importlib.metadata as metadata

        mapping = metadata.packages_distributions()
    except Exception:  # noqa: BLE001 - Python < 3.10, or broken metadata
        return {}
    stdlib = set(getattr(sys, "stdlib_module_names", ()))
    tops = {name.split(".")[0] for name in set(sys.modules) - _AT_START} - stdlib
    out = {}
    for top in sorted(tops):
        for dist in mapping.get(top, ()):
            try:
                out[dist] = metadata.version(dist)
            except Exception:  # noqa: BLE001
                pass
    return out


def save(msg):
    started = time.monotonic()
    cloudpickle = _cloudpickle()
    values = {k: v for k, v in list(namespace.items()) if _saved_name(k)}
    skipped = {}
    buffers = []
    while True:
        buffers = []
        try:
            out = io.BytesIO()
            _saver(cloudpickle, out, buffers.append).dump(values)
            data = out.getbuffer()
            break
        except Exception as exc:  # noqa: BLE001 - found out variable by variable
            bad = _culprits(cloudpickle, values)
            if not bad:
                return {"ok": False, "message": "the state could not be pickled: %s" % _why(exc)}
            for name in bad:
                values.pop(name, None)
            skipped.update(bad)
    views = []
    for buffer in buffers:
        try:
            views.append(buffer.raw())
        except (BufferError, ValueError):
            views.append(memoryview(bytes(buffer)))
    header = json.dumps(
        {
            "format": FORMAT,
            "python": _VERSION,
            "pickle": len(data),
            "buffers": [v.nbytes for v in views],
        }
    ).encode() + b"\n"
    total = len(header) + len(data) + sum(v.nbytes for v in views)
    send_with_payload(
        {"ev": "state_data", "id": msg.get("id"), "bytes": total},
        [header, data] + views,
    )
    return {
        "ok": True,
        "cell": channel_state.cell,
        "version": _VERSION,
        "variables": sorted(values),
        "skipped": skipped,
        "packages": _distributions(),
        "bytes": total,
        "seconds": round(time.monotonic() - started, 3),
    }


def _workspace_modules(before):
    """Modules the load imported from the working directory (their top-level
    code ran again)."""
    cwd = os.getcwd() + os.sep
    out = []
    for name, module in list(sys.modules.items()):
        if name in before:
            continue
        path = getattr(module, "__file__", None) or ""
        if path.startswith(cwd):
            out.append(name)
    return sorted(out)


def _changed_packages(expected):
    """`name saved-version, here other-version` for each package that differs."""
    if not isinstance(expected, dict) or not expected:
        return []
    try:
        import importlib.metadata as metadata
    except ImportError:
        return []
    changed = []
    for dist, version in sorted(expected.items()):
        try:
            here = metadata.version(dist)
        except Exception:  # noqa: BLE001 - not installed
            here = "none"
        if here != version:
            changed.append("%s %s, here %s" % (dist, version, here))
    return changed


def load(msg, requests):
    """Reads the state that follows `msg` and puts its variables into
    `__main__`. What it expects (`python`, `packages`) was checked by the
    server; a state of another format or interpreter is refused here too."""
    started = time.monotonic()
    try:
        size = int(msg.get("bytes"))
    except (TypeError, ValueError):
        return {"ok": False, "message": "load_state needs bytes"}
    data = bytearray(size)
    view = memoryview(data)
    requests.read_into(view)
    end = data.find(b"\n")
    try:
        header = json.loads(bytes(view[: end + 1]))
    except ValueError:
        return {"ok": False, "message": "the saved state has no readable header"}
    if header.get("format") != FORMAT:
        return {"ok": False, "message": "the saved state is of format %r, not %d" % (header.get("format"), FORMAT)}
    if header.get("python") != _VERSION:
        return {
            "ok": False,
            "message": "the state was saved by Python %s; this interpreter is %s" % (header.get("python"), _VERSION),
        }
    at = end + 1
    pickled = view[at : at + int(header["pickle"])]
    at += int(header["pickle"])
    buffers = []
    for n in header.get("buffers", []):
        buffers.append(view[at : at + int(n)])
        at += int(n)
    changed = _changed_packages(msg.get("packages"))
    if changed:
        return {
            "ok": False,
            "message": "the state was saved with other packages than this environment has (%s); "
            "install those versions, or rebuild the session" % ", ".join(changed[:5]),
        }
    before = set(sys.modules)
    _cloudpickle()
    try:
        values = _Loader(io.BytesIO(pickled), buffers=buffers).load()
    except Exception as exc:  # noqa: BLE001 - the session stays fresh
        return {"ok": False, "message": "the saved state could not be loaded: %s" % _why(exc)}
    if not isinstance(values, dict):
        return {"ok": False, "message": "the saved state is not a namespace"}
    for name, value in values.items():
        if isinstance(name, str) and name not in _OWN:
            namespace[name] = value
    return {
        "ok": True,
        "variables": sorted(k for k in values if isinstance(k, str)),
        "reimported": _workspace_modules(before),
        "seconds": round(time.monotonic() - started, 3),
    }


def handle(msg, requests):
    """A save_state or load_state request: its reply is sent here."""
    op = msg.get("op")
    try:
        reply = save(msg) if op == "save_state" else load(msg, requests)
    except KeyboardInterrupt:
        reply = {"ok": False, "message": "interrupted"}
    except Exception as exc:  # noqa: BLE001 - the session goes on
        reply = {"ok": False, "message": "%s failed: %s" % (op, _why(exc))}
    reply["ev"] = "reply"
    reply["id"] = msg.get("id")
    send(reply)
