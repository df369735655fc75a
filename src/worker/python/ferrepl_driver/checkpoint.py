"""Checkpoints by fork: a frozen copy of the session's state, resumed later
in place of the live interpreter (docs/protocol.md, "Checkpoints").

Only with FERREPL_CHECKPOINTS=1. Then the process the server started stays
behind as an *anchor* holding nothing of the session: it keeps the sandbox's
process tree alive, adopts orphans (a subreaper) and exits with the status of
whichever process is live when that one ends, so a crash is reported as it
happened. The live interpreter is a child of it.

A copy is forked on the main thread between cells (`take`), ignores SIGINT
(an interrupt for the live cell must not wait in it), keeps none of the
live interpreter's descriptors, and blocks on a socket pair whose other end
the live interpreter holds. Closing that end (`drop`, or the live process
ending) makes the copy exit. `switch` hands the copy the live process's
output pipes, control socket, anchor pipe and the ends of every other copy
over SCM_RIGHTS, waits for it to take over, and exits; the copy forks a
fresh copy of itself first, so its state can be gone back to again.
"""

import json
import os
import select
import signal
import socket
import threading

from . import channel
from .channel import flush_std, state

ENABLED = os.environ.pop("FERREPL_CHECKPOINTS", "") == "1"

_held = {}  # cell id -> the socket to that cell's frozen copy
PREFORK_DELAY_S = 0.25
_anchor = {"w": None}  # the pipe on which the live process announces its pid


def _blocking(sock):
    """`sock` without the timeout a cell's socket.setdefaulttimeout() gives
    new sockets: a copy waits for its switch as long as it takes."""
    sock.settimeout(None)
    return sock


def _pair():
    a, b = socket.socketpair()
    return _blocking(a), _blocking(b)


def _devnull_over(fds):
    null = os.open(os.devnull, os.O_RDWR)
    for fd in fds:
        os.dup2(null, fd)
    os.close(null)


def start_anchor():
    """Forks the live interpreter off; this process stays as the anchor."""
    if not ENABLED:
        return
    r, w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(w)
        _anchor_loop(r, pid)
    os.close(r)
    _anchor["w"] = w
    _announce()


def _announce():
    try:
        os.write(_anchor["w"], b"%d\n" % os.getpid())
    except (OSError, TypeError):
        pass


def _anchor_loop(r, live):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except Exception:
        pass
    channel.release()
    _devnull_over((0, 1, 2))
    os.set_blocking(r, False)
    pending = b""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
        try:
            while True:
                chunk = os.read(r, 4096)
                if not chunk:
                    break
                pending += chunk
        except BlockingIOError:
            pass
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                live = int(line)
        if pid != live:
            continue
        if os.WIFSIGNALED(status):
            # The same death, so the server reports what happened.
            sig = os.WTERMSIG(status)
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass  # SIGKILL cannot be handled anyway
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
            os.kill(os.getpid(), sig)
        os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _untrusted():
    """Why a copy of this process would not be the session's state, if so."""
    others = [t.name for t in threading.enumerate() if t is not threading.main_thread() and t.name != "ferrepl-control"]
    if others:
        return "threads are running (%s), and fork() copies only the main thread" % ", ".join(sorted(others)[:3])
    return None


def take(cell):
    """Forks a frozen copy holding the state after `cell`. In the live
    process: a reply. In the copy, once resumed: ("resumed", meta)."""
    why = _untrusted()
    if why:
        return {"ok": False, "message": why}
    flush_std()
    a, b = _pair()
    try:
        with channel.quiet():
            pid = os.fork()
    except OSError as e:
        # RLIMIT_NPROC (--max-processes, the uid's tasks): no copy, and the
        # session goes on.
        a.close()
        b.close()
        return {"ok": False, "message": "cannot fork a checkpoint: %s" % e}
    if pid == 0:
        b.close()
        return ("resumed", _freeze(a))
    a.close()
    old = _held.pop(cell, None)
    if old is not None:
        old.close()
    _held[cell] = b
    return {"ok": True, "pid": pid}


def _freeze(conn):
    """This process becomes a frozen copy, serving switches on `conn` (whose
    other end the live interpreter holds). Returns only in a process that
    resumes as the live interpreter: its resume details."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    channel.release()
    _devnull_over((1, 2))
    if _anchor["w"] is not None:
        os.close(_anchor["w"])
        _anchor["w"] = None
    for held in _held.values():
        held.close()
    _held.clear()
    while True:
        # A ready child is forked ahead of time, off the switch's path: it
        # takes over when a switch comes, and this copy keeps the state. The
        # fork waits a moment first, so that it does not compete for the CPU
        # with the interpreter that just took over (unless a switch comes).
        select.select([conn], [], [], PREFORK_DELAY_S)
        mine, theirs = _pair()
        try:
            pid = os.fork()
        except OSError:
            # No ready child can be made (RLIMIT_NPROC): this copy ends, and
            # a switch to it falls back to re-running the cells.
            os._exit(0)
        if pid == 0:
            mine.close()
            conn.close()
            return _wait_as_ready(theirs)
        theirs.close()
        conn = _serve_copy(conn, mine)


def _receive(sock):
    """The next message and descriptors on `sock`; exits at end of file."""
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, 512)
        except InterruptedError:
            continue
        except OSError:
            os._exit(0)
        if not msg:
            os._exit(0)  # dropped, or the live interpreter is gone
        return msg, fds


def _serve_copy(conn, ready):
    """Passes the next switch on to the ready child; returns the socket on
    which the child, now live, reaches this copy."""
    msg, fds = _receive(conn)
    try:
        socket.send_fds(ready, [msg], fds)
        ack = ready.recv(1)
    except OSError:
        ack = b""
    for fd in fds:
        os.close(fd)
    try:
        conn.sendall(ack or b"x")
    except OSError:
        pass
    conn.close()
    if ack != b"k":
        os._exit(0)  # the child is gone: so is the copy's way back
    return ready


def _wait_as_ready(sock):
    msg, fds = _receive(sock)
    return _resume(sock, json.loads(msg), fds)


def _resume(conn, meta, fds):
    """Takes over the session: the pipes on fds 1 and 2, both sockets, the
    anchor pipe and the other copies' sockets; `conn` stays as this state's
    own copy's socket."""
    out, err, ctl, side, anchor = fds[:5]
    for fd, target in ((out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    _anchor["w"] = anchor
    _announce()
    for cell, fd in zip(meta["handles"], fds[5:]):
        _held[cell] = _blocking(socket.socket(fileno=fd))
    _held[meta["cell"]] = conn
    sock, side = channel.adopt(ctl, side)
    state.fence = max(state.fence, int(meta["fence"]))
    conn.sendall(b"k")  # the old live process is done with the session
    from .cells import _on_sigint

    signal.signal(signal.SIGINT, _on_sigint)
    return {
        "id": meta["id"],
        "cell": meta["cell"],
        "sock": sock,
        "pending": meta["pending"].encode("latin-1"),
        "side": side,
        "side_pending": meta["side_pending"].encode("latin-1"),
    }


def switch(msg, cells, stop_serving, serve):
    """Hands the session to the frozen copy of msg["cell"]. This process
    then freezes in place as the copy of msg["head"] (or exits, if there is
    one already). A reply if the copy cannot take over. `cells` is the main
    thread's reader of fd 3: what it read ahead goes along."""
    target = msg["cell"]
    conn = _held.get(target)
    if conn is None:
        return {"ok": False, "message": "no checkpoint of cell %s" % target}
    # From here no thread of this process reads either socket: a request
    # the copy should answer cannot be taken here.
    pending = stop_serving()
    if pending is None:
        return {"ok": False, "message": "the control thread is busy; try again"}
    head = msg.get("head")
    keep = head is not None and head not in _held and not _untrusted()
    mine, theirs = _pair() if keep else (None, None)
    others = [(c, s) for c, s in _held.items() if c != target]
    handles = ([head] if keep else []) + [c for c, _ in others]
    fds = [1, 2, channel.control_fd(), channel.side_sock().fileno(), _anchor["w"]]
    fds += ([theirs.fileno()] if keep else []) + [s.fileno() for _, s in others]
    meta = {
        "id": msg.get("id"),
        "cell": target,
        "fence": state.fence,
        "handles": handles,
        "pending": cells.pending().decode("latin-1"),
        "side_pending": pending.decode("latin-1"),
    }
    flush_std()
    try:
        socket.send_fds(conn, [json.dumps(meta).encode()], fds)
        ack = conn.recv(1)
    except OSError:
        ack = b""
    if ack != b"k":
        for s in (mine, theirs):
            if s is not None:
                s.close()
        del _held[target]
        conn.close()
        serve(channel.side_sock(), pending)
        return {"ok": False, "message": "the checkpoint of cell %s is gone" % target}
    del _held[target]
    conn.close()
    if not keep:
        os._exit(0)
    theirs.close()
    return ("resumed", _freeze(mine))  # this process is the copy of `head` now


def drop(cell):
    held = _held.pop(cell, None)
    if held is not None:
        held.close()
    return {"ok": True}


def held_cells():
    return sorted(_held)
