#!/usr/bin/env python3
"""A local, bounded simulation of the Kubernetes layout in deploy/: three
ferrepl instances behind a real nginx routing /t/<tenant>/mcp by consistent
hashing on the tenant, with no failover; 30 tenants keeping state in their
sessions while one instance is killed (SIGKILL) and restarted on its state
directory, and another is drained (SIGTERM).

    python3 scripts/cluster-sim.py        (FERREPL_BIN=... to pick the binary)

Loopback only; every wait has a timeout; the whole run is bounded
(SIM_BUDGET seconds, 150 by default) by a watchdog; every child is killed on
exit.  Exits 0 when every assertion held, 1 with the failed ones listed, 2
when it cannot run (no binary, no nginx).  Standard library only (3.9+).

What is checked:
  * routing: each tenant's cells land on one instance, found from the cell's
    working directory (<instance>/work/<tenant>), never from nginx's hash;
    the tenants spread over the three instances;
  * state: `x = x + 1` counters in every tenant's session have the expected
    values;
  * (a) SIGKILL of instance A: A's tenants, and only they, get nginx's 502
    "instance ... is down" JSON error; the others keep working;
  * (b) A restarted on the same --state-dir: A was killed before any save
    of its sessions' state, so nothing is re-run by itself: its tenants
    re-initialize, their first call on `default` is refused with the offer
    (it is dormant; nothing was run), and a confirmed python_sessions
    rebuild brings their counter back;
  * (c) SIGTERM of instance B while some of its tenants run a 2 s cell: the
    waiting calls get their result, results of cells followed with
    python_wait are collected during the drain, a new session is refused
    with a retryable "draining" error, B exits by itself within
    --drain-seconds; after B is restarted the drained cells' effects are
    there (nothing was lost);
  * /metrics (on --metrics-addr) of every instance: ferrepl_tool_calls_total
    and ferrepl_cells_total grew under the load;
  * a report: requests, errors by kind, p50/p99 latency.
"""

import atexit
import collections
import http.client
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATE = os.path.join(ROOT, "deploy", "nginx", "ferrepl.conf.template")
BIN = os.environ.get("FERREPL_BIN", os.path.join(ROOT, "target", "debug", "ferrepl"))
BUDGET = float(os.environ.get("SIM_BUDGET", "150"))
N_INSTANCES = 3
N_TENANTS = int(os.environ.get("SIM_TENANTS", "30"))
DRAIN_SECONDS = 10
HTTP_TIMEOUT = 40.0
PROTOCOL = "2025-06-18"

T0 = time.monotonic()
CHILDREN = []  # Popen objects to kill on exit
FAILURES = []
LOCK = threading.Lock()


def log(msg):
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def fail(msg):
    with LOCK:
        FAILURES.append(msg)
    log("FAIL " + msg)


def check(cond, msg):
    if not cond:
        fail(msg)
    return cond


def kill_children():
    # Each child leads its own process group (start_new_session): kill the
    # whole group, so nginx's workers and ferrepl's launchers go too.
    for p in CHILDREN:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
    for p in CHILDREN:
        try:
            p.wait(timeout=5)
        except Exception:
            pass


atexit.register(kill_children)


def watchdog():
    """Ends the whole run when it exceeds its budget, whatever hangs."""
    deadline = T0 + BUDGET
    while time.monotonic() < deadline:
        time.sleep(0.5)
    print(f"cluster-sim: FAILED: the run exceeded its budget of {BUDGET:.0f} s", flush=True)
    kill_children()
    os._exit(1)


TAKEN_PORTS = set()


def free_port():
    """A port for a listener that must keep it across restarts (nginx names
    it). It is taken outside the kernel's ephemeral range, so no process that
    binds port 0 or connects out (the other test suites running beside this
    one) can be handed it between a check and a bind, or while an instance
    is down; only an explicit bind of the same number could."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low, ephemeral_high = (int(n) for n in f.read().split())
    if ephemeral_low - 10000 >= 1000:
        outside = (10000, ephemeral_low)
    elif 65536 - (ephemeral_high + 1) >= 1000:
        outside = (ephemeral_high + 1, 65536)
    else:
        raise RuntimeError(f"the ephemeral port range {ephemeral_low}-{ephemeral_high} leaves "
                           "too few ports outside it for the instances")
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(*outside)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        if port not in TAKEN_PORTS:
            TAKEN_PORTS.add(port)
            return port
    raise RuntimeError(f"no free port in {outside[0]}-{outside[1] - 1}")


# --------------------------------------------------------------------------
# Statistics: every HTTP request made, its latency, and errors by kind.

class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = 0
        self.errors = collections.Counter()
        self.latency = collections.defaultdict(list)  # kind -> seconds

    def request(self, kind, seconds):
        with self.lock:
            self.requests += 1
            self.latency[kind].append(seconds)

    def error(self, kind):
        with self.lock:
            self.errors[kind] += 1


STATS = Stats()


def percentile(values, q):
    if not values:
        return float("nan")
    v = sorted(values)
    k = min(len(v) - 1, max(0, int(round(q / 100.0 * (len(v) - 1)))))
    return v[k]


# --------------------------------------------------------------------------
# A minimal MCP client over streamable HTTP (raw JSON-RPC with http.client).

class HttpError(Exception):
    def __init__(self, kind, status, body):
        super().__init__(f"{kind}: HTTP {status}: {body[:300]}")
        self.kind, self.status, self.body = kind, status, body


class Mcp:
    def __init__(self, port, tenant, token):
        self.port, self.tenant, self.token = port, tenant, token
        self.session_id = None
        self.next_id = 1

    def _post(self, message, what):
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {self.token}",
        }
        if self.session_id:
            headers["Mcp-Session-Id"] = self.session_id
            headers["MCP-Protocol-Version"] = PROTOCOL
        body = json.dumps(message).encode()
        start = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=HTTP_TIMEOUT)
        try:
            try:
                conn.request("POST", f"/t/{self.tenant}/mcp", body, headers)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                STATS.request(what, time.monotonic() - start)
                STATS.error("connection")
                raise HttpError("connection", 0, repr(e))
            sid = resp.getheader("Mcp-Session-Id")
            ctype = resp.getheader("Content-Type", "")
            if resp.status >= 400:
                text = resp.read().decode(errors="replace")
                STATS.request(what, time.monotonic() - start)
                kind = f"http_{resp.status}"
                try:
                    reason = json.loads(text).get("error", {}).get("data", {}).get("reason")
                    if reason:
                        kind += f"_{reason}"
                except (ValueError, AttributeError):
                    pass
                STATS.error(kind)
                raise HttpError(kind, resp.status, text)
            if "id" not in message:  # a notification: 202, no body
                resp.read()
                STATS.request(what, time.monotonic() - start)
                return None, sid
            if ctype.startswith("text/event-stream"):
                reply = self._read_sse(resp, message["id"])
            else:
                reply = json.loads(resp.read().decode() or "null")
            STATS.request(what, time.monotonic() - start)
            if reply is None:
                STATS.error("no_reply")
                raise HttpError("no_reply", resp.status, "the stream ended without a reply")
            return reply, sid
        finally:
            conn.close()

    @staticmethod
    def _read_sse(resp, want_id):
        """Reads events until the reply to `want_id` (progress and other
        notifications are skipped)."""
        data = []
        while True:
            line = resp.readline()
            if not line:
                return None
            line = line.decode(errors="replace").rstrip("\r\n")
            if line.startswith("data:"):
                data.append(line[5:].lstrip())
            elif line == "" and data:
                try:
                    msg = json.loads("\n".join(data))
                except ValueError:
                    msg = None
                data = []
                if isinstance(msg, dict) and msg.get("id") == want_id:
                    return msg

    def rpc(self, method, params, what=None):
        mid = self.next_id
        self.next_id += 1
        reply, _ = self._post({"jsonrpc": "2.0", "id": mid, "method": method, "params": params},
                              what or method)
        return reply

    def initialize(self):
        self.session_id = None
        mid = self.next_id
        self.next_id += 1
        reply, sid = self._post({
            "jsonrpc": "2.0", "id": mid, "method": "initialize",
            "params": {"protocolVersion": PROTOCOL, "capabilities": {},
                       "clientInfo": {"name": "cluster-sim", "version": "1"}},
        }, "initialize")
        if "error" in reply:
            STATS.error("jsonrpc_error")
            raise HttpError("jsonrpc_error", 200, json.dumps(reply["error"]))
        self.session_id = sid
        self._post({"jsonrpc": "2.0", "method": "notifications/initialized"}, "initialized")
        return reply

    def call(self, tool, args, what=None):
        """A tools/call: returns (text, is_error, status) where status is the
        cell status from the result's status line (or None)."""
        reply = self.rpc("tools/call", {"name": tool, "arguments": args}, what or tool)
        if "error" in reply:
            STATS.error("jsonrpc_error")
            raise HttpError("jsonrpc_error", 200, json.dumps(reply["error"]))
        result = reply.get("result", {})
        text = "\n".join(c.get("text", "") for c in result.get("content", []) if c.get("type") == "text")
        is_error = bool(result.get("isError"))
        if is_error:
            STATS.error("tool_error")
        return text, is_error, cell_status(text)


STATUS_RE = re.compile(r"\b(ok|error|running|waiting_input|interrupted|crashed)\b")


def cell_status(text):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    for line in reversed(lines[-3:]):
        m = STATUS_RE.search(line.lower())
        if m and ("status" in line.lower() or line.strip().startswith("[") or len(line) < 120):
            return m.group(1)
    return None


def value_of(text, name):
    """The integer printed by a cell as `<name>=<int>`."""
    m = re.search(rf"\b{name}=(-?\d+)\b", text)
    return int(m.group(1)) if m else None


# --------------------------------------------------------------------------
# The processes.

class Instance:
    def __init__(self, index, base, tokens):
        self.index = index
        self.dir = os.path.join(base, f"inst{index}")
        self.work = os.path.join(self.dir, "work")
        self.state = os.path.join(self.dir, "state")
        os.makedirs(self.work)
        os.makedirs(self.state)
        self.tokens = tokens
        self.port = free_port()
        self.metrics_port = free_port()
        self.proc = None
        self.starts = 0

    def start(self):
        self.starts += 1
        logf = open(os.path.join(self.dir, f"ferrepl.{self.starts}.log"), "wb")
        cmd = [
            BIN, "--http", f"127.0.0.1:{self.port}",
            "--metrics-addr", f"127.0.0.1:{self.metrics_port}",
            "--workdir", self.work, "--state-dir", self.state,
            "--auth-token-file", self.tokens,
            "--warm-pool", "0", "--drain-seconds", str(DRAIN_SECONDS),
            "--max-sessions", "64", "--memory-limit", "1G",
            "--checkpoints", "0", "--log-format", "json",
        ]
        if os.environ.get("SIM_PYTHON"):
            cmd += ["--python", os.environ["SIM_PYTHON"]]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                     start_new_session=True)
        CHILDREN.append(self.proc)
        self.log_path = logf.name

    def wait_ready(self, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"instance {self.index} exited with {self.proc.returncode}:\n"
                                   + tail(self.log_path))
            try:
                status, _ = http_get(self.metrics_port, "/readyz", 2)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"instance {self.index} not ready within {timeout} s:\n" + tail(self.log_path))

    def metrics(self):
        status, text = http_get(self.metrics_port, "/metrics", 5)
        if status != 200:
            raise RuntimeError(f"/metrics of instance {self.index}: HTTP {status}")
        return text


def http_get(port, path, timeout):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        conn.close()


def tail(path, n=25):
    try:
        with open(path, "rb") as f:
            lines = f.read().decode(errors="replace").splitlines()
        return "\n".join("    " + l[:400] for l in lines[-n:])
    except OSError:
        return "    (no log)"


def metric_sum(text, name):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return total


def find_nginx():
    for p in (shutil.which("nginx"), "/usr/sbin/nginx"):
        if p and os.access(p, os.X_OK):
            return p
    return None


def start_nginx(nginx, base, instances):
    d = os.path.join(base, "nginx")
    os.makedirs(os.path.join(d, "logs"))
    os.chmod(d, 0o755)
    port = free_port()
    sys.path.insert(0, os.path.join(ROOT, "deploy", "nginx"))
    import render  # deploy/nginx/render.py: the same template as ferrepl.conf

    # SIM_TEMPLATE: another template, e.g. one with failover, to see the run fail.
    conf = render.render(f"127.0.0.1:{port}", [f"127.0.0.1:{i.port}" for i in instances],
                         template=os.environ.get("SIM_TEMPLATE", TEMPLATE))
    with open(os.path.join(d, "ferrepl.conf"), "w") as f:
        f.write(conf)
    main = os.path.join(d, "nginx.conf")
    user = "user root root;\n" if os.geteuid() == 0 else ""
    with open(main, "w") as f:
        f.write(f"""{user}worker_processes 2;
pid {d}/nginx.pid;
error_log {d}/logs/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log {d}/logs/access.log;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    include {d}/ferrepl.conf;
}}
""")
    out = open(os.path.join(d, "logs", "stderr.log"), "wb")
    proc = subprocess.Popen([nginx, "-p", d, "-e", f"{d}/logs/error.log", "-c", main, "-g", "daemon off;"],
                            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    CHILDREN.append(proc)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("nginx exited:\n" + tail(os.path.join(d, "logs", "error.log"))
                               + tail(out.name))
        try:
            status, _ = http_get(port, "/nginx-healthz", 2)
            if status == 200:
                return proc, port
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("nginx did not answer within 10 s")


# --------------------------------------------------------------------------
# Tenants.

class Tenant:
    def __init__(self, name, token, nginx_port):
        self.name = name
        self.token = token
        self.mcp = Mcp(nginx_port, name, token)
        self.instance = None  # discovered
        self.x = None  # the counter's expected value

    def exec(self, code, wait_s=10, what="python_exec", session=None):
        args = {"code": code, "wait_s": wait_s}
        if session:
            args["session"] = session
        return self.mcp.call("python_exec", args, what)


def run_all(tenants, fn, workers=None):
    """fn(tenant) for every tenant in parallel; returns {name: result or exception}."""
    out = {}
    with ThreadPoolExecutor(max_workers=workers or len(tenants) or 1) as pool:
        futures = {pool.submit(fn, t): t for t in tenants}
        for fut, t in futures.items():
            try:
                out[t.name] = fut.result(timeout=HTTP_TIMEOUT * 3)
            except Exception as e:  # noqa: BLE001 - reported by the caller
                out[t.name] = e
    return out


def step_increment(t):
    text, is_error, status = t.exec("x = x + 1\nprint(f'x={x}')")
    got = value_of(text, "x")
    if is_error or got != t.x + 1:
        raise AssertionError(f"tenant {t.name}: expected x={t.x + 1}, got {got!r} ({status}): {text[-300:]!r}")
    t.x = got
    return got


# --------------------------------------------------------------------------

def main():
    threading.Thread(target=watchdog, daemon=True).start()
    if not os.access(BIN, os.X_OK):
        print(f"cluster-sim: no ferrepl binary at {BIN} (cargo build, or set FERREPL_BIN)")
        return 2
    nginx = find_nginx()
    if not nginx:
        print("cluster-sim: nginx is not installed (bash scripts/test-env.sh installs it)")
        return 2
    keep = os.environ.get("SIM_KEEP") == "1"
    base = tempfile.mkdtemp(prefix="ferrepl-sim-")
    os.chmod(base, 0o711)
    ok = False
    try:
        ok = simulate(base, nginx)
    except Exception as e:  # noqa: BLE001
        fail(f"the simulation stopped: {type(e).__name__}: {e}")
    finally:
        kill_children()
        if FAILURES or keep:
            log(f"logs kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    if FAILURES:
        print(f"\ncluster-sim: FAILED ({len(FAILURES)}):")
        for f in FAILURES:
            print("  - " + f)
        return 1
    print(f"\ncluster-sim: passed in {time.monotonic() - T0:.1f} s")
    return 0 if ok else 1


def simulate(base, nginx):
    names = [f"tenant{i:02d}" for i in range(N_TENANTS)]
    tokens = {n: secrets.token_hex(24) for n in names}
    tokens_path = os.path.join(base, "tokens")
    with open(tokens_path, "w") as f:
        f.write("# TOKEN TENANT\n")
        for n in names:
            f.write(f"{tokens[n]} {n}\n")
    os.chmod(tokens_path, 0o600)

    instances = [Instance(i, base, tokens_path) for i in range(N_INSTANCES)]
    for inst in instances:
        inst.start()
    for inst in instances:
        inst.wait_ready()
    nginx_proc, nginx_port = start_nginx(nginx, base, instances)
    log(f"3 instances on ports {[i.port for i in instances]} (metrics {[i.metrics_port for i in instances]}), "
        f"nginx on {nginx_port}")
    before = {i.index: i.metrics() for i in instances}

    tenants = [Tenant(n, tokens[n], nginx_port) for n in names]
    by_name = {t.name: t for t in tenants}

    # --- Phase 1: sessions, placement, state --------------------------------
    def first(t):
        t.mcp.initialize()
        text, is_error, status = t.exec("import os\nx = 0\nprint('cwd=' + os.getcwd())\nprint(f'x={x}')",
                                        what="python_exec_first")
        m = re.search(r"/inst(\d+)/work/([A-Za-z0-9_-]+)", text)
        if is_error or not m:
            raise AssertionError(f"tenant {t.name}: first cell failed ({status}): {text[-400:]!r}")
        if m.group(2) != t.name:
            raise AssertionError(f"tenant {t.name}: its cell runs in another tenant's workspace: {m.group(0)}")
        t.instance = int(m.group(1))
        t.x = 0
        return t.instance

    res = run_all(tenants, first)
    for name, r in res.items():
        check(not isinstance(r, Exception), f"phase 1 (first cell): {r}")
    if FAILURES:
        return False
    for _ in range(3):
        res = run_all(tenants, step_increment)
        for name, r in res.items():
            check(not isinstance(r, Exception), f"phase 1 (counters): {r}")
    # The same tenant always lands on the same instance.
    res = run_all(tenants, lambda t: t.exec("import os\nprint('cwd=' + os.getcwd())")[0])
    for name, r in res.items():
        if check(not isinstance(r, Exception), f"phase 1 (placement): {r}"):
            check(f"/inst{by_name[name].instance}/work/{name}" in r,
                  f"tenant {name} moved between instances: {r[-200:]!r}")
    placement = collections.defaultdict(list)
    for t in tenants:
        placement[t.instance].append(t.name)
    log("placement (discovered from the cells' working directories): "
        + ", ".join(f"instance {i}: {len(placement[i])} tenants" for i in range(N_INSTANCES)))
    check(sum(1 for i in range(N_INSTANCES) if placement[i]) >= 2,
          f"consistent hashing put every tenant on one instance: {dict(placement)}")

    # Isolation: a token with another tenant's path is refused (403).
    a, b = tenants[0], tenants[1]
    intruder = Mcp(nginx_port, b.name, a.token)
    try:
        intruder.initialize()
        fail(f"token of {a.name} accepted at /t/{b.name}/mcp")
    except HttpError as e:
        check(e.status == 403, f"token of {a.name} at /t/{b.name}/mcp: expected 403, got {e}")

    # Metrics moved under the load.
    mid = {i.index: i.metrics() for i in instances}
    for i in instances:
        calls0 = metric_sum(before[i.index], "ferrepl_tool_calls_total")
        calls1 = metric_sum(mid[i.index], "ferrepl_tool_calls_total")
        cells1 = metric_sum(mid[i.index], "ferrepl_cells_total")
        starts1 = metric_sum(mid[i.index], "ferrepl_worker_starts_total")
        n = len(placement[i.index])
        if n:
            check(calls1 - calls0 >= 5 * n,
                  f"instance {i.index}: ferrepl_tool_calls_total moved by {calls1 - calls0}, expected >= {5 * n}")
            check(cells1 >= 5 * n, f"instance {i.index}: ferrepl_cells_total = {cells1}, expected >= {5 * n}")
            check(starts1 >= n, f"instance {i.index}: ferrepl_worker_starts_total = {starts1}, expected >= {n}")
            check(re.search(r'ferrepl_sessions\{[^}]*tenant="' + placement[i.index][0] + '"', mid[i.index]),
                  f"instance {i.index}: no ferrepl_sessions gauge for tenant {placement[i.index][0]}")
        log(f"instance {i.index} metrics: tool calls {calls0:.0f} -> {calls1:.0f}, cells {cells1:.0f}, "
            f"worker starts {starts1:.0f}")

    # --- Phase (a): SIGKILL one instance ------------------------------------
    victim = max(range(N_INSTANCES), key=lambda i: len(placement[i]))
    others_idx = [i for i in range(N_INSTANCES) if i != victim]
    vi = instances[victim]
    log(f"(a) SIGKILL instance {victim} ({len(placement[victim])} tenants)")
    os.killpg(vi.proc.pid, signal.SIGKILL)
    vi.proc.wait(timeout=10)

    def after_kill(t):
        try:
            step_increment(t)
            return ("ok", None)
        except HttpError as e:
            return ("http", e)
        except AssertionError as e:
            return ("wrong", e)

    res = run_all(tenants, after_kill)
    for name, (kind, err) in res.items():
        t = by_name[name]
        if t.instance == victim:
            if check(kind == "http" and err.status == 502, f"(a) tenant {name} of the killed instance: "
                     f"expected nginx's 502, got {kind}: {err}"):
                body = err.body
                check("is down" in body and name in body and "retry" in body.lower()
                      and '"retryable":true' in body,
                      f"(a) tenant {name}: the 502 does not say clearly what happened: {body[:300]!r}")
        else:
            check(kind == "ok", f"(a) tenant {name} on a live instance {t.instance} failed: {err}")
    sample = next((e for k, e in res.values() if k == "http"), None)
    if sample is not None:
        log(f"(a) what the killed instance's tenants read: HTTP {sample.status} {sample.body.strip()[:240]}")

    # --- Phase (b): restart it on the same state directory ------------------
    log(f"(b) restarting instance {victim} on its --state-dir")
    vi.start()
    vi.wait_ready()
    victims = [by_name[n] for n in placement[victim]]
    resumed, lost = [], []

    def after_restart(t):
        old = t.mcp.session_id
        # The old transport session is gone with the process: it must be refused, not hang.
        try:
            t.mcp.call("python_exec", {"code": "1", "wait_s": 5}, "python_exec_old_session")
            stale = "accepted"
        except HttpError as e:
            stale = e.kind
        t.mcp.initialize()
        check(t.mcp.session_id != old, f"(b) tenant {t.name}: the restarted instance kept the old Mcp-Session-Id")
        # Killed before an idle save: dormant, offered, never re-run by itself.
        text, is_error, status = t.exec("print(f'x={x}')", wait_s=30, what="python_exec_dormant")
        check(is_error and "dormant" in text and "Nothing was run" in text,
              f"(b) tenant {t.name}: expected the dormant offer, got {text[-300:]!r}")
        t.mcp.call("python_sessions", {"action": "rebuild", "session": "default", "confirm": True},
                   "python_sessions_rebuild")
        text, is_error, status = t.exec("print(f'x={x}')", wait_s=30, what="python_exec_resume")
        got = value_of(text, "x")
        return stale, got, text, is_error

    res = run_all(victims, after_restart)
    for name, r in res.items():
        t = by_name[name]
        if not check(not isinstance(r, Exception), f"(b) tenant {name} after the restart: {r}"):
            continue
        stale, got, text, is_error = r
        check(stale != "accepted", f"(b) tenant {name}: the old Mcp-Session-Id was accepted after the restart")
        if got == t.x:
            resumed.append(name)
        elif re.search(r"lost|not restored|could not|re-?run", text, re.I):
            lost.append(name)
            log(f"(b) tenant {name} was told what was lost: {text.strip()[-300:]!r}")
        else:
            fail(f"(b) tenant {name}: expected x={t.x} after the restart, got {got!r}: {text[-400:]!r}")
    log(f"(b) {len(resumed)} of {len(victims)} tenants found their counter; {len(lost)} were told what was lost")
    if resumed:
        ex = res[resumed[0]][2].strip().splitlines()
        log(f"(b) a resumed session's result: {' | '.join(ex)[:300]}")
    check(len(resumed) == len(victims), f"(b) only {len(resumed)} of {len(victims)} sessions resumed")
    for t in victims:
        if t.name in lost:  # start that tenant's counter afresh so later phases can check it
            t.exec("x = 0")
            t.x = 0
    res = run_all(victims, step_increment)
    for name, r in res.items():
        check(not isinstance(r, Exception), f"(b) tenant {name}, counting on after the restart: {r}")
    check(metric_sum(vi.metrics(), "ferrepl_tool_calls_total") >= len(victims),
          f"(b) the restarted instance {victim}'s ferrepl_tool_calls_total did not move")

    # --- Phase (c): drain another instance with SIGTERM ----------------------
    drain_idx = max(others_idx, key=lambda i: len(placement[i]))
    di = instances[drain_idx]
    dts = [by_name[n] for n in placement[drain_idx]]
    if len(dts) < 2:
        fail(f"(c) instance {drain_idx} holds {len(dts)} tenants; the drain needs 2")
        return False
    third = max(1, len(dts) // 3)
    blocking = dts[:third]            # the call waits for the 2 s cell
    following = dts[third:2 * third]  # gets `running`, then collects with python_wait
    newcomer = dts[-1]                # asks for a new session during the drain
    sleep_cell = "import time\ntime.sleep(2)\nx = x + 1\nprint(f'x={x}')"
    log(f"(c) {len(blocking) + len(following)} tenants of instance {drain_idx} start a 2 s cell; then SIGTERM")

    def start_following(t):
        text, is_error, status = t.exec(sleep_cell, wait_s=0.2, what="python_exec_start")
        if status != "running":
            raise AssertionError(f"tenant {t.name}: expected `running`, got {status}: {text[-300:]!r}")
        return status

    res = run_all(following, start_following)
    for name, r in res.items():
        check(not isinstance(r, Exception), f"(c) start: {r}")

    results = {}

    def blocking_call(t):
        text, is_error, status = t.exec(sleep_cell, wait_s=15, what="python_exec_drained")
        results[t.name] = (text, is_error, status)

    threads = [threading.Thread(target=lambda t=t: _guard(blocking_call, t)) for t in blocking]
    for th in threads:
        th.start()
    time.sleep(0.7)  # the cells are running
    drain_started = time.monotonic()
    os.kill(di.proc.pid, signal.SIGTERM)
    time.sleep(0.3)
    # Readiness turns false at once.
    try:
        status, body = http_get(di.metrics_port, "/readyz", 2)
        check(status == 503, f"(c) /readyz during the drain: expected 503, got {status} {body!r}")
    except OSError as e:
        fail(f"(c) /readyz during the drain: {e}")
    # A new session is refused with a retryable error.
    try:
        text, is_error, status = newcomer.exec("1", wait_s=5, session="fresh-during-drain",
                                               what="python_exec_new_session")
        check(is_error and "drain" in text.lower() and "retry" in text.lower(),
              f"(c) a new session during the drain: expected a retryable `draining` error, got: {text[-300:]!r}")
        log(f"(c) a new session during the drain reads: {text.strip()[:200]!r}")
    except HttpError as e:
        check(e.status in (503,) and "drain" in e.body.lower(),
              f"(c) a new session during the drain: unclear error {e}")
        log(f"(c) a new session during the drain reads: HTTP {e.status} {e.body.strip()[:200]!r}")

    def collect(t):
        deadline = time.monotonic() + DRAIN_SECONDS
        while time.monotonic() < deadline:
            text, is_error, status = t.mcp.call("python_wait", {"wait_s": 5}, "python_wait_drained")
            if status != "running":
                return text, is_error, status
        raise AssertionError(f"tenant {t.name}: the cell was still running after the drain's grace")

    res = run_all(following, collect)
    for th in threads:
        th.join(timeout=20)
    for t in following:
        results[t.name] = res[t.name]
    for t in blocking + following:
        r = results.get(t.name)
        if not check(r is not None and not isinstance(r, Exception),
                     f"(c) tenant {t.name}: the drained cell's result was lost: {r or 'no answer'}"):
            continue
        text, is_error, status = r
        got = value_of(text, "x")
        if check(not is_error and got == t.x + 1,
                 f"(c) tenant {t.name}: expected x={t.x + 1} from the drained cell, got {got!r} ({status}): "
                 f"{text[-300:]!r}"):
            t.x = got
    try:
        rc = di.proc.wait(timeout=DRAIN_SECONDS + 10)
        took = time.monotonic() - drain_started
        log(f"(c) instance {drain_idx} exited by itself {took:.1f} s after SIGTERM, status {rc}")
        check(rc == 0, f"(c) instance {drain_idx} exited with status {rc} after the drain")
        check(took <= DRAIN_SECONDS + 5, f"(c) the drain took {took:.1f} s (--drain-seconds {DRAIN_SECONDS})")
    except subprocess.TimeoutExpired:
        fail(f"(c) instance {drain_idx} had not exited {DRAIN_SECONDS + 10} s after SIGTERM")
        os.killpg(di.proc.pid, signal.SIGKILL)
        di.proc.wait(timeout=10)
    # Its tenants get the router's clear error while it is down ...
    try:
        blocking[0].exec("print(1)", wait_s=5)
        fail(f"(c) tenant {blocking[0].name}: a call reached the drained instance after it exited")
    except HttpError as e:
        check(e.status == 502 and "is down" in e.body, f"(c) after the drain: expected nginx's 502, got {e}")
    # ... and after a restart the drained cells' effects are there.
    log(f"(c) restarting instance {drain_idx}: the drained cells' effects must be in its store")
    di.start()
    di.wait_ready()

    def after_drain(t):
        t.mcp.initialize()
        text, is_error, status = t.exec("print(f'x={x}')", wait_s=30, what="python_exec_resume")
        got = value_of(text, "x")
        if got != t.x:
            raise AssertionError(f"tenant {t.name}: expected x={t.x} after the drained restart, got {got!r}: "
                                 f"{text[-300:]!r}")
        return got

    res = run_all(dts, after_drain)
    for name, r in res.items():
        check(not isinstance(r, Exception), f"(c) after the drained restart: {r}")

    # Everyone still counts correctly at the end.
    res = run_all(tenants, step_increment)
    for name, r in res.items():
        check(not isinstance(r, Exception), f"final round: {r}")

    report(instances, placement, victim, drain_idx)
    nginx_proc.terminate()
    return not FAILURES


def _guard(fn, t):
    try:
        fn(t)
    except Exception as e:  # noqa: BLE001 - reported here, the thread ends
        fail(f"(c) tenant {t.name}: {type(e).__name__}: {e}")


def report(instances, placement, victim, drained):
    lat = STATS.latency
    quick = [s for k, v in lat.items() if k in ("python_exec", "python_wait") for s in v]
    every = [s for v in lat.values() for s in v]
    print("\n=== cluster-sim report ===")
    print(f"tenants: {N_TENANTS} over {N_INSTANCES} instances: "
          + ", ".join(f"#{i}: {len(placement[i])}" for i in range(N_INSTANCES))
          + f"; killed #{victim}, drained #{drained}")
    print(f"HTTP requests through nginx: {STATS.requests}")
    print("errors by kind: " + (", ".join(f"{k}: {v}" for k, v in sorted(STATS.errors.items())) or "none"))
    print(f"latency of quick cells (python_exec of small cells on live sessions, n={len(quick)}): "
          f"p50 {percentile(quick, 50) * 1000:.1f} ms, p99 {percentile(quick, 99) * 1000:.1f} ms")
    print(f"latency of every request (n={len(every)}): p50 {percentile(every, 50) * 1000:.1f} ms, "
          f"p99 {percentile(every, 99) * 1000:.1f} ms")
    for kind in sorted(lat):
        v = lat[kind]
        print(f"  {kind:28s} n={len(v):4d}  p50 {percentile(v, 50) * 1000:8.1f} ms  "
              f"p99 {percentile(v, 99) * 1000:8.1f} ms")


if __name__ == "__main__":
    sys.exit(main())
