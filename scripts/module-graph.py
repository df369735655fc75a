#!/usr/bin/env python3
"""Which modules of src/ use which, and the circles among them.

    python3 scripts/module-graph.py            # top-level modules
    python3 scripts/module-graph.py session    # the files of src/session/

Exits 1 when there is a circle, printing it, or (top-level) when a layer
rule of docs/architecture.md is broken. An edge A -> B means a file of
A names B: `crate::B` for top-level modules; for the files of one
directory, `super::B` or `crate::DIR::B` (and `use super::*` or a path to an
item of `mod.rs`, which is an edge to `mod`). A `mod.rs`'s own `mod`
declarations and `pub use` re-exports are not edges: they only say where
code lives. Comments and strings are skipped; unit-test modules
(`#[cfg(test)]` and what follows it) are not read, since tests may use
anything.
"""

import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
ROOTS = {"lib", "main", "app"}


def code_of(text: str) -> str:
    """The text without comments, string literals and test modules."""
    cut = text.find("#[cfg(test)]")
    if cut >= 0:
        text = text[:cut]
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif c == "r" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) and re.match(r'r#*"', text[i:]):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            j = text.find('"' + hashes, i + len(hashes) + 2)
            i = n if j < 0 else j + 1 + len(hashes)
            out.append('""')
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:]):
            i += len(re.match(r"'(\\.|[^\\'])'", text[i:]).group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def top_of(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".rs")


def top_edges() -> dict:
    names = {top_of(p) for p in SRC.rglob("*.rs")} - ROOTS
    edges = {n: set() for n in names}
    for path in SRC.rglob("*.rs"):
        me = top_of(path)
        if me in ROOTS:
            continue
        code = code_of(path.read_text())
        # `crate::x`, and `crate::{x, y::z}` groups.
        found = set(re.findall(r"\bcrate::(\w+)", code))
        for group in re.findall(r"\bcrate::\{([^}]*)\}", code):
            found.update(re.findall(r"(?:^|[,{\s])(\w+)", group))
        for other in found & names:
            if other != me:
                edges[me].add(other)
    return edges


def within_edges(directory: str) -> dict:
    base = SRC / directory
    files = {p.stem: p for p in base.glob("*.rs")}
    edges = {n: set() for n in files}
    for name, path in files.items():
        code = code_of(path.read_text())
        if name == "mod":
            # Declarations and re-exports say where code lives, not a use.
            code = re.sub(r"(?m)^\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*;", "", code)
            code = re.sub(r"(?ms)^\s*pub(\([^)]*\))?\s+use\s+[^;]*;", "", code)
            refs = re.findall(r"\b(?:self|crate::" + directory + r")::(\w+)", code)
            # A child named bare in a path (`cells::x`) is a use too.
            refs += re.findall(r"(?<![\w:])(\w+)::", code)
        else:
            refs = re.findall(r"\b(?:super|crate::" + directory + r")::(\w+)", code)
            if re.search(r"\bsuper::\*", code) or re.search(r"\bsuper::\{", code):
                refs.append("mod")
            for group in re.findall(r"\bsuper::\{([^}]*)\}", code):
                refs += re.findall(r"(?:^|[,{\s])(\w+)", group)
            # super::Item where Item is not a child file: an item of mod.rs.
            if any(r not in files for r in refs):
                refs.append("mod")
        for other in set(refs):
            if other in files and other != name:
                edges[name].add(other)
    return edges


def circles(edges: dict) -> list:
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


# The layers docs/architecture.md states as invariants: who may not use whom.
FORBIDDEN = {
    "startup": {"setup", "tenants", "serve", "viewer", "mcp"},
    "mcp": {"tenants", "serve", "startup", "setup", "viewer"},
    "tenants": {"serve", "viewer", "setup"},
    "viewer": {"setup"},
    "session": {"mcp", "serve", "tenants", "startup", "setup", "viewer"},
    "jobs": {"mcp", "serve", "tenants", "startup", "setup", "viewer"},
    "files": {"mcp", "serve", "tenants", "session", "worker"},
    "worker": {"mcp", "serve", "tenants", "session", "jobs"},
    "process": {"mcp", "session", "jobs", "worker"},
    "sandbox": {"mcp", "session", "jobs", "worker", "process"},
}
LEAVES = {"metrics", "units", "output", "store", "state"}


def broken_rules(edges: dict) -> list:
    out = []
    for name, uses in sorted(edges.items()):
        banned = FORBIDDEN.get(name, set())
        if name in LEAVES:
            banned = set(edges) - LEAVES
        for other in sorted(uses & banned):
            out.append(f"{name} may not use {other} (docs/architecture.md, Layers)")
    return out


def main() -> int:
    top = len(sys.argv) == 1
    edges = top_edges() if top else within_edges(sys.argv[1])
    for name in sorted(edges):
        print(f"{name} -> {', '.join(sorted(edges[name])) or '(nothing)'}")
    found = circles(edges)
    for comp in found:
        inner = {v: sorted(w for w in edges[v] if w in comp) for v in comp}
        print("circle: " + "; ".join(f"{v} -> {', '.join(ws)}" for v, ws in inner.items()))
    broken = broken_rules(edges) if top else []
    for rule in broken:
        print(rule)
    return 1 if found or broken else 0


if __name__ == "__main__":
    sys.exit(main())
