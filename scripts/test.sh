#!/usr/bin/env bash
# Install what is missing (tests included), check style and types, then run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh test
if [ "$(id -u)" -ne 0 ]; then
    echo "==> not root: the escape suite's root part is skipped (tests/security, root_only)."
    echo "    As root (as CI runs it), it also runs the suite again as a dedicated user."
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy  # [tool.mypy] in pyproject.toml: what it checks, and how strictly
exec .venv/bin/pytest "$@"
