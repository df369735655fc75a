#!/usr/bin/env bash
# Emulates, on one Linux host (as root, no cluster), the container that
# deploy/k8s/statefulset.yaml asks for, and starts ferrepl in it to see which
# sandbox layers it gets:
#
#   * a private mount and PID namespace with a fresh /proc, masked the way
#     container runtimes (runc, crun) mask it by default (`procMount:
#     Default`): /dev/null over /proc/kcore, /proc/keys, /proc/timer_list...,
#     read-only /proc/sys, /proc/bus, /proc/fs, /proc/irq, /proc/sysrq-trigger;
#     or left unmasked (`procMount: Unmasked`) with MASK=0;
#   * readOnlyRootFilesystem: / remounted read-only; an emptyDir on /tmp, the
#     "PVC" (a host directory) on /srv;
#   * runAsUser/runAsGroup 10001, capabilities drop ALL (empty bounding
#     set), allowPrivilegeEscalation: false (no_new_privs).
#
# Not emulated: the runtime's default seccomp and AppArmor profiles (the
# manifests ask for Unconfined), cgroup v2 limits, the kubelet.
#
#   MASK=1 deploy/k8s/emulate-pod-security.sh   # prints ferrepl's sandbox line
#   MASK=0 deploy/k8s/emulate-pod-security.sh
#
# Exit 0 with "NAMESPACES: yes" or "NAMESPACES: no (...)" on the last line;
# exit 2 when it cannot run here (not root, no unshare/setpriv, no binary).
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

work=$(mktemp -d /var/tmp/ferrepl-podemu.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/pvc/work" "$work/pvc/state" "$work/pvc/tmp" "$work/pvc/bin" "$work/etc"
cp "$bin" "$work/pvc/bin/ferrepl"
printf 'emulated-token-0123456789abcdef emu\n' >"$work/etc/tokens"
chmod 0644 "$work/etc/tokens"
chown -R 10001:10001 "$work/pvc"
chmod 0755 "$work" "$work/etc"

export MASK=$mask WORK=$work PY=$python
timeout 60 unshare --mount --pid --fork --mount-proc --propagation private -- bash -c '
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
  mount --bind "$WORK/etc" /mnt                      # the Secret at /mnt
  mount -t tmpfs -o mode=1777,size=64m tmpfs /tmp    # the emptyDir
  mount -o remount,bind,ro /                         # readOnlyRootFilesystem
  cd /srv
  PATH=/usr/local/bin:/usr/bin:/bin TMPDIR=/srv/tmp HOME=/tmp \
  timeout 20 setpriv --reuid 10001 --regid 10001 --clear-groups \
      --no-new-privs --inh-caps=-all --bounding-set=-all \
    /srv/bin/ferrepl --http 127.0.0.1:0 --workdir /srv/work --state-dir /srv/state \
      --auth-token-file /mnt/tokens --python "$PY" --warm-pool 0 --log-format text \
      >/tmp/log 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do
    grep -q "startup: sandbox: " /tmp/log && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  kill -TERM $pid 2>/dev/null || true
  wait $pid 2>/dev/null || true
  line=$(grep -m1 "startup: sandbox: " /tmp/log || true)
  if [ -z "$line" ]; then echo "ferrepl did not start:"; cat /tmp/log; exit 1; fi
  echo "$line" | sed "s/.*sandbox: /sandbox: /"
  grep -m1 "not available here" /tmp/log | sed "s/.*probe: /warning: /" || true
  if echo "$line" | grep -q "private mount, PID"; then
    echo "NAMESPACES: yes"
  else
    echo "NAMESPACES: no ($(echo "$line" | grep -o "NO private namespaces ([^)]*)" | head -c 300))"
  fi
'
