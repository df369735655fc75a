#!/usr/bin/env bash
# Validates the deployment files:
#   1. deploy/k8s/*.yaml against the Kubernetes API schemas (kubernetes-validate
#      from PyPI, --strict: unknown fields are errors), in a venv under
#      target/test-env/deploy-venv (scripts/test-env.sh makes it);
#   2. the manifests against ferrepl's own flags (grace period > drain,
#      probes on the metrics port, memory limit >= (sessions + jobs) x per-session
#      limit, the security context the sandbox needs, replicas = router
#      servers);
#   3. deploy/nginx/ferrepl.conf is exactly render.py --k8s (the template);
#   4. `nginx -t` on the template rendered for loopback (what
#      scripts/cluster-sim.py runs) and on ferrepl.conf (pod names mapped to
#      loopback; `resolve` dropped when this nginx predates 1.27.3); nginx
#      comes from scripts/test-env.sh (Debian's nginx-light);
#   5. where possible (root, unshare, nsenter, setpriv, a built ferrepl), the
#      pod's security context emulated on this host (deploy/k8s/emulate-pod-
#      security.sh: a pod user namespace, root in it with the manifest's
#      capabilities): with /proc unmasked ferrepl must start with
#      --sandbox-require (as the ConfigMap has it), get its namespaces and
#      run two tenants' sessions as two uids; with the runtime's default mask
#      it must get neither, and say "uid boundary DEGRADED" (why procMount:
#      Unmasked); in both, a session (python_exec, shell_exec over MCP) must
#      fail to read the tokens Secret mounted at /etc/ferrepl.
#
# Usage: bash scripts/deploy-check.sh     (DEPLOY_CHECK_EMULATE=0 skips 5)
# Ends with "N passed, M failed"; exit 1 when something failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# kubernetes-validate's venv and nginx come from the project's test set-up.
env_dir=${FERREPL_TEST_ENV:-$(bash scripts/test-env.sh)}
venv=$env_dir/deploy-venv
k8s_version=${K8S_VERSION:-1.33.0}
kv_version=${KUBERNETES_VALIDATE_VERSION:-1.37.0}
passed=0
failed=0
ok() { echo "PASS $*"; passed=$((passed + 1)); }
bad() { echo "FAIL $*"; failed=$((failed + 1)); }
skip() { echo "SKIP $*"; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# --- 1. kubernetes-validate ------------------------------------------------
if "$venv/bin/kubernetes-validate" --strict --quiet -k "$k8s_version" deploy/k8s/*.yaml; then
  ok "kubernetes-validate --strict (Kubernetes $k8s_version): $(ls deploy/k8s/*.yaml | wc -l) manifests"
else
  bad "kubernetes-validate --strict (Kubernetes $k8s_version)"
fi

# --- 2. manifests vs. ferrepl's flags ----------------------------------------
if "$venv/bin/python" - <<'PY'
import re, sys, yaml

def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]

def size(v):  # Kubernetes quantities and ferrepl sizes (K/M/G are binary in ferrepl)
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]i?)?", str(v))
    if not m:
        raise ValueError(v)
    mult = {None: 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40,
            "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[m.group(2)]
    return float(m.group(1)) * mult

problems = []
def check(cond, msg):
    if not cond:
        problems.append(msg)

cm = load("deploy/k8s/configmap.yaml")[0]["data"]
sts = load("deploy/k8s/statefulset.yaml")[0]
svc = load("deploy/k8s/service.yaml")[0]
pod = sts["spec"]["template"]["spec"]
c = [x for x in pod["containers"] if x["name"] == "ferrepl"][0]
ports = {p["name"]: p["containerPort"] for p in c["ports"]}

check(int(pod["terminationGracePeriodSeconds"]) >= int(cm["FERREPL_DRAIN_SECONDS"]) + 10,
      "terminationGracePeriodSeconds must exceed FERREPL_DRAIN_SECONDS by >= 10 s (drain + flush)")
check(cm["FERREPL_HTTP"].rsplit(":", 1)[1] == str(ports["mcp"]), "FERREPL_HTTP port != containerPort mcp")
check(cm["FERREPL_METRICS_ADDR"].rsplit(":", 1)[1] == str(ports["metrics"]),
      "FERREPL_METRICS_ADDR port != containerPort metrics")
for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"), ("startupProbe", "/healthz")):
    g = c[probe]["httpGet"]
    check(g["path"] == path and g["port"] in ("metrics", ports["metrics"]),
          f"{probe} must GET {path} on the metrics port (no auth there)")
need = (int(cm["FERREPL_MAX_SESSIONS"]) + int(cm["FERREPL_MAX_JOBS"])) * size(cm["FERREPL_MEMORY_LIMIT"]) + 512 * 2**20
have = size(c["resources"]["limits"]["memory"])
check(have >= need, f"limits.memory {have/2**30:.1f} GiB < (max-sessions + max-jobs) x memory-limit + 0.5 GiB = {need/2**30:.1f} GiB")
check(size(c["resources"]["requests"]["memory"]) <= have, "requests.memory > limits.memory")
check(int(cm["FERREPL_TENANT_MAX_SESSIONS"]) < int(cm["FERREPL_MAX_SESSIONS"]),
      "FERREPL_TENANT_MAX_SESSIONS should be below FERREPL_MAX_SESSIONS (one tenant must not take every slot)")
psc, csc = pod["securityContext"], c["securityContext"]
# ferrepl is root in the pod's own user namespace, never on the node.
check(pod.get("hostUsers") is False, "hostUsers: false (ferrepl's root and capabilities must be the pod's only)")
for name, sc in [("pod", psc)] + [(x["name"], x.get("securityContext") or {})
                                  for x in pod["containers"] + pod.get("initContainers", [])]:
    if sc.get("runAsUser") == 0:
        check(pod.get("hostUsers") is False, f"{name}: runAsUser 0 only with hostUsers: false")
uid = csc.get("runAsUser", psc.get("runAsUser"))
check(uid == 0, "ferrepl must run as uid 0 (of the pod's user namespace) to give each tenant its own uid")
check(csc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not True, "runAsNonRoot: true would refuse uid 0")
caps = csc.get("capabilities", {})
want = {"SETUID", "SETGID", "SETFCAP", "CHOWN", "FOWNER", "DAC_OVERRIDE", "KILL"}
check(caps.get("drop") == ["ALL"] and set(caps.get("add") or []) == want and len(caps.get("add") or []) == len(want),
      f"capabilities: drop ALL, add exactly {sorted(want)}")
check(csc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation: false")
tokens_vol = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == "ferrepl-tokens"]
check(tokens_vol and int(tokens_vol[0]["secret"].get("defaultMode", 0o644)) & 0o007 == 0,
      "the tokens Secret must not be readable by others (defaultMode)")
m = re.fullmatch(r"(\d+)-(\d+)", cm.get("FERREPL_TENANT_UIDS", ""))
check(m and 1 <= int(m.group(1)) <= int(m.group(2)) <= 65533,
      "FERREPL_TENANT_UIDS must be a range inside 1-65533 (the pod maps 0-65535; 65534 is nobody)")
check(cm.get("FERREPL_SANDBOX_REQUIRE") == "true", "FERREPL_SANDBOX_REQUIRE must be \"true\"")
check(csc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem: true")
check(not csc.get("privileged"), "privileged must not be set")
if csc.get("procMount") == "Unmasked":
    check(pod.get("hostUsers") is False, "procMount: Unmasked requires hostUsers: false")
mounts = {m["mountPath"] for m in c["volumeMounts"]}
check({"/data", "/tmp"} <= mounts, "/data and /tmp must be mounted writable (read-only root)")
env = {e["name"]: e.get("value") for e in c.get("env", [])}
for key, val in (("FERREPL_WORKDIR", cm["FERREPL_WORKDIR"]), ("FERREPL_STATE_DIR", cm["FERREPL_STATE_DIR"]),
                 ("TMPDIR", env.get("TMPDIR", "/tmp"))):
    check(val.startswith("/data/") or val.startswith("/tmp"), f"{key}={val} is not on a writable volume")
check(svc["spec"].get("clusterIP") == "None" and svc["spec"].get("publishNotReadyAddresses") is True,
      "the Service must be headless with publishNotReadyAddresses")
check(sts["spec"]["serviceName"] == svc["metadata"]["name"], "serviceName != the headless Service")
conf = open("deploy/nginx/ferrepl.conf").read()
servers = re.findall(r"^\s*server\s+(ferrepl-(\d+)\.ferrepl\.[a-z0-9-]+\.svc\.cluster\.local:(\d+))", conf, re.M)
check(sorted(int(s[1]) for s in servers) == list(range(int(sts["spec"]["replicas"]))),
      "deploy/nginx/ferrepl.conf must list ferrepl-0..replicas-1")
check(all(s[2] == str(ports["mcp"]) for s in servers), "router servers must use the mcp port")
if problems:
    print("\n".join("  - " + p for p in problems))
    sys.exit(1)
PY
then ok "manifests agree with ferrepl's flags (drain, ports, probes, memory, security context, tenant uids, router)"
else bad "manifests vs. ferrepl's flags"; fi

# --- 3. ferrepl.conf is the rendered template --------------------------------
if python3 deploy/nginx/render.py --k8s | diff -u deploy/nginx/ferrepl.conf - >"$tmp/diff"; then
  ok "deploy/nginx/ferrepl.conf = render.py --k8s (template)"
else
  cat "$tmp/diff"; bad "deploy/nginx/ferrepl.conf differs from the template: python3 deploy/nginx/render.py --k8s > deploy/nginx/ferrepl.conf"
fi

# --- 4. nginx -t ---------------------------------------------------------------
if ! command -v nginx >/dev/null && [ -x /usr/sbin/nginx ]; then PATH=$PATH:/usr/sbin; fi
command -v nginx >/dev/null || bad "nginx is not installed (bash scripts/test-env.sh installs it)"
if command -v nginx >/dev/null; then
  ver=$(nginx -v 2>&1 | sed -n 's|.*nginx/\([0-9.]*\).*|\1|p')
  nginx_test() { # id label conf-file
    local d="$tmp/nginx-$1"
    mkdir -p "$d/logs"
    cp "$3" "$d/ferrepl.conf"
    cat >"$d/nginx.conf" <<CONF
pid $d/nginx.pid;
error_log $d/logs/error.log;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path $d/body;
    proxy_temp_path $d/proxy;
    fastcgi_temp_path $d/fastcgi;
    uwsgi_temp_path $d/uwsgi;
    scgi_temp_path $d/scgi;
    include $d/ferrepl.conf;
}
CONF
    if nginx -t -q -p "$d" -e "$d/logs/error.log" -c "$d/nginx.conf" 2>"$d/out"; then
      ok "nginx $ver -t: $2"
    else
      cat "$d/out"; bad "nginx $ver -t: $2"
    fi
  }
  python3 deploy/nginx/render.py --listen 127.0.0.1:18080 --server 127.0.0.1:18001 \
    --server 127.0.0.1:18002 --server 127.0.0.1:18003 >"$tmp/sim.conf"
  nginx_test sim "template rendered for loopback (cluster-sim)" "$tmp/sim.conf"
  # The Kubernetes form: pod names do not resolve here, kube-dns neither.
  strip_resolve=1   # unless this nginx is >= 1.27.3
  [ "$(printf '%s\n%s\n' 1.27.3 "$ver" | sort -V | head -1)" = 1.27.3 ] && strip_resolve=0
  sed -E -e 's/ferrepl-([0-9]+)\.ferrepl\.[a-z0-9-]+\.svc\.cluster\.local:8000/127.0.0.1:1810\1/' \
      -e 's/resolver kube-dns\.kube-system\.svc\.cluster\.local/resolver 127.0.0.1/' \
      deploy/nginx/ferrepl.conf >"$tmp/k8s.conf"
  note=""
  if [ "$strip_resolve" = 1 ]; then
    sed -i -E 's/ max_fails=0 resolve;/ max_fails=0;/' "$tmp/k8s.conf"; note=", 'resolve' dropped: needs nginx >= 1.27.3"
  fi
  nginx_test k8s "deploy/nginx/ferrepl.conf (pod names as loopback$note)" "$tmp/k8s.conf"
else
  bad "nginx not available"
fi

# --- 5. security context emulated on this host ---------------------------------
verdict() { echo "$1" | grep -m1 "^$2: " || echo "$2: (none)"; }   # output, SECRET/UIDS/NAMESPACES/sandbox
if [ "${DEPLOY_CHECK_EMULATE:-1}" = 0 ]; then
  skip "pod security emulation (DEPLOY_CHECK_EMULATE=0)"
else
  # As the ConfigMap has it: --sandbox-require, which also refuses a shared uid.
  out0=$(MASK=0 REQUIRE=1 bash deploy/k8s/emulate-pod-security.sh 2>&1); rc0=$?
  if [ $rc0 = 2 ]; then
    skip "pod security emulation: $(echo "$out0" | tail -1)"
  else
    if [ $rc0 = 0 ] && verdict "$out0" NAMESPACES | grep -q "^NAMESPACES: yes" \
       && verdict "$out0" SECRET | grep -q "^SECRET: unreadable" \
       && verdict "$out0" UIDS | grep -q "^UIDS: distinct" \
       && ! verdict "$out0" sandbox | grep -q "uid boundary DEGRADED"; then
      ok "emulated pod (root in a pod user namespace, the manifest's capabilities, no_new_privs, read-only root, /proc unmasked, --sandbox-require): ferrepl has its namespaces; $(verdict "$out0" UIDS); SECRET: unreadable (the tokens Secret at /etc/ferrepl is not in a session's view)"
    else
      echo "$out0" | tail -15; bad "emulated pod with /proc unmasked and --sandbox-require: expected it to start, namespaces, UIDS: distinct and SECRET: unreadable"
    fi
    out1=$(MASK=1 bash deploy/k8s/emulate-pod-security.sh 2>&1); rc1=$?
    if [ $rc1 = 0 ] && verdict "$out1" NAMESPACES | grep -q "^NAMESPACES: no" \
       && verdict "$out1" SECRET | grep -q "^SECRET: unreadable" \
       && verdict "$out1" UIDS | grep -q "^UIDS: SHARED" \
       && verdict "$out1" sandbox | grep -q "uid boundary DEGRADED"; then
      ok "emulated pod with the runtime's default /proc mask: no namespaces, as expected ($(verdict "$out1" NAMESPACES | grep -o 'mount on [^:]*: [^(]*' | head -1 | sed 's/ *$//')), so one uid for both tenants, reported as 'uid boundary DEGRADED'; SECRET: unreadable"
    else
      echo "$out1" | tail -15; bad "emulated pod with masked /proc: expected no namespaces, UIDS: SHARED, 'uid boundary DEGRADED' and SECRET: unreadable"
    fi
  fi
fi

echo "deploy-check: $passed passed, $failed failed"
[ "$failed" = 0 ]
