#!/usr/bin/env python3
"""Measures what ferrepl's tool surface costs an agent, against budgets.

    cargo build && python3 scripts/tool-surface.py [--bin PATH] [-- SERVER ARGS...]

For each profile (default, `--tools all`, `--tools all --structured-content`)
it starts the server over stdio with a fresh temporary --workdir (and
--state-dir, so nothing is left in the user's own), speaks
newline-delimited JSON-RPC itself (initialize, notifications/initialized,
tools/list, one tools/call of python_exec {"code": "1+1"}) and prints, per
tool, the model-visible characters: len(name) + len(description) + the length
of the inputSchema as compact JSON (separators (',', ':')), and the size of
its outputSchema and annotations (compact JSON; "-" when absent). Then the
totals: model-visible (all tools plus the server instructions of the
initialize result), the whole tools array as compact JSON, and the length of
the JSON-RPC response line of the 1+1 call.

Sizes are characters (Unicode code points); JSON is dumped with
ensure_ascii=False, as serde_json writes it. tests/suite/tool_surface.rs counts the
same way and asserts the same budgets. Exit status 1 when a budget is missed
(or a profile fails to run). Standard library only.
"""

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time

# Budgets, shared with tests/suite/tool_surface.rs.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "tool-budgets.json")) as f:
    LIMITS = json.load(f)
# (label, profile, measure, limit); "r+PROFILE" measures what R adds to PROFILE.
BUDGETS = [
    ("model-visible, default profile", "default", "visible", LIMITS["default_visible"]),
    ("model-visible, --tools all", "all", "visible", LIMITS["all_visible"]),
    ("tools array, --tools all", "all", "tools_json", LIMITS["all_tools_json"]),
    ("1+1 response line, default profile", "default", "line", LIMITS["one_plus_one_line"]),
    ("1+1 response line, --tools all", "all", "line", LIMITS["one_plus_one_line"]),
    ("R adds, default profile", "r+default", "visible", LIMITS["r_added_visible"]),
    ("R adds, --tools all", "r+all", "visible", LIMITS["r_added_visible"]),
]

PROFILES = [
    ("default", []),
    ("all", ["--tools", "all"]),
    ("all+structured", ["--tools", "all", "--structured-content"]),
    ("default+r", ["--languages", "python,r"]),
    ("all+r", ["--tools", "all", "--languages", "python,r"]),
]

TIMEOUT_S = 60.0


def compact(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class ServerError(RuntimeError):
    pass


class Server:
    """One ferrepl process driven over stdio with newline-delimited JSON-RPC."""

    def __init__(self, binary, args, workdir, state_dir):
        self._stderr = tempfile.TemporaryFile()
        argv = [binary, "--workdir", workdir, "--state-dir", state_dir, *args]
        self.argv = argv
        env = {k: v for k, v in os.environ.items() if not k.startswith("FERREPL_")}
        env["NO_COLOR"] = "1"
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env
        )
        self._lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._ids = 0

    def _read(self):
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _fail(self, why):
        time.sleep(0.1)
        self._stderr.seek(0)
        tail = self._stderr.read()[-3000:].decode(errors="replace")
        raise ServerError(f"{why}; ferrepl stderr (tail):\n{tail}")

    def send(self, message):
        try:
            self.proc.stdin.write(compact(message).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self._fail("ferrepl closed its stdin")

    def request(self, method, params):
        """Returns (the raw response line without its newline, its result)."""
        self._ids += 1
        want = self._ids
        self.send({"jsonrpc": "2.0", "id": want, "method": method, "params": params})
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self._fail(f"no answer to {method} within {TIMEOUT_S:.0f} s")
            if line is None:
                self._fail(f"ferrepl closed its stdout while we waited for the answer to {method}")
            text = line.decode("utf-8").rstrip("\r\n")
            try:
                message = json.loads(text)
            except ValueError:
                self._fail(f"ferrepl wrote a line that is not JSON: {text[:200]!r}")
            if message.get("id") == want and "method" not in message:
                if "error" in message:
                    self._fail(f"{method} failed: {message['error']}")
                return text, message["result"]
            # Notifications (progress, logging) are not ours.

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._stderr.close()


def measure(binary, args):
    """Runs one profile; returns its measures."""
    with tempfile.TemporaryDirectory(prefix="ferrepl-surface-") as top:
        workdir, state_dir = os.path.join(top, "work"), os.path.join(top, "state")
        os.mkdir(workdir)
        server = Server(binary, args, workdir, state_dir)
        try:
            _, init = server.request(
                "initialize",
                {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "ferrepl-tool-surface", "version": "1"},
                },
            )
            server.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            tools, cursor = [], None
            while True:
                _, listed = server.request("tools/list", {"cursor": cursor} if cursor else {})
                tools += listed.get("tools", [])
                cursor = listed.get("nextCursor")
                if not cursor:
                    break
            line, result = server.request(
                "tools/call", {"name": "python_exec", "arguments": {"code": "1+1"}}
            )
        finally:
            server.close()
    rows = []
    for tool in tools:
        visible = (
            len(tool.get("name", ""))
            + len(tool.get("description", "") or "")
            + len(compact(tool.get("inputSchema", {})))
        )
        output = len(compact(tool["outputSchema"])) if "outputSchema" in tool else None
        annotations = len(compact(tool["annotations"])) if "annotations" in tool else None
        rows.append((tool.get("name", "?"), visible, output, annotations))
    instructions = init.get("instructions") or ""
    return {
        "rows": rows,
        "tools_visible": sum(r[1] for r in rows),
        "instructions": len(instructions),
        "visible": sum(r[1] for r in rows) + len(instructions),
        "tools_json": len(compact(tools)),
        "line": len(line),
        "line_text": line,
        "is_error": bool(result.get("isError")),
    }


def show(n):
    return "-" if n is None else str(n)


def report(name, argv_shown, m):
    print(f"== {name}: {argv_shown}")
    print(f"  {'tool':<20} {'visible':>8} {'output':>8} {'annot':>6}")
    for tool, visible, output, annotations in m["rows"]:
        print(f"  {tool:<20} {visible:>8} {show(output):>8} {show(annotations):>6}")
    print(
        f"  model-visible: {m['tools_visible']} (tools) + {m['instructions']} (instructions)"
        f" = {m['visible']}"
    )
    print(f"  tools array (compact JSON): {m['tools_json']}")
    shown = m["line_text"] if len(m["line_text"]) <= 400 else m["line_text"][:400] + "..."
    print(f"  1+1 response line: {m['line']}{'  (isError!)' if m['is_error'] else ''}")
    print(f"    {shown}")
    print()


def main():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(
        description="Measure ferrepl's tool surface (tools/list, instructions, a 1+1 result) "
        "against its budgets. Arguments after -- are passed to the server.",
    )
    parser.add_argument(
        "--bin",
        default=os.path.join(repo, "target", "debug", "ferrepl"),
        help="the ferrepl binary (default: target/debug/ferrepl)",
    )
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    opts = parser.parse_args(argv)
    if not os.access(opts.bin, os.X_OK):
        sys.exit(f"{opts.bin} is not an executable; build it first (cargo build)")

    measures, failed = {}, False
    for name, args in PROFILES:
        shown = " ".join(["ferrepl", *args, *extra]) if args or extra else "ferrepl"
        try:
            measures[name] = measure(opts.bin, args + extra)
        except ServerError as e:
            print(f"== {name}: {shown}\n  FAILED: {e}\n")
            failed = True
            continue
        report(name, shown, measures[name])

    # What R adds to a profile: the difference of the two runs.
    for base in ("default", "all"):
        if base in measures and f"{base}+r" in measures:
            added = measures[f"{base}+r"]["visible"] - measures[base]["visible"]
            measures[f"r+{base}"] = {"visible": added}
    print("== budgets")
    for label, profile, key, limit in BUDGETS:
        if profile not in measures:
            print(f"  {label:<38} {'?':>6} <= {limit:<6} MISSED (the profile did not run)")
            failed = True
            continue
        got = measures[profile][key]
        ok = got <= limit
        failed |= not ok
        print(f"  {label:<38} {got:>6} <= {limit:<6} {'MET' if ok else 'MISSED'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
