"""The control channel (fd 3) and the fence markers on the output pipes.

The protocol is documented in docs/protocol.md. In short: JSON lines on fd 3,
requests for cells and checkpoints from the server and every event from here;
on fd 4, requests answered while a cell runs. Output is never sent on them: it
flows through fds 1 and 2 (pipes read by the server). Events that close a
span of output (cell done, input request) carry a fence number; before
sending such an event the driver writes a marker with that number on both
output pipes, so the server can attribute every byte to the right cell.
"""

import contextlib
import json
import os
import socket
import sys
import threading

NONCE = os.environ.pop("FERREPL_NONCE", "0" * 32).encode("ascii")

_sock = None  # the control socket (fd 3), from connect()
_side = None  # the socket of requests answered while a cell runs (fd 4)
# Private duplicates of the output pipes: markers still reach the server when
# user code redirects or closes fds 1 and 2.
_out_fd = os.dup(1)
_err_fd = os.dup(2)
_send_lock = threading.Lock()


def connect(sock, side):
    """Sends events on the control socket the bootstrap opened and keeps the
    side socket; subprocesses never inherit them."""
    global _sock, _side
    for s in (sock, side):
        os.set_inheritable(s.fileno(), False)
        # A socket made after a cell's socket.setdefaulttimeout() would
        # take that timeout: these wait as long as the server is there.
        s.settimeout(None)
    _sock = sock
    _side = side


class _State:
    fence = 0
    in_user_code = False
    cell = 0
    value = None


state = _State()


@contextlib.contextmanager
def quiet():
    """Holds the channel's locks, so that no other thread holds one while
    the process forks (the copy would inherit it held forever)."""
    with _send_lock, _fence_lock:
        yield


def control_fd():
    return _sock.fileno()


def control_sock():
    return _sock


def side_sock():
    return _side


def release():
    """Gives up both sockets and the private output descriptors (a frozen
    copy, or the anchor, must not keep them open)."""
    global _sock, _side, _out_fd, _err_fd
    for sock in (_sock, _side):
        if sock is not None:
            os.close(sock.detach())
    _sock = _side = None
    for fd in (_out_fd, _err_fd):
        try:
            os.close(fd)
        except OSError:
            pass
    _out_fd = _err_fd = -1


def adopt(fd, side_fd):
    """Takes over the sockets handed over by the live interpreter (and the
    output pipes already on fds 1 and 2)."""
    global _out_fd, _err_fd
    sock = socket.socket(fileno=fd)
    side = socket.socket(fileno=side_fd)
    connect(sock, side)
    _out_fd = os.dup(1)
    _err_fd = os.dup(2)
    return sock, side


# One encoder for every event: json.dumps with options builds a new one per call.
_encode = json.JSONEncoder(ensure_ascii=False).encode


def send(event):
    data = (_encode(event) + "\n").encode("utf-8", "surrogatepass")
    with _send_lock:
        _sock.sendall(data)


def send_with_payload(event, chunks):
    """`event` (which says how many bytes follow), then those bytes, with
    no other event between them."""
    data = (_encode(event) + "\n").encode("utf-8", "surrogatepass")
    with _send_lock:
        _sock.sendall(data)
        for chunk in chunks:
            _sock.sendall(chunk)


def flush_std():
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass


EVENT_FENCE = b"\x00"  # closes a span of output that an event owns
SYNC_FENCE = b"\x01"  # only orders the two pipes against each other
_fence_lock = threading.RLock()


def fence(kind=EVENT_FENCE):
    """Write a numbered marker on both output pipes; returns (number, streams marked)."""
    with _fence_lock:
        state.fence += 1
        number = state.fence
        marker = b"\x00FERREPL:" + NONCE + b":" + ("%016x" % number).encode("ascii") + kind
        marked = []
        for name, fd in (("stdout", _out_fd), ("stderr", _err_fd)):
            try:
                os.write(fd, marker)
                marked.append(name)
            except OSError:
                pass
    return number, marked


class _Order:
    last = None
    enabled = True


_order = _Order()


def _switch_to(which, streams):
    """Before Python code writes to one stream after the other, flush the other
    and put a sync marker on both pipes, so the server keeps their order."""
    last = _order.last
    if last is not None and last != which and _order.enabled:
        try:
            streams[last].flush()
        except Exception:
            pass
        _, marked = fence(SYNC_FENCE)
        if len(marked) != 2:
            _order.enabled = False
    _order.last = which


class OrderedStream:
    """sys.stdout / sys.stderr: the real text stream, plus ordering markers."""

    def __init__(self, inner, which, streams):
        self._inner = inner
        self._which = which
        self._streams = streams

    def write(self, text):
        _switch_to(self._which, self._streams)
        return self._inner.write(text)

    def writelines(self, lines):
        _switch_to(self._which, self._streams)
        return self._inner.writelines(lines)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __iter__(self):
        return iter(self._inner)

    def __repr__(self):
        return repr(self._inner)


def send_fenced(event):
    flush_std()
    number, marked = fence()
    event["fence"] = number
    event["fenced"] = marked
    send(event)
