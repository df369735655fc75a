#!/usr/bin/env bash
# Creates target/peer-env/jupyter-mcp: Datalayer's jupyter-mcp-server with the
# JupyterLab (and its collaboration extension) it drives, for bench/peers.py.
# Pinned, so a number in bench/README.md names what it was measured against;
# kept apart from target/test-env so its pins cannot change the versions the
# tests run with. Safe to run again: fast when present.
set -euo pipefail
cd "$(dirname "$0")/.."
ENV=target/peer-env/jupyter-mcp
PINS=(jupyter-mcp-server==2.2.4 jupyterlab==4.6.6 ipykernel==7.4.0 mcp==2.3.0)
if [ -x "$ENV/bin/python" ] && "$ENV/bin/python" -m pip freeze 2>/dev/null | grep -qx 'jupyter_mcp_server==2.2.4'; then
    echo "jupyter-mcp-server 2.2.4 already in $ENV"
    exit 0
fi
mkdir -p target/peer-env
python3 -m venv "$ENV"
"$ENV/bin/python" -m pip install --quiet "${PINS[@]}"
echo "jupyter-mcp-server 2.2.4 installed in $ENV"
