"""The two readers of the server's requests.

`CellRequests` is the main thread's: cells and checkpoints on fd 3, read
only between cells, so a cell reaches the thread that runs it without a
handoff between threads. `ControlReader` is a daemon thread reading fd 4,
what must be answered while a cell runs (input, inspect, completion...); it
hands each line to `route`. It can be stopped without losing a byte: a
switch to a checkpoint hands both sockets, and what was read ahead, to
another process, and no thread here may read from them after that."""

import json
import os
import select
import signal
import threading


def server_gone():
    """The server is gone: end this worker and everything it started."""
    try:
        os.killpg(0, signal.SIGKILL)
    finally:
        os._exit(1)


class CellRequests:
    """The requests on fd 3, read by the main thread between cells."""

    def __init__(self, sock, pending):
        self._sock = sock
        self._buf = bytearray(pending)

    def next(self):
        """The next request (a dict); blocks until one comes."""
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[: nl + 1])
                del self._buf[: nl + 1]
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if isinstance(msg, dict):
                    return msg
                continue
            try:
                chunk = self._sock.recv(1 << 16)
            except InterruptedError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                server_gone()
            self._buf += chunk

    def pending(self):
        """What was read ahead and not returned yet."""
        return bytes(self._buf)


class ControlReader:
    def __init__(self, sock, pending, route):
        self._sock = sock
        self._buf = bytearray(pending)
        self._route = route
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="ferrepl-control", daemon=True)
        self._thread.start()

    def _run(self):
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[: nl + 1])
                del self._buf[: nl + 1]
                self._route(line)
                continue
            ready, _, _ = select.select([self._sock, self._stop_r], [], [])
            if self._stop_r in ready:
                return
            try:
                chunk = self._sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                chunk = b""
            if not chunk:
                server_gone()
            self._buf += chunk

    def stop(self, timeout=5.0):
        """Stops the thread; the bytes read but not routed yet, or None if
        it did not stop in time (it is then still running)."""
        os.write(self._stop_w, b"x")
        self._thread.join(timeout)
        if self._thread.is_alive():
            return None
        os.close(self._stop_r)
        os.close(self._stop_w)
        return bytes(self._buf)


def drain(reader, sock):
    """What the bootstrap's buffered reader holds (or the socket has now)
    beyond what was read from it: the first requests, read ahead."""
    out = b""
    sock.setblocking(False)
    try:
        while True:
            try:
                chunk = reader.read1(1 << 16)
            except (BlockingIOError, InterruptedError):
                break
            if not chunk:
                break
            out += chunk
    finally:
        sock.setblocking(True)
    return out
