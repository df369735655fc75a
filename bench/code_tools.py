"""Code calls tools (issue 33): what `import ferrepl; ferrepl.call(...)` costs
and what it saves. Needs the official MCP Python SDK (the test venv has it).

    target/test-env/venv/bin/python bench/code_tools.py [--ferrepl PATH]

The upstream is a standard-library MCP server over stdio written into a temp
dir (tools echo, slow, issue; a thread per slow call, so calls overlap).

1. per-call overhead over stdio, `echo(text="x")`, median and p90 of --calls:
   (c) a raw JSON-RPC client on the upstream's pipes (the floor),
   (a) the SDK client on the upstream,
   (b) ferrepl.call in ONE python_exec cell, timed inside the cell; for
       --ferrepl and target/release/ferrepl when it exists and has the flag.
2. 100 ferrepl.acall("m", "slow", seconds=0.2) under asyncio.gather in one
   cell (--mcp-max-in-flight 128): wall time inside the cell.
3. context: 40 calls of issue(i) (~2 KB of JSON each) as direct tool calls
   (the characters of their text content) against one cell that makes them
   and prints a 10-line answer (the characters of the python_exec result's
   text blocks).
"""
import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

ROOT = Path(__file__).resolve().parent.parent

UPSTREAM = r'''
import json, random, sys, threading, time
lock = threading.Lock()
def send(m):
    with lock:
        sys.stdout.write(json.dumps(m) + "\n")
        sys.stdout.flush()
def schema(**props):
    return {"type": "object", "properties": {k: {"type": v} for k, v in props.items()}}
TOOLS = [
    {"name": "echo", "description": "Echo text", "inputSchema": schema(text="string")},
    {"name": "slow", "description": "Sleep", "inputSchema": schema(seconds="number")},
    {"name": "issue", "description": "One issue record as JSON", "inputSchema": schema(i="integer")},
]
WORDS = ("the worker crashes when a session restarts under load and the pool runs dry "
         "after the timeout expires we see a traceback in the log with an empty reply").split()
LABELS = ["bug", "enhancement", "docs", "performance", "security", "good first issue", "wontfix"]
PEOPLE = ["alice", "bob", "carol", "dave", "erin", "frank"]
def issue(i):
    r = random.Random(i)
    words = lambda n: " ".join(r.choice(WORDS) for _ in range(n))
    return json.dumps({
        "number": 1000 + i, "title": words(8).capitalize(),
        "state": r.choice(["open", "open", "closed"]), "author": r.choice(PEOPLE),
        "created_at": "2026-%02d-%02dT%02d:00:00Z" % (r.randint(1, 11), r.randint(1, 28), r.randint(0, 23)),
        "labels": sorted(r.sample(LABELS, r.randint(1, 3))),
        "body": words(175),
        "comments": [{"author": r.choice(PEOPLE), "body": words(22)} for _ in range(r.randint(3, 6))],
        "reactions": {"+1": r.randint(0, 30), "-1": r.randint(0, 3)},
    }, indent=1)
def call(mid, name, args):
    if name == "echo":
        text = str(args.get("text", ""))
    elif name == "slow":
        time.sleep(float(args.get("seconds", 1)))
        text = "slept"
    elif name == "issue":
        text = issue(int(args.get("i", 0)))
    else:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32602, "message": "unknown tool"}})
        return
    send({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": text}]}})
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    mid, method, p = m.get("id"), m.get("method"), m.get("params") or {}
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": p.get("protocolVersion", "2025-06-18"),
              "capabilities": {"tools": {}}, "serverInfo": {"name": "bench", "version": "0"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": mid, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        name, args = p.get("name"), p.get("arguments") or {}
        if name == "slow":  # calls that wait get a thread each; the rest answer in turn
            threading.Thread(target=call, args=(mid, name, args), daemon=True).start()
        else:
            call(mid, name, args)
    elif mid is not None:
        send({"jsonrpc": "2.0", "id": mid, "result": {}})
'''

# Cells: each prints one line `RESULT {json}`.
CELL_SEQ = """
import ferrepl, time, statistics, json
for _ in range({warmup}):
    ferrepl.call("m", "echo", text="x")
ts = []
for _ in range({calls}):
    t = time.perf_counter()
    ferrepl.call("m", "echo", text="x")
    ts.append(time.perf_counter() - t)
ts.sort()
print("RESULT", json.dumps({{"median": statistics.median(ts), "p90": ts[int(len(ts) * 0.9)],
                            "mean": statistics.mean(ts)}}))
"""

CELL_GATHER = """
import ferrepl, asyncio, time, json
await ferrepl.acall("m", "slow", seconds=0)
walls = []
for _ in range({rounds}):
    t = time.perf_counter()
    out = await asyncio.gather(*[ferrepl.acall("m", "slow", seconds=0.2) for _ in range({n})])
    walls.append(time.perf_counter() - t)
    assert out == ["slept"] * {n}, out[:3]
print("RESULT", json.dumps({{"walls": walls}}))
"""

CELL_CONTEXT = """
import ferrepl, json, collections
issues = [json.loads(ferrepl.call("m", "issue", i=i)) for i in range(40)]
bugs = [x for x in issues if x["state"] == "open" and "bug" in x["labels"]]
labels = collections.Counter(l for x in issues if x["state"] == "open" for l in x["labels"])
people = collections.Counter(c["author"] for x in bugs for c in x["comments"])
print(f"{len(issues)} issues, {sum(x['state'] == 'open' for x in issues)} open, {len(bugs)} open bugs")
print("open by label:", dict(labels.most_common(4)))
print("most active on open bugs:", people.most_common(3))
for x in sorted(bugs, key=lambda x: -x["reactions"]["+1"])[:7]:
    print(f"#{x['number']} +{x['reactions']['+1']} {x['created_at'][:10]} {x['title'][:50]}")
"""


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))]


def raw_floor(cmd, calls, warmup, gather_rounds):
    """(c): newline-delimited JSON-RPC on the upstream's own pipes."""
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    def rpc(i, method, params):
        p.stdin.write(json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}) + "\n")
        p.stdin.flush()
        return p.stdout.readline()
    try:
        rpc(0, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                              "clientInfo": {"name": "raw", "version": "0"}})
        p.stdin.write('{"jsonrpc":"2.0","method":"notifications/initialized"}\n'); p.stdin.flush()
        ts = []
        for i in range(1, warmup + calls + 1):
            t = time.perf_counter()
            line = rpc(i, "tools/call", {"name": "echo", "arguments": {"text": "x"}})
            ts.append(time.perf_counter() - t)
            assert '"x"' in line, line
        ts = ts[warmup:]
        # 100 slow(0.2) requests written at once, wall time to the last response (section 2's floor)
        walls = []
        for k in range(gather_rounds):
            base = 20000 + 1000 * k
            t = time.perf_counter()
            p.stdin.write("".join(json.dumps({"jsonrpc": "2.0", "id": base + j, "method": "tools/call",
                                              "params": {"name": "slow", "arguments": {"seconds": 0.2}}}) + "\n"
                                  for j in range(100)))
            p.stdin.flush()
            for _ in range(100):
                assert "slept" in p.stdout.readline()
            walls.append(time.perf_counter() - t)
        # the JSON-RPC response lines of the 40 issue calls (for section 3)
        issue_lines = [rpc(10000 + i, "tools/call", {"name": "issue", "arguments": {"i": i}}).strip()
                       for i in range(40)]
        return statistics.median(ts), pct(ts, 0.9), walls, issue_lines
    finally:
        p.stdin.close(); p.wait()


def text_of(result):
    return "\n".join(b.text for b in result.content if getattr(b, "type", None) == "text")


async def sdk_direct(cmd, calls, warmup):
    """(a): the SDK client on the upstream; also the 40 issue results' text."""
    params = StdioServerParameters(command=cmd[0], args=cmd[1:])
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        ts = []
        for _ in range(warmup + calls):
            t = time.perf_counter()
            res = await s.call_tool("echo", {"text": "x"})
            ts.append(time.perf_counter() - t)
            assert not res.is_error and text_of(res) == "x", res
        ts = ts[warmup:]
        issues = [text_of(await s.call_tool("issue", {"i": i})) for i in range(40)]
        return statistics.median(ts), pct(ts, 0.9), issues


async def through_ferrepl(binary, servers, d, args, context):
    """(b), section 2 and (optionally) section 3 with one ferrepl."""
    ws = tempfile.mkdtemp(dir=d, prefix="ws-")
    env = dict(os.environ, XDG_STATE_HOME=os.path.join(ws + "-state"))
    params = StdioServerParameters(command=binary, env=env, args=[
        "--workdir", ws, "--resume", "off", "--mcp-servers", servers, "--mcp-max-in-flight", "128"])
    out = {}
    with open(os.path.join(d, "ferrepl-" + os.path.basename(ws) + ".log"), "w") as log:
        async with stdio_client(params, errlog=log) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            async def cell(code):
                res = await s.call_tool("python_exec", {"code": code, "wait_s": 50})
                text = text_of(res)
                m = re.search(r"^RESULT (.*)$", text, re.M)
                if res.is_error or not m:
                    raise RuntimeError(f"the cell failed:\n{text}")
                note = re.search(r"Tool calls: [^\n]*", text)
                return json.loads(m.group(1)), note.group(0) if note else "", res, text
            await cell('print("RESULT", 1)')  # the interpreter is up
            seq, out["seq_note"], _, _ = await cell(CELL_SEQ.format(calls=args.calls, warmup=args.warmup))
            out["median"], out["p90"], out["mean"] = seq["median"], seq["p90"], seq["mean"]
            m = re.search(r"Tool calls: (\d+), ([\d.]+) s waiting on servers", out["seq_note"])
            out["upstream_each"] = float(m.group(2)) / int(m.group(1)) if m else None
            g, out["gather_note"], _, _ = await cell(CELL_GATHER.format(n=100, rounds=args.gather_rounds))
            out["walls"] = g["walls"]
            if context:
                res = await s.call_tool("python_exec", {"code": CELL_CONTEXT, "wait_s": 50})
                assert not res.is_error, res
                out["context_text"] = text_of(res)
                out["context_json"] = res.model_dump_json(by_alias=True, exclude_none=True)
    return out


def supports(binary):
    try:
        h = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return False
    return "--mcp-servers" in h


async def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ferrepl", default=str(ROOT / "target/debug/ferrepl"))
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--gather-rounds", type=int, default=3)
    ap.add_argument("--show-cell", action="store_true", help="print the context cell's result text")
    args = ap.parse_args()

    d = tempfile.mkdtemp(prefix="ferrepl-code-tools-")
    try:
        conf = os.path.join(d, "conf"); os.mkdir(conf)
        up = os.path.join(conf, "upstream.py")
        Path(up).write_text(UPSTREAM)
        # the interpreter itself, not a shim (pyenv's is a shell script)
        py = subprocess.run(["python3", "-c", "import sys; print(sys.executable)"],
                            capture_output=True, text=True).stdout.strip() or sys.executable
        cmd = [py, up]
        servers = os.path.join(conf, "mcp.json")
        Path(servers).write_text(json.dumps({"mcpServers": {"m": {"command": cmd[0], "args": cmd[1:]}}}))

        print(f"load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} "
              f"({os.cpu_count()} cores); upstream: {cmd[0]}; {args.calls} timed calls after {args.warmup}")
        c_med, c_p90, c_walls, issue_lines = raw_floor(cmd, args.calls, args.warmup, args.gather_rounds)
        a_med, a_p90, issue_texts = await sdk_direct(cmd, args.calls, args.warmup)

        builds = [("debug" if "/debug/" in args.ferrepl else "given", args.ferrepl)]
        release = ROOT / "target/release/ferrepl"
        skipped = None
        if release.exists() and os.path.realpath(release) != os.path.realpath(args.ferrepl):
            if supports(str(release)):
                builds.append(("release", str(release)))
            else:
                skipped = f"{release} has no --mcp-servers (built before issue 33): skipped"
        runs = []
        for i, (name, binary) in enumerate(builds):
            runs.append((name, binary, await through_ferrepl(binary, servers, d, args, context=(i == 0))))
        load = os.getloadavg()

        ms = lambda x: f"{x * 1000:8.3f}"
        print()
        print("1. per-call overhead over stdio, echo(text=\"x\")      median ms    p90 ms")
        print(f"   (c) raw JSON-RPC on the upstream's pipes (floor) {ms(c_med)}  {ms(c_p90)}")
        print(f"   (a) MCP Python SDK client -> upstream            {ms(a_med)}  {ms(a_p90)}")
        for name, binary, r in runs:
            print(f"   (b) ferrepl.call in one cell, {name:7s} build      {ms(r['median'])}  {ms(r['p90'])}")
        for name, binary, r in runs:
            print(f"   added by ferrepl ({name}): (b)-(a) {(r['median'] - a_med) * 1000:+.3f} ms, "
                  f"(b)-(c) {(r['median'] - c_med) * 1000:+.3f} ms per call (median); goal <= 0.5 ms")
            each = f"{r['upstream_each'] * 1000:.3f} ms" if r["upstream_each"] is not None else "?"
            print(f"       mean in the cell {r['mean'] * 1000:.3f} ms; ferrepl's count of time upstream: {each} "
                  f"a call ({r['seq_note']})")
        if skipped:
            print("   " + skipped)
        print()
        print("2. 100 x acall(slow, seconds=0.2) under asyncio.gather in one cell (ideal 0.2 s)")
        print(f"   raw client -> upstream, 100 requests at once  wall s: " + ", ".join(f"{w:.3f}" for w in c_walls)
              + f" (median {statistics.median(c_walls):.3f})")
        for name, binary, r in runs:
            print(f"   ferrepl {name:7s} build, one cell      wall s: " + ", ".join(f"{w:.3f}" for w in r["walls"])
                  + f" (median {statistics.median(r['walls']):.3f}); {r['gather_note']}")
        print()
        r = runs[0][2]
        direct_text = sum(len(t) for t in issue_texts)
        direct_json = sum(len(l) for l in issue_lines)
        cell_text = len(r["context_text"])
        print("3. context: 40 issue records (~2 KB JSON each) -> a 10-line answer     characters")
        print(f"   direct: the 40 results' text content                         {direct_text:8d}")
        print(f"   direct: the 40 JSON-RPC result lines                         {direct_json:8d}")
        print(f"   one python_exec cell: its result's text blocks               {cell_text:8d}")
        print(f"   one python_exec cell: its whole result as JSON               {len(r['context_json']):8d}")
        print(f"   ratio (text / text): {direct_text / cell_text:.0f}x fewer characters")
        if args.show_cell:
            print("\n--- the cell's result text ---\n" + r["context_text"])
        print()
        print(f"load after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
