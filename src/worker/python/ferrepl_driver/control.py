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


def _next_line(buf):
    """Takes the next whole line off `buf`; None while there is none."""
    nl = buf.find(b"\n")
    if nl < 0:
        return None
    line = bytes(buf[: nl + 1])
    del buf[: nl + 1]
    return line


def _receive(sock, buf):
    """Appends what `sock` has to `buf` (it is readable, or blocking); the
    worker ends when the server is gone."""
    try:
        chunk = sock.recv(1 << 16)
    except (BlockingIOError, InterruptedError):
        return
    except OSError:
        chunk = b""
    if not chunk:
        server_gone()
    buf += chunk


class CellRequests:
    """The requests on fd 3, read by the main thread between cells."""

    def __init__(self, sock, pending):
        self._sock = sock
        self._buf = bytearray(pending)

    def next(self):
        """The next request (a dict); blocks until one comes."""
        while True:
            line = _next_line(self._buf)
            if line is None:
                _receive(self._sock, self._buf)
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict):
                return msg

    def read_into(self, view):
        """Fills `view` (a writable memoryview) with the bytes that follow
        the request just returned."""
        done = min(len(self._buf), len(view))
        view[:done] = self._buf[:done]
        del self._buf[:done]
        while done < len(view):
            try:
                n = self._sock.recv_into(view[done:])
            except InterruptedError:
                continue
            except BlockingIOError:
                select.select([self._sock], [], [])
                continue
            except OSError:
                n = 0
            if n == 0:
                server_gone()
            done += n

    def pending(self):
        """What was read ahead and not returned yet."""
        return bytes(self._buf)


class ControlReader:
    def __init__(self, sock, pending, route):
        self._sock = sock
        self._buf = bytearray(pending)
        self._route = route
        self._stop_r, self._stop_w = os.pipe()
        # A stop asked for, and taken: a stop that times out is taken back.
        self._lock = threading.Lock()
        self._stopping = False
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="ferrepl-control", daemon=True)
        self._thread.start()

    def _run(self):
        while True:
            line = _next_line(self._buf)
            if line is not None:
                self._route(line)
                continue
            ready, _, _ = select.select([self._sock, self._stop_r], [], [])
            if self._stop_r in ready:
                with self._lock:
                    if self._stopping:
                        self._stopped = True
                        return
                    os.read(self._stop_r, 1)  # a stop taken back
                continue
            _receive(self._sock, self._buf)

    def stop(self, timeout=5.0):
        """Stops the thread; the bytes read but not routed yet, or None if
        it did not stop in time (it then goes on serving)."""
        with self._lock:
            self._stopping = True
        os.write(self._stop_w, b"x")
        self._thread.join(timeout)
        with self._lock:
            if not self._stopped:
                self._stopping = False
                return None
        self._thread.join()
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
