#!/usr/bin/env bash
# Runs the escape suite (tests/suite/escape: the `escape::` tests of the one
# test binary) once more as an ordinary user, since a laptop user runs
# ferrepl unprivileged and the sandbox must hold there too.
#
# As root: makes (once) the system user ferrepl-ci (or falls back to nobody),
# builds the test binary, and runs its escape tests as that user with a clean
# environment: PATH=/usr/local/bin:/usr/bin:/bin (so python3 is the system
# interpreter; root's pyenv under /root is unreadable to that user), HOME the
# user's home and TMPDIR a directory the user owns. Not as root: skips, as
# creating a user and switching to it needs root (and `cargo test` already
# ran the suite unprivileged then).
#
# The user runs copies (hard links where the file system allows) of the test
# binary and of the ferrepl binary, placed in a directory of its own under
# /tmp, from that directory: the checkout may sit where the user cannot
# reach (under a directory of mode 0700, such as one made by mktemp -d).
# The test binary finds the server through FERREPL_TEST_SERVER_BIN and its
# servers' state directory through FERREPL_TEST_STATE_HOME
# (tests/suite/support/launch.rs); the escape tests read nothing else from
# the checkout but the test environment's `kernels` venv (escape::kernels,
# through FERREPL_TEST_ENV). Where the user cannot run that venv (its base
# interpreter under /root, the checkout out of reach), the script makes one
# it can: a venv of the system python3 (same minor version) holding the same
# packages (hard links) and kernelspecs pointing at it, root's, read-only,
# under the user's directory in /tmp.
#
#   bash scripts/escape-unprivileged.sh [TEST-BINARY ARGS]   # default: escape::
set -euo pipefail
cd "$(dirname "$0")/.."
TEST_ARGS=("$@")
if ((${#TEST_ARGS[@]} == 0)); then
    TEST_ARGS=(escape::)
fi

echo "== escape suite as an unprivileged user" >&2
if [ "$(id -u)" != 0 ]; then
    echo "skipped: not running as root (uid $(id -u)); the cargo test run above already was unprivileged" >&2
    exit 0
fi

RUN_USER=ferrepl-ci
if ! id -u "$RUN_USER" >/dev/null 2>&1; then
    if command -v useradd >/dev/null 2>&1; then
        useradd --system --create-home --shell /usr/sbin/nologin "$RUN_USER" ||
            id -u "$RUN_USER" >/dev/null 2>&1 # another run may have made it meanwhile
    else
        RUN_USER=nobody
    fi
fi
RUN_GROUP="$(id -gn "$RUN_USER")"

if command -v runuser >/dev/null 2>&1; then
    as_user() { runuser -u "$RUN_USER" -- "$@"; }
elif command -v setpriv >/dev/null 2>&1; then
    as_user() { setpriv --reuid="$RUN_USER" --regid="$RUN_GROUP" --init-groups -- "$@"; }
else
    echo "cannot switch to $RUN_USER: neither runuser nor setpriv is installed" >&2
    exit 1
fi

# TMPDIR (and, for nobody, HOME) live in a directory of the user's own under
# /tmp, removed afterwards.
SCRATCH="$(mktemp -d /tmp/ferrepl-unprivileged.XXXXXX)"
trap 'rm -rf "$SCRATCH"' EXIT
mkdir -p "$SCRATCH/tmp"
USER_HOME="$(getent passwd "$RUN_USER" | cut -d: -f6)"
if [ -z "$USER_HOME" ] || [ ! -d "$USER_HOME" ] || [ "$RUN_USER" = nobody ]; then
    USER_HOME="$SCRATCH/home"
    mkdir -p "$USER_HOME"
fi
chown -R "$RUN_USER:$RUN_GROUP" "$SCRATCH"
chmod 0700 "$SCRATCH"
if [ "$USER_HOME" != "$SCRATCH/home" ]; then
    chown "$RUN_USER:$RUN_GROUP" "$USER_HOME"
fi
# The test servers' state (XDG_STATE_HOME) in the user's home, outside /tmp
# as a user's own is: a state directory under /tmp changes what sessions see
# there. Removed afterwards.
STATE_HOME="$(mktemp -d "$USER_HOME/.ferrepl-test-state.XXXXXX")"
# A directory of the user's own that sessions' views would show if it were
# bound (tests/suite/support visible_outside_dir): outside the homes, /tmp
# and /run, which ferrepl hides from every session.
VISIBLE_DIR="$(mktemp -d /var/cache/ferrepl-tests-user.XXXXXX)"
trap 'rm -rf "$SCRATCH" "$STATE_HOME" "$VISIBLE_DIR"' EXIT
chown "$RUN_USER:$RUN_GROUP" "$STATE_HOME" "$VISIBLE_DIR"

# The test binary (and the ferrepl binary it starts, by absolute path).
TEST_BIN="$(cargo test --quiet --test suite --no-run --message-format=json |
    python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") \
            and m["target"]["name"] == "suite" and m["profile"]["test"]:
        print(m["executable"])
')"
SERVER_BIN="$PWD/target/debug/ferrepl"
if [ -z "$TEST_BIN" ] || [ ! -x "$TEST_BIN" ]; then
    echo "could not build or find the test binary" >&2
    exit 1
fi
if [ ! -x "$SERVER_BIN" ]; then
    echo "no ferrepl binary at $SERVER_BIN (cargo build)" >&2
    exit 1
fi

# Copies the user can reach, wherever the checkout is. A hard link costs
# nothing (the files stay root's, mode 0755); across file systems, a copy.
# After the chown above, so the checkout's own files keep their owner.
BIN_DIR="$SCRATCH/bin"
mkdir "$BIN_DIR"
place() { ln "$1" "$2" 2>/dev/null || cp "$1" "$2"; }
place "$TEST_BIN" "$BIN_DIR/suite"
place "$SERVER_BIN" "$BIN_DIR/ferrepl"
chmod 0755 "$BIN_DIR"
for bin in "$BIN_DIR/suite" "$BIN_DIR/ferrepl"; do
    if ! as_user test -x "$bin"; then
        echo "$RUN_USER cannot execute $bin (is /tmp mounted noexec?)" >&2
        exit 1
    fi
done

# The test environment the user's kernel tests read (see the header).
TEST_ENV="${FERREPL_TEST_ENV:-$PWD/target/test-env}"
KERNELS="$TEST_ENV/kernels"
if [ -d "$KERNELS" ] && ! as_user "$KERNELS/bin/python" -c 'import ipykernel' 2>/dev/null; then
    SYSTEM_PYTHON="$(PATH=/usr/local/bin:/usr/bin:/bin command -v python3 || true)"
    want="$(sed -n 's/^version *= *\([0-9]*\.[0-9]*\).*/\1/p' "$KERNELS/pyvenv.cfg")"
    have=""
    if [ -n "$SYSTEM_PYTHON" ]; then
        have="$("$SYSTEM_PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    fi
    if [ -z "$want" ] || [ "$want" != "$have" ]; then
        echo "$RUN_USER cannot run the kernels venv $KERNELS (its interpreter is out of its reach), and the system python3 (${have:-none}) is not its Python ${want:-?}, which a copy would need: make the test environment with a python3 $RUN_USER can run (bash scripts/test-env.sh), or point FERREPL_TEST_ENV at one" >&2
        exit 1
    fi
    TEST_ENV="$SCRATCH/test-env"
    USER_KERNELS="$TEST_ENV/kernels"
    site="lib/python$want/site-packages"
    # Hard links share the venv's files (never chmod them: they are the
    # checkout's too); what is made here is readable by all, written by root.
    (
        umask 022
        mkdir "$TEST_ENV"
        "$SYSTEM_PYTHON" -m venv --without-pip "$USER_KERNELS"
        rm -rf "${USER_KERNELS:?}/$site"
        cp -al "$KERNELS/$site" "$USER_KERNELS/$site" 2>/dev/null || {
            rm -rf "${USER_KERNELS:?}/$site"
            cp -a "$KERNELS/$site" "$USER_KERNELS/$site"
        }
        mkdir -p "$USER_KERNELS/share/jupyter"
        cp -r "$KERNELS/share/jupyter/kernels" "$USER_KERNELS/share/jupyter/kernels"
        # Their argv[0] named the venv's python: the copy's now.
        "$SYSTEM_PYTHON" - "$KERNELS" "$USER_KERNELS" <<'PY'
import json, os, pathlib, sys
olds, new = {sys.argv[1], os.path.realpath(sys.argv[1])}, sys.argv[2]
for spec in pathlib.Path(new, "share/jupyter/kernels").glob("*/kernel.json"):
    data = json.loads(spec.read_text())
    for old in olds:
        if data["argv"] and data["argv"][0].startswith(old + "/"):
            data["argv"][0] = new + data["argv"][0][len(old):]
    spec.write_text(json.dumps(data))
PY
    )
    if ! as_user "$USER_KERNELS/bin/python" -c 'import ipykernel, zmq, jupyter_client'; then
        echo "$RUN_USER cannot run the copy of the kernels venv in $USER_KERNELS" >&2
        exit 1
    fi
    echo "the kernel tests use $USER_KERNELS ($SYSTEM_PYTHON with the packages of $KERNELS)" >&2
fi

echo "running ${TEST_ARGS[*]} of $(basename "$TEST_BIN") as $RUN_USER (uid $(id -u "$RUN_USER")), from copies in $BIN_DIR" >&2
# From the user's own directory: the checkout may be out of its reach.
cd "$SCRATCH"
as_user env -i \
    PATH=/usr/local/bin:/usr/bin:/bin \
    HOME="$USER_HOME" \
    USER="$RUN_USER" \
    LOGNAME="$RUN_USER" \
    TMPDIR="$SCRATCH/tmp" \
    LANG=C.UTF-8 \
    RUST_BACKTRACE=1 \
    FERREPL_TEST_SERVER_BIN="$BIN_DIR/ferrepl" \
    FERREPL_TEST_STATE_HOME="$STATE_HOME" \
    FERREPL_TEST_VISIBLE_DIR="$VISIBLE_DIR" \
    FERREPL_TEST_ENV="$TEST_ENV" \
    "$BIN_DIR/suite" "${TEST_ARGS[@]}" --test-threads 2 -q
