"""Input served by the agent: sys.stdin, input() and getpass.getpass().

Each read sends a fenced `input_request` and waits for the server's `input`
request (routed here by the control thread, ferrepl_driver/main.py).
"""

import io
import queue
import sys

from .channel import send_fenced, state

input_replies = queue.SimpleQueue()
# The most characters of a prompt the agent is shown (the kernel bridge caps
# a kernel's prompts the same, worker/kernel/media.rs): the cell's code
# chooses how long it is, and each result that waits on it repeats it.
MAX_PROMPT_CHARS = 4000


def request_input(prompt="", password=False):
    prompt = "" if prompt is None else str(prompt)
    if len(prompt) > MAX_PROMPT_CHARS:
        prompt = "%s... [%d more characters]" % (prompt[:MAX_PROMPT_CHARS], len(prompt) - MAX_PROMPT_CHARS)
    cell = state.cell
    send_fenced({"ev": "input_request", "cell": cell, "prompt": prompt, "password": password})
    reply = input_replies.get()
    # Replies come on fd 4, beside the cells on fd 3: one to an earlier
    # cell's prompt that was routed late is not this prompt's answer.
    while reply.get("cell", cell) != cell:
        reply = input_replies.get()
    if reply.get("eof"):
        raise EOFError("input was closed by the agent")
    text = str(reply.get("text", ""))
    # Echo like a terminal, so the cell's transcript reads naturally.
    try:
        sys.stdout.write(prompt + ("" if password else text) + "\n")
    except Exception:
        pass
    return text


def _input(prompt=""):
    return request_input(prompt)


def _getpass(prompt="Password: ", stream=None):
    return request_input(prompt, password=True)


class AgentStdin(io.TextIOBase):
    """sys.stdin: each line read asks the agent (python_input)."""

    def __init__(self):
        self._pending = ""
        self._eof = False

    def readable(self):
        return True

    def isatty(self):
        return False

    @property
    def encoding(self):
        return "utf-8"

    def fileno(self):
        raise io.UnsupportedOperation("ferrepl's stdin is served by the agent and has no fd")

    def _fill(self):
        if self._eof:
            return False
        try:
            text = request_input("", password=False)
        except EOFError:
            self._eof = True
            return False
        self._pending += text + "\n"
        return True

    def readline(self, size=-1):
        if not self._pending and not self._fill():
            return ""
        line, sep, rest = self._pending.partition("\n")
        out = line + sep
        if size is not None and 0 <= size < len(out):
            out = out[:size]
            self._pending = self._pending[size:]
        else:
            self._pending = rest
        return out

    def read(self, size=-1):
        if size is None or size < 0:
            while self._fill():
                pass
            out, self._pending = self._pending, ""
            self._eof = False
            return out
        while len(self._pending) < size and self._fill():
            pass
        out, self._pending = self._pending[:size], self._pending[size:]
        return out

    def __iter__(self):
        return self

    def __next__(self):
        line = self.readline()
        if not line:
            self._eof = False
            raise StopIteration
        return line
