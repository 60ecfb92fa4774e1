#!/usr/bin/env bash
# Create .venv (if missing), install the build and test dependencies, and
# build + install tensorplay into it. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# Build dependencies pinned as in pyproject.toml: cuda-bindings and the CUDA
# headers (nvidia-cuda-runtime) share one minor version.
.venv/bin/python -m pip install -q \
    "meson-python>=0.16" "meson>=1.2" ninja "cython>=3.1" \
    "cuda-bindings==13.5.*" "nvidia-cuda-runtime==13.5.*" "cuda-pathfinder>=1.3" \
    "nvidia-cuda-nvrtc>=13,<14" numpy "ml_dtypes>=0.4" \
    "pytest>=8" "hypothesis>=6" "pytest-benchmark>=4" "mypy>=1.18"
.venv/bin/python -m pip install -q --no-build-isolation --no-deps .
