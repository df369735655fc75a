#!/usr/bin/env python3
"""Renders ferrepl.conf.template.

    render.py --k8s                      the Kubernetes form (= ferrepl.conf)
    render.py --listen 127.0.0.1:8080 --server 127.0.0.1:18001 --server ...

--k8s names the StatefulSet's pods (deploy/k8s/): ferrepl-<i>.ferrepl.<ns>.svc
with `resolve`, and kube-dns as the resolver.  scripts/deploy-check.sh checks
that ferrepl.conf is exactly `render.py --k8s`; scripts/cluster-sim.py renders
the local form.  Standard library only.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "ferrepl.conf.template")


def render(listen, servers, resolve=False, resolver=None, template=TEMPLATE):
    with open(template, encoding="utf-8") as f:
        text = f.read()
    flag = " resolve" if resolve else ""
    lines = "\n".join(f"    server {s} max_fails=0{flag};" for s in servers)
    res = (
        f"# Pod IPs change when a pod is rescheduled: re-resolve the names.\n"
        f"resolver {resolver} valid=10s ipv6=off;\nresolver_timeout 5s;"
        if resolver
        else "# (no resolver: the servers are fixed addresses)"
    )
    out = (
        text.replace("@@RESOLVER@@", res)
        .replace("@@SERVERS@@", lines)
        .replace("@@LISTEN@@", f"    listen {listen};")
    )
    header = (
        "# GENERATED from ferrepl.conf.template by render.py; edit the template.\n"
    )
    return header + out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k8s", action="store_true")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--namespace", default="ferrepl")
    ap.add_argument("--listen", default="8080")
    ap.add_argument("--server", action="append", default=[])
    a = ap.parse_args()
    if a.k8s:
        servers = [
            f"ferrepl-{i}.ferrepl.{a.namespace}.svc.cluster.local:8000"
            for i in range(a.replicas)
        ]
        sys.stdout.write(
            render(a.listen, servers, resolve=True,
                   resolver="kube-dns.kube-system.svc.cluster.local")
        )
    else:
        if not a.server:
            ap.error("--server HOST:PORT (repeatable) or --k8s")
        sys.stdout.write(render(a.listen, a.server))


if __name__ == "__main__":
    main()
