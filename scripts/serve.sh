#!/usr/bin/env bash
# Install what is missing, then run the service on 127.0.0.1:8000 and print its URL.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
if [ "${CUBICLE_RUNTIME:-local}" = microvm ]; then
    # Once per change of images/ or the guest's code; later starts find it cached.
    .venv/bin/cubicle image build
fi
exec .venv/bin/cubicle serve "$@"
