#!/usr/bin/env bash
# Rewrites the tool-surface tables of README.md and docs/tools.md (between
# `<!-- tool-surface ... -->` and `<!-- /tool-surface -->`) from the
# server's own tools/list: tests/suite/docs_numbers.rs measures every
# profile and, with FERREPL_UPDATE_DOCS=1, writes what it measured instead
# of failing. Run it after changing a tool's name, description or schema,
# or the server's instructions, when that test says the tables differ.
set -euo pipefail
cd "$(dirname "$0")/.."
FERREPL_UPDATE_DOCS=1 cargo test --quiet --test suite -- docs_numbers::the_tool_surface_tables
