#!/usr/bin/env python3
"""ferrepl benchmark: cold start, warm python_exec latency against a raw-pipe
floor, and large output.

It speaks newline-delimited JSON-RPC to `ferrepl` over stdio itself (initialize,
notifications/initialized, tools/call), so it needs only the standard library.

    cargo build --release && python3 bench/bench.py --bin target/release/ferrepl

* cold start: spawning ferrepl -> the result of the first `print(1)` call
  (handshake and interpreter start included), median of --cold-runs runs;
  next to it, for context, the same for a bare Python worker.
* warm: python_exec of `x = x + 1`, median and p99 over --calls calls.
* floor: the same loop over a raw pipe to a bare Python worker (reads a JSON
  line, exec()s it, writes a JSON line), run with the same interpreter the
  server's sessions use, timed in alternating turns of 50 calls with the
  warm loop (so a change in the machine's speed weighs on both); and the
  difference and ratio to it.
* large output: 10 MB printed as many lines and as one line (time to the
  result; the server's peak RSS).
* R (when R is installed; --no-r skips it): cold start of an R session
  (spawn -> result of the first r_exec `cat(1)`), warm r_exec `x <- x + 1`
  against the same loop over a raw pipe to a bare R process.
* sessions (bench/scale.py): a new session and a reset with the warm pool,
  and once it runs dry; the server's memory and each session's with 32 idle
  sessions; 32 cells of time.sleep(1) at once.
* clients (bench/clients.py): the official SDKs and raw clients, stdio and
  HTTP, against ferrepl and a trivial MCP server in the same run.
* load (examples/loadgen.rs): 32 HTTP clients, 10 calls a second each.

At the end, every goal with its target and MET or MISSED; --json FILE
writes all the numbers.
"""

import argparse
import ast
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

COLD_TARGET_MS = 100.0
OVERHEAD_TARGET_MS = 0.1
R_COLD_TARGET_MS = 300.0
R_OVERHEAD_TARGET_MS = 0.3

FLOOR_WORKER = r"""
import json, sys
ns = {}
read, write, flush = sys.stdin.readline, sys.stdout.write, sys.stdout.flush
while True:
    line = read()
    if not line:
        break
    exec(json.loads(line)["code"], ns)
    write('{"ok": true}\n')
    flush()
"""

# The R floor: a bare R loop reading one line of code, evaluating it and
# answering one line (the code is sent as it is: R parses the line itself).
R_FLOOR_WORKER = (
    "con <- file('stdin'); open(con); "
    "repeat { l <- readLines(con, n = 1L); if (!length(l)) break; "
    "eval(parse(text = l), globalenv()); cat('{\"ok\": true}\\n'); flush(stdout()) }"
)


class ServerError(RuntimeError):
    pass


class Ferrepl:
    """One `ferrepl` process driven over stdio with newline-delimited JSON-RPC."""

    def __init__(self, binary, python=None, workdir=None, extra=()):
        args = [binary, *extra]
        if python:
            args += ["--python", python]
        if workdir:
            args += ["--workdir", workdir]
        self._stderr = tempfile.TemporaryFile()
        # A fresh store per server: a reused one would make ferrepl rebuild
        # the previous run's sessions at the first call.
        self._state = tempfile.TemporaryDirectory(prefix="ferrepl-bench-state-")
        env = dict(os.environ, FERREPL_STATE_DIR=self._state.name)
        self.proc = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env
        )
        self._ids = 0

    def _fail(self, why):
        self._stderr.seek(0)
        tail = self._stderr.read()[-4000:].decode(errors="replace")
        raise ServerError(f"{why}; ferrepl stderr (tail):\n{tail}")

    def send(self, message):
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self._fail("ferrepl closed its stdin")

    def request(self, method, params):
        self._ids += 1
        want = self._ids
        self.send({"jsonrpc": "2.0", "id": want, "method": method, "params": params})
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self._fail(f"ferrepl closed its stdout while we waited for the answer to {method}")
            message = json.loads(line)
            if message.get("id") == want and "method" not in message:
                if "error" in message:
                    self._fail(f"{method} failed: {message['error']}")
                return message["result"]
            # Anything else (progress or log notifications) is not ours.

    def initialize(self):
        self.request(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "ferrepl-bench", "version": "1"},
            },
        )
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return self

    def exec(self, code, session=None, tool="python_exec"):
        arguments = {"code": code}
        if session:
            arguments["session"] = session
        result = self.request("tools/call", {"name": tool, "arguments": arguments})
        # The default result is text: the last line is the status footer.
        text = "".join(c.get("text", "") for c in result.get("content", []) if c.get("type") == "text")
        footer = text.rsplit("\n", 1)[-1]
        if result.get("isError") or not footer.startswith("-- ok |"):
            self._fail(f"python_exec {code!r} did not succeed: {json.dumps(result)[:2000]}")
        return text

    def peak_rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        return 0

    def close(self):
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._stderr.close()
        self._state.cleanup()


class FloorWorker:
    """The floor: a bare Python exec() loop behind a pipe, no MCP, no server
    (or with `argv`, another such loop, e.g. R's)."""

    def __init__(self, python, argv=None, raw_lines=False):
        self.raw_lines = raw_lines
        self.proc = subprocess.Popen(
            argv or [python, "-c", FLOOR_WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )

    def exec(self, code):
        line = code if self.raw_lines else json.dumps({"code": code})
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the floor worker died")
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(10)


def body(text):
    """A result's text without its status footer: the value of a cell that prints nothing."""
    return text.rsplit("\n", 1)[0]


def ms_since(start):
    return (time.perf_counter() - start) * 1000.0


def p99(values):
    ordered = sorted(values)
    # nearest-rank percentile
    rank = max(1, -(-99 * len(ordered) // 100))
    return ordered[rank - 1]


# Calls per turn when two loops are timed in turns.
TURN = 50


def time_in_turns(exec_a, exec_b, calls, warmup):
    """Times `x = x + 1` through two executors (after `x = 0` and `warmup`
    untimed calls each) in alternating turns of TURN calls, so a change in
    the machine's speed while they run (2 cores, other load) weighs on both
    alike; returns both lists of times."""
    times = ([], [])
    for exec_fn in (exec_a, exec_b):
        exec_fn("x = 0")
        for _ in range(warmup):
            exec_fn("x = x + 1")
    while len(times[1]) < calls:
        for exec_fn, out in ((exec_a, times[0]), (exec_b, times[1])):
            for _ in range(min(TURN, calls - len(out))):
                start = time.perf_counter()
                exec_fn("x = x + 1")
                out.append(ms_since(start))
    return times


def bench_cold(args, workdir):
    times = []
    for _ in range(args.cold_runs):
        start = time.perf_counter()
        server = Ferrepl(args.bin, args.python, workdir)
        try:
            server.initialize()
            result = server.exec("print(1)")
            times.append(ms_since(start))
            if not result.startswith("1\n-- ok |"):
                raise ServerError(f"print(1) gave {result!r}")
        finally:
            server.close()
    return times


def bench_warm(args, workdir):
    """Warm python_exec calls and the floor (the same loop over a raw pipe
    to a bare worker on the sessions' interpreter), timed in turns."""
    server = Ferrepl(args.bin, args.python, workdir).initialize()
    try:
        python = body(server.exec("import sys; sys.executable"))
        # The cell's value is the repr of the path.
        python = ast.literal_eval(python) if python else sys.executable
        worker = FloorWorker(python)
        try:
            times, floor = time_in_turns(server.exec, worker.exec, args.calls, args.warmup)
        finally:
            worker.close()
        final = body(server.exec("x"))
        if final != str(args.calls + args.warmup):
            raise ServerError(f"x is {final} after {args.calls + args.warmup} increments")
    finally:
        server.close()
    return times, floor, python


def bench_cold_floor(args, python):
    """Spawning the bare worker -> the answer to its first cell: what Python's
    own start-up costs on this machine, for context."""
    times = []
    for _ in range(args.cold_runs):
        start = time.perf_counter()
        worker = FloorWorker(python)
        try:
            worker.exec("print(1)")
            times.append(ms_since(start))
        finally:
            worker.close()
    return times


LARGE_OUTPUTS = (
    ("10 MB as 100,000 lines", "for i in range(100000): print('x' * 99)"),
    ("10 MB as one line", "print('x' * 10_000_000)"),
)


def bench_large(args, workdir):
    rows = []
    for label, code in LARGE_OUTPUTS:
        server = Ferrepl(args.bin, args.python, workdir).initialize()
        try:
            server.exec("1")
            before = server.peak_rss_kib()
            start = time.perf_counter()
            result = server.exec(code)
            elapsed = ms_since(start)
            rows.append((label, elapsed, before, server.peak_rss_kib(), len(result)))
        finally:
            server.close()
    return rows


R_ARGS = ("--languages", "python,r")


def bench_r(args, workdir):
    """Cold start and warm calls of an R session, and the raw-pipe floor."""
    cold = []
    for _ in range(args.cold_runs):
        start = time.perf_counter()
        server = Ferrepl(args.bin, args.python, workdir, R_ARGS)
        try:
            server.initialize()
            result = server.exec("cat(1)", tool="r_exec")
            cold.append(ms_since(start))
            if not result.startswith("1-- ok |") and not result.startswith("1\n-- ok |"):
                raise ServerError(f"cat(1) gave {result!r}")
        finally:
            server.close()
    server = Ferrepl(args.bin, args.python, workdir, R_ARGS).initialize()
    r_exec = lambda code: server.exec(code.replace("=", "<-"), tool="r_exec")  # noqa: E731
    floor_worker = FloorWorker(None, ["R", "--vanilla", "--quiet", "--no-echo", "-e", R_FLOOR_WORKER], raw_lines=True)
    r_floor = lambda code: floor_worker.exec(code.replace("=", "<-"))  # noqa: E731
    try:
        warm, floor = time_in_turns(r_exec, r_floor, args.calls, args.warmup)
    finally:
        floor_worker.close()
        server.close()
    return cold, warm, floor


def report_r(args, workdir):
    cold, warm, floor = bench_r(args, workdir)
    cold_med, warm_med, floor_med = statistics.median(cold), statistics.median(warm), statistics.median(floor)
    overhead = warm_med - floor_med
    print()
    print(
        f"R cold start (spawn -> result of r_exec cat(1)), median of {len(cold)}: {cold_med:.1f} ms"
        f"   target < {R_COLD_TARGET_MS:.0f} ms: {verdict(cold_med < R_COLD_TARGET_MS)}"
    )
    print(f"warm r_exec 'x <- x + 1' ({len(warm)} calls): median {warm_med:.3f} ms, p99 {p99(warm):.3f} ms")
    print(f"floor, raw pipe to a bare R eval loop: median {floor_med:.3f} ms, p99 {p99(floor):.3f} ms")
    print(
        f"R overhead over the floor: median {overhead:+.3f} ms (ratio {warm_med / floor_med:.2f}x)"
        f"   target within {R_OVERHEAD_TARGET_MS} ms: {verdict(overhead <= R_OVERHEAD_TARGET_MS)}"
    )


def verdict(ok):
    return "MET" if ok else "MISSED"


class Goals:
    """Every goal measured in this run, for the summary and the JSON file."""

    def __init__(self):
        self.rows = []
        self.data = {}

    def add(self, name, shown, target, met):
        self.rows.append({"goal": name, "measured": shown, "target": target, "met": met})

    def print(self):
        width = max((len(r["goal"]) for r in self.rows), default=10)
        print("\nsummary")
        for r in self.rows:
            v = "reported" if r["met"] is None else verdict(r["met"])
            print(f"  {r['goal']:<{width}}  {r['measured']:>18}  {r['target']:>14}  {v}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", default="target/release/ferrepl", help="the ferrepl binary (default: %(default)s)")
    parser.add_argument("--python", help="interpreter for the sessions (passed as --python; default: ferrepl's own)")
    parser.add_argument("--calls", type=int, default=1000, help="timed calls in each warm loop (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=50, help="untimed calls before each warm loop (default: %(default)s)")
    parser.add_argument("--cold-runs", type=int, default=5, help="server starts for the cold median (default: %(default)s)")
    parser.add_argument("--client-calls", type=int, default=300, help="timed calls per client in the matrix (default: %(default)s)")
    parser.add_argument("--pool", type=int, default=4, help="--warm-pool for the session measurements (default: %(default)s)")
    parser.add_argument("--load-seconds", type=int, default=10, help="length of the HTTP load run (default: %(default)s)")
    parser.add_argument("--json", help="write every number to this file")
    for part in ("large", "r", "sessions", "clients", "load"):
        parser.add_argument(f"--no-{part}", action="store_true", help=f"skip the {part} measurements")
    args = parser.parse_args()

    if not (os.path.isfile(args.bin) and os.access(args.bin, os.X_OK)):
        sys.exit(f"bench: no ferrepl binary at {args.bin} (cargo build --release, or pass --bin)")

    goals = Goals()
    with tempfile.TemporaryDirectory(prefix="ferrepl-bench-") as workdir:
        print(f"ferrepl: {args.bin}")
        report_stdio(args, workdir, goals)
        if not args.no_r:
            if shutil.which("R"):
                report_r(args, workdir)
            else:
                print("\nR: not installed, R measurements skipped (apt-get install r-base-core)")
        if not args.no_large:
            print()
            for label, elapsed, before, peak, size in bench_large(args, workdir):
                print(
                    f"large output, {label}: result in {elapsed:.0f} ms ({size} characters of text); "
                    f"server peak RSS {peak / 1024:.1f} MiB (+{(peak - before) / 1024:.1f} MiB during the cell)"
                )
        if not args.no_sessions:
            import scale

            scale.report(args, workdir, goals)
        if not args.no_clients:
            report_clients(args, workdir, goals)
        if not args.no_load:
            report_load(args, workdir, goals)
    goals.print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"goals": goals.rows, "data": goals.data}, f, indent=1)
        print(f"\nwritten: {args.json}")


def report_stdio(args, workdir, goals):
    cold = bench_cold(args, workdir)
    warm, floor, python = bench_warm(args, workdir)
    print(f"session interpreter (also runs the floor): {python}")
    cold_floor = bench_cold_floor(args, python)
    cold_med = statistics.median(cold)
    warm_med, warm_p99 = statistics.median(warm), p99(warm)
    floor_med, floor_p99 = statistics.median(floor), p99(floor)
    overhead = warm_med - floor_med
    print()
    print(f"cold start (spawn -> result of print(1)), median of {len(cold)}: {cold_med:.1f} ms  (runs: {', '.join(f'{t:.1f}' for t in cold)})")
    print(f"  for context, spawn -> first answer of the bare Python worker: median {statistics.median(cold_floor):.1f} ms")
    print(f"warm python_exec 'x = x + 1' over MCP stdio ({len(warm)} calls): median {warm_med:.3f} ms, p99 {warm_p99:.3f} ms")
    print(f"floor, raw pipe to a bare Python exec() loop ({len(floor)} calls): median {floor_med:.3f} ms, p99 {floor_p99:.3f} ms")
    print(f"overhead over the floor: median {overhead:+.3f} ms (ratio {warm_med / floor_med:.2f}x), p99 {warm_p99 - floor_p99:+.3f} ms")
    goals.data["stdio"] = {"cold_ms": cold, "warm_median_ms": warm_med, "warm_p99_ms": warm_p99,
                           "floor_median_ms": floor_med, "floor_p99_ms": floor_p99,
                           "cold_floor_ms": statistics.median(cold_floor)}
    goals.add("cold start, raw stdio", f"{cold_med:.1f} ms", f"< {COLD_TARGET_MS:.0f} ms", cold_med < COLD_TARGET_MS)
    goals.add("raw stdio overhead over the floor", f"{overhead:+.3f} ms", f"<= +{OVERHEAD_TARGET_MS} ms", overhead <= OVERHEAD_TARGET_MS)


def report_clients(args, workdir, goals):
    try:
        import clients
    except ImportError as e:
        print(f"\nclients: skipped ({e})")
        return
    cmd = [args.bin, "--workdir", workdir] + (["--python", args.python] if args.python else [])
    state = tempfile.mkdtemp(prefix="ferrepl-bench-state-")
    rows = clients.run_matrix(cmd, dict(os.environ, FERREPL_STATE_DIR=state), args.client_calls, 30)
    shutil.rmtree(state, ignore_errors=True)
    goals.data["clients"] = rows
    print("\nclients (median / p99 ms; ratio of medians)")
    for r in rows:
        label = f"{r['client']}, {r['transport']}"
        if r.get("skipped"):
            print(f"  {label}: skipped ({r['skipped']})")
            continue
        t, f = r["trivial"], r["ferrepl"]
        print(f"  {label:<22} trivial {t['median_ms']:.3f} / {t['p99_ms']:.3f}   ferrepl {f['median_ms']:.3f} / {f['p99_ms']:.3f}   {r['ratio']:.2f}x")
        goals.add(f"{label} vs trivial server", f"{r['ratio']:.2f}x", "<= 1.2x", r["ratio"] <= 1.2)
        if "connect_ms" in t and "connect_ms" in f and r["transport"] == "stdio":
            cold_ratio = f["connect_ms"] / t["connect_ms"]
            goals.add(f"cold start, {r['client']} stdio, vs trivial", f"{cold_ratio:.2f}x", "<= 1.0x", cold_ratio <= 1.0)


def report_load(args, workdir, goals):
    loadgen = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(args.bin))), "release", "examples", "loadgen")
    if not os.path.exists(loadgen):
        loadgen = os.path.join("target", "release", "examples", "loadgen")
    if not os.path.exists(loadgen):
        print("\nload: skipped (cargo build --release --example loadgen)")
        return
    import scale

    result = scale.run_load(args, workdir, loadgen, clients=32, rate=10)
    goals.data["load"] = result
    p = result["latency_ms"]["p99"]
    print(f"\nload: 32 HTTP clients x 10 calls/s for {result['seconds']} s: {result['calls']} calls, "
          f"{result['errors']} errors; latency p50 {result['latency_ms']['p50']:.2f} ms, p99 {p:.2f} ms, max {result['latency_ms']['max']:.2f} ms")
    goals.add("32 HTTP clients x 10/s, p99", f"{p:.2f} ms", "<= 20 ms", p <= 20.0 and result["errors"] == 0)


if __name__ == "__main__":
    main()
