#!/usr/bin/env bash
# Regenerates docs/viewer.png and docs/images/viewer-phone.png, README's
# pictures of the live viewer, with the viewer's browser check
# (tests/viewer/browser_check.py --readme --phone). Needs
# scripts/test-env.sh (chromium, chromedriver, the viewer and rich venvs).
set -euo pipefail
cd "$(dirname "$0")/.."
ENV_DIR="$(bash scripts/test-env.sh)"
cargo build --quiet
FERREPL_BIN="$PWD/target/debug/ferrepl" FERREPL_RICH_PYTHON="$ENV_DIR/rich/bin/python" \
    "$ENV_DIR/viewer-venv/bin/python" tests/viewer/browser_check.py --readme docs/viewer.png \
    --phone docs/images/viewer-phone.png
echo "docs/viewer.png and docs/images/viewer-phone.png updated" >&2
