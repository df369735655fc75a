#!/usr/bin/env bash
# Creates target/bench-env, a venv with fastmcp, for bench/clients/fastmcp_client.py.
# Kept apart from target/test-env so fastmcp's own pin of the `mcp` SDK cannot
# change the version the interop tests run against. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
ENV=target/bench-env
if [ -x "$ENV/bin/python" ] && "$ENV/bin/python" -c 'import fastmcp' 2>/dev/null; then
    echo "fastmcp already in $ENV: $("$ENV/bin/python" -c 'import fastmcp; print(fastmcp.__version__)')"
    exit 0
fi
python3 -m venv "$ENV"
"$ENV/bin/python" -m pip install --quiet --upgrade pip
"$ENV/bin/python" -m pip install --quiet fastmcp
echo "fastmcp $("$ENV/bin/python" -c 'import fastmcp; print(fastmcp.__version__)') installed in $ENV"
