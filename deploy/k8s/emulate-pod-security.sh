#!/usr/bin/env bash
# Emulates, on one Linux host (as root, no cluster), the container that
# deploy/k8s/statefulset.yaml asks for, starts ferrepl in it to see which
# sandbox layers it gets, and checks as an MCP client that a session cannot
# read the tokens Secret:
#
#   * a private mount and PID namespace with a fresh /proc, masked the way
#     container runtimes (runc, crun) mask it by default (`procMount:
#     Default`): /dev/null over /proc/kcore, /proc/keys, /proc/timer_list...,
#     read-only /proc/sys, /proc/bus, /proc/fs, /proc/irq, /proc/sysrq-trigger;
#     or left unmasked (`procMount: Unmasked`) with MASK=0;
#   * readOnlyRootFilesystem: / remounted read-only; an emptyDir on /tmp, the
#     "PVC" (a host directory) on /srv;
#   * the tokens Secret mounted read-only where the manifest mounts it
#     (/etc/ferrepl), laid out as the kubelet does (tokens -> ..data/tokens),
#     with the manifest's defaultMode and group fsGroup; the mount point is
#     created on the host if missing and removed afterwards;
#   * runAsUser/runAsGroup 10001, capabilities drop ALL (empty bounding
#     set), allowPrivilegeEscalation: false (no_new_privs).
#
# ferrepl serves Streamable HTTP with --auth-token-file on the Secret (and
# --tools python,shell). A client (Python standard library) initializes with
# the token and asks python_exec to open() the tokens file and shell_exec to
# cat it: both must fail, and the token must appear in no result.
#
# Not emulated: the runtime's default seccomp and AppArmor profiles (the
# manifests ask for Unconfined), cgroup v2 limits, the kubelet.
#
#   MASK=1 deploy/k8s/emulate-pod-security.sh
#   MASK=0 deploy/k8s/emulate-pod-security.sh
#
# The last two lines: "SECRET: unreadable", or "SECRET: READABLE" / "SECRET:
# UNKNOWN" with the evidence above; then "NAMESPACES: yes" or "NAMESPACES: no
# (...)". Exit 0 when ferrepl started and the client ran (whatever it found),
# 1 when not, 2 when it cannot run here (not root, no unshare/setpriv, no
# binary).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${FERREPL_BIN:-$root/target/debug/ferrepl}
mask=${MASK:-1}
python=${PYTHON:-/usr/bin/python3}

if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null || ! command -v setpriv >/dev/null \
   || [ ! -x "$bin" ] || [ ! -x "$python" ]; then
  echo "emulate-pod-security: needs root, unshare, setpriv, $python and $bin" >&2
  exit 2
fi

# Where the manifest mounts the tokens Secret, its defaultMode and the item's
# path (a plain reading of statefulset.yaml: no YAML library needed).
read -r secret_dir secret_mode secret_item < <("$python" - "$here/statefulset.yaml" <<'PY'
import re, sys
lines = open(sys.argv[1]).read().splitlines()
indent = lambda s: len(s) - len(s.lstrip(" -"))
def item(i):  # the "key: value" pairs of the list item starting at line i
    body = [lines[i]] + [l for l in lines[i + 1:i + 12]]
    out = {}
    for n, l in enumerate(body):
        if n and (not l.strip() or indent(l) < indent(lines[i]) or l.lstrip().startswith("-")):
            break
        m = re.match(r"[\s-]*(\w+):\s*(\S*)", l)
        if m:
            out.setdefault(m.group(1), m.group(2))
    return out
at = next(i for i, l in enumerate(lines) if re.match(r"\s*secretName:\s*ferrepl-tokens\s*$", l))
volume = next(re.match(r"\s*-\s*name:\s*(\S+)", l).group(1) for l in reversed(lines[:at])
              if re.match(r"\s*-\s*name:", l))
mode, path = "0644", "tokens"
for i in range(at + 1, len(lines)):
    l = lines[i]
    if l.strip() and len(l) - len(l.lstrip()) < len(lines[at]) - len(lines[at].lstrip()):
        break
    m = re.match(r"\s*defaultMode:\s*(\d+)", l)
    if m:
        v = m.group(1)
        mode = "0" + v.lstrip("0") if v.startswith("0") else format(int(v), "04o")
    if l.lstrip().startswith("-") and item(i).get("key") == "tokens":
        path = item(i).get("path", path)
for i, l in enumerate(lines):
    if l.lstrip().startswith("-"):
        it = item(i)
        if it.get("name") == volume and it.get("mountPath"):
            print(it["mountPath"], mode, path)
            break
PY
)
case "${secret_dir:-}" in
  /?*) ;;
  *) echo "emulate-pod-security: no mountPath for the ferrepl-tokens Secret in statefulset.yaml" >&2; exit 1 ;;
esac
token=emulated-token-0123456789abcdef   # what must never show up in a result

work=$(mktemp -d /var/tmp/ferrepl-podemu.XXXXXX)
created=()   # mount point directories this script made on the host
cleanup() {
  rm -rf "$work"
  local i
  for ((i = ${#created[@]} - 1; i >= 0; i--)); do rmdir "${created[i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
d=$secret_dir
while [ ! -e "$d" ]; do created=("$d" "${created[@]}"); d=$(dirname "$d"); done
[ ${#created[@]} = 0 ] || mkdir -p "$secret_dir"   # created: top first, cleanup goes deepest first
mkdir -p "$work/pvc/work" "$work/pvc/state" "$work/pvc/tmp" "$work/pvc/bin" "$work/secret/..2025_01_01_00_00_00.0"
cp "$bin" "$work/pvc/bin/ferrepl"
chown -R 10001:10001 "$work/pvc"
# The kubelet's layout of a Secret volume: files owned by root, group
# fsGroup (10001), mode defaultMode, behind ..data symlinks.
printf '%s emu\n' "$token" >"$work/secret/..2025_01_01_00_00_00.0/$secret_item"
ln -s ..2025_01_01_00_00_00.0 "$work/secret/..data"
ln -s "..data/$secret_item" "$work/secret/$secret_item"
chown -R 0:10001 "$work/secret"
chmod "$secret_mode" "$work/secret/..2025_01_01_00_00_00.0/$secret_item"
chmod 0755 "$work" "$work/secret" "$work/secret/..2025_01_01_00_00_00.0"

# The MCP client: initialize, notifications/initialized, then python_exec and
# shell_exec (collected with python_wait / shell_wait if still running).
cat >"$work/client.py" <<'PY'
import json, os, re, sys, time, urllib.error, urllib.request

url, secret = sys.argv[1], sys.argv[2]
token = os.environ["TOKEN"]
deadline = time.monotonic() + float(os.environ.get("CLIENT_SECONDS", "150"))
seen = []              # every message received, searched for the token
sid, proto, next_id = None, "2025-06-18", 0

def post(msg):
    """POSTs one JSON-RPC message; returns the reply to it (None for a notification)."""
    global sid
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("client time budget spent")
    headers = {"Content-Type": "application/json",
               "Accept": "application/json, text/event-stream",
               "Authorization": "Bearer " + token}
    if sid:
        headers["Mcp-Session-Id"] = sid
        headers["MCP-Protocol-Version"] = proto
    req = urllib.request.Request(url, data=json.dumps(msg).encode(), headers=headers, method="POST")
    try:
        r = urllib.request.urlopen(req, timeout=min(60.0, left))
    except urllib.error.HTTPError as e:
        body = e.read(4096).decode("utf-8", "replace")
        seen.append(body)
        raise RuntimeError(f"HTTP {e.code} for {msg.get('method')}: {body}") from None
    with r:
        sid = r.headers.get("Mcp-Session-Id") or sid
        if "id" not in msg:
            seen.append(r.read().decode("utf-8", "replace"))
            return None
        if r.headers.get("Content-Type", "").startswith("text/event-stream"):
            data = []
            for raw in r:                      # SSE: events end with a blank line
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if line.startswith("data:"):
                    data.append(line[5:][1:] if line[5:6] == " " else line[5:])
                    continue
                if line or not data:
                    continue
                payload, data = "\n".join(data), []
                seen.append(payload)
                if not payload.strip():
                    continue
                m = json.loads(payload)
                if m.get("id") == msg["id"] and ("result" in m or "error" in m):
                    return m
                if time.monotonic() > deadline:
                    break
            raise RuntimeError(f"no reply to {msg.get('method')} in its event stream")
        body = r.read().decode("utf-8", "replace")
        seen.append(body)
        return json.loads(body)

def rpc(method, params):
    global next_id
    next_id += 1
    m = post({"jsonrpc": "2.0", "id": next_id, "method": method, "params": params})
    if "error" in m:
        raise RuntimeError(f"{method}: {m['error']}")
    return m["result"]

def call(tool, args):
    """(isError, text) of a tools/call."""
    res = rpc("tools/call", {"name": tool, "arguments": args})
    text = "\n".join(c.get("text", "") for c in res.get("content", []) if c.get("type") == "text")
    return bool(res.get("isError")), text

def show(label, text):
    for line in text.splitlines():
        print(f"  {label}: {line}")

verdicts, evidence = [], []
try:
    init = rpc("initialize", {"protocolVersion": proto, "capabilities": {},
                              "clientInfo": {"name": "emulate-pod-security", "version": "1"}})
    proto = init.get("protocolVersion", proto)
    post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    code = ("try:\n"
            f"    data = open({secret!r}).read()\n"
            "    print('OUTCOME: read', len(data), 'bytes:', data)\n"
            "except Exception as e:\n"
            "    print('OUTCOME: refused:', type(e).__name__, e)\n")
    err, text = call("python_exec", {"code": code, "session": "secret-probe", "wait_s": 45})
    while "[ferrepl] still running" in text and time.monotonic() < deadline:
        err, text = call("python_wait", {"session": "secret-probe", "wait_s": 30})
    show("python_exec", text)
    if "OUTCOME: refused:" in text and "OUTCOME: read" not in text:
        verdicts.append("refused")
    elif "OUTCOME: read" in text:
        verdicts.append("read"); evidence.append("python_exec read it")
    else:
        verdicts.append("unknown"); evidence.append("python_exec did not run the code")

    err, text = call("shell_exec", {"command": f"cat {secret}", "wait_s": 30})
    job = re.search(r"\| job (\S+) \|", text)
    while job and "is still running" in text and time.monotonic() < deadline:
        err, text = call("shell_wait", {"job": job.group(1), "wait_s": 30})
    show("shell_exec", text)
    status = re.search(r"^-- (.+?) \| job ", text, re.M)
    status = status.group(1) if status else "no result"
    if re.fullmatch(r"exit [1-9][0-9]*", status):
        verdicts.append("refused")
    elif status == "exit 0":
        verdicts.append("read"); evidence.append("shell_exec: cat exited 0")
    else:
        verdicts.append("unknown"); evidence.append(f"shell_exec: {status}")
except Exception as e:  # noqa: BLE001 - any failure is reported, not raised
    print(f"  client: {type(e).__name__}: {e}")
    verdicts.append("unknown"); evidence.append(f"client failed: {e}")
finally:
    if sid:
        try:  # end the MCP session (best effort)
            req = urllib.request.Request(url, method="DELETE", headers={
                "Authorization": "Bearer " + token, "Mcp-Session-Id": sid,
                "MCP-Protocol-Version": proto})
            urllib.request.urlopen(req, timeout=5).close()
        except Exception:  # noqa: BLE001
            pass

if any(token in s for s in seen):
    evidence.insert(0, "the token text is in a result")
    print(f"SECRET: READABLE ({'; '.join(evidence)})")
elif "read" in verdicts:
    print(f"SECRET: READABLE ({'; '.join(evidence)})")
elif verdicts == ["refused", "refused"]:
    print("SECRET: unreadable (python_exec and shell_exec both refused, token in no result)")
else:
    print(f"SECRET: UNKNOWN ({'; '.join(evidence)})")
PY

export MASK=$mask WORK=$work PY=$python SECRET_DIR=$secret_dir SECRET_FILE=$secret_dir/$secret_item TOKEN=$token
# shellcheck disable=SC2016 # expanded by the inner shell
timeout 270 unshare --mount --pid --fork --mount-proc --propagation private -- bash -c '
  set -euo pipefail
  if [ "$MASK" = 1 ]; then
    for p in /proc/kcore /proc/keys /proc/latency_stats /proc/timer_list /proc/timer_stats /proc/sched_debug; do
      [ -e "$p" ] && mount --bind /dev/null "$p"
    done
    for d in /proc/acpi /proc/scsi; do
      [ -d "$d" ] && mount -t tmpfs -o ro tmpfs "$d"
    done
    for r in /proc/bus /proc/fs /proc/irq /proc/sys /proc/sysrq-trigger; do
      [ -e "$r" ] && mount --bind "$r" "$r" && mount -o remount,bind,ro "$r"
    done
  fi
  mount --bind "$WORK/pvc" /srv                      # the PVC at /srv
  mount --bind "$WORK/secret" "$SECRET_DIR"          # the Secret, readOnly
  mount -o remount,bind,ro "$SECRET_DIR"
  mount -t tmpfs -o mode=1777,size=64m tmpfs /tmp    # the emptyDir
  mount -o remount,bind,ro /                         # readOnlyRootFilesystem
  cd /srv
  PATH=/usr/local/bin:/usr/bin:/bin TMPDIR=/srv/tmp HOME=/tmp \
  timeout 250 setpriv --reuid 10001 --regid 10001 --clear-groups \
      --no-new-privs --inh-caps=-all --bounding-set=-all \
    env -u TOKEN /srv/bin/ferrepl --http 127.0.0.1:0 --workdir /srv/work --state-dir /srv/state \
      --auth-token-file "$SECRET_FILE" --python "$PY" --warm-pool 0 --log-format text \
      --tools python,shell >/tmp/log 2>&1 &
  pid=$!
  url=
  for _ in $(seq 1 600); do                          # up to 60 s
    url=$(grep -o "listening on http://[0-9.:]*/mcp" /tmp/log | head -1 | sed "s/listening on //") || true
    [ -n "$url" ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  line=$(grep -m1 "startup: sandbox: " /tmp/log || true)
  if [ -z "$line" ] || [ -z "$url" ]; then
    kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true
    echo "ferrepl did not start:"; cat /tmp/log; exit 1
  fi
  echo "$line" | sed "s/.*sandbox: /sandbox: /"
  grep -m1 "not available here" /tmp/log | sed "s/.*probe: /warning: /" || true
  echo "secret: $SECRET_FILE ($(stat -Lc "mode %a, uid %u, gid %g" "$SECRET_FILE")), MCP client on $url"
  secret=$(CLIENT_SECONDS=150 timeout 170 "$PY" "$WORK/client.py" "$url" "$SECRET_FILE") || {
    echo "$secret"; echo "the MCP client failed or timed out; ferrepl log:"; tail -20 /tmp/log
    kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; exit 1
  }
  kill -TERM $pid 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  kill -KILL $pid 2>/dev/null || true
  wait $pid 2>/dev/null || true
  echo "$secret"
  if echo "$line" | grep -q "private mount, PID"; then
    echo "NAMESPACES: yes"
  else
    echo "NAMESPACES: no ($(echo "$line" | sed "s/.*NO private namespaces (//; s/): .*//" | head -c 300))"
  fi
'
