#!/usr/bin/env python3
"""The floor for bench/clients.py: an MCP server whose `python_exec` runs
nothing and answers "ok", so what a client measures against it is the client's
and the transport's own cost.

    python3 bench/trivial_server.py               # stdio, newline-delimited
    python3 bench/trivial_server.py --http PORT   # http://127.0.0.1:PORT/mcp
    ... --http PORT --sse  # replies framed as event streams, as rmcp does
"""

import json
import socket
import sys
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
TOOL = {
    "name": "python_exec",
    "description": "Answers ok; runs nothing.",
    "inputSchema": {
        "type": "object",
        "properties": {"code": {"type": "string"}, "session": {"type": "string"}},
        "required": ["code"],
    },
}
OK = {"content": [{"type": "text", "text": "ok"}], "isError": False}


def handle(msg):
    """The reply to one JSON-RPC message, or None for notifications and responses."""
    if "method" not in msg or "id" not in msg:
        return None
    method, params = msg["method"], msg.get("params") or {}
    if method == "initialize":
        asked = params.get("protocolVersion")
        result = {
            "protocolVersion": asked if asked in VERSIONS else VERSIONS[-1],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "trivial", "version": "0"},
        }
    elif method == "tools/list":
        result = {"tools": [TOOL]}
    elif method == "tools/call":
        result = OK
    elif method == "ping":
        result = {}
    else:
        return {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": f"no method {method}"}}
    return {"jsonrpc": "2.0", "id": msg["id"], "result": result}


def serve_stdio():
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        reply = handle(json.loads(line))
        if reply is not None:
            out.write(json.dumps(reply).encode() + b"\n")
            out.flush()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    wbufsize = -1  # headers and body leave in one send; the server flushes after each request
    sse = False

    def setup(self):
        # Without it, a response's second segment waits for the client's delayed ACK (~40 ms).
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().setup()

    def log_message(self, *args):
        pass

    def empty(self, status, **headers):
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        self.empty(405, Allow="POST, DELETE")

    def do_DELETE(self):
        self.empty(200)

    def do_POST(self):
        if self.path != "/mcp":
            return self.empty(404)
        msg = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        reply = handle(msg)
        if reply is None:
            return self.empty(202)
        body = json.dumps(reply).encode()
        self.send_response(200)
        if msg["method"] == "initialize":
            self.send_header("Mcp-Session-Id", uuid.uuid4().hex)
        if not self.sse:
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        # rmcp's shape: a priming event (empty data, an id, a retry hint), then
        # the message, each its own chunk and flushed on its own.
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in (b"data: \nid: 0\nretry: 3000\n\n", b"data: " + body + b"\nid: 1\n\n"):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # SDK clients drop connections mid-stream (the Python SDK after each
        # event-stream reply): not worth a traceback per call.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def main(argv):
    if "--http" not in argv:
        return serve_stdio()
    Handler.sse = "--sse" in argv
    server = Server(("127.0.0.1", int(argv[argv.index("--http") + 1])), Handler)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main(sys.argv[1:])
