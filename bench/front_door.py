#!/usr/bin/env python3
"""Bob's latency while alice sits at every share of the front door
(docs/deploy.md, "Each principal's share"): her connections, her event
streams and her buffered request bytes, with the refusals she gets past
them counted.

    cargo build && python3 bench/front_door.py --bin target/debug/ferrepl

Prints bob's python_exec median and p95 alone and while alice is at every
share. Only the standard library is used.
"""

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time

ALICE, BOB = "alice-bench-token-0123456789", "bob-bench-token-0123456789ab"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    def __init__(self, port, token):
        self.port, self.token, self.sid, self.next = port, token, None, 0
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def post(self, body):
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                   "Authorization": "Bearer " + self.token}
        if self.sid:
            headers["Mcp-Session-Id"] = self.sid
        self.conn.request("POST", "/mcp", body=json.dumps(body), headers=headers)
        r = self.conn.getresponse()
        data = r.read()
        self.sid = self.sid or r.getheader("Mcp-Session-Id")
        return r.status, data

    def initialize(self):
        self.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}})
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return self

    def call(self, code):
        self.next += 1
        status, _ = self.post({"jsonrpc": "2.0", "id": self.next, "method": "tools/call",
                               "params": {"name": "python_exec", "arguments": {"code": code}}})
        assert status == 200, status


def raw(port, head):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(head)
    return s


def timed_calls(bob, n):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        bob.call("1 + 1")
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.95) - 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="target/debug/ferrepl")
    ap.add_argument("--calls", type=int, default=200)
    opts = ap.parse_args()
    d = tempfile.mkdtemp(prefix="ferrepl-bench-door-")
    tokens = os.path.join(d, "tokens")
    with open(tokens, "w") as f:
        f.write(f"{ALICE} alice\n{BOB} bob\n")
    os.chmod(tokens, 0o600)
    os.makedirs(os.path.join(d, "ws"))
    port = free_port()
    server = subprocess.Popen([os.path.abspath(opts.bin), "--http", f"127.0.0.1:{port}", "--auth-token-file", tokens,
                               "--workdir", os.path.join(d, "ws"), "--state-dir", os.path.join(d, "state"),
                               "--tenant-max-http-connections", "24", "--max-connections", "8",
                               "--max-request-bytes", "262144", "--http-max-buffered-bytes", "4194304"],
                              stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                time.sleep(0.1)
        bob = Client(port, BOB).initialize()
        bob.call("x = 0")
        alone = timed_calls(bob, opts.calls)
        # alice: every share held.
        alice = Client(port, ALICE).initialize()
        held, refused = [], 0
        for _ in range(8):  # streams: one per MCP connection (--max-connections 8)
            c = Client(port, ALICE).initialize()
            s = raw(port, (f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
                           f"Authorization: Bearer {ALICE}\r\nMcp-Session-Id: {c.sid}\r\n\r\n").encode())
            held.append(s)
        body = 250000
        head = (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Accept: application/json, text/event-stream\r\nAuthorization: Bearer {ALICE}\r\n"
                f"Mcp-Session-Id: {alice.sid}\r\nContent-Length: {body}\r\n\r\n").encode()
        for _ in range(30):  # bodies never finished: her buffered share, then her connections
            s = raw(port, head + b" " * (body - 1))
            held.append(s)
        time.sleep(1)
        for s in held:
            s.setblocking(False)
            try:
                if s.recv(64).startswith(b"HTTP/1.1 429"):
                    refused += 1
            except BlockingIOError:
                pass
        during = timed_calls(bob, opts.calls)
        print(f"bob's python_exec, {opts.calls} calls: alone median {alone[0]:.2f} ms p95 {alone[1]:.2f} ms; "
              f"while alice holds every share median {during[0]:.2f} ms p95 {during[1]:.2f} ms; "
              f"alice refused {refused} times (429)")
        for s in held:
            s.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
