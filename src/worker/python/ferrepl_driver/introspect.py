"""Requests answered on the control thread, so they work while a cell runs:
inspect, complete, namespace edits (without running code), import refresh."""

import builtins
import os
import sys
import types

from .cells import namespace
from .display import format_value

_short = None


def _short_repr_engine():
    global _short
    if _short is None:
        import reprlib

        _short = reprlib.Repr()
        _short.maxstring = 100
        _short.maxother = 100
        _short.maxlist = _short.maxtuple = _short.maxdict = _short.maxset = 8
    return _short


def _type_name(value):
    t = type(value)
    module = getattr(t, "__module__", "builtins")
    return t.__qualname__ if module == "builtins" else "%s.%s" % (module, t.__qualname__)


def _short_repr(value, limit=120):
    try:
        text = _short_repr_engine().repr(value)
    except Exception as exc:
        text = "<repr failed: %s>" % type(exc).__name__
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_user_variable(name, value):
    if name.startswith("_"):
        return False
    if isinstance(value, types.ModuleType):
        return False
    if isinstance(value, (types.FunctionType, type, types.BuiltinFunctionType)):
        return getattr(value, "__module__", None) == "__main__"
    return True


def _describe(name, value):
    item = {"name": name, "type": _type_name(value), "repr": _short_repr(value)}
    if isinstance(value, (str, bytes, bytearray, list, tuple, dict, set, frozenset, range)):
        item["len"] = len(value)
    shape = getattr(value, "shape", None) if not isinstance(value, type) else None
    if isinstance(shape, tuple) and all(isinstance(n, int) for n in shape):
        item["shape"] = list(shape)
    elif "len" not in item and hasattr(type(value), "__len__") and not isinstance(value, type):
        try:
            item["len"] = int(len(value))
        except Exception:
            pass
    return item


def _lookup(path, namespace):
    parts = path.split(".")
    if not all(p.isidentifier() for p in parts):
        raise LookupError("%r is not a name or a dotted attribute path" % path)
    if parts[0] in namespace:
        value = namespace[parts[0]]
    elif hasattr(builtins, parts[0]):
        value = getattr(builtins, parts[0])
    else:
        raise LookupError("name %r is not defined in this session" % parts[0])
    for i, part in enumerate(parts[1:], 1):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise LookupError("%s has no attribute %r" % (".".join(parts[:i]), part)) from None
    return value


def inspect_request(msg):
    import inspect

    name = msg.get("name")
    if not name:
        items = []
        for key, value in list(dict(namespace).items()):
            if _is_user_variable(key, value):
                items.append(_describe(key, value))
        return {"ok": True, "variables": items}
    try:
        value = _lookup(str(name), namespace)
    except LookupError as exc:
        return {"ok": False, "message": str(exc)}
    detail = {"name": name, "type": _type_name(value), "repr": format_value(value)[:2000]}
    if callable(value):
        try:
            detail["signature"] = str(inspect.signature(value))
        except (TypeError, ValueError):
            detail["signature"] = None
    doc = inspect.getdoc(value)
    if doc:
        detail["doc"] = doc if len(doc) <= 4000 else doc[:4000] + "\n[... docstring truncated]"
    try:
        detail["module"] = getattr(value, "__module__", None) if callable(value) else None
    except Exception:
        pass
    _add_source(detail, value, inspect)
    described = _describe(str(name), value)
    for key in ("len", "shape"):
        if key in described:
            detail[key] = described[key]
    return {"ok": True, "detail": detail}


MAX_SOURCE_CHARS = 8000


def _add_source(detail, value, inspect):
    """Where a function, class or module is defined, and its source when cheap."""
    target = value
    if not (inspect.isfunction(target) or inspect.isclass(target) or inspect.ismethod(target) or inspect.ismodule(target)):
        return
    try:
        detail["file"] = inspect.getsourcefile(target) or inspect.getfile(target)
    except (TypeError, OSError):
        return
    try:
        lines, first = inspect.getsourcelines(target)
    except (TypeError, OSError):
        return
    detail["line"] = first or 1
    if inspect.ismodule(target):
        return
    source = "".join(lines)
    if len(source) > MAX_SOURCE_CHARS:
        source = source[:MAX_SOURCE_CHARS] + "\n[... source truncated]"
    detail["source"] = source


MAX_COMPLETIONS = 200


def complete_request(msg):
    """Completions at the cursor, from the live namespace (jedi when installed)."""
    code = str(msg.get("code", ""))
    cursor = msg.get("cursor")
    cursor = len(code) if cursor is None else max(0, min(int(cursor), len(code)))
    before = code[:cursor]
    items = _jedi_completions(code, before)
    engine = "jedi"
    if items is None:
        engine = "rlcompleter"
        items = _rl_completions(before)
    token = _token_before(before)
    return {"ok": True, "engine": engine, "token": token, "completions": items[:MAX_COMPLETIONS]}


def _token_before(text):
    i = len(text)
    while i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_."):
        i -= 1
    return text[i:]


def _rl_completions(before):
    import rlcompleter

    token = _token_before(before)
    completer = rlcompleter.Completer(namespace)
    seen, items = set(), []
    for n in range(10000):
        try:
            match = completer.complete(token, n)
        except Exception:
            break
        if match is None or len(items) >= MAX_COMPLETIONS:
            break
        name = match.rstrip("(")
        if name in seen:
            continue
        seen.add(name)
        items.append({"text": name, "kind": "callable" if match.endswith("(") else "name"})
    return items


def _jedi_completions(code, before):
    try:
        import jedi
    except Exception:
        return None
    try:
        line = before.count("\n") + 1
        column = len(before) - (before.rfind("\n") + 1)
        script = jedi.Interpreter(code, [namespace])
        items = []
        for c in script.complete(line, column)[:MAX_COMPLETIONS]:
            items.append({"text": c.name, "kind": c.type})
        return items
    except Exception:
        return None


_PROTECTED = {"__name__", "__builtins__", "__doc__", "__spec__", "__loader__", "__package__"}


def namespace_request(msg):
    """Edits the namespace without running code: set (from JSON), delete, clear."""
    action = msg.get("action")
    if action == "set":
        name = str(msg.get("name", ""))
        if not name.isidentifier() or name in _PROTECTED:
            return {"ok": False, "message": "%r is not a name that can be set" % name}
        namespace[name] = msg.get("value")
        return {"ok": True, "changed": [name]}
    if action == "delete":
        names = [str(n) for n in (msg.get("names") or [])]
        missing = [n for n in names if n not in namespace or n in _PROTECTED]
        if missing:
            return {"ok": False, "message": "not defined in this session: %s" % ", ".join(missing)}
        for n in names:
            del namespace[n]
        return {"ok": True, "changed": names}
    if action == "clear":
        names = [n for n in list(namespace) if n not in _PROTECTED]
        for n in names:
            del namespace[n]
        return {"ok": True, "changed": names}
    return {"ok": False, "message": "unknown namespace action %r" % (action,)}


def refresh_imports_request(msg):
    """After a package install: new modules (and .pth files) import without a restart."""
    import importlib
    import site

    importlib.invalidate_caches()
    added = []
    dirs = list(getattr(site, "getsitepackages", lambda: [])())
    for d in dirs:
        if os.path.isdir(d):
            before = set(sys.path)
            site.addsitedir(d)
            added.extend(p for p in sys.path if p not in before)
    return {"ok": True, "added": added}


CONTROL_HANDLERS = {
    "refresh_imports": refresh_imports_request,
    "inspect": inspect_request,
    "complete": complete_request,
    "namespace": namespace_request,
}
