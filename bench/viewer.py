#!/usr/bin/env python3
"""ferrepl benchmark: a cell printing a lot while viewers watch it live.

    cargo build --release && python3 bench/viewer.py --bin target/release/ferrepl

A cell prints --mb megabytes (1 MB lines, so the output log spills to disk)
with 0 and then --viewers event streams open on its session
(/events/s/NAME, read as fast as they come). Printed: the cell's time to its
result, the `running` events each viewer got and the bytes it read. With
the running cell's output read as its last 64 KiB only (and only when its
byte count changed), the time with viewers stays near the time without.
"""

import argparse
import os
import re
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import Ferrepl  # noqa: E402


class Stream(threading.Thread):
    def __init__(self, port):
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port))
        host = f"ferrepl-viewer.localhost:{port}"
        self.sock.sendall(f"GET /events/s/default HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        self.bytes = 0
        self.running = 0
        self.stop = False

    def run(self):
        tail = b""
        while not self.stop:
            try:
                data = self.sock.recv(1 << 20)
            except OSError:
                return
            if not data:
                return
            self.bytes += len(data)
            chunk = tail + data
            self.running += chunk.count(b"event: running\n")
            tail = chunk[-32:]


def timed_cell(server, mb):
    code = f"import sys\nfor i in range({mb}):\n    sys.stdout.write('x' * 1_000_000 + '\\n')\nprint('done')"
    started = time.monotonic()
    result = server.request("tools/call", {"name": "python_exec", "arguments": {"code": code, "wait_s": 600}})
    text = "".join(c.get("text", "") for c in result.get("content", []) if c.get("type") == "text")
    if result.get("isError") or "done" not in text:
        raise RuntimeError(text[-2000:])
    return time.monotonic() - started


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="target/release/ferrepl")
    p.add_argument("--python")
    p.add_argument("--mb", type=int, default=50)
    p.add_argument("--viewers", type=int, default=4)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    server = Ferrepl(a.bin, a.python, extra=["--viewer", "127.0.0.1:0", "--viewer-max-clients", str(a.viewers + 1)]).initialize()
    try:
        server.exec("1")
        port = None
        while port is None:
            server._stderr.seek(0)
            m = re.search(rb"ferrepl viewer: http://[^:/]+:(\d+)/", server._stderr.read())
            port = m and int(m.group(1))
        for viewers in (0, a.viewers):
            streams = [Stream(port) for _ in range(viewers)]
            for s in streams:
                s.start()
            times = [timed_cell(server, a.mb) for _ in range(a.runs)]
            for s in streams:
                s.stop = True
                s.sock.close()
            per = ""
            if streams:
                per = f"; per viewer {sum(s.running for s in streams) / len(streams):.0f} running events, " \
                      f"{sum(s.bytes for s in streams) / len(streams) / 1e6:.1f} MB read"
            print(f"{a.mb} MB cell, {viewers} viewers: " + ", ".join(f"{t:.2f} s" for t in times) + per)
    finally:
        server.close()


if __name__ == "__main__":
    main()
