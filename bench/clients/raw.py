#!/usr/bin/env python3
"""Bench driver with no SDK (standard library only): newline-delimited
JSON-RPC over a child's stdio, or HTTP/1.1 on one keep-alive connection.

    raw.py [--calls N] [--warmup W] (--url URL | -- CMD ARGS...)
"""

import http.client
import json
import socket
import subprocess
import time
import urllib.parse

from _common import FIRST, LOOP, fail, parse_args, report

PROTOCOL = "2025-11-25"


class Stdio:
    def __init__(self, cmd):
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.next_id = 0

    def send(self, msg):
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def request(self, method, params):
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while line := self.proc.stdout.readline():
            msg = json.loads(line)
            if msg.get("id") == self.next_id and "method" not in msg:
                return msg
        fail(f"server closed stdout before answering {method}")

    def notify(self, method):
        self.send({"jsonrpc": "2.0", "method": method})

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


class Http:
    def __init__(self, url):
        u = urllib.parse.urlsplit(url)
        self.path = u.path or "/"
        self.conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=60)
        self.conn.connect()
        # Otherwise a request sent as headers then body waits on a delayed ACK.
        self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.session = self.version = None
        self.next_id = 0

    def headers(self):
        h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.session:
            h["Mcp-Session-Id"] = self.session
        if self.version:
            h["MCP-Protocol-Version"] = self.version
        return h

    def post(self, msg):
        self.conn.request("POST", self.path, json.dumps(msg).encode(), self.headers())
        resp = self.conn.getresponse()
        self.session = resp.getheader("Mcp-Session-Id") or self.session
        if resp.status not in (200, 202):
            fail(f"HTTP {resp.status} to {msg.get('method')}: {resp.read()[:300]!r}")
        return resp

    def request(self, method, params):
        self.next_id += 1
        resp = self.post({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        if not resp.getheader("Content-Type", "").startswith("text/event-stream"):
            return json.loads(resp.read())
        reply = self.from_stream(resp)
        resp.read()  # the stream ends after the reply; the connection is reused only once it has
        if reply is None:
            fail(f"event stream ended without the reply to {method}")
        return reply

    def from_stream(self, resp):
        """The event whose data is the response to the last request (skips priming
        events, whose data is empty, and anything the server sends first)."""
        data = []
        while line := resp.readline():
            line = line.rstrip(b"\r\n")
            if line.startswith(b"data:"):
                data.append(line[5:].removeprefix(b" "))
            elif not line and data:
                payload, data = b"\n".join(data), []
                if payload:
                    msg = json.loads(payload)
                    if msg.get("id") == self.next_id and "method" not in msg:
                        return msg
        return None

    def notify(self, method):
        self.post({"jsonrpc": "2.0", "method": method}).read()

    def close(self):
        if self.session:
            self.conn.request("DELETE", self.path, headers=self.headers())
            self.conn.getresponse().read()
        self.conn.close()


def call(conn, code):
    msg = conn.request("tools/call", {"name": "python_exec", "arguments": {"code": code}})
    if "error" in msg or msg["result"].get("isError"):
        fail(f"python_exec {code!r}: {json.dumps(msg)[:500]}")


def main():
    args = parse_args(__doc__)
    start = time.perf_counter()
    conn = Http(args.url) if args.url else Stdio(args.cmd)
    init = conn.request("initialize", {
        "protocolVersion": PROTOCOL,
        "capabilities": {},
        "clientInfo": {"name": "ferrepl-bench-raw", "version": "0"},
    })
    if "error" in init:
        fail(f"initialize: {init['error']}")
    conn.version = init["result"]["protocolVersion"]
    conn.notify("notifications/initialized")
    call(conn, FIRST)
    connect = time.perf_counter() - start
    for _ in range(args.warmup):
        call(conn, LOOP)
    times = []
    for _ in range(args.calls):
        t = time.perf_counter()
        call(conn, LOOP)
        times.append(time.perf_counter() - t)
    conn.close()
    report("raw", args, connect, times)


if __name__ == "__main__":
    main()
