#!/usr/bin/env bash
# Emulates, on one Linux host (as root, no cluster), the container that
# deploy/k8s/statefulset.yaml asks for, starts ferrepl in it to see which
# sandbox layers it gets, and checks as MCP clients of two tenants that a
# session cannot read the tokens Secret and that the tenants' sessions run
# as different uids:
#
#   * hostUsers: false: a user namespace mapping 65,536 ids, 0-65535 inside
#     to host 100000-165535 (the kubelet likewise picks a range above
#     65535); ferrepl runs as root inside it (runAsUser: 0), unprivileged on
#     the host;
#   * in it, a private mount and PID namespace with a fresh /proc, masked the
#     way container runtimes (runc, crun) mask it by default (`procMount:
#     Default`): /dev/null over /proc/kcore, /proc/keys, /proc/timer_list...,
#     read-only /proc/sys, /proc/bus, /proc/fs, /proc/irq, /proc/sysrq-trigger;
#     or left unmasked (`procMount: Unmasked`) with MASK=0;
#   * readOnlyRootFilesystem: / remounted read-only; an emptyDir on /tmp, the
#     "PVC" (a host directory owned by the pod's root) on /srv;
#   * the tokens Secret mounted read-only where the manifest mounts it
#     (/etc/ferrepl), laid out as the kubelet does (tokens -> ..data/tokens)
#     with the manifest's defaultMode, owned by the pod's root; the mount
#     point is created on the host if missing and removed afterwards;
#   * capabilities: bounding, permitted and effective sets exactly the
#     manifest's `capabilities.add` (drop ALL), none inheritable or ambient;
#     allowPrivilegeEscalation: false (no_new_privs).
#
# ferrepl serves Streamable HTTP with --auth-token-file on the Secret (two
# tenants, alice and bob), FERREPL_TENANT_UIDS from configmap.yaml and
# --tools python,shell, its uid table on the "PVC" as the ConfigMap's
# FERREPL_UID_TABLE puts it; with REQUIRE=1 also --sandbox-require, as the
# ConfigMap sets it, else --allow-degraded-isolation (to see what a pod
# without namespaces would get, which tenants otherwise refuse). Clients (Python standard library) then check:
#   * as alice, python_exec open()s the tokens file and shell_exec cats it:
#     both must fail, and no token may appear in any result;
#   * as each tenant, python_exec writes a file into its workspace; from the
#     host, the files' owners must differ from each other and from the pod's
#     root, inside the pod's range.
#
# Not emulated: the runtime's default seccomp and AppArmor profiles (the
# manifests ask for Unconfined), cgroup v2 limits, the kubelet, idmapped
# mounts (see the Secret below).
#
#   MASK=1 deploy/k8s/emulate-pod-security.sh
#   MASK=0 REQUIRE=1 deploy/k8s/emulate-pod-security.sh
#
# The last three lines: "SECRET: unreadable", or "SECRET: READABLE" /
# "SECRET: UNKNOWN" with the evidence above; "UIDS: distinct (...)", or
# "UIDS: SHARED (...)" / "UIDS: UNKNOWN (...)"; "NAMESPACES: yes" or
# "NAMESPACES: no (...)". The sandbox line ferrepl logs at start comes
# before them ("sandbox: ..."). Exit 0 when ferrepl started and the clients
# ran (whatever they found), 1 when not, 2 when it cannot run here (not root,
# no unshare/nsenter/setpriv, no binary).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${FERREPL_BIN:-$root/target/debug/ferrepl}
mask=${MASK:-1}
python=${PYTHON:-/usr/bin/python3}
require=${REQUIRE:-0}
base=100000   # host uid/gid of the pod's root; the pod maps 65,536 from here
ids=65536

if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null || ! command -v nsenter >/dev/null \
   || ! command -v setpriv >/dev/null || [ ! -x "$bin" ] || [ ! -x "$python" ]; then
  echo "emulate-pod-security: needs root, unshare, nsenter, setpriv, $python and $bin" >&2
  exit 2
fi

# Where the manifest mounts the tokens Secret, its defaultMode, the item's
# path and the capabilities the ferrepl container adds (a plain reading of
# statefulset.yaml: no YAML library needed).
read -r secret_dir secret_mode secret_item caps < <("$python" - "$here/statefulset.yaml" <<'PY'
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
# capabilities.add of the container named ferrepl (a flow list on one line)
caps = "-"
start = next(i for i, l in enumerate(lines) if re.match(r"\s*containers:\s*$", l))
me = next(i for i in range(start, len(lines)) if re.match(r"\s*-\s*name:\s*ferrepl\s*$", lines[i]))
for l in lines[me + 1:]:
    if re.match(r"\s*-\s*name:", l) and indent(l) <= indent(lines[me]):
        break
    m = re.match(r"\s*add:\s*\[(.*)\]", l)
    if m:
        caps = ",".join(c.strip().strip("'\"").lower() for c in m.group(1).split(",") if c.strip()) or "-"
        break
for i, l in enumerate(lines):
    if l.lstrip().startswith("-"):
        it = item(i)
        if it.get("name") == volume and it.get("mountPath"):
            print(it["mountPath"], mode, path, caps)
            break
PY
)
case "${secret_dir:-}" in
  /?*) ;;
  *) echo "emulate-pod-security: no mountPath for the ferrepl-tokens Secret in statefulset.yaml" >&2; exit 1 ;;
esac
# The bounding set: exactly the added capabilities (drop ALL).
bounding=-all
[ "${caps:--}" = - ] || bounding="-all,+${caps//,/,+}"
tenant_uids=$(sed -n 's/^ *FERREPL_TENANT_UIDS: *"\{0,1\}\([0-9]*-[0-9]*\)"\{0,1\}.*/\1/p' "$here/configmap.yaml" | head -1)
# Two tenants; no token may show up in a result.
tokens="alice=emulated-alice-0123456789abcdef bob=emulated-bob-0123456789abcdef"
probe=uid-probe.txt   # what each tenant's session writes into its workspace

work=$(mktemp -d /var/tmp/ferrepl-podemu.XXXXXX)
created=()   # mount point directories this script made on the host
holder=      # the process that holds the pod's user namespace
cleanup() {
  [ -z "$holder" ] || { kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null; } || true
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
# The PVC as the init container leaves it: the pod root's, directories 0700.
chown -R "$base:$base" "$work/pvc"
chmod 0700 "$work/pvc/work" "$work/pvc/state" "$work/pvc/tmp"
# The Secret: the kubelet writes its files owned by root (group fsGroup if
# set; none here) with mode defaultMode, behind ..data symlinks, and the
# runtime idmaps the volume into the pod, where they are root's. Owning them
# by the pod's root on the host (no idmapped mount) looks the same inside.
for t in $tokens; do printf '%s %s\n' "${t#*=}" "${t%%=*}"; done \
  >"$work/secret/..2025_01_01_00_00_00.0/$secret_item"
ln -s ..2025_01_01_00_00_00.0 "$work/secret/..data"
ln -s "..data/$secret_item" "$work/secret/$secret_item"
chown -hR "$base:$base" "$work/secret"
chmod "$secret_mode" "$work/secret/..2025_01_01_00_00_00.0/$secret_item"
# Host root's directories are nobody's inside the pod: open them to others.
chmod 0755 "$work" "$work/secret" "$work/secret/..2025_01_01_00_00_00.0"

# The MCP clients: initialize, notifications/initialized, then tool calls
# (collected with python_wait / shell_wait if still running).
cat >"$work/client.py" <<'PY'
import json, os, re, sys, time, urllib.error, urllib.request

url, secret, probe = sys.argv[1], sys.argv[2], sys.argv[3]
tokens = dict(t.split("=", 1) for t in os.environ["TOKENS"].split())   # tenant -> token
deadline = time.monotonic() + float(os.environ.get("CLIENT_SECONDS", "150"))
seen = []              # every message received, searched for the tokens

class Client:
    """One MCP connection with one tenant's token."""
    def __init__(self, token):
        self.token, self.sid, self.proto, self.next_id = token, None, "2025-06-18", 0

    def post(self, msg):
        """POSTs one JSON-RPC message; returns the reply to it (None for a notification)."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("client time budget spent")
        headers = {"Content-Type": "application/json",
                   "Accept": "application/json, text/event-stream",
                   "Authorization": "Bearer " + self.token}
        if self.sid:
            headers["Mcp-Session-Id"] = self.sid
            headers["MCP-Protocol-Version"] = self.proto
        req = urllib.request.Request(url, data=json.dumps(msg).encode(), headers=headers, method="POST")
        try:
            r = urllib.request.urlopen(req, timeout=min(60.0, left))
        except urllib.error.HTTPError as e:
            body = e.read(4096).decode("utf-8", "replace")
            seen.append(body)
            raise RuntimeError(f"HTTP {e.code} for {msg.get('method')}: {body}") from None
        with r:
            self.sid = r.headers.get("Mcp-Session-Id") or self.sid
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

    def rpc(self, method, params):
        self.next_id += 1
        m = self.post({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        if "error" in m:
            raise RuntimeError(f"{method}: {m['error']}")
        return m["result"]

    def open(self):
        init = self.rpc("initialize", {"protocolVersion": self.proto, "capabilities": {},
                                       "clientInfo": {"name": "emulate-pod-security", "version": "1"}})
        self.proto = init.get("protocolVersion", self.proto)
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return self

    def call(self, tool, args):
        """(isError, text) of a tools/call."""
        res = self.rpc("tools/call", {"name": tool, "arguments": args})
        text = "\n".join(c.get("text", "") for c in res.get("content", []) if c.get("type") == "text")
        return bool(res.get("isError")), text

    def python(self, code, session):
        err, text = self.call("python_exec", {"code": code, "session": session, "wait_s": 45})
        while "[ferrepl] still running" in text and time.monotonic() < deadline:
            err, text = self.call("python_wait", {"session": session, "wait_s": 30})
        return text

    def close(self):
        if not self.sid:
            return
        try:  # end the MCP session (best effort)
            req = urllib.request.Request(url, method="DELETE", headers={
                "Authorization": "Bearer " + self.token, "Mcp-Session-Id": self.sid,
                "MCP-Protocol-Version": self.proto})
            urllib.request.urlopen(req, timeout=5).close()
        except Exception:  # noqa: BLE001
            pass

def show(label, text):
    for line in text.splitlines():
        print(f"  {label}: {line}")

verdicts, evidence, clients = [], [], []
try:
    alice = Client(tokens["alice"]).open()
    clients.append(alice)
    text = alice.python("try:\n"
                        f"    data = open({secret!r}).read()\n"
                        "    print('OUTCOME: read', len(data), 'bytes:', data)\n"
                        "except Exception as e:\n"
                        "    print('OUTCOME: refused:', type(e).__name__, e)\n", "secret-probe")
    show("alice python_exec", text)
    if "OUTCOME: refused:" in text and "OUTCOME: read" not in text:
        verdicts.append("refused")
    elif "OUTCOME: read" in text:
        verdicts.append("read"); evidence.append("python_exec read it")
    else:
        verdicts.append("unknown"); evidence.append("python_exec did not run the code")

    err, text = alice.call("shell_exec", {"command": f"cat {secret}", "wait_s": 30})
    job = re.search(r"\| job (\S+) \|", text)
    while job and "is still running" in text and time.monotonic() < deadline:
        err, text = alice.call("shell_wait", {"job": job.group(1), "wait_s": 30})
    show("alice shell_exec", text)
    status = re.search(r"^-- (.+?) \| job ", text, re.M)
    status = status.group(1) if status else "no result"
    if re.fullmatch(r"exit [1-9][0-9]*", status):
        verdicts.append("refused")
    elif status == "exit 0":
        verdicts.append("read"); evidence.append("shell_exec: cat exited 0")
    else:
        verdicts.append("unknown"); evidence.append(f"shell_exec: {status}")

    # Each tenant writes a file into its workspace (the cell's working
    # directory); the script stats them from the host.
    for tenant in ("alice", "bob"):
        c = alice if tenant == "alice" else Client(tokens[tenant]).open()
        if c is not alice:
            clients.append(c)
        text = c.python("import os\n"
                        f"open({probe!r}, 'w').write('written by a session\\n')\n"
                        "print('PROBE uid', os.getuid(), 'gid', os.getgid(), 'file', os.path.abspath("
                        f"{probe!r}))\n", "uid-probe")
        show(f"{tenant} python_exec", text)
except Exception as e:  # noqa: BLE001 - any failure is reported, not raised
    print(f"  client: {type(e).__name__}: {e}")
    verdicts.append("unknown"); evidence.append(f"client failed: {e}")
finally:
    for c in clients:
        c.close()

if any(t in s for s in seen for t in tokens.values()):
    evidence.insert(0, "a token's text is in a result")
    print(f"SECRET: READABLE ({'; '.join(evidence)})")
elif "read" in verdicts:
    print(f"SECRET: READABLE ({'; '.join(evidence)})")
elif verdicts == ["refused", "refused"]:
    print("SECRET: unreadable (python_exec and shell_exec both refused, no token in any result)")
else:
    print(f"SECRET: UNKNOWN ({'; '.join(evidence)})")
PY

# The pod's user namespace: held by a sleeping process while its maps are
# written (as host root: any range may be mapped; newuidmap is not needed).
unshare --user -- sleep 400 &
holder=$!
for _ in $(seq 1 100); do
  [ "$(readlink "/proc/$holder/ns/user")" != "$(readlink /proc/self/ns/user)" ] && break
  sleep 0.05
done
echo "0 $base $ids" >"/proc/$holder/uid_map"
echo "0 $base $ids" >"/proc/$holder/gid_map"

export MASK=$mask WORK=$work PY=$python SECRET_DIR=$secret_dir SECRET_FILE=$secret_dir/$secret_item \
  TOKENS=$tokens BOUNDING=$bounding TENANT_UIDS=$tenant_uids PROBE=$probe REQUIRE_FLAG=
# Without --sandbox-require the script shows what a pod gets, degraded
# isolation included, which ferrepl refuses for tenants unless told.
if [ "$require" = 1 ]; then REQUIRE_FLAG=--sandbox-require; else REQUIRE_FLAG=--allow-degraded-isolation; fi
# Inside: root of the pod's user namespace, every capability there (as the
# runtime has while it sets the container up); ferrepl itself gets only the
# manifest's, from setpriv. The verdict lines are printed last, below.
rc=0
# shellcheck disable=SC2016 # expanded by the inner shell
timeout 270 nsenter --user --target "$holder" --setuid 0 --setgid 0 -- \
    unshare --mount --pid --fork --mount-proc --propagation private -- bash -c '
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
  timeout 250 setpriv --no-new-privs --inh-caps=-all --ambient-caps=-all --bounding-set="$BOUNDING" \
    env -u TOKENS ${TENANT_UIDS:+FERREPL_TENANT_UIDS=$TENANT_UIDS} \
      /srv/bin/ferrepl --http 127.0.0.1:0 --workdir /srv/work --state-dir /srv/state \
      --uid-table /srv/uids/uids.json \
      --auth-token-file "$SECRET_FILE" --python "$PY" --warm-pool 0 --log-format text \
      --tools python,shell $REQUIRE_FLAG >/tmp/log 2>&1 &
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
  fp=; read -r fp _ </proc/$pid/task/$pid/children || true   # timeout -> ferrepl
  [ -z "$fp" ] || echo "ferrepl: $(grep -E "^(CapPrm|CapEff|CapBnd|NoNewPrivs)" /proc/$fp/status | tr -s "\t\n" "  ")"
  echo "secret: $SECRET_FILE ($(stat -Lc "mode %a, uid %u, gid %g" "$SECRET_FILE")), MCP clients on $url"
  out=$(CLIENT_SECONDS=150 timeout 170 "$PY" "$WORK/client.py" "$url" "$SECRET_FILE" "$PROBE") || {
    echo "$out"; echo "the MCP client failed or timed out; ferrepl log:"; tail -20 /tmp/log
    kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; exit 1
  }
  kill -TERM $pid 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  kill -KILL $pid 2>/dev/null || true
  wait $pid 2>/dev/null || true
  echo "$out"
  if echo "$line" | sed "s/; NOT in force.*//" | grep -qw namespaces; then
    echo "NAMESPACES: yes"
  else
    echo "NAMESPACES: no ($(grep -m1 "not available here" /tmp/log | sed "s/.*not available here: //" | head -c 300))"
  fi
' >"$work/inner.out" 2>&1 || rc=$?
grep -v -e '^SECRET: ' -e '^NAMESPACES: ' "$work/inner.out" || true
[ "$rc" = 0 ] || exit 1

# From the host: who owns the files the tenants' sessions wrote?
owner() { stat -c %u "$work/pvc/work/$1/$probe" 2>/dev/null || echo missing; }
a=$(owner alice) b=$(owner bob)
in_pod() { [ "$1" != missing ] && [ "$1" -gt "$base" ] && [ "$1" -lt $((base + ids)) ]; }
if [ "$a" = missing ] || [ "$b" = missing ]; then
  uids="UIDS: UNKNOWN (a probe file is missing: alice $a, bob $b)"
elif [ "$a" = "$b" ] || [ "$a" = "$base" ] || [ "$b" = "$base" ]; then
  uids="UIDS: SHARED (alice host uid $a, bob host uid $b; the pod's root is $base)"
elif in_pod "$a" && in_pod "$b"; then
  uids="UIDS: distinct (alice host uid $a, bob host uid $b)"
else
  uids="UIDS: UNKNOWN (outside the pod's range $base-$((base + ids - 1)): alice $a, bob $b)"
fi
grep -m1 '^SECRET: ' "$work/inner.out" || echo "SECRET: UNKNOWN (no verdict from the client)"
echo "$uids"
grep -m1 '^NAMESPACES: ' "$work/inner.out" || echo "NAMESPACES: no (no verdict)"
