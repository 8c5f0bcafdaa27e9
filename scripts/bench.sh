#!/usr/bin/env bash
# Run the benchmarks; each prints JSON (and writes it under bench/results/).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh test
exec .venv/bin/python -m bench "$@"
