#!/usr/bin/env bash
# Install what is missing (tests included), check style, then run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh test
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/pytest "$@"
