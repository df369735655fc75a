#!/usr/bin/env python3
"""Test harness for ferrepl's R driver (src/worker/r/): starts R the way the
server does and checks the driver's behaviour scenario by scenario.

    python3 scripts/r-driver-harness.py [-k SUBSTRING] [-v]

fd 0 = /dev/null, fds 1/2 = pipes (split at fence markers), fd 3 = request
pipe (R expressions, one per line), fd 4 = event pipe (JSON lines); env
FERREPL_NONCE / FERREPL_MAX_IMAGE_BYTES / FERREPL_MAX_VALUE_CHARS; own
process group. Scenarios share one session unless they need their own (quit,
end of file, image limit, locale); a failed scenario gets a fresh session.
Every event line must be JSON and every fenced event must carry a fence seen
on both pipes (next_event() asserts it). Exit status 1 when a scenario fails.
"""

import atexit
import json
import random
import os
import queue
import re
import secrets
import signal
import statistics
import struct
import subprocess
import sys
import threading
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The driver's parts, in the order the server sends them (src/worker/r.rs).
DRIVER_PARTS = ("channel.R", "cells.R", "console.R", "tools.R", "main.R")
R_DIR = os.path.join(ROOT, "src", "worker", "r")
R_BIN = os.environ.get("FERREPL_R", "R")
ARGS = ["--vanilla", "--quiet", "--no-echo", "--no-save", "-e"]
VERBOSE = "-v" in sys.argv


def r_string(s):
    """An R string literal, ASCII only (as the server writes them)."""
    out = ['"']
    for c in s:
        o = ord(c)
        if c == '"':
            out.append('\\"')
        elif c == "\\":
            out.append("\\\\")
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        elif o == 0:
            pass
        elif o < 0x20 or o == 0x7F:
            out.append("\\x%02x" % o)
        elif o < 0x80:
            out.append(c)
        elif o <= 0xFFFF:
            out.append("\\u{%04x}" % o)
        else:
            out.append("\\U{%08x}" % o)
    out.append('"')
    return "".join(out)


def r_literal(v):
    if v is None:
        return "NULL"
    if v is True:
        return "TRUE"
    if v is False:
        return "FALSE"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return r_string(v)
    if isinstance(v, list):
        return "list(" + ",".join(r_literal(x) for x in v) + ")"
    if isinstance(v, dict):
        return "list(" + ",".join(r_string(k) + "=" + r_literal(x) for k, x in v.items()) + ")"
    raise TypeError(v)


def encode(req):
    return ("list(" + ",".join("%s=%s" % (k, r_literal(v)) for k, v in req.items()) + ")\n").encode("ascii")


class Stream:
    """Reads one output pipe; splits it at fence markers into segments."""

    def __init__(self, name, fd, nonce):
        self.name = name
        self.fd = fd
        self.pattern = re.compile(rb"\x00FERREPL:" + nonce.encode() + rb":([0-9a-f]{16})([\x00\x01])")
        self.segments = {}  # fence number -> bytes before that marker
        self.current = b""
        self.cond = threading.Condition()
        self.eof = False
        self.fences = []
        self.sync_fences = []
        self.raw_total = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        buf = b""
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                chunk = b""
            with self.cond:
                if not chunk:
                    self.current += buf
                    self.eof = True
                    self.cond.notify_all()
                    return
                self.raw_total += len(chunk)
                buf += chunk
                while True:
                    m = self.pattern.search(buf)
                    if not m:
                        break
                    number = int(m.group(1), 16)
                    self.current += buf[: m.start()]
                    buf = buf[m.end():]
                    if m.group(2) == b"\x01":
                        # A sync fence only orders the pipes: the output
                        # around it belongs to the same event.
                        self.sync_fences.append(number)
                        continue
                    self.segments[number] = self.current
                    self.fences.append(number)
                    self.current = b""
                # Keep a possible partial marker for the next read.
                cut = buf.rfind(b"\x00")
                if cut == -1 or len(buf) - cut > 60:
                    self.current += buf
                    buf = b""
                else:
                    self.current += buf[:cut]
                    buf = buf[cut:]
                self.cond.notify_all()

    def take(self, number, timeout=10):
        deadline = time.time() + timeout
        with self.cond:
            while number not in self.segments and not self.eof:
                left = deadline - time.time()
                if left <= 0:
                    raise AssertionError("%s: fence %d never arrived" % (self.name, number))
                self.cond.wait(left)
            return self.segments.pop(number, b"")

    def rest(self, wait=0.3):
        time.sleep(wait)
        with self.cond:
            out, self.current = self.current, b""
            return out


class Result:
    def __init__(self):
        self.events = []
        self.stdout = ""
        self.stderr = ""
        self.done = None

    @property
    def displays(self):
        return [e for e in self.events if e["ev"] == "display"]

    @property
    def status(self):
        return self.done["status"]

    @property
    def error(self):
        return self.done["error"]

    def __repr__(self):
        return "Result(status=%r, error=%r, stdout=%r, stderr=%r, events=%r)" % (
            self.done and self.done.get("status"), self.done and self.done.get("error"),
            self.stdout[:2000], self.stderr[:2000], [e["ev"] for e in self.events])


WORKERS = []


def _kill_workers():
    """No R started here outlives the harness."""
    for w in WORKERS:
        if w.proc.poll() is None:
            try:
                os.killpg(w.proc.pid, signal.SIGKILL)
            except OSError:
                pass


atexit.register(_kill_workers)


class Worker:
    def __init__(self, env_extra=None, max_image=5000000, boot_prefix=""):
        self.nonce = secrets.token_hex(16)
        boot = open(os.path.join(R_DIR, "boot.R")).read().strip()
        assert "\n" not in boot and '"' not in boot, "boot.R must be one line without double quotes"
        boot = boot_prefix + boot
        driver = "".join(open(os.path.join(R_DIR, part)).read() for part in DRIVER_PARTS)
        body = driver[:-1] if driver.endswith("\n") else driver
        req_r, self.req_w = os.pipe()
        self.ev_r, ev_w = os.pipe()
        env = dict(os.environ)
        env.update({"FERREPL_NONCE": self.nonce, "FERREPL_MAX_IMAGE_BYTES": str(max_image),
                    "FERREPL_MAX_VALUE_CHARS": "20000"})
        env.update(env_extra or {})

        def child():
            import fcntl

            r2 = fcntl.fcntl(req_r, fcntl.F_DUPFD_CLOEXEC, 10)
            w2 = fcntl.fcntl(ev_w, fcntl.F_DUPFD_CLOEXEC, 10)
            os.dup2(r2, 3)
            os.dup2(w2, 4)

        self.proc = subprocess.Popen([R_BIN] + ARGS + [boot], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, start_new_session=True,
                                     preexec_fn=child, close_fds=False)
        WORKERS.append(self)
        os.close(req_r)
        os.close(ev_w)
        self.out = Stream("stdout", self.proc.stdout.fileno(), self.nonce)
        self.err = Stream("stderr", self.proc.stderr.fileno(), self.nonce)
        self.events = queue.Queue()
        self.event_log = []
        threading.Thread(target=self._read_events, daemon=True).start()
        self.cell = 0
        self.next_id = 0
        self.write(("%d\n%s\n" % (len(body.splitlines()), body)).encode("utf-8"))
        ready = self.next_event(60)
        assert ready["ev"] == "ready", ready
        self.ready = ready

    def _read_events(self):
        f = os.fdopen(self.ev_r, "rb")
        for line in f:
            try:
                ev = json.loads(line.decode("utf-8"))
            except Exception as exc:  # a protocol violation: report it loudly
                ev = {"ev": "__bad__", "line": line[:500], "error": repr(exc)}
            self.event_log.append(ev)
            self.events.put(ev)
        self.events.put({"ev": "__eof__"})

    def write(self, data):
        os.write(self.req_w, data)

    def send(self, **req):
        self.write(encode(req))

    def next_event(self, timeout=30):
        try:
            ev = self.events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("no event within %ss" % timeout)
        assert ev["ev"] != "__bad__", "bad event line: %r" % ev
        if "fence" in ev:
            assert ev["fenced"] == ["stdout", "stderr"], ev
            ev["_stdout"] = self.out.take(ev["fence"]).decode("utf-8", "replace")
            ev["_stderr"] = self.err.take(ev["fence"]).decode("utf-8", "replace")
        return ev

    def start(self, code):
        self.cell += 1
        self.send(op="exec", cell=self.cell, code=code)
        return Result()

    def collect(self, res, timeout=60, until=("done",)):
        while True:
            ev = self.next_event(timeout)
            assert ev["ev"] != "__eof__", "worker ended: rc=%r %r" % (self.proc.poll(), res)
            res.events.append(ev)
            res.stdout += ev.get("_stdout", "")
            res.stderr += ev.get("_stderr", "")
            if ev["ev"] == "done":
                res.done = ev
                return res
            if ev["ev"] in until:
                return res

    def run(self, code, timeout=60):
        res = self.collect(self.start(code), timeout)
        if VERBOSE:
            print("   ", repr(code)[:80], "->", res)
        return res

    def request(self, **req):
        self.next_id += 1
        req["id"] = self.next_id
        self.send(**req)
        ev = self.next_event(30)
        assert ev["ev"] == "reply" and ev["id"] == self.next_id, ev
        return ev

    def interrupt(self):
        os.killpg(self.proc.pid, signal.SIGINT)

    def close(self):
        try:
            os.close(self.req_w)
        except OSError:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def check(cond, what, res=None):
    if not cond:
        raise AssertionError(what + ("\n    " + repr(res) if res is not None else ""))


def ok(res, what=""):
    check(res.status == "ok", "expected status ok %s" % what, res)
    return res


# ------------------------------------------------------------------ scenarios

SCENARIOS = []


def scenario(fn):
    SCENARIOS.append(fn)
    return fn


@scenario
def ready_event(w):
    r = w.ready
    check(r["version"] == "4.2.2", "version: %r" % r)
    check(isinstance(r["pid"], int) and r["pid"] > 0, "pid: %r" % r)
    check(r["executable"].endswith("/bin/R") and os.path.exists(r["executable"]), "executable: %r" % r)


@scenario
def variables_persist_and_driver_is_hidden(w):
    ok(w.run("x <- 41"))
    r = ok(w.run("x + 1"))
    check(r.stdout == "[1] 42\n", "x + 1", r)
    r = ok(w.run("print(ls(all.names = TRUE))"))
    check(r.stdout == '[1] "x"\n', "ls() of a session shows only the user's names", r)
    r = ok(w.run("cat(search(), sep = '\\n')"))
    first = r.stdout.split("\n")
    check(first[0] == ".GlobalEnv" and "package:base" in first and len(first) <= 11, "search path", r)
    r = ok(w.run("rm(list = ls()); exists('state') || exists('ferrepl_main') || exists('run_cell')"))
    check(r.stdout == "[1] FALSE\n", "driver names are not reachable from the global env", r)
    r = ok(w.run("Sys.getenv(c('FERREPL_NONCE', 'FERREPL_MAX_IMAGE_BYTES', 'FERREPL_MAX_VALUE_CHARS'))"))
    check(r.stdout.count('""') == 3, "the driver's environment variables are removed", r)
    r = ok(w.run("identical(parent.frame(), globalenv()); environment()"))
    check(r.stdout == "[1] TRUE\n<environment: R_GlobalEnv>\n", "top level is the global env", r)
    r = ok(w.run("y <- 2; y * 21; .Last.value"))
    check(r.stdout == "[1] 42\n[1] 42\n", ".Last.value", r)


@scenario
def visible_and_invisible_values(w):
    r = ok(w.run("x <- 1\ninvisible(2)\nlibrary(stats)\nsuppressWarnings(library(utils))\n(x <- 5)\n1; 'a'"))
    check(r.stdout == '[1] 5\n[1] 1\n[1] "a"\n', "only visible values print", r)
    check(r.stderr == "", "no stderr", r)
    r = ok(w.run("setClass('P', representation(n = 'numeric')); setMethod('show', 'P', function(object) cat('<P', object@n, '>\\n')); new('P', n = 3)"))
    check(r.stdout.endswith("<P 3 >\n"), "S4 objects are shown with show()", r)
    r = ok(w.run("structure(list(), class = 'zz'); print.zz <- function(x, ...) cat('custom zz\\n'); structure(list(), class = 'zz')"))
    check(r.stdout.endswith("custom zz\n"), "S3 print methods from the global env", r)
    r = ok(w.run("f <- function(a) {\n  # keep me\n  a + 1\n}\nf"))
    check("# keep me" in r.stdout, "functions print with their source (keep.source)", r)


@scenario
def output_streams_and_subprocesses(w):
    r = ok(w.run("cat('a\\n'); system('echo hi'); message('to stderr'); cat('b\\n')"))
    check(r.stdout == "a\nhi\nb\n", "system() output in order", r)
    check(r.stderr == "to stderr\n", "message() goes to stderr", r)
    r = ok(w.run("cat('caf\\u00e9 \\U0001F600\\n'); x <- '\\u00fc'; x"))
    check(r.stdout == "caf\u00e9 \U0001F600\n[1] \"\u00fc\"\n", "UTF-8 output", r)
    r = ok(w.run("cat(strrep('x', 5e6)); cat('\\n'); print(1:200000)"))
    check(len(r.stdout) > 5000000 and "[ reached getOption(\"max.print\")" in r.stdout, "huge output", None)


@scenario
def warnings_like_the_console(w):
    r = ok(w.run("f <- function(x) { warning('careful'); x }\nf(1)"))
    check(r.stdout == "[1] 1\n", "value still printed", r)
    check(r.stderr == "Warning message:\nIn f(1) : careful\n", "one warning", r)
    r = ok(w.run("as.integer('a'); warning('plain', call. = FALSE); log(-1)"))
    check(r.stderr == ("Warning messages:\n1: NAs introduced by coercion \n2: plain \n3: In log(-1) : NaNs produced\n")
          or r.stderr.startswith("Warning messages:\n1: "), "several warnings", r)
    lines = [l.rstrip() for l in r.stderr.splitlines()]
    check(lines[0] == "Warning messages:" and lines[2] == "2: plain" and lines[3] == "3: In log(-1) : NaNs produced", "several warnings", r)
    check(r.stdout == "[1] NA\n[1] NaN\n", "values of a warning cell", r)
    r = ok(w.run("warnings()"))
    check("NaNs produced" in r.stdout, "warnings() sees the last cell's warnings", r)
    r = ok(w.run("warning('top-level')"))
    check(r.stderr == "Warning message:\ntop-level \n" or r.stderr == "Warning message:\ntop-level\n", "warning without a user call", r)
    r = ok(w.run("for (i in 1:12) warning(paste('w', i))"))
    check(r.stderr == "There were 12 warnings (use warnings() to see them)\n", "many warnings", r)
    r = ok(w.run("g <- function() warning('a rather long warning message that goes on and on and on, past the line')\ng()"))
    check(r.stderr == "Warning message:\nIn g() :\n  a rather long warning message that goes on and on and on, past the line\n", "long warning wraps", r)
    r = w.run("options(warn = 2); h <- function() { as.integer('z'); cat('not reached\\n') }; h()")
    check(r.status == "error" and r.error["message"] == "(converted from warning) NAs introduced by coercion", "warn=2", r)
    check("not reached" not in r.stdout and r.error["traceback"].startswith("Error in h() : (converted"), "warn=2 stops", r)
    r = ok(w.run("options(warn = -1); as.integer('z')"))
    check(r.stderr == "" and r.stdout == "[1] NA\n", "warn=-1 drops warnings", r)
    r = ok(w.run("options(warn = 1); as.integer('z'); cat('after\\n')"))
    check(r.stderr == "Warning: NAs introduced by coercion\n" or "Warning" in r.stderr, "warn=1 prints at once", r)
    ok(w.run("options(warn = 0)"))


@scenario
def errors_and_backtraces(w):
    r = w.run("f <- function() g(2)\ng <- function(x) stop('boom')\ncat('before\\n')\nf()\ncat('after\\n')")
    check(r.status == "error", "status", r)
    check(r.stdout == "before\n" and r.stderr == "", "the rest of the cell does not run; nothing printed", r)
    e = r.error
    check(e["type"] == "simpleError" and e["message"] == "boom", "type/message", r)
    tb = e["traceback"].splitlines()
    check(tb[0] == "Error in g(2) : boom" and tb[1] == "Backtrace:", "traceback head", r)
    check(re.match(r"^\s+1\. f\(\)", tb[2]) and re.match(r"^\s+2\. g\(2\)", tb[3]) and len(tb) == 4, "frames", r)
    r = w.run("log('a')")
    check(r.error["traceback"] == "Error in log(\"a\") : non-numeric argument to mathematical function", "base error, no frames", r)
    r = w.run("stop('top')")
    check(r.error["traceback"] == "Error: top" and r.error["type"] == "simpleError", "top-level stop", r)
    r = w.run("h <- function(x) stopifnot(x > 0)\nh(-1)")
    check(r.error["message"] == "x > 0 is not TRUE" and r.error["traceback"].startswith("Error in h(-1) : x > 0 is not TRUE"), "stopifnot", r)
    check("stopifnot(x > 0)" in r.error["traceback"], "stopifnot frame kept", r)
    r = w.run("k <- function() stop(structure(class = c('myError', 'error', 'condition'), list(message = 'custom', call = sys.call())))\nk()")
    check(r.error["type"] == "myError" and r.error["message"] == "custom", "custom condition class", r)
    r = w.run("rec <- function(n) rec(n + 1)\nrec(1)")
    check(r.status == "error" and ("nested too deeply" in r.error["message"] or "stack" in r.error["message"]), "infinite recursion", r)
    r = w.run("deep <- function(n) if (n == 0) stop('bottom') else deep(n - 1)\ndeep(80)")
    tb = r.error["traceback"].splitlines()
    check(len(tb) < 60 and "frames omitted" in r.error["traceback"] and tb[-1].strip().startswith("81. deep(n - 1)"), "backtrace is capped", r)
    r = w.run("big <- function(d) stop('bad data'); do.call(big, list(data.frame(a = 1:100000)))")
    check(len(r.error["traceback"]) < 400, "calls holding data are shortened", r)
    r = w.run("stop('caf\\u00e9 \\u2603')")
    check(r.error["message"] == "caf\u00e9 \u2603", "non-ASCII error message", r)
    r = w.run("stop(strrep('y', 100000))")
    check(len(r.error["message"]) < 21000, "error message capped at FERREPL_MAX_VALUE_CHARS", r)
    r = ok(w.run("tryCatch(stop('inner'), error = function(e) cat('handled', conditionMessage(e), '\\n'))"))
    check(r.stdout == "handled inner \n", "user handlers work", r)


@scenario
def parse_errors(w):
    r = w.run("f <- function() {\n  1 +")
    check(r.status == "error" and r.error["type"] == "IncompleteInput", "incomplete", r)
    r = w.run("f <- function() {\n  x <- 1")
    check(r.error["message"] == "the cell is incomplete: missing '}'", "missing }", r)
    r = w.run("lapply(1:3, function(i) {\n  i + 1  # comment")
    check(r.error["message"] == "the cell is incomplete: missing '})'", "missing })", r)
    r = w.run("x <- 'abc")
    check(r.error["type"] == "IncompleteInput" and r.error["message"] == "the cell is incomplete: missing a closing quote", "string", r)
    r = w.run("paste(\"abc")
    check(r.error["message"] == "the cell is incomplete: missing a closing quote and ')'", "string in a call", r)
    r = w.run("x <-")
    check(r.error["type"] == "IncompleteInput" and "incomplete" in r.error["message"], "dangling operator", r)
    r = w.run("x <- 1\ny y")
    check(r.error["type"] == "ParseError", "parse error type", r)
    check(r.error["message"].startswith("<cell %d>:2:3: unexpected symbol" % w.cell), "parse error message", r)
    check(r.stdout == "", "nothing runs after a parse error", r)


@scenario
def interrupts(w):
    ok(w.run("keep <- 'still here'"))
    res = w.start("cat('started\\n'); Sys.sleep(30); cat('not reached\\n')")
    wait_for_output(w, "started")
    t0 = time.time()
    w.interrupt()
    w.collect(res, timeout=10)
    check(res.status == "interrupted" and time.time() - t0 < 5, "Sys.sleep interrupted", res)
    check("not reached" not in res.stdout, "cell stopped", res)
    res = w.start("spin <- function() repeat {}\ncat('spinning\\n'); spin()")
    wait_for_output(w, "spinning")
    w.interrupt()
    w.collect(res, timeout=10)
    check(res.status == "interrupted", "busy loop interrupted", res)
    check("spin()" in res.error["traceback"], "interrupt backtrace", res)
    r = ok(w.run("keep"))
    check(r.stdout == '[1] "still here"\n', "session kept", r)
    res = w.start("cat('shell\\n'); system('sleep 30'); cat('went on\\n')")
    t0 = time.time()
    wait_for_output(w, "shell")
    time.sleep(0.2)
    w.interrupt()
    w.collect(res, timeout=10)
    # libc's system() ignores SIGINT in R while the child runs: the child
    # dies and the cell goes on, as in R's console.
    check(res.status in ("ok", "interrupted") and time.time() - t0 < 8, "system('sleep 30'): the child is interrupted", res)
    # While idle, and several in a row: the driver survives and the next cell is not hit.
    for _ in range(3):
        w.interrupt()
        time.sleep(0.05)
    time.sleep(0.3)
    r = ok(w.run("Sys.sleep(0.2); 1"), "after idle interrupts")
    check(r.stdout == "[1] 1\n", "after idle interrupts", r)
    # While writing events (plots make long event writes).
    res = w.start("for (i in 1:3) plot(1:10); cat('plotted\\n')")
    w.interrupt()
    w.collect(res, timeout=20)
    check(res.status in ("ok", "interrupted"), "interrupt during a plotting cell", res)
    r = ok(w.run("keep"))
    check(r.stdout == '[1] "still here"\n', "session kept after interrupt storm", r)


@scenario
def interrupt_storm(w):
    import random

    rng = random.Random(7)
    statuses = []
    for i in range(40):
        res = w.start("plot(1:10); hist(rnorm(100)); z <- %d" % i)
        time.sleep(rng.random() * 0.08)
        w.interrupt()
        w.collect(res, timeout=20)
        statuses.append(res.status)
        for d in res.displays:
            png_dims(d["data"])  # every image that was sent is whole
    for _ in range(20):  # and while idle
        w.interrupt()
        time.sleep(rng.random() * 0.005)
    time.sleep(0.2)
    r = ok(w.run("1 + 1"))
    check(r.stdout == "[1] 2\n", "the session survives an interrupt storm", r)
    check(set(statuses) <= {"ok", "interrupted"}, "statuses %r" % statuses)
    print("    %d of 40 cells were interrupted" % statuses.count("interrupted"))


def wait_for_output(w, text, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        with w.out.cond:
            if text.encode() in w.out.current:
                return
            w.out.cond.wait(0.05)
    raise AssertionError("output %r never came" % text)


@scenario
def input_requests(w):
    res = w.collect(w.start("name <- readline('Name? ')\ncat('hello', name, '\\n')"), until=("input_request",))
    ev = res.events[-1]
    check(ev["ev"] == "input_request" and ev["prompt"] == "Name? " and ev["password"] is False and ev["cell"] == w.cell, "input_request", res)
    w.send(op="input", text="Ada", eof=False)
    w.collect(res)
    ok(res)
    check(res.stdout == "Name? Ada\nhello Ada \n", "prompt echoed, answer used", res)
    # readLines(stdin) until end of input
    res = w.collect(w.start("x <- readLines('stdin'); print(x)"), until=("input_request",))
    w.send(op="input", text="one", eof=False)
    w.collect(res, until=("input_request",))
    w.send(op="input", text="two\nthree", eof=False)
    w.collect(res, until=("input_request",))
    w.send(op="input", text="", eof=True)
    w.collect(res)
    check(ok(res).stdout.endswith('[1] "one"   "two"   "three"\n'), "readLines(stdin) until eof", res)
    res = w.collect(w.start("x <- readLines(stdin(), n = 1); x"), until=("input_request",))
    w.send(op="input", text="solo", eof=False)
    check(ok(w.collect(res)).stdout.endswith('[1] "solo"\n'), "readLines(stdin(), n = 1)", res)
    res = w.collect(w.start("con <- file('stdin'); x <- readLines(con, n = 2); print(x); print(isOpen <- con %in% getAllConnections())"), until=("input_request",))
    w.send(op="input", text="p", eof=False)
    w.collect(res, until=("input_request",))
    w.send(op="input", text="q", eof=False)
    check(ok(w.collect(res)).stdout.endswith('[1] "p" "q"\n[1] FALSE\n'), "readLines(file('stdin')) closes the connection it opened", res)
    r = ok(w.run("writeLines(c('a', 'b'), f <- tempfile()); readLines(f)"))
    check(r.stdout == '[1] "a" "b"\n', "readLines(file) untouched", r)
    # scan() reads until an empty line
    res = w.collect(w.start("v <- scan(); sum(v)"), until=("input_request",))
    check(res.events[-1]["prompt"] == "1: ", "scan prompt", res)
    w.send(op="input", text="1 2 3", eof=False)
    w.collect(res, until=("input_request",))
    w.send(op="input", text="", eof=False)
    w.collect(res)
    check(ok(res).stdout.endswith("[1] 6\n") and "Read 3 items" in res.stderr, "scan", res)
    res = w.collect(w.start("v <- scan(what = ''); v"), until=("input_request",))
    w.send(op="input", text="a b", eof=False)
    w.collect(res, until=("input_request",))
    w.send(op="input", text="", eof=True)
    check(ok(w.collect(res)).stdout.endswith('[1] "a" "b"\n'), "scan stops at end of input", res)
    r = ok(w.run("scan(text = '4 5', quiet = TRUE)"))
    check(r.stdout == "[1] 4 5\n", "scan(text=) untouched", r)
    # menu()
    res = w.collect(w.start("menu(c('red', 'green'), title = 'Colour?')"), until=("input_request",))
    check(res.events[-1]["prompt"] == "Selection: " and "1: red" in res.stdout, "menu shows choices", res)
    w.send(op="input", text="2", eof=False)
    check(ok(w.collect(res)).stdout.endswith("[1] 2\n"), "menu returns the number", res)
    # EOF at readline gives ""
    res = w.collect(w.start("z <- readline('> '); nchar(z)"), until=("input_request",))
    w.send(op="input", text="", eof=True)
    check(ok(w.collect(res)).stdout.endswith("[1] 0\n"), "readline at eof", res)
    # browser() refuses
    r = w.run("f <- function() browser(); f()")
    check(r.status == "error" and "browser() needs an interactive R console" in r.error["message"], "browser", r)
    # Interrupt while waiting for input
    res = w.collect(w.start("readline('wait: ')"), until=("input_request",))
    time.sleep(0.2)
    w.interrupt()
    w.collect(res, timeout=10)
    check(res.status == "interrupted", "interrupt ends an input wait", res)
    # A stray input answer after the cell ended is dropped; requests still work
    w.send(op="input", text="late", eof=False)
    r = ok(w.run("1 + 1"))
    check(r.stdout == "[1] 2\n", "late input ignored", r)
    # Non-ASCII answers
    res = w.collect(w.start("s <- readline(); nchar(s)"), until=("input_request",))
    w.send(op="input", text="\u00e9t\u00e9 \U0001F600", eof=False)
    check(ok(w.collect(res)).stdout.endswith("[1] 5\n"), "non-ASCII input", res)
    # An inspect request while waiting for input is answered
    res = w.collect(w.start("a1 <- 1; readline('q ')"), until=("input_request",))
    rep = w.request(op="inspect", name="a1")
    check(rep["ok"] and rep["detail"]["type"] == "numeric", "inspect during input", rep)
    w.send(op="input", text="x", eof=False)
    ok(w.collect(res))


def png_dims(b64):
    import base64

    data = base64.b64decode(b64)
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
    return struct.unpack(">II", data[16:24]), data


@scenario
def plots(w):
    tmp_before = set(os.listdir(w_tempdir(w)))
    r = ok(w.run("plot(1:10)"))
    check(len(r.displays) == 1 and r.events[-1]["ev"] == "done", "one PNG, before done", r)
    d = r.displays[0]
    (wd, ht), data = png_dims(d["data"])
    check((wd, ht) == (700, 500) and d["width"] == 700 and d["height"] == 500, "PNG size", d.keys())
    check(d["bytes"] == len(data) and d["mime"] == "image/png" and len(d["sha"]) == 32, "display fields", None)
    r = ok(w.run("plot(1:3); plot(3:1)"))
    check(len(r.displays) == 2 and r.displays[0]["sha"] != r.displays[1]["sha"], "two plots, two PNGs", r)
    r = ok(w.run("x <- 1; x"))
    check(not r.displays, "no plot, no display", r)
    r = ok(w.run("grid::grid.newpage(); grid::grid.rect()"))
    check(len(r.displays) == 1, "grid", r)
    r = ok(w.run("dev.new(width = 4, height = 3); plot(1)"))
    check(len(r.displays) == 1 and r.displays[0]["width"] == 400 and r.displays[0]["height"] == 300, "dev.new size", r)
    r = w.run("plot(1:10); stop('after plot')")
    check(r.status == "error" and len(r.displays) == 1, "plots are sent after an error too", r)
    r = ok(w.run("plot(1); dev.off(); plot(2)"))
    check(len(r.displays) == 2, "a device closed by the cell and a new one", r)
    if ggplot_available():
        r = ok(w.run("suppressPackageStartupMessages(library(ggplot2)); ggplot(mtcars, aes(wt, mpg)) + geom_point()"), "ggplot")
        check(len(r.displays) == 1, "ggplot auto-print", r)
        r = ok(w.run("p <- ggplot(mtcars, aes(wt, mpg)) + geom_point(); print(p)"))
        check(len(r.displays) == 1, "print(ggplot)", r)
        r = ok(w.run("p2 <- ggplot(mtcars, aes(wt, mpg)) + geom_point()"))
        check(not r.displays, "an unprinted ggplot makes no image", r)
    else:
        print("    (ggplot2 not installed: ggplot checks skipped)")
    leftovers = [f for f in os.listdir(w_tempdir(w)) if f.startswith("ferrepl-plots") and f not in tmp_before]
    check(not leftovers, "plot files are deleted: %r" % leftovers)
    check(not os.path.exists("Rplots.pdf"), "no Rplots.pdf")


def w_tempdir(w):
    if not hasattr(w, "_tempdir"):
        r = ok(w.run("cat(tempdir())"))
        w._tempdir = r.stdout
    return w._tempdir


_GG = None


def ggplot_available():
    global _GG
    if _GG is None:
        _GG = subprocess.run([R_BIN.replace("/R", "/Rscript") if "/" in R_BIN else "Rscript", "-e", "library(ggplot2)"],
                             capture_output=True).returncode == 0
    return _GG


@scenario
def image_limit(_):
    w = Worker(max_image=1000)
    try:
        r = ok(w.run("plot(1:10)"))
        check(not r.displays and "was not sent" in r.stderr, "too big images are skipped with a note", r)
    finally:
        w.close()


@scenario
def help_as_text(w):
    r = ok(w.run("?mean"))
    check("Arithmetic Mean" in r.stdout and "\b" not in r.stdout and "Usage" in r.stdout, "?mean", r)
    r = ok(w.run("help('lm')"))
    check("Fitting Linear Models" in r.stdout, "help('lm')", r)
    r = ok(w.run("help(package = 'stats')"))
    check("Information on package" in r.stdout and "lm" in r.stdout, "help(package=)", r)
    r = ok(w.run("vignette()"))
    check(r.stdout.strip() != "" or r.stderr == "", "vignette() listing", r)
    r = ok(w.run("example(mean)"))
    check("mean(x, trim = .1)" in r.stdout or "mean(x" in r.stdout, "example(mean)", r)
    r = ok(w.run("browseURL('https://www.r-project.org')"))
    check(r.stdout == "no browser in ferrepl: https://www.r-project.org\n", "browser", r)
    r = w.run("help.start()")
    check(r.status == "error" and "HTTP server" in r.error["message"], "help.start() fails at once (no help server)", r)
    r = ok(w.run("RShowDoc('NEWS')"), "RShowDoc")
    time.sleep(0.5)
    r2 = ok(w.run("invisible(0)"))
    check("no PDF viewer in ferrepl: " in r.stdout + r2.stdout, "RShowDoc names the PDF (in the background)", r)
    r = ok(w.run("RShowDoc('NEWS', type = 'html')"))
    check("no browser in ferrepl: file://" in r.stdout, "RShowDoc html", r)
    r = ok(w.run("x <- edit(1:3); x"))
    check(r.stdout.startswith("no editor in ferrepl") and r.stdout.endswith("[1] 1 2 3\n"), "edit() returns its argument", r)
    # Debian's r-cran-* packages list vignettes whose built files were left
    # out (+dfsg): only one whose file is there can be opened.
    r = ok(w.run("v <- vignette()$results; built <- function(ext) which(grepl(ext, v[, 'Title']) & "
                 "file.exists(file.path(v[, 'LibPath'], v[, 'Package'], 'doc', paste0(v[, 'Item'], '.', ext))))[1]; "
                 "h <- built('html'); p <- built('pdf'); "
                 "if (!is.na(h)) print(vignette(v[h, 'Item'], package = v[h, 'Package'])); "
                 "if (!is.na(p)) print(vignette(v[p, 'Item'], package = v[p, 'Package'])); cat(!is.na(h), !is.na(p), '\\n')"))
    time.sleep(0.5)
    r2 = ok(w.run("invisible(0)"))
    if "TRUE TRUE \n" in r.stdout:
        check("no browser in ferrepl: " in r.stdout and "no PDF viewer in ferrepl: " in r.stdout + r2.stdout, "vignettes name their files", r)
        check(r.stderr == "", "no warnings from vignettes", r)
    else:
        print("    (no HTML and PDF vignettes installed: vignette check partial)")


@scenario
def inspect_requests(w):
    ok(w.run("rm(list = ls()); df <- data.frame(a = 1:3, b = letters[1:3]); lst <- list(a = 1, b = 'x'); f <- function(x, ...) x; m <- matrix(1:6, 2); s <- 'one'; .hidden <- 1"))
    rep = w.request(op="inspect", name=None)
    check(rep["ok"], "ok", rep)
    names = {v["name"]: v for v in rep["variables"]}
    check(set(names) == {"df", "lst", "f", "m", "s"}, "variables (hidden excluded)", rep)
    check(names["df"]["type"] == "data.frame" and names["df"]["len"] == 2 and names["df"]["shape"] == [3, 2], "df", rep)
    check(names["m"]["shape"] == [2, 3] and names["s"]["len"] == 1 and "len" not in names["f"], "m/s/f", rep)
    check(names["s"]["repr"] == 'chr "one"' and len(names["df"]["repr"]) <= 120, "repr", rep)
    rep = w.request(op="inspect", name="f")
    check(rep["ok"] and rep["detail"]["signature"] == "function (x, ...)" and rep["detail"]["doc"] is None, "function detail", rep)
    rep = w.request(op="inspect", name="df$b")
    check(rep["ok"] and rep["detail"]["type"] == "character" and '"a"' in rep["detail"]["repr"], "df$b", rep)
    rep = w.request(op="inspect", name='lst[["a"]]')
    check(rep["ok"] and rep["detail"]["repr"] == "[1] 1", "lst[[\"a\"]]", rep)
    rep = w.request(op="inspect", name="zz")
    check(not rep["ok"] and rep["message"] == "object 'zz' is not defined in this session", "missing", rep)
    rep = w.request(op="inspect", name="system('touch /tmp/ferrepl-pwned')")
    check(not rep["ok"] and not os.path.exists("/tmp/ferrepl-pwned"), "code is refused", rep)
    ok(w.run("big <- 1:1e6"))
    rep = w.request(op="inspect", name="big")
    check(rep["ok"] and len(rep["detail"]["repr"]) < 2100 and rep["detail"]["len"] == 1000000, "bounded repr", rep)
    rep = w.request(op="frobnicate")
    check(rep["ok"] is False and rep["message"] == "unknown request", "unknown op", rep)


@scenario
def completions(w):
    ok(w.run("my_variable <- 1; my_function <- function(alpha, beta) 1"))
    rep = w.request(op="complete", code="my_", cursor=None)
    texts = {c["text"]: c["kind"] for c in rep["completions"]}
    check(rep["ok"] and rep["engine"] == "rcompgen" and rep["token"] == "my_", "token", rep)
    check(texts.get("my_variable") == "variable" and texts.get("my_function") == "function", "kinds", rep)
    rep = w.request(op="complete", code="my_function(al", cursor=None)
    check(any(c["text"].startswith("alpha") and c["kind"] == "argument" for c in rep["completions"]), "arguments", rep)
    rep = w.request(op="complete", code="x <- 1\nmea + 1", cursor=10)
    check(any(c["text"] == "mean" for c in rep["completions"]), "cursor and multi-line", rep)
    rep = w.request(op="complete", code="", cursor=None)
    check(rep["ok"] and len(rep["completions"]) <= 200, "at most 200", rep)


@scenario
def robustness(w):
    r = w.run("print.bad <- function(x, ...) stop('cannot print'); structure(1, class = 'bad')")
    check(r.status == "error" and r.error["message"] == "cannot print", "error while printing a value", r)
    check("print" in r.error["traceback"], "print frames shown", r)
    r = ok(w.run("sink(tempfile()); cat('hidden\\n')"))
    r = ok(w.run("cat('visible\\n')"))
    check(r.stdout == "visible\n", "user sinks undone", r)
    r = ok(w.run("zz <- file(tempfile(), 'w'); closeAllConnections(); cat('still\\n')"))
    r = ok(w.run("cat('alive\\n')"))
    check(r.stdout == "alive\n", "closeAllConnections() spares the driver", r)
    r = ok(w.run("for (i in getAllConnections()) if (i > 2) try(close(getConnection(i)), silent = TRUE); cat('x\\n')"))
    r = ok(w.run("plot(1); cat('reopened\\n')"))
    check(r.stdout == "reopened\n" and len(r.displays) == 1, "the driver reopens connections closed under it", r)
    r = ok(w.run("options(warn = 2); 1"))
    r = w.run("as.integer('q')")
    check(r.status == "error", "warn=2 makes an error", r)
    r = ok(w.run("options(warn = 0); cat('fine\\n')"))
    check(r.stdout == "fine\n", "driver works with warn=2", r)
    big = "x <- c(" + ",".join(str(i) for i in range(100000)) + ")\nlength(x)"
    r = ok(w.run(big))
    check(r.stdout == "[1] 100000\n", "a 600 kB cell", r)
    r = ok(w.run("options(error = function() cat('user error option\\n')); f <- function() 1; f()"))
    r = w.run("stop('e')")
    check(r.status == "error", "options(error) does not break the driver", r)
    ok(w.run("options(error = NULL)"))
    # A failure inside the driver itself still ends the cell with a done event.
    r = w.run("local({d <- parent.env(environment(base::readline)); d$saved <- d$finish_cell; d$finish_cell <- function() stop('driver bug')})")
    check(r.status == "error" and r.error["type"] == "DriverError" and "driver bug" in r.error["message"], "driver failure", r)
    r = ok(w.run("local({d <- parent.env(environment(base::readline)); d$finish_cell <- d$saved}); 2"))
    check(r.stdout == "[1] 2\n", "driver repaired", r)


@scenario
def quit_status(_):
    w = Worker()
    w.send(op="exec", cell=1, code="cat('bye\\n'); quit(status = 3)")
    rc = w.proc.wait(20)
    check(rc == 3, "quit(status=3) exits with 3, got %r" % rc)
    w = Worker()
    w.send(op="exec", cell=1, code="q()")
    rc = w.proc.wait(20)
    check(rc == 0, "q() exits with 0, got %r" % rc)


@scenario
def server_gone(_):
    w = Worker()
    ok(w.run("1"))
    t0 = time.time()
    os.close(w.req_w)
    rc = w.proc.wait(10)
    check(rc == 0 and time.time() - t0 < 3, "EOF on fd 3 ends R at once (rc %r)" % rc)


@scenario
def server_gone_during_input(_):
    w = Worker()
    res = w.collect(w.start("readline('> ')"), until=("input_request",))
    t0 = time.time()
    os.close(w.req_w)
    rc = w.proc.wait(10)
    check(rc == 0 and time.time() - t0 < 3, "EOF on fd 3 during an input wait ends R (rc %r)" % rc)


@scenario
def exec_queued_during_input(w):
    # Not something the server does, but requests must never be lost.
    res = w.collect(w.start("a <- readline('first? ')"), until=("input_request",))
    w.cell += 1
    w.send(op="exec", cell=w.cell, code="cat('second', a, '\\n')")
    time.sleep(0.1)
    w.send(op="input", text="A", eof=False)
    ok(w.collect(res))
    second = ok(w.collect(Result()))
    check(second.done["cell"] == w.cell and second.stdout == "second A \n", "queued exec runs after the cell", second)


@scenario
def json_edge_cases(w):
    r = w.run("stop('tab\\there \\001 bell\\a quote\\\" back\\\\slash')")
    check(r.error["message"] == 'tab\there \x01 bell\x07 quote" back\\slash', "control characters and escapes", r)
    r = w.run("stop(rawToChar(as.raw(c(0x61, 0xff, 0x62))))")
    check(r.status == "error" and r.error["message"].startswith("a") and r.error["message"].endswith("b"), "invalid UTF-8 is repaired", r)
    big = "x <- '" + "ab" * 1500000 + "'\nnchar(x)"
    r = ok(w.run(big))
    check(r.stdout == "[1] 3000000\n", "a 3 MB string literal", r)
    r = ok(w.run("cat('\\u00e9\\u4e2d\\U0001F600', '\\n')"))
    check(r.stdout == "\u00e9\u4e2d\U0001F600 \n", "non-BMP characters", r)
    rep = w.request(op="inspect", name=None)
    check(rep["ok"], "inspect after odd values", rep)


def answer_upstream(w, res, reply_for):
    """Runs the started cell `res`, answering each upstream request with the
    JSON line reply_for(event) gives (bytes), until the cell is done."""
    while True:
        ev = w.next_event(30)
        assert ev["ev"] != "__eof__", "worker ended: rc=%r" % (w.proc.poll(),)
        res.stdout += ev.get("_stdout", "")
        if ev["ev"] == "upstream":
            if ev.get("op") != "cancel":
                w.write(reply_for(ev))
            continue
        res.events.append(ev)
        if ev["ev"] == "done":
            res.done = ev
            return res


def text_reply(text, ensure_ascii=True):
    def reply(ev):
        return (json.dumps({"op": "upstream_reply", "id": ev["id"], "ok": True,
                            "result": {"content": [{"type": "text", "text": text}]}},
                           ensure_ascii=ensure_ascii) + "\n").encode("utf-8", "surrogatepass")
    return reply


def expected_code_points(text):
    # What R holds: JSON's \\u escapes of a surrogate pair make one
    # character; lone surrogates and NUL become U+FFFD.
    text = json.loads(json.dumps(text))
    return [0xFFFD if (0xD800 <= ord(c) <= 0xDFFF or c == "\0") else ord(c) for c in text]


@scenario
def upstream_replies_are_data(w):
    # Tool results are third-party data: R decodes them with its own JSON
    # parser and never evaluates them, whatever they hold.
    marker = os.path.join(w_tempdir(w), "evaluated")
    attacks = [
        "'); file.create('%s'); ('" % marker,
        '"); file.create("%s"); ("' % marker,
        "`r file.create('%s')`" % marker,
        "\\\"); file.create(\"%s\"); #" % marker,
        "}, file.create('%s'), list(op='x'" % marker,
        "\0 NUL \ud800 lone \udc00 low \U0001F600 pair",
        "quote \" back \\ slash / tab \t cr \r nl \n bell \x07 del \x7f",
        "é中😀" * 1000,
        "x" * 1_000_000,
        "",
    ]
    for i, text in enumerate(attacks):
        for ascii_only in (True, False):
            if not ascii_only and any(0xD800 <= ord(c) <= 0xDFFF for c in text):
                continue  # raw lone surrogates are not UTF-8: the server never sends them
            res = answer_upstream(w, w.start("x <- ferrepl_call('s', 'echo', text = 'q')\ncat(utf8ToInt(x), sep = ' ')"),
                                  text_reply(text, ascii_only))
            ok(res, "attack %d" % i)
            got = [int(v) for v in res.stdout.split()]
            check(got == expected_code_points(text), "text %d decoded exactly (ascii=%s)" % (i, ascii_only), res)
    check(not os.path.exists(marker), "no tool result was evaluated as R")
    rng = random.Random(7)
    alphabet = ['"', "\\", "/", "'", "`", "(", ")", ";", "{", "}", "\n", "\t", "\0", "\x01", "a", "é", "😀", "\ud83d", "\ude00", "\ufffe"]
    for i in range(60):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        res = answer_upstream(w, w.start("x <- ferrepl_call('s', 't')\ncat(utf8ToInt(x), sep = ' ')"), text_reply(text))
        ok(res, "fuzz %d" % i)
        check([int(v) for v in res.stdout.split()] == expected_code_points(text), "fuzzed text %d" % i, res)
    structured = {"n": [1, 2.5, -0.0, 1e308, 1.5e-7], "s": ["a", "b"], "mixed": [1, "a", None, True],
                  "nested": {"deep": [[{"k": "v"}]]}, "empty": {}, "none": None, "é": True}
    res = answer_upstream(w, w.start(
        "x <- ferrepl_call('s', 'st')\n"
        "cat(x$n, is.numeric(x$n), identical(x$s, c('a', 'b')), length(x$mixed), is.null(x$mixed[[3]]),"
        " x$nested$deep[[1]][[1]]$k, length(x$empty), 'none' %in% names(x), is.null(x$none), x[['\u00e9']], sep = '|')"),
        lambda ev: (json.dumps({"op": "upstream_reply", "id": ev["id"], "ok": True,
                                "result": {"structured": structured}}) + "\n").encode())
    ok(res, "structured")
    check(res.stdout == "1|2.5|0|1e+308|1.5e-07|TRUE|TRUE|4|TRUE|v|0|TRUE|TRUE|TRUE", "structured content as R values", res)
    # A reply that is not JSON fails the call; the session goes on.
    res = answer_upstream(w, w.start("r <- tryCatch(ferrepl_call('s', 't'), ferrepl_error = function(e) conditionMessage(e)); cat(r)"),
                          lambda ev: b'{"op": "upstream_reply", "id": ' + str(ev["id"]).encode() + b', "ok": tru\n')
    ok(res, "broken reply")
    check("could not be decoded" in res.stdout, "a broken reply is an error of the call", res)
    r = ok(w.run("1 + 1"))
    check(r.stdout == "[1] 2\n", "the session goes on")


@scenario
def fences_and_events_are_clean(w):
    r = ok(w.run("cat('x'); cat('y', file = stderr())"))
    check(r.stdout == "x" and r.stderr == "y", "unterminated lines belong to their cell", r)
    fences = [e["fence"] for e in w.event_log if "fence" in e]
    syncs = w.out.sync_fences
    check(sorted(fences + syncs) == list(range(1, len(fences) + len(syncs) + 1)),
          "event and sync fences share one count, up by one")
    check(w.out.fences == fences and w.err.fences == fences, "every fence on both streams")
    check(w.err.sync_fences == syncs, "every sync fence on both streams")
    check(all(e["ev"] in ("ready", "done", "display", "input_request", "reply", "upstream") for e in w.event_log), "event kinds")
    d = [e for e in w.event_log if e["ev"] == "done"][-1]
    check(set(d) >= {"ev", "cell", "status", "value", "error", "elapsed_ms", "fence", "fenced"} and d["value"] is None, "done fields", d)
    check(isinstance(d["cell"], int), "cell is an integer", d)


@scenario
def per_cell_overhead(w):
    ok(w.run("x <- 0"))
    times = []
    for i in range(20):  # warm-up: R compiles the driver's functions on first use
        w.run("x <- x + 0")
    for i in range(200):
        t0 = time.perf_counter()
        r = w.run("x <- x + 1")
        times.append((time.perf_counter() - t0) * 1000)
        assert r.status == "ok"
    r = ok(w.run("x"))
    check(r.stdout == "[1] 200\n", "200 cells ran", r)
    med = statistics.median(times)
    inside = statistics.median(e["elapsed_ms"] for e in w.event_log[-201:-1] if e["ev"] == "done")
    print("    per-cell round trip (request written -> done read): median %.3f ms, p90 %.3f ms; "
          "run_cell in R (elapsed_ms): median %.3f ms" % (med, sorted(times)[179], inside))
    check(med < 3.0, "per-cell overhead %.3f ms" % med)


# What src/worker/r.rs puts before boot.R (R drops a missing R_LIBS_USER).
SERVER_PREFIX = ("local({l <- Sys.getenv('R_LIBS_USER'); if (nzchar(l)) {dir.create(l, recursive = TRUE, "
                 "showWarnings = FALSE); .libPaths(c(l, .libPaths()))}}); ")


@scenario
def server_boot_prefix(_):
    import tempfile

    import shutil

    top = tempfile.mkdtemp(prefix="ferrepl-harness-")
    lib = os.path.join(top, "r-library")
    w = Worker(env_extra={"R_LIBS_USER": lib}, boot_prefix=SERVER_PREFIX)
    try:
        r = ok(w.run("cat(.libPaths()[1], '\\n'); ls(all.names = TRUE)"))
        check(r.stdout.startswith(os.path.realpath(lib)) or r.stdout.startswith(lib), "library first", r)
        check(r.stdout.endswith("character(0)\n"), "nothing left in the global env", r)
    finally:
        w.close()
        shutil.rmtree(top, ignore_errors=True)


@scenario
def locale_without_lang(_):
    env = {k: "" for k in ("LANG", "LC_ALL", "LC_CTYPE")}
    w = Worker(env_extra=env)
    try:
        r = ok(w.run("cat('\\u00e9\\n'); stop('\\u00fc')".replace("stop", "message")))
        check(r.stdout == "\u00e9\n" and r.stderr == "\u00fc\n", "UTF-8 without LANG", r)
    finally:
        w.close()


def main():
    only = None
    if "-k" in sys.argv:
        only = sys.argv[sys.argv.index("-k") + 1]
    failed = 0
    shared = None
    for fn in SCENARIOS:
        if only and only not in fn.__name__:
            continue
        try:
            if shared is None or shared.proc.poll() is not None:
                shared = Worker()
            t0 = time.time()
            fn(shared)
            print("PASS %s (%.1fs)" % (fn.__name__, time.time() - t0))
        except Exception as exc:
            failed += 1
            print("FAIL %s: %s" % (fn.__name__, exc))
            if VERBOSE or not isinstance(exc, AssertionError):
                traceback.print_exc()
            if shared is not None:
                tail = shared.err.current[-2000:]
                if tail:
                    print("    stderr tail:", tail)
                try:
                    shared.proc.kill()
                except Exception:
                    pass
                shared = None
    if shared is not None:
        shared.close()
    print("%d scenario(s) failed" % failed if failed else "all scenarios passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
