"""What a session sees of an upstream tool, made from its MCP listing: the
Python signature of its input schema (keyword-only parameters, required
ones first) and its help text (each parameter's type, whether it is
required, its default and description, what a call returns). Used by
`ferrepl.tool()` (tools.py); apart from it because turning JSON Schema into
Python signatures and prose is a concern of its own, beside making calls.
"""

import json
import keyword

_ANNOTATIONS = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
    "null": None,
}


def _one_line(text):
    return " ".join(str(text).split())


def _type_text(spec, depth=0):
    """A JSON Schema's type in a few words: "string", "integer | null",
    "array of string"..."""
    if not isinstance(spec, dict) or depth > 3:
        return "any"
    kind = spec.get("type")
    if isinstance(kind, str):
        text = kind
    elif isinstance(kind, list) and kind and all(isinstance(k, str) for k in kind):
        text = " | ".join(kind)
    else:
        branches = spec.get("anyOf") or spec.get("oneOf")
        if isinstance(branches, list) and branches:
            names = []
            for branch in branches:
                name = _type_text(branch, depth + 1)
                if name not in names:
                    names.append(name)
            text = " | ".join(names)
        elif "enum" in spec:
            text = "enum"
        elif "const" in spec:
            text = "const"
        else:
            text = "any"
    if text == "array" and isinstance(spec.get("items"), dict):
        text = "array of %s" % _type_text(spec["items"], depth + 1)
    return text


def _annotation(spec):
    kind = spec.get("type") if isinstance(spec, dict) else None
    if isinstance(kind, str) and kind in _ANNOTATIONS:
        return _ANNOTATIONS[kind]
    if isinstance(kind, list) and kind and all(k in _ANNOTATIONS for k in kind if isinstance(k, str)):
        names = ["None" if _ANNOTATIONS.get(k) is None else _ANNOTATIONS[k].__name__ for k in kind if isinstance(k, str)]
        return " | ".join(names) if names else None
    return None


def _short_json(value, limit=60):
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _properties(schema):
    """[(name, spec, required)] of an input schema, whatever its shape."""
    if not isinstance(schema, dict):
        return []
    props = schema.get("properties")
    if not isinstance(props, dict):
        return []
    required = schema.get("required")
    required = set(r for r in required if isinstance(r, str)) if isinstance(required, list) else set()
    return [(str(name), spec, name in required) for name, spec in props.items()]


def _is_parameter_name(name):
    return name.isidentifier() and not keyword.iskeyword(name)


def signature_of(schema):
    """The inspect.Signature of a tool's input schema: keyword-only
    parameters, required ones first and without default, optional ones
    with the schema's default or None; `**kwargs` when some property is
    not a Python name (such arguments go in as **{"name": value})."""
    import inspect

    P = inspect.Parameter
    props = _properties(schema)
    params, others = [], False
    for required in (True, False):
        for name, spec, is_required in props:
            if is_required != required:
                continue
            if not _is_parameter_name(name):
                others = True
                continue
            if required:
                default = P.empty
            elif isinstance(spec, dict) and "default" in spec:
                default = spec["default"]
            else:
                default = None
            annotation = _annotation(spec)
            params.append(P(name, P.KEYWORD_ONLY, default=default,
                            annotation=P.empty if annotation is None else annotation))
    if others:
        taken = set(p.name for p in params)
        rest = "kwargs"
        while rest in taken:
            rest += "_"
        params.append(P(rest, P.VAR_KEYWORD))
    try:
        return inspect.Signature(params)
    except (TypeError, ValueError):
        return inspect.Signature([P("kwargs", P.VAR_KEYWORD)])


def doc_of(server, info):
    """A tool's help text: its description, one line per parameter (name,
    type, required or default, description), what a call returns."""
    info = info if isinstance(info, dict) else {}
    name = str(info.get("name", "?"))
    description = info.get("description") or info.get("title") or ""
    lines = [str(description).strip() or "(no description)", ""]
    props = _properties(info.get("inputSchema"))
    if props:
        lines.append("Parameters (keyword arguments):")
        for required in (True, False):
            for pname, spec, is_required in props:
                if is_required != required:
                    continue
                words = [_type_text(spec), "required" if required else "optional"]
                if isinstance(spec, dict):
                    if not required and "default" in spec:
                        words.append("default %s" % _short_json(spec["default"]))
                    if isinstance(spec.get("enum"), list):
                        words.append("one of %s" % ", ".join(_short_json(v, 30) for v in spec["enum"][:12]))
                if not _is_parameter_name(pname):
                    words.append("pass it as **{%s: ...}" % _short_json(pname))
                line = "  %s (%s)" % (pname, ", ".join(words))
                text = spec.get("description") if isinstance(spec, dict) else None
                if text:
                    line += ": " + _one_line(text)
                lines.append(line)
    else:
        lines.append("Parameters: none described.")
    lines.append("")
    if isinstance(info.get("outputSchema"), dict):
        lines.append("Returns its structured content (a dict, see its outputSchema).")
    else:
        lines.append("Returns its text (str); a list of blocks when it answers with images or other content.")
    lines.append("Same as ferrepl.call(%s, %s, ...); .acall(...) is the coroutine form."
                 % (_short_json(server), _short_json(name)))
    return "\n".join(lines)
