"""Sessions at scale, over raw stdio: how fast a new session or a reset is
ready with the warm pool and once it runs dry, the memory of the server and
of each session with 32 idle sessions, and 32 cells sleeping at once."""

import os
import re
import statistics
import time

from bench import Ferrepl, ServerError, ms_since

SESSIONS = 32


def pool_ready(server):
    result = server.request("tools/call", {"name": "python_sessions", "arguments": {"action": "status"}})
    text = "".join(c.get("text", "") for c in result.get("content", []))
    found = re.search(r"^warm pool: (\d+) ready", text, re.M)
    return int(found.group(1)) if found else 0


def wait_pool(server, n, timeout=60.0):
    deadline = time.monotonic() + timeout
    while pool_ready(server) < n:
        if time.monotonic() > deadline:
            raise ServerError(f"the warm pool did not reach {n} within {timeout} s")
        time.sleep(0.02)


def bench_session_start(args, workdir, pool):
    """First-call time of new sessions taken back to back (the first `pool`
    from the pool, the rest after it ran dry), and of resets with a full pool."""
    server = Ferrepl(args.bin, args.python, workdir, ("--warm-pool", str(pool), "--max-sessions", "64"))
    server.initialize()
    try:
        server.exec("1")
        wait_pool(server, pool)
        fresh = []
        for i in range(pool + 4):
            start = time.perf_counter()
            server.exec("1", session=f"new{i}")
            fresh.append(ms_since(start))
        resets = []
        for _ in range(5):
            wait_pool(server, pool)
            start = time.perf_counter()
            server.request("tools/call", {"name": "python_sessions", "arguments": {"action": "reset", "session": "new0"}})
            server.exec("1", session="new0")
            resets.append(ms_since(start))
    finally:
        server.close()
    return {"from_pool_ms": fresh[:pool], "pool_dry_ms": fresh[pool:], "reset_ms": resets}


def _children():
    """{ppid: [pid, ...]} of every process now."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    return children


def _tree(pid, children):
    """pid and its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _rollup(pid):
    """(Rss, Pss, Private) of one process in KiB, from smaps_rollup."""
    values = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[1].isdigit():
                    values[parts[0].rstrip(":")] = int(parts[1])
    except OSError:
        return 0, 0, 0
    private = values.get("Private_Clean", 0) + values.get("Private_Dirty", 0)
    return values.get("Rss", 0), values.get("Pss", 0), private


def bench_memory_and_parallel(args, workdir):
    """32 idle sessions: the server's RSS and each session tree's PSS/USS;
    then 32 cells of time.sleep(1) sent at once, each one's time to result."""
    server = Ferrepl(args.bin, args.python, workdir, ("--max-sessions", str(SESSIONS + 4)))
    server.initialize()
    try:
        for i in range(SESSIONS):
            server.exec("x = 1", session=f"m{i}")
        own = _rollup(server.proc.pid)
        per_session = []
        children = _children()
        # Each session's tree hangs off the server (launcher -> interpreter).
        for top in children.get(server.proc.pid, []):
            tree = _tree(top, children)
            rolls = [_rollup(p) for p in tree]
            per_session.append((sum(r[0] for r in rolls), sum(r[1] for r in rolls), sum(r[2] for r in rolls), len(tree)))
        parallel = _sleep_at_once(server)
    finally:
        server.close()
    med = lambda i: statistics.median(r[i] for r in per_session) if per_session else 0  # noqa: E731
    return {
        "server_rss_kib": own[0],
        "server_uss_kib": own[2],
        "session_trees": len(per_session),
        "session_rss_kib": med(0),
        "session_pss_kib": med(1),
        "session_uss_kib": med(2),
        "session_processes": med(3),
        "parallel_sleep_ms": parallel,
    }


def _sleep_at_once(server):
    """Sends SESSIONS python_exec calls of time.sleep(1) without waiting,
    then the time from the first send to each result."""
    import json

    ids = {}
    start = time.perf_counter()
    for i in range(SESSIONS):
        server._ids += 1
        ids[server._ids] = i
        server.send({"jsonrpc": "2.0", "id": server._ids, "method": "tools/call",
                     "params": {"name": "python_exec", "arguments": {"code": "import time; time.sleep(1)", "session": f"m{i}"}}})
    done = []
    while len(done) < SESSIONS:
        line = server.proc.stdout.readline()
        if not line:
            raise ServerError("ferrepl closed its stdout during the parallel sleeps")
        message = json.loads(line)
        if message.get("id") in ids and "method" not in message:
            result = message.get("result") or {}
            if result.get("isError"):
                raise ServerError(f"a parallel sleep failed: {json.dumps(message)[:500]}")
            done.append(ms_since(start))
    return done


def report(args, workdir, goals):
    start = bench_session_start(args, workdir, args.pool)
    pooled = statistics.median(start["from_pool_ms"])
    reset = statistics.median(start["reset_ms"])
    print(f"\nnew session, first call, from a warm pool of {args.pool}: "
          + ", ".join(f"{t:.1f}" for t in start["from_pool_ms"]) + " ms")
    print("  the pool run dry (next sessions back to back): "
          + ", ".join(f"{t:.1f}" for t in start["pool_dry_ms"]) + " ms")
    print("reset (pool full), then the first call: " + ", ".join(f"{t:.1f}" for t in start["reset_ms"]) + " ms")
    mem = bench_memory_and_parallel(args, workdir)
    slowest = max(mem["parallel_sleep_ms"])
    print(f"{SESSIONS} idle sessions: server RSS {mem['server_rss_kib'] / 1024:.1f} MiB "
          f"(USS {mem['server_uss_kib'] / 1024:.1f} MiB); per session tree ({mem['session_processes']:.0f} processes, "
          f"median of {mem['session_trees']}): RSS {mem['session_rss_kib'] / 1024:.1f} MiB, "
          f"PSS {mem['session_pss_kib'] / 1024:.1f} MiB, USS {mem['session_uss_kib'] / 1024:.1f} MiB")
    print(f"{SESSIONS} cells of time.sleep(1) at once: all results within {slowest:.0f} ms "
          f"(first {min(mem['parallel_sleep_ms']):.0f} ms)")
    goals.data["sessions"] = {**start, **mem}
    goals.add("new session from the warm pool", f"{pooled:.1f} ms", "<= 15 ms", pooled <= 15.0)
    goals.add("reset with the warm pool", f"{reset:.1f} ms", "<= 15 ms", reset <= 15.0)
    goals.add(f"server RSS, {SESSIONS} idle sessions", f"{mem['server_rss_kib'] / 1024:.1f} MiB", "<= 15 MiB",
              mem["server_rss_kib"] <= 15 * 1024)
    goals.add("per session PSS / USS", f"{mem['session_pss_kib'] / 1024:.1f} / {mem['session_uss_kib'] / 1024:.1f} MiB",
              "report", None)
    goals.add(f"{SESSIONS} x sleep(1) at once, slowest", f"{slowest:.0f} ms", "<= 1300 ms", slowest <= 1300.0)


def run_load(args, workdir, loadgen, clients, rate):
    """`ferrepl --http` on a free port and the load generator against it."""
    import json
    import socket
    import subprocess
    import tempfile

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = tempfile.TemporaryDirectory(prefix="ferrepl-bench-state-")
    out = tempfile.NamedTemporaryFile(suffix=".json", delete=False)
    out.close()
    cmd = [args.bin, "--http", f"127.0.0.1:{port}", "--workdir", workdir, "--max-sessions", str(clients + 4)]
    if args.python:
        cmd += ["--python", args.python]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=dict(os.environ, FERREPL_STATE_DIR=state.name))
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise ServerError("ferrepl --http did not start listening")
                time.sleep(0.05)
        run = subprocess.run([loadgen, "--url", f"http://127.0.0.1:{port}/mcp", "--clients", str(clients),
                              "--rate", str(rate), "--seconds", str(args.load_seconds), "--json", out.name],
                             capture_output=True, text=True, timeout=args.load_seconds + 300)
        if run.returncode != 0:
            raise ServerError(f"loadgen failed: {run.stderr[-2000:]}")
        with open(out.name) as f:
            return json.load(f)
    finally:
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
        os.unlink(out.name)
        state.cleanup()
