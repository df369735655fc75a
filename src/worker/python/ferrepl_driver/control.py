"""The control reader: a daemon thread that reads requests from the control
socket and hands each line to `route`. It can be stopped without losing a
byte: a switch to a checkpoint hands the socket, and what was read ahead,
to another process, and no thread here may read from it after that."""

import os
import select
import signal
import threading


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
                # The server is gone: end this worker and everything it started.
                try:
                    os.killpg(0, signal.SIGKILL)
                finally:
                    os._exit(1)
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
