#!/usr/bin/env bash
# The test command: set up (venv + build) and run the test suite.
# GPU tests skip with a reason on a machine without a CUDA GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/pytest tests -q -rs "$@"
