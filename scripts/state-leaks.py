#!/usr/bin/env python3
"""Finds session stores that test servers left in a state directory.

    state-leaks.py list DIR > BEFORE
    state-leaks.py check BEFORE DIR [PREFIX...]

Every test server keeps its sessions in a state directory of its test's own
(tests/suite/support/launch.rs, tests/interop/conftest.py, the TypeScript
harness, --state-dir in the scripts). scripts/test.sh lists the user's own
state directory before the run (`list`: the store files in DIR, one name a
line) and checks it after (`check`): a store that was not there before and
was made for a workspace under one of the PREFIXes (this run's temporary
directories; every new store when no PREFIX is given) is a test server that
used the user's state directory. Each is printed with its workspace; exit
status 1 when there is one. A store is `*.sqlite3`; its `meta` table names
its workspace. Standard library only.
"""

import os
import sqlite3
import sys


def stores(directory):
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.endswith(".sqlite3"))


def workspace(path):
    """The workspace a store was made for, or None when it cannot be read."""
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2)
        try:
            row = con.execute("SELECT value FROM meta WHERE key = 'workspace'").fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return None
    if row is None:
        return None
    value = row[0]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def under(path, prefix):
    return path == prefix.rstrip("/") or path.startswith(prefix)


def main(argv):
    if len(argv) == 2 and argv[0] == "list":
        for name in stores(argv[1]):
            print(name)
        return 0
    if len(argv) >= 3 and argv[0] == "check":
        before_file, directory, prefixes = argv[1], argv[2], argv[3:]
        with open(before_file) as f:
            before = {line.strip() for line in f if line.strip()}
        leaked = []
        for name in stores(directory):
            if name in before:
                continue
            ws = workspace(os.path.join(directory, name))
            if prefixes and not (ws and any(under(ws, p) for p in prefixes)):
                continue
            leaked.append((name, ws))
        for name, ws in leaked:
            print(f"{os.path.join(directory, name)}: a store of workspace {ws or '(unreadable)'}")
        return 1 if leaked else 0
    print(__doc__.strip().splitlines()[0], file=sys.stderr)
    print("usage: state-leaks.py list DIR | state-leaks.py check BEFORE DIR [PREFIX...]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
